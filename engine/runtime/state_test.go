package runtime_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// hybridFixtures are the fixtures of models with linear-attention layers.
var hybridFixtures = []string{"qwen3_next", "glm5_next"}

// stateSpy wraps a hybrid model (hiding its MTP module) and checks every
// batch's state slots: present, distinct, from the batch's pool, within
// its budget.
type stateSpy struct {
	model.StateModel

	mu       sync.Mutex
	maxSeqs  int   // most sequences in one batch
	maxBytes int64 // most state bytes in use during a Forward
}

// Unwrap returns the spied model (model.NewCache and model.NewStatePool
// find its device).
func (s *stateSpy) Unwrap() model.Model { return s.StateModel }

func (s *stateSpy) Forward(b *model.Batch) (*model.Output, error) {
	if b.States == nil {
		return nil, errors.New("spy: no state pool")
	}
	seen := map[*linattn.Slot]bool{}
	for i, q := range b.Seqs {
		if q.State == nil || seen[q.State] {
			return nil, fmt.Errorf("spy: sequence %d: missing or repeated slot", i)
		}
		seen[q.State] = true
	}
	used := b.States.Used()
	if used > b.States.Budget() {
		return nil, fmt.Errorf("spy: %d state bytes in use, budget %d", used, b.States.Budget())
	}
	s.mu.Lock()
	s.maxSeqs = max(s.maxSeqs, len(b.Seqs))
	s.maxBytes = max(s.maxBytes, used)
	s.mu.Unlock()
	return s.StateModel.Forward(b)
}

func (s *stateSpy) seen() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxSeqs, s.maxBytes
}

func loadHybrid(t *testing.T, name string) model.StateModel {
	m := loadFixture(t, name)
	sm, ok := m.(model.StateModel)
	if !ok || len(sm.StateLayout()) == 0 {
		t.Fatalf("%s: %T has no recurrent state", name, m)
	}
	return sm
}

// Hybrid models batched, chunked and preempted (recomputed from scratch,
// state included) produce the tokens of the request run alone, greedy or
// seeded; every slot goes back to the pool.
func TestHybridBatchedEqualsAlone(t *testing.T) {
	for _, name := range hybridFixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spy := &stateSpy{StateModel: loadHybrid(t, name)}
			per := spy.Info().StateBytesPerSeq
			n, blocks, prompt := 14, 16, 30
			if raceOn {
				n, blocks, prompt = 7, 10, 16
			}
			r := start(t, spy, runtime.Options{KVBudget: budget(spy, blocks), MaxBatchTokens: 16, MaxSeqs: 6})
			if st := r.Stats(); st.RecurrentBudget != 6*per || st.RecurrentBytes != 0 {
				t.Errorf("idle: state budget %d (want 6 × %d), %d in use", st.RecurrentBudget, per, st.RecurrentBytes)
			}
			reqs := mixedRequests(rand.New(rand.NewPCG(61, 62)), n, prompt, spy.Info().Vocab)
			checkAgainstReference(t, spy, r, reqs)
			st := waitIdle(t, r) // RecurrentBytes back to 0
			maxSeqs, maxBytes := spy.seen()
			if maxSeqs < 2 || maxBytes < 2*per || st.Preemptions == 0 {
				t.Errorf("at most %d sequences and %d state bytes in a batch, %d preemptions: want batching and preemption", maxSeqs, maxBytes, st.Preemptions)
			}
			t.Logf("%d steps, %d preemptions, up to %d state bytes (%d per sequence)", st.Steps, st.Preemptions, maxBytes, per)
		})
	}
}

// A state budget below one slot is refused; one of exactly one slot runs
// requests one at a time, and leaves speculation no room for snapshots.
func TestStateBudget(t *testing.T) {
	m := loadHybrid(t, "qwen3_next")
	per := m.Info().StateBytesPerSeq
	if _, err := runtime.New(m, runtime.Options{KVBudget: budget(m, 16), StateBudget: per - 1}); !errors.Is(err, runtime.ErrStateBudget) {
		t.Errorf("budget below one slot: %v, want ErrStateBudget", err)
	}
	spy := &stateSpy{StateModel: m}
	r := start(t, spy, runtime.Options{KVBudget: budget(m, 64), StateBudget: per, MaxSeqs: 4})
	reqs := mixedRequests(rand.New(rand.NewPCG(63, 64)), 4, 10, m.Info().Vocab)
	checkAgainstReference(t, spy, r, reqs)
	waitIdle(t, r)
	if maxSeqs, _ := spy.seen(); maxSeqs != 1 {
		t.Errorf("%d sequences in a batch with one state slot", maxSeqs)
	}

	// The MTP model itself: speculation on, but no room for a snapshot.
	if _, ok := m.(model.MTPModel); !ok {
		return
	}
	r = start(t, m, runtime.Options{KVBudget: budget(m, 64), StateBudget: per, MaxSeqs: 4, Draft: 2})
	checkAgainstReference(t, m, r, reqs[:2])
	if st := waitIdle(t, r); st.VerifySteps != 0 {
		t.Errorf("%d verification steps without room for a snapshot", st.VerifySteps)
	}
}
