package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func chatJSON(t *testing.T, ts *testServer, body string) chatCompletion {
	t.Helper()
	status, out := ts.post(t, "/v1/chat/completions", body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, out)
	}
	var resp chatCompletion
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestChoicesSideBySide: n choices come back indexed, a seed makes them
// reproducible, and each choice has its own seed (they differ).
func TestChoicesSideBySide(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	body := `{"messages":[{"role":"user","content":"Tell me a quote about time."}],"n":3,"seed":7,"temperature":1,"max_tokens":24,
		"top_k":50,"min_p":0.01,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":0.2}`
	a, c := chatJSON(t, ts, body), chatJSON(t, ts, body)
	// Seeds past int64 (ferrite's chat sends uint64 seeds) and negative
	// ones (OpenAI's clients send int64) are both taken, as their 64 bits.
	neg := chatJSON(t, ts, strings.Replace(body, `"seed":7`, `"seed":-1`, 1))
	big := chatJSON(t, ts, strings.Replace(body, `"seed":7`, `"seed":18446744073709551615`, 1))
	if neg.Choices[0].Message.Content != big.Choices[0].Message.Content {
		t.Errorf("seeds -1 and 2^64-1 gave %q and %q", neg.Choices[0].Message.Content, big.Choices[0].Message.Content)
	}
	if len(a.Choices) != 3 {
		t.Fatalf("%d choices", len(a.Choices))
	}
	distinct := map[string]bool{}
	total := 0
	for i := range a.Choices {
		if a.Choices[i].Index != i || a.Choices[i].Message.Content != c.Choices[i].Message.Content {
			t.Errorf("choice %d: index %d, %q then %q with the same seed", i, a.Choices[i].Index, a.Choices[i].Message.Content, c.Choices[i].Message.Content)
		}
		distinct[a.Choices[i].Message.Content] = true
	}
	if len(distinct) < 2 {
		t.Errorf("the choices are all the same: %q", a.Choices[0].Message.Content)
	}
	for range a.Choices {
		total++
	}
	if a.Usage.CompletionTokens < total || a.Usage.PromptTokens != c.Usage.PromptTokens {
		t.Errorf("usage %+v", a.Usage)
	}

	// Streamed: every choice gets its role, its text and its finish reason.
	status, out := ts.post(t, "/v1/chat/completions", strings.Replace(body, `"n":3`, `"n":3,"stream":true`, 1))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, out)
	}
	texts := make([]string, 3)
	roles, finishes := 0, 0
	for ev := range strings.SplitSeq(strings.TrimSpace(out), "\n\n") {
		data := strings.TrimPrefix(ev, "data: ")
		if data == "[DONE]" {
			break
		}
		var ch chatChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			texts[c.Index] += c.Delta.Content
			if c.Delta.Role == "assistant" {
				roles++
			}
			if c.FinishReason != nil {
				finishes++
			}
		}
	}
	for i := range texts {
		if texts[i] != a.Choices[i].Message.Content {
			t.Errorf("streamed choice %d %q, want %q", i, texts[i], a.Choices[i].Message.Content)
		}
	}
	if roles != 3 || finishes != 3 {
		t.Errorf("%d role deltas and %d finish reasons, want 3 and 3", roles, finishes)
	}
	waitIdle(t, b.Runtime)
}

// TestReasoningContent: a reasoning model's <think> block comes back as
// reasoning_content, streamed or not, and its tags never reach the client.
func TestReasoningContent(t *testing.T) {
	b := scriptedBackend(t, "Why?", "<think>\nBecause of the rain.\n</think>\n\nIt rained.", 0)
	ts := startServer(t, Options{Models: []Model{loaded("thinker", b)}}, true)
	resp := chatJSON(t, ts, `{"messages":[{"role":"user","content":"Why?"}]}`)
	m := resp.Choices[0].Message
	if m.ReasoningContent == nil || *m.ReasoningContent != "Because of the rain." || m.Content != "It rained." {
		t.Errorf("message %+v", m)
	}
	status, out := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Why?"}],"stream":true}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, out)
	}
	var reasoning, content string
	for ev := range strings.SplitSeq(strings.TrimSpace(out), "\n\n") {
		var ch chatChunk
		if json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &ch) == nil {
			for _, c := range ch.Choices {
				reasoning += c.Delta.ReasoningContent
				content += c.Delta.Content
			}
		}
	}
	if reasoning != "Because of the rain." || content != "It rained." || strings.Contains(out, "think>") {
		t.Errorf("streamed reasoning %q, content %q:\n%s", reasoning, content, out)
	}
	waitIdle(t, b.Runtime)
}

// TestRequestsShareTheBatch: concurrent requests from several clients run
// in the same engine steps (far fewer steps than tokens).
func TestRequestsShareTheBatch(t *testing.T) {
	b := scriptedBackend(t, "Go on.", strings.Repeat("and on ", 15), 10*time.Millisecond)
	ts := startServer(t, Options{Models: []Model{loaded("slow", b)}}, true)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if status, body := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"Go on."}]}`); status != 200 {
				t.Errorf("status %d: %s", status, body)
			}
		}()
	}
	wg.Wait()
	st := b.Runtime.Stats()
	if st.GeneratedTokens < 4*30 || st.Steps > st.GeneratedTokens/2 {
		t.Errorf("%d steps for %d tokens of 4 concurrent requests: not batched", st.Steps, st.GeneratedTokens)
	}
}

// TestSeveralModels: each request goes to the model it names, the first
// one when it names none, and /v1/models lists them in order.
func TestSeveralModels(t *testing.T) {
	tiny := tinyBackend(t, defaultTestRuntime())
	thinker := scriptedBackend(t, "Why?", "<think>Hmm.</think>Because.", 0)
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", tiny), loaded("thinker", thinker)}}, true)
	if _, body := ts.do(t, "GET", "/v1/models", ""); !strings.Contains(body, `"id":"ferrite-tiny"`) ||
		strings.Index(body, `"id":"thinker"`) < strings.Index(body, `"id":"ferrite-tiny"`) {
		t.Errorf("models: %s", body)
	}
	r := chatJSON(t, ts, `{"model":"thinker","messages":[{"role":"user","content":"Why?"}]}`)
	if r.Model != "thinker" || r.Choices[0].Message.Content != "Because." {
		t.Errorf("thinker: %+v", r)
	}
	r = chatJSON(t, ts, `{"messages":[{"role":"user","content":"Why?"}],"max_tokens":3}`)
	if r.Model != "ferrite-tiny" || r.Choices[0].Message.ReasoningContent != nil || tiny.Runtime.Stats().GeneratedTokens == 0 {
		t.Errorf("default model: %+v", r)
	}
	waitIdle(t, tiny.Runtime)
	waitIdle(t, thinker.Runtime)
}

// TestModelSamplingDefaults: a request that gives no temperature gets the
// model's recommended sampling (ferrite-tiny's generation_config.json says
// do_sample false: greedy), not OpenAI's temperature 1; one that gives a
// temperature samples.
func TestModelSamplingDefaults(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	q := `{"messages":[{"role":"user","content":"Tell me a quote about time."}],"max_tokens":24,`
	greedy := chatJSON(t, ts, q+`"temperature":0}`).Choices[0].Message.Content
	for _, c := range chatJSON(t, ts, q+`"n":3,"seed":7}`).Choices {
		if c.Message.Content != greedy {
			t.Errorf("no temperature given: choice %d is %q, want the greedy %q", c.Index, c.Message.Content, greedy)
		}
	}
	distinct := map[string]bool{}
	for _, c := range chatJSON(t, ts, q+`"n":3,"seed":7,"temperature":1.5}`).Choices {
		distinct[c.Message.Content] = true
	}
	if len(distinct) < 2 {
		t.Errorf("temperature 1.5: the 3 choices are all %q", greedy)
	}
}
