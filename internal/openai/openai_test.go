package openai

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// serve answers every request with status and body, recording the last
// request's body.
func serve(t *testing.T, status int, body string, got *map[string]any) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got != nil {
			_ = json.NewDecoder(r.Body).Decode(got)
		}
		if r.Header.Get("Authorization") != "Bearer sk-test" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error": {"message": "bad key", "type": "auth"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return &Client{BaseURL: srv.URL + "/v1", APIKey: "sk-test"}
}

// readAll reads a stream to its end: the concatenated content and
// reasoning, the last finish reason and usage, and the error that ended it.
func readAll(s *Stream) (content, reasoning, finish string, usage *Usage, err error) {
	var c, r strings.Builder
	for {
		ch, err := s.Next()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return c.String(), r.String(), finish, usage, err
		}
		c.WriteString(ch.Content)
		r.WriteString(ch.Reasoning)
		if ch.Finish != "" {
			finish = ch.Finish
		}
		if ch.Usage != nil {
			usage = ch.Usage
		}
	}
}

const goodStream = `: a comment the client ignores

data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}

event: message
data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}

data:{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}

data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

`

func TestStreamChat(t *testing.T) {
	var body map[string]any
	c := serve(t, 200, goodStream, &body)
	temp, seed := 0.0, uint64(7)
	s, err := c.StreamChat(context.Background(), ChatRequest{
		Model: "m", Messages: []Message{{Role: "user", Content: "hi"}}, MaxTokens: 5,
		Temperature: &temp, Seed: &seed, Extra: map[string]any{"top_k": 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	content, reasoning, finish, usage, err := readAll(s)
	if err != nil || content != "Hello" || reasoning != "hmm" || finish != "stop" {
		t.Fatalf("content %q reasoning %q finish %q err %v", content, reasoning, finish, err)
	}
	if usage == nil || *usage != (Usage{PromptTokens: 12, CompletionTokens: 3, CachedTokens: 8}) {
		t.Fatalf("usage %+v", usage)
	}
	want := map[string]any{"model": "m", "stream": true, "max_tokens": 5.0, "temperature": 0.0, "seed": 7.0, "top_k": 20.0,
		"stream_options": map[string]any{"include_usage": true}}
	for k, v := range want {
		if got, _ := json.Marshal(body[k]); string(got) != mustJSON(v) {
			t.Errorf("request %s = %s, want %s", k, got, mustJSON(v))
		}
	}
	if _, ok := body["top_p"]; ok {
		t.Error("top_p was sent though not set")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		content    string
		err        string // "" for a clean end
	}{
		{"finish without DONE", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"length\"}]}\n\n", "a", ""},
		{"cut", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "a", ErrCut.Error()},
		{"cut mid-event", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi", "a", ErrCut.Error()},
		{"bad JSON", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {nope}\n\n", "a", "not JSON"},
		{"error event", "data: {\"error\": {\"message\": \"out of memory\", \"code\": 500}}\n\n", "", "out of memory"},
		{"multi-line data", "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n", "x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := serve(t, 200, tc.body, nil).StreamChat(context.Background(), ChatRequest{Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			content, _, _, _, err := readAll(s)
			if content != tc.content {
				t.Errorf("content %q, want %q", content, tc.content)
			}
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
		})
	}
}

func TestErrorsBeforeTheStream(t *testing.T) {
	c := serve(t, 500, `{"error": {"message": "the engine died", "type": "server_error"}}`, nil)
	_, err := c.StreamChat(context.Background(), ChatRequest{Model: "m"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 500 || err.Error() != "HTTP 500: the engine died" {
		t.Fatalf("err %v", err)
	}
	c.APIKey = "wrong"
	if _, err := c.Models(context.Background()); err == nil || err.Error() != "HTTP 401: bad key" {
		t.Fatalf("err %v", err)
	}
	c = serve(t, 400, `{"detail": "Not Found"}`, nil)
	if _, err := c.StreamChat(context.Background(), ChatRequest{Model: "m"}); err == nil || !strings.Contains(err.Error(), "Not Found") {
		t.Fatalf("err %v", err)
	}
}

func TestModels(t *testing.T) {
	c := serve(t, 200, `{"object":"list","data":[{"id":"Qwen/Qwen3-32B","owned_by":"vllm","max_model_len":32768},{"id":"b"}]}`, nil)
	ms, err := c.Models(context.Background())
	if err != nil || len(ms) != 2 || ms[0] != (Model{ID: "Qwen/Qwen3-32B", OwnedBy: "vllm", MaxModelLen: 32768}) || ms[1].ID != "b" {
		t.Fatalf("%+v, %v", ms, err)
	}
	c = serve(t, 200, `<html>`, nil)
	if _, err := c.Models(context.Background()); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("err %v", err)
	}
}

func TestNormalizeBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://gpu:8000":        "http://gpu:8000/v1",
		"http://gpu:8000/":       "http://gpu:8000/v1",
		"https://api.x.ai/v1/":   "https://api.x.ai/v1",
		"http://h/proxy/v1?x=1":  "http://h/proxy/v1",
		" http://localhost:8080": "http://localhost:8080/v1",
	} {
		if got, err := NormalizeBaseURL(in); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"gpu:8000", "ftp://x", "http://", ""} {
		if _, err := NormalizeBaseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
