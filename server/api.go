package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ferrite-llm/ferrite/tokenizer"
)

// The wire types of the OpenAI API that the server speaks (the subset it
// implements; unknown request fields are ignored, as OpenAI's own servers
// ignore fields they do not use).

// samplingRequest are the generation parameters chat and text completions
// share. Pointers tell "not given" from zero.
type samplingRequest struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	Seed                *seed           `json:"seed"`
	Stop                stopList        `json:"stop"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Logprobs            json.RawMessage `json:"logprobs"`
	LogitBias           json.RawMessage `json:"logit_bias"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	samplingRequest
	Messages           []chatMessage              `json:"messages"`
	Tools              json.RawMessage            `json:"tools"`
	ResponseFormat     *struct{ Type string }     `json:"response_format"`
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
}

// chatMessage is one message of a conversation. Content is a string or a
// list of parts, of which only text parts are supported.
type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	samplingRequest
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	Suffix *string         `json:"suffix"`
}

// stopList is the stop parameter: null, a string or a list of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &fieldError{field: "stop", msg: "stop: want a string or a list of strings"}
	}
	*s = many
	return nil
}

// seed is the seed parameter: any integer from -2^63 to 2^64-1 (OpenAI's
// clients send int64, ferrite's chat a uint64), kept as its 64 bits.
type seed uint64

func (s *seed) UnmarshalJSON(b []byte) error {
	var u uint64
	if err := json.Unmarshal(b, &u); err == nil {
		*s = seed(u)
		return nil
	}
	var i int64
	if err := json.Unmarshal(b, &i); err != nil {
		return &fieldError{field: "seed", msg: "seed: want an integer"}
	}
	*s = seed(i)
	return nil
}

// fieldError is a request field that does not decode.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.msg }

// isSet reports whether a raw JSON value is present and not null, false or
// empty: the unsupported options a request may still send switched off.
func isSet(raw json.RawMessage) bool {
	v := string(bytes.TrimSpace(raw))
	return v != "" && v != "null" && v != "false" && v != "{}" && v != "[]"
}

// text is a message's content as one string: the string itself, or its
// text parts joined by newlines.
func (m *chatMessage) text() (string, error) {
	if !isSet(m.Content) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", errors.New("content: want a string or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part of type %q: only text parts are supported", p.Type)
		}
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// templateMessages is the conversation for the chat template.
func templateMessages(msgs []chatMessage) ([]tokenizer.Message, *apiError) {
	if len(msgs) == 0 {
		return nil, paramError("messages", "messages must hold at least one message")
	}
	out := make([]tokenizer.Message, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		role := m.Role
		switch role {
		case "developer":
			role = "system"
		case "system", "user", "assistant", "tool":
		default:
			return nil, paramError(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("messages[%d]: unknown role %q (want system, developer, user, assistant or tool)", i, m.Role))
		}
		if isSet(m.ToolCalls) {
			return nil, paramError(fmt.Sprintf("messages[%d].tool_calls", i), "tool calls are not supported")
		}
		content, err := m.text()
		if err != nil {
			return nil, paramError(fmt.Sprintf("messages[%d].content", i), fmt.Sprintf("messages[%d]: %v", i, err))
		}
		out[i] = tokenizer.Message{Role: role, Content: content, ReasoningContent: m.ReasoningContent,
			Name: m.Name, ToolCallID: m.ToolCallID}
	}
	return out, nil
}

// completionPrompts is the prompt parameter of a text completion: a
// string, a list of strings, a list of token ids or a list of such lists.
// Strings come back in texts, id lists in ids (one of the two is set).
func completionPrompts(raw json.RawMessage) (texts []string, ids [][]int32, err *apiError) {
	if !isSet(raw) {
		return nil, nil, paramError("prompt", "prompt is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		return many, nil, nil
	}
	var tokens []int32
	if json.Unmarshal(raw, &tokens) == nil {
		return nil, [][]int32{tokens}, nil
	}
	var lists [][]int32
	if json.Unmarshal(raw, &lists) == nil {
		return nil, lists, nil
	}
	return nil, nil, paramError("prompt", "prompt: want a string, a list of strings, a list of token ids or a list of such lists")
}

// ** responses **

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // "chat.completion"
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      responseMessage `json:"message"`
	Logprobs     *struct{}       `json:"logprobs"` // always null
	FinishReason string          `json:"finish_reason"`
}

type responseMessage struct {
	Role             string  `json:"role"`
	Content          string  `json:"content"`
	ReasoningContent *string `json:"reasoning_content,omitempty"` // a reasoning model's <think> block; absent without one
}

// chatChunk is one streamed chunk of a chat completion, Object
// "chat.completion.chunk".
type chatChunk = choices[chatChunkChoice]

// choices is the envelope of a streamed chat chunk and of a text
// completion: the same fields around their own kind of choice.
type choices[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"` // always null
	FinishReason *string   `json:"finish_reason"`
}

type chatDelta struct {
	Role             string `json:"role,omitempty"`
	Content          string `json:"content,omitempty"`
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

// textCompletion is a /v1/completions response or chunk, Object
// "text_completion".
type textCompletion = choices[textChoice]

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"` // always null
	FinishReason *string   `json:"finish_reason"`
}

type modelList struct {
	Object string      `json:"object"` // "list"
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is the most tokens (prompt and reply) a request may
	// hold; 0 while the model loads (vLLM's field).
	MaxModelLen int `json:"max_model_len,omitempty"`
}

type tokenizeRequest struct {
	Model               string        `json:"model"`
	Prompt              *string       `json:"prompt"`
	Messages            []chatMessage `json:"messages"`
	AddSpecialTokens    *bool         `json:"add_special_tokens"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt"`
}

type tokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
}
