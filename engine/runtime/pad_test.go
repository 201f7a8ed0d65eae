package runtime_test

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// passSizes records the sizes of the passes whose entries are all one
// token (those Options.PadBatch pads).
type passSizes struct {
	mu    sync.Mutex
	sizes map[int]int // entries → passes
}

func (p *passSizes) see(b *model.Batch) {
	for _, s := range b.Seqs {
		if len(s.Tokens) != 1 {
			return
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sizes == nil {
		p.sizes = map[int]int{}
	}
	p.sizes[len(b.Seqs)]++
}

// check fails t unless every recorded size is a bucket and some pass was
// padded beyond maxSeqs, the most sequences that may run.
func (p *passSizes) check(t *testing.T, what string, maxSeqs int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	padded := false
	for n := range p.sizes {
		if !slices.Contains([]int{1, 2, 4, 8, 16}, n) {
			t.Errorf("%s: a pass of %d one-token entries, not a bucket (%v)", what, n, p.sizes)
		}
		padded = padded || n > maxSeqs
	}
	if !padded {
		t.Errorf("%s: no pass padded beyond the %d sequences that run (%v)", what, maxSeqs, p.sizes)
	}
	t.Logf("%s: one-token passes by entries %v", what, p.sizes)
}

// With Options.PadBatch on, decode steps are padded to their bucket (6
// running sequences to 8) and every request still gets exactly the
// tokens it gets alone: pad entries are inert. waitIdle checks that the
// scratch blocks went back to the pool.
func TestPaddedBatchesEqualAlone(t *testing.T) {
	for _, tc := range []struct{ name, cfg string }{{"llama", tinyLlama}, {"qwen3", tinyQwen3}} {
		t.Run(tc.name, func(t *testing.T) {
			hm := &hookModel{Model: build(t, tc.cfg)}
			var sizes passSizes
			hm.setBefore(func(b *model.Batch) error { sizes.see(b); return nil })
			r := start(t, hm, runtime.Options{KVBudget: budget(hm, 256), MaxBatchTokens: 16, MaxSeqs: 6, PadBatch: 1})
			reqs := mixedRequests(rand.New(rand.NewPCG(1, 2)), 14, 40, hm.Info().Vocab)
			checkAgainstReference(t, hm, r, reqs)
			waitIdle(t, r)
			sizes.check(t, "forward", 6)
		})
	}
}

// Speculative greedy decoding with padded passes (the MTP draft passes
// too, each pad entry with a zero hidden state) emits plain greedy
// decoding's tokens; the fake checks the MTP cache rows of every sequence
// against its tokens, so a pad entry that wrote into a real sequence's
// rows fails loudly. (The cache is large enough never to be full: a full
// cache has no room for the scratch block, and the pass runs unpadded.)
func TestPaddedSpecGreedy(t *testing.T) {
	m := &mtpWatch{MTPModel: &fakeMTP{vocab: 24, noise: 0.6, scale: 4}}
	r := start(t, m, runtime.Options{
		KVBudget: budget(m, 200), MaxBatchTokens: 32, MaxSeqs: 6, Draft: 3, DraftMaxSeqs: 3, PadBatch: 1,
	})
	reqs := specReqs(rand.New(rand.NewPCG(43, 44)), 16, 12, 30, m.Info().Vocab)
	checkAgainstReference(t, m.MTPModel, r, reqs)
	st := waitIdle(t, r)
	if st.VerifySteps == 0 {
		t.Errorf("stats %+v: no verification steps", st)
	}
	m.fwd.check(t, "forward", 6)
	m.mtp.check(t, "MTP", 3)
}

// Without a device that replays graphs (the strict backend), PadBatch 0
// leaves passes unpadded: 6 running sequences decode as 6 entries.
func TestPadOffOnHostBackends(t *testing.T) {
	hm := &hookModel{Model: build(t, tinyLlama)}
	var sizes passSizes
	hm.setBefore(func(b *model.Batch) error { sizes.see(b); return nil })
	r := start(t, hm, runtime.Options{KVBudget: budget(hm, 256), MaxBatchTokens: 16, MaxSeqs: 6})
	checkAgainstReference(t, hm, r, mixedRequests(rand.New(rand.NewPCG(1, 2)), 8, 20, hm.Info().Vocab))
	waitIdle(t, r)
	sizes.mu.Lock()
	defer sizes.mu.Unlock()
	if sizes.sizes[6] == 0 {
		t.Errorf("no decode pass of 6 entries (%v): padded by default on a host backend", sizes.sizes)
	}
}

// A real MTP model's padded passes (gqa's NextN layer fed zero hidden
// rows for the pad entries) leave speculative greedy decoding equal to
// plain greedy decoding: the first MTP fixture without recurrent state, on
// the strict backend.
func TestPaddedSpecFixture(t *testing.T) {
	var name string
	var fm model.Model
	for _, n := range mtpFixtures(t) {
		fm = loadFixture(t, n)
		if sm, ok := fm.(model.StateModel); !ok || len(sm.StateLayout()) == 0 {
			name = n
			break
		}
	}
	if name == "" {
		t.Skip("no MTP fixture without recurrent state")
	}
	m := &mtpWatch{MTPModel: fm.(model.MTPModel)}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 200), MaxBatchTokens: 16, MaxSeqs: 3, Draft: 2, DraftMaxSeqs: 3, PadBatch: 1})
	reqs := specReqs(rand.New(rand.NewPCG(45, 46)), 5, 8, 10, m.Info().Vocab)
	checkAgainstReference(t, m.MTPModel, r, reqs)
	st := waitIdle(t, r)
	if st.VerifySteps == 0 {
		t.Errorf("%s: no verification steps (%+v)", name, st)
	}
	m.mtp.check(t, name+" MTP", 3) // its forward passes verify drafts: not one-token passes
}

// mtpWatch wraps an MTP model, recording its one-token passes.
type mtpWatch struct {
	model.MTPModel
	fwd, mtp passSizes
}

// Unwrap returns the wrapped model (model.NewCache finds its device).
func (m *mtpWatch) Unwrap() model.Model { return m.MTPModel }

func (m *mtpWatch) Forward(b *model.Batch) (*model.Output, error) {
	m.fwd.see(b)
	return m.MTPModel.Forward(b)
}

func (m *mtpWatch) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	m.mtp.see(b)
	return m.MTPModel.ForwardMTP(b, hidden)
}
