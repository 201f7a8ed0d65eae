package modeltest

import (
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
)

// Env is a model with a KV cache and, when the model has recurrent state
// (a model.StateModel with linear-attention layers), a state pool in the
// model's memory: the place the suites run sequences in.
type Env struct {
	M      model.Model
	Cache  *kvcache.Cache
	States *linattn.StatePool // nil for a model without recurrent state
}

// Seq is one sequence of an Env: its cache handle and state slot (nil
// without recurrent state).
type Seq struct {
	KV   *kvcache.Seq
	Slot *linattn.Slot
}

// NewEnv makes an Env with a cache of blockSize-token blocks holding tokens
// tokens and room for seqs state slots (sequences and snapshots).
func NewEnv(t testing.TB, m model.Model, blockSize, tokens, seqs int) *Env {
	t.Helper()
	c, err := model.NewCache(m, kvcache.Options{BlockSize: blockSize, Budget: int64(tokens) * m.Info().KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{M: m, Cache: c}
	if sm, ok := m.(model.StateModel); ok && len(sm.StateLayout()) > 0 {
		if e.States, err = model.NewStatePool(sm, int64(seqs)*m.Info().StateBytesPerSeq); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// NewSeq returns an empty sequence with a zeroed state.
func (e *Env) NewSeq(t testing.TB) *Seq {
	t.Helper()
	s := &Seq{KV: e.Cache.NewSeq()}
	if e.States != nil {
		var err error
		if s.Slot, err = e.States.Alloc(); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// Free gives s's cache blocks and state slot back.
func (e *Env) Free(s *Seq) {
	e.Cache.Free(s.KV)
	if s.Slot != nil {
		e.States.Free(s.Slot)
	}
}

// Fork returns a new sequence sharing s's first n tokens, with a copy of
// s's state (so s must be n tokens long when it has one).
func (e *Env) Fork(t testing.TB, s *Seq, n int) *Seq {
	t.Helper()
	kv, err := e.Cache.Fork(s.KV, n)
	if err != nil {
		t.Fatal(err)
	}
	f := &Seq{KV: kv}
	if s.Slot != nil {
		if f.Slot, err = e.States.Alloc(); err != nil {
			t.Fatal(err)
		}
		e.States.Copy(f.Slot, s.Slot)
	}
	return f
}

// Checkpoint records s's length and state; the returned function rolls s
// back to them (a rejected speculation).
func (e *Env) Checkpoint(t testing.TB, s *Seq) (rollback func()) {
	t.Helper()
	n := s.KV.Len()
	if s.Slot == nil {
		return func() { e.Cache.Truncate(s.KV, n) }
	}
	sn, err := e.States.NewSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	e.States.Snapshot(sn, s.Slot)
	return func() {
		e.Cache.Truncate(s.KV, n)
		e.States.Restore(s.Slot, sn)
		e.States.FreeSnapshot(sn)
	}
}

// Entry is one sequence's part of a batch: tokens continuing at the end of
// S.
type Entry struct {
	S      *Seq
	Tokens []int32
	Logits model.Logits
	Hidden bool
}

// Batch reserves every entry's tokens and returns the batch running them.
func (e *Env) Batch(t testing.TB, entries ...Entry) *model.Batch {
	t.Helper()
	b := &model.Batch{Cache: e.Cache, States: e.States}
	for _, en := range entries {
		pos := en.S.KV.Len()
		if err := e.Cache.Reserve(en.S.KV, pos+len(en.Tokens)); err != nil {
			t.Fatal(err)
		}
		b.Seqs = append(b.Seqs, model.Seq{Tokens: en.Tokens, Pos: pos, KV: en.S.KV, State: en.S.Slot, Logits: en.Logits, Hidden: en.Hidden})
	}
	return b
}

// Run runs one batch of entries and returns their outputs.
func (e *Env) Run(t testing.TB, entries ...Entry) []model.SeqOutput {
	t.Helper()
	out, err := e.M.Forward(e.Batch(t, entries...))
	if err != nil {
		t.Fatal(err)
	}
	return out.Seqs
}

// Step runs tokens at the end of s alone and returns their logits.
func (e *Env) Step(t testing.TB, s *Seq, tokens []int32, mode model.Logits) []float32 {
	t.Helper()
	return e.Run(t, Entry{S: s, Tokens: tokens, Logits: mode})[0].Logits
}

// CheckEmpty fails t unless every cache block and state slot was given
// back.
func (e *Env) CheckEmpty(t testing.TB) {
	t.Helper()
	if st := e.Cache.Stats(); st.BlocksUsed != 0 || st.Seqs != 0 {
		t.Errorf("cache after freeing everything: %+v", st)
	}
	if e.States != nil && e.States.Used() != 0 {
		t.Errorf("state pool after freeing everything: %d bytes in use", e.States.Used())
	}
}
