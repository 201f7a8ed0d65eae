package cli

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/bench"
)

// TestBenchPrintsGraphs checks that a case's step-graph counts (a device
// that replays steps as graphs) are printed, and that a host device's
// report has no such section.
func TestBenchPrintsGraphs(t *testing.T) {
	c := bench.Case{Concurrency: 1, PromptLen: 16, GenLen: 64, MTP: true}
	var sb strings.Builder
	printGraphs(&sb, []bench.Result{{Case: c, GraphReplays: 120, GraphCaptures: 3, GraphEager: 5}})
	want := "concurrency 1, prompt 16, gen 64, mtp on: 120 of 125 replayed as one graph (3 captured), 5 launched eagerly"
	if !strings.Contains(sb.String(), want) {
		t.Errorf("got %q, want a line %q", sb.String(), want)
	}
	sb.Reset()
	printGraphs(&sb, []bench.Result{{Case: c}})
	if sb.Len() != 0 {
		t.Errorf("a host device's report has graph lines: %q", sb.String())
	}
}
