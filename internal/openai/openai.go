// Package openai is a small client of OpenAI-compatible chat servers
// (vLLM, SGLang, llama.cpp's server, ferrite serve, OpenAI itself): the
// model list (GET /v1/models) and streamed chat completions (POST
// /v1/chat/completions with "stream": true, read as server-sent events).
// The chat uses it for remote endpoints (ui.RemoteEngine).
package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to one server.
type Client struct {
	BaseURL string       // e.g. "http://gpu-box:8000/v1" (NormalizeBaseURL)
	APIKey  string       // sent as a bearer token; "": none
	HTTP    *http.Client // nil: DefaultHTTP
}

// DefaultHTTP bounds connecting and waiting for the response headers, not
// the stream (a long reply takes minutes).
var DefaultHTTP = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   10 * time.Second,
	ResponseHeaderTimeout: 5 * time.Minute, // a busy server queues the request before answering
	MaxIdleConnsPerHost:   16,
	ForceAttemptHTTP2:     true,
}}

// NormalizeBaseURL checks an endpoint's URL and gives it the /v1 suffix
// OpenAI clients expect when it has no path at all
// ("http://host:8000" → "http://host:8000/v1").
func NormalizeBaseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q: want an http:// or https:// URL such as http://localhost:8000/v1", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	if u.Path == "" {
		u.Path = "/v1"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return DefaultHTTP
}

func (c *Client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	return req, nil
}

// APIError is an answer other than 200, with the server's message (the
// OpenAI error shape {"error": {"message", "type", "code"}} when it has one).
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
}

// apiError reads a failed response's message.
func apiError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	return &APIError{Status: resp.StatusCode, Message: errorMessage(data)}
}

// errorMessage is the message of an error body: OpenAI's {"error":
// {"message"}}, a bare {"error": "…"} or {"message": "…"} (vLLM, FastAPI's
// {"detail"}), else the text itself, shortened.
func errorMessage(data []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(data, &e) == nil {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			return s
		case e.Message != "":
			return e.Message
		case e.Detail != nil:
			return fmt.Sprint(e.Detail)
		}
	}
	s := strings.TrimSpace(string(data))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Model is one model a server serves.
type Model struct {
	ID          string `json:"id"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"` // vLLM and SGLang say the context; 0: unknown
}

// Models asks GET /models.
func (c *Client) Models(ctx context.Context) ([]Model, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, apiError(resp)
	}
	var list struct {
		Data []Model `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("the model list is not valid JSON: %w", err)
	}
	return list.Data, nil
}

// Message is one turn of the conversation.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is a streamed chat completion. Fields left zero are not
// sent (the server's defaults apply).
type ChatRequest struct {
	Model       string
	Messages    []Message
	MaxTokens   int      // 0: not sent
	Temperature *float64 // nil: not sent
	TopP        *float64
	Seed        *uint64
	// Extra are non-OpenAI sampling fields the open servers accept
	// (top_k, min_p, repetition_penalty), sent as they are.
	Extra map[string]any
}

func (r ChatRequest) body() ([]byte, error) {
	m := map[string]any{
		"model":          r.Model,
		"messages":       r.Messages,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if r.MaxTokens > 0 {
		m["max_tokens"] = r.MaxTokens
	}
	if r.Temperature != nil {
		m["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		m["top_p"] = *r.TopP
	}
	if r.Seed != nil {
		m["seed"] = *r.Seed
	}
	for k, v := range r.Extra {
		m[k] = v
	}
	return json.Marshal(m)
}

// StreamChat starts a streamed chat completion; it returns once the
// server has answered the request (with its headers), before the reply.
func (c *Client) StreamChat(ctx context.Context, r ChatRequest) (*Stream, error) {
	body, err := r.body()
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/chat/completions", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, apiError(resp)
	}
	return &Stream{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10)}, nil
}

// Chunk is one event of a stream: text of the first choice, its end, or
// the usage (a stream with include_usage ends with a chunk of usage only).
type Chunk struct {
	Content   string // new answer text
	Reasoning string // new reasoning text (reasoning_content, or vLLM's reasoning)
	Finish    string // finish_reason of the first choice: "stop", "length"…; "" while it runs
	Usage     *Usage // nil until the server sends it
}

// Usage is the server's count of a completion.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
}

// ErrCut is a stream that ended before "data: [DONE]" and before any
// finish_reason: the connection was cut or the server died.
var ErrCut = errors.New("the stream ended before the reply did")

// Stream reads the events of a streamed completion.
type Stream struct {
	body     io.ReadCloser
	r        *bufio.Reader
	finished bool // a finish_reason was seen
	done     bool
}

// Next is the next chunk; io.EOF after "data: [DONE]" (or after a
// finish_reason when the server closes without [DONE]); ErrCut when the
// stream ends before; an *APIError for an error event.
func (s *Stream) Next() (Chunk, error) {
	for {
		if s.done {
			return Chunk{}, io.EOF
		}
		data, err := s.event()
		if err == io.EOF {
			s.done = true
			if s.finished {
				return Chunk{}, io.EOF
			}
			return Chunk{}, ErrCut
		}
		if err != nil {
			return Chunk{}, err
		}
		if data == "[DONE]" {
			s.done = true
			return Chunk{}, io.EOF
		}
		c, ok, err := parseChunk(data)
		if err != nil {
			return Chunk{}, err
		}
		if c.Finish != "" {
			s.finished = true
		}
		if ok {
			return c, nil
		}
	}
}

// event reads the data of the next server-sent event (its data: lines
// joined with newlines); comments, other fields and empty events are
// skipped. io.EOF at the end of the body; a body cut in the middle of
// a chunked response gives io.ErrUnexpectedEOF.
func (s *Stream) event() (string, error) {
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return "", err // at io.EOF an event without its blank line is dropped, as the SSE spec says
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if len(data) > 0 {
				return strings.Join(data, "\n"), nil
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
}

// parseChunk reads one data payload; ok is false for a chunk that
// carries nothing (a role-only delta, a keep-alive).
func parseChunk(data string) (Chunk, bool, error) {
	var raw struct {
		Choices []struct {
			Delta struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
				Reasoning        string `json:"reasoning"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &raw); err != nil {
		return Chunk{}, false, fmt.Errorf("the server sent an event that is not JSON (%.80q): %w", data, err)
	}
	if len(raw.Error) > 0 && string(raw.Error) != "null" {
		return Chunk{}, false, &APIError{Status: http.StatusOK, Message: errorMessage([]byte(data))}
	}
	var c Chunk
	if len(raw.Choices) > 0 {
		ch := raw.Choices[0]
		c.Content = ch.Delta.Content
		c.Reasoning = ch.Delta.ReasoningContent + ch.Delta.Reasoning
		if ch.FinishReason != nil {
			c.Finish = *ch.FinishReason
		}
	}
	if u := raw.Usage; u != nil {
		c.Usage = &Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
		if u.PromptTokensDetails != nil {
			c.Usage.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	ok := c.Content != "" || c.Reasoning != "" || c.Finish != "" || c.Usage != nil
	return c, ok, nil
}

// Close ends the stream (and the request, if it still runs).
func (s *Stream) Close() error { return s.body.Close() }
