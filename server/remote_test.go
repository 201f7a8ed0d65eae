package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	remote "github.com/ferrite-llm/ferrite/internal/openai"
)

// TestChatRemoteClient: the chat's own client for remote endpoints
// (internal/openai) works against ferrite serve: the model list, a streamed
// reply with its reasoning and usage, the extra sampling fields, and an
// error.
func TestChatRemoteClient(t *testing.T) {
	b := scriptedBackend(t, "Why?", "<think>Hmm.</think>Because.", 0)
	ts := startServer(t, Options{Models: []Model{loaded("thinker", b)}, APIKey: "k"}, true)
	c := &remote.Client{BaseURL: ts.url + "/v1", APIKey: "k"}
	ctx := context.Background()
	models, err := c.Models(ctx)
	if err != nil || len(models) != 1 || models[0].ID != "thinker" || models[0].MaxModelLen != b.Runtime.MaxSeqLen() {
		t.Fatalf("models %+v, %v", models, err)
	}
	temp := 0.0
	st, err := c.StreamChat(ctx, remote.ChatRequest{Model: "thinker", Messages: []remote.Message{{Role: "user", Content: "Why?"}},
		Temperature: &temp, MaxTokens: 100, Extra: map[string]any{"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1}})
	if err != nil {
		t.Fatal(err)
	}
	var reasoning, content, finish string
	var usage *remote.Usage
	for {
		ch, err := st.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		reasoning += ch.Reasoning
		content += ch.Content
		if ch.Finish != "" {
			finish = ch.Finish
		}
		if ch.Usage != nil {
			usage = ch.Usage
		}
	}
	st.Close()
	if reasoning != "Hmm." || content != "Because." || finish != "stop" || usage == nil || usage.CompletionTokens == 0 {
		t.Errorf("reasoning %q, content %q, finish %q, usage %+v", reasoning, content, finish, usage)
	}
	_, err = c.StreamChat(ctx, remote.ChatRequest{Model: "nope", Messages: []remote.Message{{Role: "user", Content: "Why?"}}})
	var apiErr *remote.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Errorf("unknown model: %v", err)
	}
	waitIdle(t, b.Runtime)
}
