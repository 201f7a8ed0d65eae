package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// The golden files under testdata/ hold whole responses, byte for byte, on
// greedy decoding with fixed ids and timestamps; regenerate them with
// go test ./server -run Golden -update and review the diff. The questions
// are among testdata/models/ferrite-tiny/answers.json's, whose greedy
// answers have no near-tie (the same tokens on every kernel).

func goldenServer(t *testing.T) *testServer {
	b := tinyBackend(t, defaultTestRuntime())
	opts := Options{Models: []Model{loaded("ferrite-tiny", b)}}
	fixedIDs(&opts)
	return startServer(t, opts, true)
}

func TestChatStreamGolden(t *testing.T) {
	ts := goldenServer(t)
	code, body := ts.post(t, "/v1/chat/completions", `{"model":"ferrite-tiny","messages":[{"role":"user","content":"Who are you?"}],
		"temperature":0,"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	golden.RequireEqual(t, []byte(body))
	// What the golden file must show, whatever it was regenerated from.
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	if events[len(events)-1] != "data: [DONE]" {
		t.Errorf("last event %q", events[len(events)-1])
	}
	if !strings.Contains(events[0], `"delta":{"role":"assistant"}`) {
		t.Errorf("first event %q has no role", events[0])
	}
	if !strings.Contains(events[len(events)-3], `"finish_reason":"stop"`) || !strings.Contains(events[len(events)-2], `"choices":[],"usage":{`) {
		t.Errorf("the stream does not end with a finish reason and the usage:\n%s\n%s", events[len(events)-3], events[len(events)-2])
	}
}

func TestChatGolden(t *testing.T) {
	ts := goldenServer(t)
	code, body := ts.post(t, "/v1/chat/completions", `{"model":"ferrite-tiny",
		"messages":[{"role":"user","content":[{"type":"text","text":"What does fail mean?"}]}],"temperature":0,"max_tokens":64}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	golden.RequireEqual(t, []byte(body))
}

func TestCompletionStreamGolden(t *testing.T) {
	ts := goldenServer(t)
	code, body := ts.post(t, "/v1/completions", `{"prompt":"<|im_start|>user\nWhat is the opposite of hot?<|im_end|>\n<|im_start|>assistant\n",
		"max_tokens":12,"temperature":0,"echo":true,"stream":true,"stream_options":{"include_usage":true}}`)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	golden.RequireEqual(t, []byte(body))
}

// TestStopStringAcrossTokens stops ferrite-tiny's greedy reply on a string
// that spans three tokens: nothing of it reaches the client, streamed or
// not, and the usage counts the tokens up to the one that completed it.
func TestStopStringAcrossTokens(t *testing.T) {
	ts := goldenServer(t)
	req := `{"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"stop":[" ferrite-t","never"]%s}`
	code, body := ts.post(t, "/v1/chat/completions", strings.Replace(req, "%s", "", 1))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var resp chatCompletion
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	// The reply's tokens are "I", "'m", " ferrite", "-", "tiny", …: the stop
	// string ends inside the fifth.
	c := resp.Choices[0]
	if c.Message.Content != "I'm" || c.FinishReason != "stop" || resp.Usage.CompletionTokens != 5 {
		t.Errorf("content %q, finish %q, %d tokens; want \"I'm\", stop, 5", c.Message.Content, c.FinishReason, resp.Usage.CompletionTokens)
	}

	code, body = ts.post(t, "/v1/chat/completions", strings.Replace(req, "%s", `,"stream":true`, 1))
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	text, finish := streamedText(t, body)
	if text != "I'm" || finish != "stop" {
		t.Errorf("streamed %q (%s); the stream:\n%s", text, finish, body)
	}
}

// streamedText is the content and last finish reason of a streamed chat
// completion of one choice.
func streamedText(t *testing.T, body string) (text, finish string) {
	t.Helper()
	for ev := range strings.SplitSeq(strings.TrimSpace(body), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %q is not data", ev)
		}
		if data == "[DONE]" {
			return text, finish
		}
		var ch chatChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		for _, c := range ch.Choices {
			text += c.Delta.Content
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	t.Fatalf("the stream has no [DONE]:\n%s", body)
	return
}

// TestSpeculativeDecoding: with MTP drafts (several tokens per runtime
// event) the server gives the same greedy reply, and a stop string in the
// middle of an event still counts the tokens up to it.
func TestSpeculativeDecoding(t *testing.T) {
	plain := goldenServer(t)
	b := tinyBackend(t, runtime.Options{KVBudget: 16 << 20, Draft: 3, DraftIgnoreCost: true})
	spec := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"What does ephemeral mean?"}],"temperature":0}`,
		`{"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"stop":" ferrite-t"}`,
	} {
		want, got := chatJSON(t, plain, body), chatJSON(t, spec, body)
		if got.Choices[0].Message.Content != want.Choices[0].Message.Content || got.Usage.CompletionTokens != want.Usage.CompletionTokens ||
			got.Choices[0].FinishReason != want.Choices[0].FinishReason {
			t.Errorf("with drafts: %q (%d tokens, %s); without: %q (%d tokens, %s)",
				got.Choices[0].Message.Content, got.Usage.CompletionTokens, got.Choices[0].FinishReason,
				want.Choices[0].Message.Content, want.Usage.CompletionTokens, want.Choices[0].FinishReason)
		}
	}
	if st := b.Runtime.Stats(); st.AcceptedTokens == 0 {
		t.Errorf("no draft was accepted: %+v", st)
	}
	waitIdle(t, b.Runtime)
}
