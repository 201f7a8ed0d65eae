package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// client is the official OpenAI Go client pointed at ts.
func (ts *testServer) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(ts.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func TestOpenAIClientChat(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}, APIKey: "sesame"}, true)
	c := ts.client("sesame")
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:       "ferrite-tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Who are you?")},
		Temperature: openai.Float(0),
		MaxTokens:   openai.Int(64),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("%d choices", len(resp.Choices))
	}
	got := resp.Choices[0]
	if !strings.HasPrefix(got.Message.Content, "I'm ferrite-tiny") || got.FinishReason != "stop" || got.Message.Role != "assistant" {
		t.Errorf("reply %q, finish %q, role %q", got.Message.Content, got.FinishReason, got.Message.Role)
	}
	u := resp.Usage
	if u.PromptTokens == 0 || u.CompletionTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v", u)
	}

	// The same request streamed gives the same text, usage included.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 {
		t.Errorf("only %d chunks", chunks)
	}
	if acc.Choices[0].Message.Content != got.Message.Content || acc.Choices[0].FinishReason != "stop" {
		t.Errorf("streamed %q (%q), want %q", acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, got.Message.Content)
	}
	if acc.Usage.CompletionTokens != u.CompletionTokens || acc.Usage.PromptTokens != u.PromptTokens {
		t.Errorf("streamed usage %+v, want %+v", acc.Usage, u)
	}

	// The conversation's next turn reuses the cached prompt and reply.
	params = params2(params)
	params.Messages = append(params.Messages, got.Message.ToParam(), openai.UserMessage("What does ephemeral mean?"))
	if resp, err = c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	if resp.Usage.PromptTokensDetails.CachedTokens < u.PromptTokens {
		t.Errorf("%d cached prompt tokens on the next turn, want at least the first prompt's %d", resp.Usage.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}

	// Unknown model: a 404 the client reports as an API error.
	params.Model = "gpt-17"
	_, err = c.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}

	// A wrong key: 401.
	wrong := ts.client("wrong")
	_, err = wrong.Models.List(ctx)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong key: %v", err)
	}
	waitIdle(t, b.Runtime)
}

// params2 is p without streaming options.
func params2(p openai.ChatCompletionNewParams) openai.ChatCompletionNewParams {
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	return p
}

func TestOpenAIClientCompletionsAndModels(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	c := ts.client("")
	ctx := context.Background()
	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "ferrite-tiny" || page.Data[0].OwnedBy != "ferrite" {
		t.Fatalf("models %+v", page.Data)
	}
	if m, err := c.Models.Get(ctx, "ferrite-tiny"); err != nil || m.ID != "ferrite-tiny" {
		t.Errorf("get ferrite-tiny: %+v, %v", m, err)
	}
	var apiErr *openai.Error
	if _, err := c.Models.Get(ctx, "gpt-17"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("get gpt-17: %v", err)
	}
	resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:       "ferrite-tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"Ephemeral means", "A synonym for big is"}},
		MaxTokens:   openai.Int(5),
		Temperature: openai.Float(0),
		N:           openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 4 {
		t.Fatalf("%d choices, want 2 prompts × n 2", len(resp.Choices))
	}
	for i, ch := range resp.Choices {
		if int(ch.Index) != i || ch.FinishReason != "length" || ch.Text == "" {
			t.Errorf("choice %d: %+v", i, ch)
		}
	}
	if resp.Choices[0].Text != resp.Choices[1].Text || resp.Usage.CompletionTokens != 20 {
		t.Errorf("greedy choices of one prompt differ, or usage %+v is not 4 × 5 tokens", resp.Usage)
	}

	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:       "ferrite-tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Ephemeral means")},
		MaxTokens:   openai.Int(5),
		Temperature: openai.Float(0),
	})
	var text strings.Builder
	finish := ""
	for stream.Next() {
		ch := stream.Current()
		text.WriteString(ch.Choices[0].Text)
		if ch.Choices[0].FinishReason != "" {
			finish = string(ch.Choices[0].FinishReason)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != resp.Choices[0].Text || finish != "length" {
		t.Errorf("streamed %q (%s), want %q", text.String(), finish, resp.Choices[0].Text)
	}
	waitIdle(t, b.Runtime)
}
