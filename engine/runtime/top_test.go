package runtime_test

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
)

// tinyWide is tinyLlama with a vocabulary wider than
// sample.MaxCandidates, so that best entries are fewer than the row.
var tinyWide = strings.Replace(tinyLlama, `"vocab_size": 64`, `"vocab_size": 700`, 1)

// topModel records the Batch.Top values it is asked for and, with cut,
// keeps only the first cut best entries of every reduced row (so that a
// sampler needing more must fall back to the whole row).
type topModel struct {
	model.Model
	cut int

	mu   sync.Mutex
	tops map[int]int // Batch.Top → forward passes
}

func (m *topModel) Unwrap() model.Model { return m.Model }

func (m *topModel) Forward(b *model.Batch) (*model.Output, error) {
	m.mu.Lock()
	m.tops[b.Top]++
	m.mu.Unlock()
	out, err := m.Model.Forward(b)
	if err != nil || m.cut == 0 {
		return out, err
	}
	for i := range out.Seqs {
		o := &out.Seqs[i]
		if o.Top <= m.cut {
			continue
		}
		rows := len(o.TopIDs) / o.Top
		vals, ids := make([]float32, 0, rows*m.cut), make([]int32, 0, rows*m.cut)
		for r := range rows {
			v, id := o.TopRow(r)
			vals, ids = append(vals, v[:m.cut]...), append(ids, id[:m.cut]...)
		}
		o.Top, o.TopVals, o.TopIDs = m.cut, vals, ids
	}
	return out, nil
}

// topRequests mixes greedy decoding, seeded top-k sampling (best entries)
// and samplers that need whole rows (no top-k, penalties).
func topRequests(rng *rand.Rand, n, vocab int) []runtime.Request {
	params := []sample.Params{
		greedy,
		{Temperature: 0.8, TopK: 40},
		{Temperature: 1.3, TopK: 7, TopP: 0.9, MinP: 0.02},
		{Temperature: 0.9, TopP: 0.95},
		{Temperature: 0, RepeatPenalty: 1.3},
	}
	reqs := make([]runtime.Request, n)
	for i := range reqs {
		p := params[i%len(params)]
		p.Seed = uint64(300 + i)
		reqs[i] = runtime.Request{Prompt: randPrompt(rng, 1+rng.IntN(12), vocab), MaxTokens: 6 + rng.IntN(8), Sampling: p}
	}
	return reqs
}

// Sequences that can sample from their rows' best entries ask for them,
// reduced on the device (the strict backend's kernels.SampleOps), and
// still draw every request alone's tokens, batched with sequences that
// want whole rows.
func TestTopSampling(t *testing.T) {
	m := &topModel{Model: build(t, tinyWide), tops: map[int]int{}}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 128), MaxBatchTokens: 32, MaxSeqs: 8})
	checkAgainstReference(t, m, r, topRequests(rand.New(rand.NewPCG(81, 82)), 15, m.Info().Vocab))
	st := waitIdle(t, r)
	t.Logf("Batch.Top → passes: %v; %d rows from best entries, %d undecided", m.tops, st.TopRows, st.TopMisses)
	for top := range m.tops {
		if top != 0 && top != 1 && top != sample.MaxCandidates {
			t.Errorf("Batch.Top %d: want 0, 1 or %d", top, sample.MaxCandidates)
		}
	}
	if m.tops[sample.MaxCandidates] == 0 || st.TopRows == 0 {
		t.Errorf("no step sampled from best entries (tops %v, %d rows)", m.tops, st.TopRows)
	}
}

// When the best entries cannot decide (here: fewer than the sampler
// needs), the runtime reads the whole row from the device
// (model.Output.Logits) and output is unchanged.
func TestTopFallback(t *testing.T) {
	m := &topModel{Model: build(t, tinyWide), cut: 3, tops: map[int]int{}}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 128), MaxBatchTokens: 32, MaxSeqs: 8})
	checkAgainstReference(t, m, r, topRequests(rand.New(rand.NewPCG(83, 84)), 10, m.Info().Vocab))
	st := waitIdle(t, r)
	if st.TopMisses == 0 || st.TopRows == 0 {
		t.Errorf("%d rows from best entries, %d read whole: want both", st.TopRows, st.TopMisses)
	}
}
