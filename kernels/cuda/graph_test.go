//go:build linux && (amd64 || arm64)

package cuda

import "testing"

// TestGraphCache checks the step-graph cache's bookkeeping without a GPU:
// a trace finds its own graph only, the cache holds graphCacheSize graphs,
// and a full cache evicts the least recently replayed one.
func TestGraphCache(t *testing.T) {
	var g stepGraphs
	trace := func(i int) []uint64 { return []uint64{42, uint64(i), 7} }
	lookup := func(i int) uintptr {
		tr := trace(i)
		if c := g.find(tr, traceHash(tr)); c != nil {
			return c.exec
		}
		return 0
	}
	for i := range graphCacheSize {
		if lookup(i) != 0 {
			t.Fatalf("trace %d found before it was added", i)
		}
		tr := trace(i)
		if old := g.add(tr, traceHash(tr), uintptr(100+i)); old != 0 {
			t.Fatalf("adding graph %d of %d evicted %d", i+1, graphCacheSize, old)
		}
	}
	for i := range graphCacheSize {
		if got := lookup(i); got != uintptr(100+i) {
			t.Fatalf("trace %d: graph %d, want %d", i, got, 100+i)
		}
	}
	if lookup(graphCacheSize) != 0 || lookup(-1) != 0 {
		t.Fatal("an unknown trace found a graph")
	}
	// Trace 0 is replayed again: trace 1 is now the least recently used.
	lookup(0)
	tr := trace(graphCacheSize)
	if old := g.add(tr, traceHash(tr), 999); old != 101 {
		t.Fatalf("evicted graph %d, want 101 (trace 1, least recently used)", old)
	}
	if lookup(1) != 0 || lookup(0) != 100 || lookup(graphCacheSize) != 999 {
		t.Fatal("the cache after an eviction is wrong")
	}
	if len(g.cache) != graphCacheSize {
		t.Fatalf("%d graphs cached, want %d", len(g.cache), graphCacheSize)
	}
	// Equal hashes are not enough: the traces must match.
	if c := g.find([]uint64{1}, traceHash(trace(3))); c != nil {
		t.Fatal("a hash collision replayed another step's graph")
	}
}

// TestGraphSecondSighting checks when a step is captured, without a GPU:
// on a trace's second sighting among the remembered ones, whatever ran in
// between (speculation alternates draft and verification shapes), never on
// its first, and not once the first sighting was forgotten.
func TestGraphSecondSighting(t *testing.T) {
	var g stepGraphs
	trace := func(i int) []uint64 { return []uint64{42, uint64(i), 7} }
	exec := uintptr(0)
	// step looks trace i up as runStepL does and says what it did.
	step := func(i int) string {
		tr := trace(i)
		c, capture, h := g.lookup(tr)
		switch {
		case c != nil:
			return "replay"
		case capture:
			exec++
			g.add(tr, h, exec)
			return "capture"
		}
		return "eager"
	}
	want := []struct {
		trace int
		did   string
	}{
		{0, "eager"}, {1, "eager"}, {0, "capture"}, {1, "capture"}, {0, "replay"}, {1, "replay"},
		{2, "eager"}, {0, "replay"}, {3, "eager"}, {2, "capture"}, {3, "capture"}, {2, "replay"},
	}
	for i, w := range want {
		if did := step(w.trace); did != w.did {
			t.Fatalf("step %d (trace %d): %s, want %s", i, w.trace, did, w.did)
		}
	}
	// A trace whose first sighting scrolled out of the remembered ones
	// starts over.
	step(100)
	for i := range graphSeenSize {
		step(1000 + i)
	}
	if did := step(100); did != "eager" {
		t.Fatalf("a trace seen %d traces ago: %s, want eager", graphSeenSize+1, did)
	}
	if did := step(100); did != "capture" {
		t.Fatalf("its next sighting: %s, want capture", did)
	}
	if traceHash(nil) == 0 || traceHash([]uint64{0}) == 0 {
		t.Fatal("a trace hashed to 0, the empty mark of the remembered traces")
	}
}
