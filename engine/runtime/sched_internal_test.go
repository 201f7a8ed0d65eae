package runtime

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// layoutModel is a model that is never run: it only sizes a cache.
type layoutModel struct{}

func (layoutModel) Info() model.Info {
	return model.Info{Arch: "stub", Vocab: 10, MaxContext: 1000, KVBytesPerToken: 8}
}
func (layoutModel) CacheLayout() kvcache.Layout                 { return kvcache.Layout{{K: 1, V: 1}} }
func (layoutModel) Forward(*model.Batch) (*model.Output, error) { panic("layoutModel: Forward") }

// idleRuntime is a Runtime without its loop goroutine, for driving the
// scheduler by hand.
func idleRuntime(t *testing.T, blocks int, opts Options) *Runtime {
	t.Helper()
	opts.BlockSize = 4
	opts.KVBudget = int64(blocks * 4 * 8)
	c, err := kvcache.New(layoutModel{}.CacheLayout(), kvcache.Options{BlockSize: opts.BlockSize, Budget: opts.KVBudget, Memory: strict.New()})
	if err != nil {
		t.Fatal(err)
	}
	r := &Runtime{m: layoutModel{}, info: layoutModel{}.Info(), opts: opts, cache: c, limit: blocks * 4}
	r.sched.init(r)
	return r
}

// addRunning puts a sequence of n prompt tokens, computed of them cached,
// into the running set.
func addRunning(t *testing.T, sc *scheduler, id uint64, n, computed int) *seq {
	t.Helper()
	s := &seq{id: id, tokens: make([]int32, n), nPrompt: n, stream: newStream(id, func() {}), stopWatch: func() bool { return true }, cancelCtx: func() {}}
	sc.attach(s)
	if err := sc.r.cache.Reserve(s.kv, computed); err != nil {
		t.Fatal(err)
	}
	s.computed = computed
	sc.insertRunning(s)
	return s
}

// Every running sequence is mid-prefill and the cache is full: the newest
// is preempted so the oldest can go on.
func TestScheduleUnblocksFullPrefill(t *testing.T) {
	r := idleRuntime(t, 4, Options{MaxBatchTokens: 8, MaxSeqs: 4})
	sc := &r.sched
	a := addRunning(t, sc, 1, 12, 8)
	b := addRunning(t, sc, 2, 12, 8)
	if r.cache.BlocksFree() != 0 {
		t.Fatalf("%d blocks free, want a full cache", r.cache.BlocksFree())
	}
	sc.schedule()
	if !slices.Equal(sc.step, []*seq{a}) || sc.batch.Seqs[0].Pos != 8 || len(sc.batch.Seqs[0].Tokens) != 4 || sc.batch.Seqs[0].Logits != model.LastLogits {
		t.Errorf("step %v %+v, want the rest of a's prompt", sc.step, sc.batch.Seqs)
	}
	if b.state != seqWaiting || b.kv != nil || b.computed != 0 || b.preemptions != 1 || !slices.Equal(sc.waiting, []*seq{b}) {
		t.Errorf("b: state %d, computed %d, preemptions %d; want preempted", b.state, b.computed, b.preemptions)
	}
}

// A decode that needs a block preempts the newest sequence, which goes
// back to the queue in arrival order, ahead of later arrivals.
func TestPreemptNewest(t *testing.T) {
	r := idleRuntime(t, 4, Options{MaxBatchTokens: 8, MaxSeqs: 4})
	sc := &r.sched
	a := addRunning(t, sc, 1, 9, 8) // one decode token pending, needs a new block
	b := addRunning(t, sc, 2, 4, 3) // its decode token fits in its block
	c := addRunning(t, sc, 3, 4, 3)
	late := &seq{id: 4, tokens: make([]int32, 3), nPrompt: 3}
	sc.wait(late)
	sc.schedule()
	if !slices.Equal(sc.running, []*seq{a, b}) || !slices.Equal(sc.waiting, []*seq{c, late}) {
		t.Errorf("running %v waiting %v; want c preempted ahead of the later arrival", ids(sc.running), ids(sc.waiting))
	}
	if !slices.Equal(sc.step, []*seq{a, b}) {
		t.Errorf("step %v, want a and b decoding", ids(sc.step))
	}
}

func ids(list []*seq) []uint64 {
	var out []uint64
	for _, s := range list {
		out = append(out, s.id)
	}
	return out
}

func TestTakeText(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pieces []string
		want   string
	}{
		{"ascii", []string{"ab", "c"}, "abc"},
		{"split 2-byte", []string{"\xc3", "\xa9"}, "é"},
		{"split 4-byte", []string{"\xf0", "\x9f", "\x98", "\x80!"}, "😀!"},
		{"invalid middle", []string{"a\xffb"}, "a\uFFFDb"},
		{"lead then ascii", []string{"\xe2", "x"}, "\uFFFDx"},
		{"cut at end", []string{"ok\xe2\x82"}, "ok\uFFFD"},
		{"stray continuation", []string{"\x80\x80\x80\x80a"}, "\uFFFDa"},
	} {
		s := &seq{}
		var got strings.Builder
		for _, p := range tc.pieces {
			out := s.takeText(p, false)
			if !utf8.ValidString(out) {
				t.Errorf("%s: invalid piece %q", tc.name, out)
			}
			got.WriteString(out)
		}
		got.WriteString(s.takeText("", true))
		if got.String() != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got.String(), tc.want)
		}
	}
}

// The draft length follows the measured acceptance: full length at first,
// down to nothing but a probe every probeEvery steps when drafts keep
// failing, and back up when they pass again.
func TestAdaptiveDraftLength(t *testing.T) {
	sp := newSpecSeq(5)
	if k := sp.want(); k != 5 {
		t.Fatalf("fresh: %d drafts, want 5", k)
	}
	// Position 2 keeps failing: stop after it.
	for range 20 {
		sp.learn(5, 2)
	}
	if k := sp.want(); k != 2 {
		t.Errorf("position 2 always rejected: %d drafts, want 2", k)
	}
	// Nothing passes: drafting stops but for probes.
	for range 20 {
		sp.learn(sp.want(), 0)
	}
	probes := 0
	for range 4 * probeEvery {
		if k := sp.want(); k > 0 {
			probes++
			if k != 1 {
				t.Errorf("probe of %d drafts, want 1", k)
			}
		}
	}
	if probes != 4 {
		t.Errorf("%d probes in %d steps, want 4", probes, 4*probeEvery)
	}
	// Everything passes again: back to the full length.
	for range 60 {
		if k := sp.want(); k > 0 {
			sp.learn(k, k)
		}
	}
	if k := sp.want(); k != 5 {
		t.Errorf("all accepted again: %d drafts, want 5", k)
	}
}
