package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/hub/hubtest"
)

// hubWithModel is a fake Hugging Face Hub serving a fixture model (with a
// byte tokenizer) as acme/tiny-qwen3.
func hubWithModel(t *testing.T) *hubtest.Hub {
	t.Helper()
	dir := fixtures.ChatModel(t, "qwen3")
	files := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	h := hubtest.New(t)
	h.Add("acme/tiny-qwen3", "00112233445566778899aabbccddeeff00112233", files)
	return h
}

// TestPullInTerminal: ferrite pull shows its progress bar on a terminal
// and leaves a model the chat opens by its Hub name.
func TestPullInTerminal(t *testing.T) {
	bin := terminalBinary(t)
	h := hubWithModel(t)
	h.Throttle(400 << 10) // the weights take about 2 s: the bar is seen
	data := t.TempDir()
	e := append(env(data), "HF_ENDPOINT="+h.URL, "HF_TOKEN=")
	tm := newTerm(t, e, "sh", "-c", bin+" pull acme/tiny-qwen3; echo EXIT=$?; sleep 60")
	tm.waitFor("the progress bar", func(s string) bool {
		return strings.Contains(s, "Pulling acme/tiny-qwen3") && strings.Contains(s, "█") && strings.Contains(s, "KiB/s")
	})
	s := tm.waitFor("the end of the pull", func(s string) bool { return strings.Contains(s, "EXIT=") })
	for _, want := range []string{"chat with it: ferrite --model acme/tiny-qwen3", "models--acme--tiny-qwen3/snapshots/", "EXIT=0"} {
		if !strings.Contains(s, want) {
			t.Errorf("the screen lacks %q:\n%s", want, s)
		}
	}
	chat := newTerm(t, e, bin, "--model", "acme/tiny-qwen3", "--temperature", "0")
	chat.waitFor("the pulled model to open", func(s string) bool {
		return strings.Contains(s, "Chatting with acme/tiny-qwen3") && strings.Contains(s, "Type /help")
	})
	chat.line("/quit")
	chat.waitFor("the program to exit", func(s string) bool { return s == "" })
}

// TestRemoteEndpointAndPullInTheChat: the chat opens on a remote
// endpoint's model, streams its reply, pulls a model in the background
// and switches to it.
func TestRemoteEndpointAndPullInTheChat(t *testing.T) {
	bin := terminalBinary(t)
	h := hubWithModel(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"data": [{"id": "big-model", "max_model_len": 65536}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, word := range []string{"Served ", "from ", "far ", "away."} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", word)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	data := t.TempDir()
	e := append(env(data), "HF_ENDPOINT="+h.URL, "HF_TOKEN=")
	tm := newTerm(t, e, bin, "--no-save", "--endpoint", "gpu="+srv.URL+"/v1")
	tm.waitFor("the chat on the remote model", func(s string) bool {
		return strings.Contains(s, "Chatting with gpu/big-model") && strings.Contains(s, "⇄ remote") && strings.Contains(s, "ctx 0/65536")
	})
	tm.line("hello")
	tm.waitFor("the remote reply", func(s string) bool { return strings.Contains(s, "Served from far away.") })
	tm.line("/pull acme/tiny-qwen3")
	tm.waitFor("the pull to end", func(s string) bool {
		return strings.Contains(s, "Pulled acme/tiny-qwen3") && strings.Contains(s, "4 files")
	})
	tm.line("/model acme/tiny-qwen3")
	s := tm.waitFor("the switch", func(s string) bool { return strings.Contains(s, "Switched to acme/tiny-qwen3") })
	if strings.Contains(s[strings.LastIndex(s, "\n ")+1:], "remote") {
		t.Errorf("the status bar still says remote:\n%s", s)
	}
	tm.line("/quit")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })
}
