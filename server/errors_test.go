package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// TestErrors sends bad requests: each gets OpenAI's error object with the
// right status, type, param and code, and the server keeps answering.
func TestErrors(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	long := strings.Repeat("word ", 1500)
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	cases := []struct {
		name, method, path, body string
		status                   int
		typ, param, code         string
	}{
		{"bad JSON", "POST", "/v1/chat/completions", `{"messages":`, 400, "invalid_request_error", "", ""},
		{"empty body", "POST", "/v1/chat/completions", ``, 400, "invalid_request_error", "", ""},
		{"trailing data", "POST", "/v1/chat/completions", chat("") + "{}", 400, "invalid_request_error", "", ""},
		{"wrong type", "POST", "/v1/chat/completions", chat(`,"temperature":"hot"`), 400, "invalid_request_error", "temperature", ""},
		{"temperature", "POST", "/v1/chat/completions", chat(`,"temperature":3`), 400, "invalid_request_error", "temperature", ""},
		{"top_p", "POST", "/v1/chat/completions", chat(`,"top_p":0`), 400, "invalid_request_error", "top_p", ""},
		{"min_p", "POST", "/v1/chat/completions", chat(`,"min_p":1.5`), 400, "invalid_request_error", "min_p", ""},
		{"top_k", "POST", "/v1/chat/completions", chat(`,"top_k":-5`), 400, "invalid_request_error", "top_k", ""},
		{"presence", "POST", "/v1/chat/completions", chat(`,"presence_penalty":2.5`), 400, "invalid_request_error", "presence_penalty", ""},
		{"repetition", "POST", "/v1/chat/completions", chat(`,"repetition_penalty":0`), 400, "invalid_request_error", "repetition_penalty", ""},
		{"n", "POST", "/v1/chat/completions", chat(`,"n":9`), 400, "invalid_request_error", "n", ""},
		{"max_tokens", "POST", "/v1/chat/completions", chat(`,"max_tokens":0`), 400, "invalid_request_error", "max_tokens", ""},
		{"max_completion_tokens", "POST", "/v1/chat/completions", chat(`,"max_completion_tokens":-1`), 400, "invalid_request_error", "max_completion_tokens", ""},
		{"seed type", "POST", "/v1/chat/completions", chat(`,"seed":1.5`), 400, "invalid_request_error", "seed", ""},
		{"stop type", "POST", "/v1/chat/completions", chat(`,"stop":7`), 400, "invalid_request_error", "stop", ""},
		{"logprobs", "POST", "/v1/chat/completions", chat(`,"logprobs":true`), 400, "invalid_request_error", "logprobs", ""},
		{"tools", "POST", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f"}}]`), 400, "invalid_request_error", "tools", ""},
		{"json mode", "POST", "/v1/chat/completions", chat(`,"response_format":{"type":"json_object"}`), 400, "invalid_request_error", "response_format", ""},
		{"stream_options alone", "POST", "/v1/chat/completions", chat(`,"stream_options":{"include_usage":true}`), 400, "invalid_request_error", "stream_options", ""},
		{"no messages", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request_error", "messages", ""},
		{"bad role", "POST", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "invalid_request_error", "messages[0].role", ""},
		{"image", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "invalid_request_error", "messages[0].content", ""},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-17","messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "model", "model_not_found"},
		{"past the context", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "invalid_request_error", "messages", "context_length_exceeded"},
		{"max_tokens past the context", "POST", "/v1/chat/completions", chat(`,"max_tokens":1020`), 400, "invalid_request_error", "messages", "context_length_exceeded"},
		{"completion past the context", "POST", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "invalid_request_error", "prompt", "context_length_exceeded"},
		{"no prompt", "POST", "/v1/completions", `{"max_tokens":3}`, 400, "invalid_request_error", "prompt", ""},
		{"empty prompt list", "POST", "/v1/completions", `{"prompt":[]}`, 400, "invalid_request_error", "prompt", ""},
		{"suffix", "POST", "/v1/completions", `{"prompt":"a","suffix":"b"}`, 400, "invalid_request_error", "suffix", ""},
		{"token outside the vocabulary", "POST", "/v1/completions", `{"prompt":[1,99999999]}`, 400, "invalid_request_error", "", ""},
		{"empty token prompt", "POST", "/v1/completions", `{"prompt":[[]]}`, 400, "invalid_request_error", "prompt", ""},
		{"tokenize nothing", "POST", "/tokenize", `{}`, 400, "invalid_request_error", "", ""},
		{"wrong method", "GET", "/v1/chat/completions", ``, 405, "invalid_request_error", "", ""},
		{"no such endpoint", "GET", "/v1/embeddings", ``, 404, "not_found_error", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := ts.do(t, c.method, c.path, c.body)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			str := func(p *string) string {
				if p == nil {
					return ""
				}
				return *p
			}
			if e.Error.Message == "" || e.Error.Type != c.typ || str(e.Error.Param) != c.param || str(e.Error.Code) != c.code {
				t.Errorf("error %s; want type %q, param %q, code %q", body, c.typ, c.param, c.code)
			}
			if !strings.Contains(body, `"param":`) || !strings.Contains(body, `"code":`) {
				t.Errorf("the error lacks param or code (null when unset): %s", body)
			}
		})
	}
	if status, body := ts.post(t, "/v1/chat/completions", chat(`,"max_tokens":2`)); status != http.StatusOK {
		t.Errorf("after the bad requests: %d %s", status, body)
	}
	waitIdle(t, b.Runtime)
}

func TestAuth(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}, APIKey: "s3cret"}, true)
	for _, c := range []struct {
		name, path string
		header     []string
		status     int
	}{
		{"no key", "/v1/models", nil, 401},
		{"wrong key", "/v1/models", []string{"Authorization", "Bearer nope"}, 401},
		{"not bearer", "/v1/models", []string{"Authorization", "Basic czNjcmV0"}, 401},
		{"right key", "/v1/models", []string{"Authorization", "Bearer s3cret"}, 200},
		{"metrics need it", "/metrics", nil, 401},
		{"health does not", "/health", nil, 200},
	} {
		status, body := ts.do(t, "GET", c.path, "", c.header...)
		if status != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, status, c.status, body)
		}
		if status == 401 && !strings.Contains(body, `"code":"invalid_api_key"`) {
			t.Errorf("%s: %s", c.name, body)
		}
	}
	status, _ := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if status != 401 {
		t.Errorf("chat without a key: %d", status)
	}
}

// TestContextErrorNamesTheCache: past a context that the KV budget sets,
// the message says so.
func TestContextErrorNamesTheCache(t *testing.T) {
	b := tinyBackend(t, runtime.Options{KVBudget: 4 * 16 * tinyBytesPerToken(t)}) // 64 tokens
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	status, body := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"`+strings.Repeat("word ", 80)+`"}]}`)
	if status != http.StatusBadRequest || !strings.Contains(body, "KV cache holds 64 tokens") || !strings.Contains(body, "context_length_exceeded") {
		t.Errorf("%d %s", status, body)
	}
}
