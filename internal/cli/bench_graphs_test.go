package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/bench"
)

// TestBenchPrintsGraphs checks that a case's step-graph counts (a device
// that replays steps as graphs) are printed, and that a host device's
// report has no such section.
func TestBenchPrintsGraphs(t *testing.T) {
	c := bench.Case{Concurrency: 1, PromptLen: 16, GenLen: 64, MTP: true, Draft: 2}
	var sb strings.Builder
	printGraphs(&sb, []bench.Result{{Case: c, GraphReplays: 120, GraphCaptures: 3, GraphEager: 5}})
	want := "concurrency 1, prompt 16, gen 64, mtp on, draft 2: 120 of 125 replayed as one graph (3 captured), 5 launched eagerly"
	if !strings.Contains(sb.String(), want) {
		t.Errorf("got %q, want a line %q", sb.String(), want)
	}
	sb.Reset()
	printGraphs(&sb, []bench.Result{{Case: c}})
	if sb.Len() != 0 {
		t.Errorf("a host device's report has graph lines: %q", sb.String())
	}
}

// TestBenchChat checks --chat: the requests send the chat questions
// through the built-in model's template, request i question i, whatever
// --prompt-len says; and --draft-always.
func TestBenchChat(t *testing.T) {
	want, err := chatPrompts("ferrite-tiny")
	if err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(t.TempDir(), "bench.json")
	code, _, errs := runCLI(t, "", "bench", "--model", "ferrite-tiny", "--chat", "--concurrency", "2", "--prompt-len", "5",
		"--gen-len", "8", "--mtp", "on", "--draft", "1", "--draft-always", "--threads", "2", "--device", "cpu", "--bandwidth", "10",
		"--no-warmup", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []bench.Result
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d results, want 1", len(rep.Runs))
	}
	r := rep.Runs[0]
	if got := r.PromptTokens; got != len(want[0])+len(want[1]) {
		t.Errorf("%d prompt tokens, want %d + %d (the first two chat questions)", got, len(want[0]), len(want[1]))
	}
	// --draft-always: the runtime drafts on every decode step, on the CPU
	// too, where it does not pay: at least 3 drafts for each sequence's 8
	// tokens (every draft accepted: steps at tokens 1, 3 and 5).
	if r.DraftTokens < 6 {
		t.Errorf("%d drafts with --draft-always, want at least 6 (%+v)", r.DraftTokens, r)
	}
	if r.PromptLen != max(len(want[0]), len(want[1]), len(want[2]), len(want[3]), len(want[4]), len(want[5])) {
		t.Errorf("case labelled prompt %d, want the longest chat prompt", r.PromptLen)
	}
}
