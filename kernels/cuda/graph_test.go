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
		if old := g.add(tr, traceHash(tr), uintptr(100+i), nil); old != 0 {
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
	if old := g.add(tr, traceHash(tr), 999, nil); old != 101 {
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
