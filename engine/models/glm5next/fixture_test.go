package glm5next

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// fixtureTol bounds max|engine − transformers| / max|transformers|, the
// tolerance the other architectures' fixture tests use.
const fixtureTol = 1e-4

// selfTol bounds the difference between two ways of computing the same
// thing in the engine (chunking, batching).
const selfTol = 2e-5

// loadFixture opens the glm5_next fixture, skipping the test when absent.
func loadFixture(t testing.TB) *fixtures.Fixture {
	t.Helper()
	fx, err := fixtures.Load("glm5_next")
	if os.IsNotExist(err) {
		t.Skip("fixture glm5_next not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// build makes the model from a config and weight source with a 2-thread backend.
func build(t testing.TB, cfg *config.Config, w model.WeightSource) *Model {
	t.Helper()
	be, err := modeltest.Backend() // the GPU with FERRITE_TEST_DEVICE=cuda
	if err != nil {
		t.Fatal(err)
	}
	mm, err := model.New(cfg, w, be)
	if err != nil {
		t.Fatal(err)
	}
	switch m := mm.(type) {
	case withMTP:
		return m.Model
	case *Model:
		return m
	}
	t.Fatalf("model.New returned %T", mm)
	return nil
}

// fixtureModel loads the fixture checkpoint as it is on disk.
func fixtureModel(t testing.TB, fx *fixtures.Fixture) *Model {
	t.Helper()
	cfg, err := config.Load(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := weights.Open(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return build(t, cfg, w)
}

// env is a cache and a state pool for a model.
type env struct {
	t  testing.TB
	m  *Model
	c  *kvcache.Cache
	st *linattn.StatePool
}

func newEnv(t testing.TB, m *Model, tokens, seqs int) *env {
	t.Helper()
	c, err := kvcache.New(m.CacheLayout(), kvcache.Options{BlockSize: 16, Budget: int64(tokens+16*seqs) * m.Info().KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	lay := m.StateLayout()
	var per int64
	for _, l := range lay {
		per += l.Bytes()
	}
	st, err := linattn.NewStatePool(lay, int64(seqs)*per)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, m: m, c: c, st: st}
}

// seq is one sequence's cache handle and state slot.
type seq struct {
	kv   *kvcache.Seq
	slot *linattn.Slot
}

func (e *env) newSeq() *seq {
	e.t.Helper()
	sl, err := e.st.Alloc()
	if err != nil {
		e.t.Fatal(err)
	}
	return &seq{kv: e.c.NewSeq(), slot: sl}
}

func (e *env) free(s *seq) {
	e.c.Free(s.kv)
	e.st.Free(s.slot)
}

// batchSeq reserves toks at the end of s and returns its batch entry.
func (e *env) batchSeq(s *seq, toks []int32, mode model.Logits, hidden bool) model.Seq {
	e.t.Helper()
	pos := s.kv.Len()
	if err := e.c.Reserve(s.kv, pos+len(toks)); err != nil {
		e.t.Fatal(err)
	}
	return model.Seq{Tokens: toks, Pos: pos, KV: s.kv, State: s.slot, Logits: mode, Hidden: hidden}
}

// run runs toks at the end of s alone.
func (e *env) run(s *seq, toks []int32, mode model.Logits, hidden bool) model.SeqOutput {
	e.t.Helper()
	out, err := e.m.Forward(&model.Batch{Cache: e.c, States: e.st, Seqs: []model.Seq{e.batchSeq(s, toks, mode, hidden)}})
	if err != nil {
		e.t.Fatal(err)
	}
	return out.Seqs[0]
}

// relErr is max|got−want| / max|want| and max|got−want|.
func relErr(got, want []float32) (rel, abs float64) {
	var maxRef float64
	for i := range want {
		maxRef = max(maxRef, math.Abs(float64(want[i])))
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		abs = max(abs, d)
	}
	return abs / maxRef, abs
}

// check compares got with want at tol, logging the error.
func check(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	rel, abs := relErr(got, want)
	t.Logf("%-26s max abs error %.3g, relative %.3g", what, abs, rel)
	if rel > tol {
		t.Errorf("%s: relative error %.3g > %g", what, rel, tol)
	}
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func mustFloats(t testing.TB, fx *fixtures.Fixture, name string) []float32 {
	t.Helper()
	v, _, err := fx.Floats(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustInts(t testing.TB, fx *fixtures.Fixture, name string) []int32 {
	t.Helper()
	v, _, err := fx.Ints(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestFixture runs the transformers fixture: every layer's residual
// streams, prompt logits and final hidden states from one forward, cached
// decode logits fed one token at a time, 16 greedy tokens, and the MTP
// logits.
func TestFixture(t *testing.T) {
	fx := loadFixture(t)
	m := fixtureModel(t, fx)
	info := m.Info()
	if info.Vocab != fx.Ref.V || info.Hidden != fx.Ref.H || info.Layers != 4 || info.Arch != "glm5_next" {
		t.Fatalf("info %+v, fixture V %d H %d", info, fx.Ref.V, fx.Ref.H)
	}
	prompt := mustInts(t, fx, "prompt_ids")
	T, H, hc := len(prompt), info.Hidden, m.p.hc
	wantStreams := mustFloats(t, fx, "hidden_states") // (L, T, hc, H): [0] = embedding, [i] = after layer i−1
	wantLast := mustFloats(t, fx, "last_layer_output")
	e := newEnv(t, m, 2*T+64, 2)

	per := T * hc * H
	m.trace = func(l int, X []float32) {
		if l+1 < info.Layers {
			check(t, fmt.Sprintf("streams after layer %d", l), X, wantStreams[(l+1)*per:(l+2)*per], fixtureTol)
		} else {
			check(t, "last layer output", X, wantLast, fixtureTol)
		}
	}
	s := e.newSeq()
	out := e.run(s, prompt, model.AllLogits, true)
	m.trace = nil
	check(t, "prompt logits", out.Logits, mustFloats(t, fx, "prompt_logits"), fixtureTol)
	check(t, "final hidden", out.Hidden, mustFloats(t, fx, "final_hidden"), fixtureTol)
	finalHidden := out.Hidden

	var dec []float32
	for _, id := range mustInts(t, fx, "decode_ids") {
		dec = append(dec, e.run(s, []int32{id}, model.LastLogits, false).Logits...)
	}
	check(t, "decode logits", dec, mustFloats(t, fx, "decode_logits"), fixtureTol)
	e.free(s)

	t.Run("greedy", func(t *testing.T) {
		greedy := mustInts(t, fx, "greedy_ids")
		g := e.newSeq()
		defer e.free(g)
		next := argmax(e.run(g, prompt, model.LastLogits, false).Logits)
		var got []int32
		for range len(greedy) {
			got = append(got, next)
			next = argmax(e.run(g, []int32{next}, model.LastLogits, false).Logits)
		}
		if !slices.Equal(got, greedy) {
			t.Errorf("greedy tokens\n got %v\nwant %v", got, greedy)
		}
	})

	t.Run("mtp", func(t *testing.T) {
		mm := model.Model(withMTP{m})
		mtpModel, ok := mm.(model.MTPModel)
		if !ok {
			t.Fatal("not an MTPModel")
		}
		s := e.newSeq()
		defer e.free(s)
		// The main model's pass fills positions [0, T); the MTP runs over
		// positions [0, T−1) with tokens 1..T−1 and its own cache layer.
		e.run(s, prompt, model.NoLogits, false)
		out, err := mtpModel.ForwardMTP(&model.Batch{Cache: e.c, Seqs: []model.Seq{
			{Tokens: prompt[1:], Pos: 0, KV: s.kv, Logits: model.AllLogits, Hidden: true},
		}}, [][]float32{finalHidden[:(T-1)*H]})
		if err != nil {
			t.Fatal(err)
		}
		check(t, "MTP logits", out.Seqs[0].Logits, mustFloats(t, fx, "mtp_logits"), fixtureTol)
		if len(out.Seqs[0].Hidden) != (T-1)*H {
			t.Errorf("MTP hidden: %d values, want %d", len(out.Seqs[0].Hidden), (T-1)*H)
		}
	})
	if st := e.c.Stats(); st.BlocksUsed != 0 {
		t.Errorf("cache not empty after Free: %+v", st)
	}
}
