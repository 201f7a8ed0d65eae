package glm5next

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
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

// devices runs fn as a subtest on every backend the architecture suites
// use (cpu, strict, and the device of FERRITE_TEST_DEVICE).
func devices(t *testing.T, fn func(t *testing.T, be kernels.Backend)) {
	for name, newBackend := range modeltest.Devices() {
		t.Run(name, func(t *testing.T) {
			be, err := newBackend()
			if err != nil {
				t.Fatal(err)
			}
			fn(t, be)
		})
	}
}

// build makes the model from a config and weight source on be.
func build(t testing.TB, be kernels.Backend, cfg *config.Config, w model.WeightSource) *Model {
	t.Helper()
	mm, err := model.New(cfg, w, be)
	var missing *model.OpsError
	if errors.As(err, &missing) && os.Getenv("FERRITE_TEST_DEVICE") != "" {
		t.Skipf("the device backend lacks glm5_next's ops: %v", err) // cpu and strict have them all
	}
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

// fixtureModel loads the fixture checkpoint as it is on disk, with a
// float32 KV cache (the fixture tolerance; TestFixture checks BF16 too).
func fixtureModel(t testing.TB, be kernels.Backend, fx *fixtures.Fixture) *Model {
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
	m := build(t, be, cfg, w)
	if err := m.SetCacheDType(kernels.F32); err != nil {
		t.Fatal(err)
	}
	return m
}

// env is modeltest's Env (a cache and a state pool in the model's memory)
// bound to one test.
type env struct {
	t testing.TB
	*modeltest.Env
}

// seq is one sequence's cache handle and state slot.
type seq = modeltest.Seq

// newEnv makes an env with room for tokens tokens (plus a block per
// sequence) and seqs sequences and a snapshot.
func newEnv(t testing.TB, m *Model, tokens, seqs int) *env {
	t.Helper()
	return &env{t, modeltest.NewEnv(t, m, 16, tokens+16*seqs, seqs+1)}
}

func (e *env) newSeq() *seq { return e.NewSeq(e.t) }
func (e *env) free(s *seq)  { e.Free(s) }

// batchSeq reserves toks at the end of s and returns its batch entry.
func (e *env) batchSeq(s *seq, toks []int32, mode model.Logits, hidden bool) model.Seq {
	e.t.Helper()
	return e.Batch(e.t, modeltest.Entry{S: s, Tokens: toks, Logits: mode, Hidden: hidden}).Seqs[0]
}

// run runs toks at the end of s alone.
func (e *env) run(s *seq, toks []int32, mode model.Logits, hidden bool) model.SeqOutput {
	e.t.Helper()
	return e.Run(e.t, modeltest.Entry{S: s, Tokens: toks, Logits: mode, Hidden: hidden})[0]
}

// check compares got with want at tol, logging the error.
func check(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	rel, abs := fixtures.RelErr(got, want)
	t.Logf("%-26s max abs error %.3g, relative %.3g", what, abs, rel)
	if rel > tol {
		t.Errorf("%s: relative error %.3g > %g", what, rel, tol)
	}
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

// record keeps copies of tensors an op writes inside a step (the model's
// trace hooks), to read them once the step is over.
type record struct {
	dev  kernels.Device
	keys []int
	ts   []kernels.Tensor
}

// add copies t into persistent memory under key.
func (r *record) add(key int, t kernels.Tensor) {
	c, err := r.dev.Alloc(t.DType, t.Rows, t.Cols)
	if err != nil {
		panic(err)
	}
	r.dev.Copy(c, t)
	r.keys, r.ts = append(r.keys, key), append(r.ts, c)
}

// f32 reads the i-th recorded F32 tensor.
func (r *record) f32(i int) []float32 {
	v := make([]float32, r.ts[i].Elems())
	r.dev.ReadF32(v, r.ts[i])
	return v
}

// i32 reads the i-th recorded I32 tensor.
func (r *record) i32(i int) []int32 {
	v := make([]int32, r.ts[i].Elems())
	r.dev.(interface {
		ReadI32(dst []int32, t kernels.Tensor)
	}).ReadI32(v, r.ts[i])
	return v
}

// TestFixture runs the transformers fixture on every backend: every
// layer's residual streams, prompt logits and final hidden states from one
// forward, cached decode logits fed one token at a time, 16 greedy tokens,
// and the MTP logits, with a float32 KV cache; then the prompt, decode
// and greedy tokens with the default BF16 cache.
func TestFixture(t *testing.T) { devices(t, testFixture) }

func testFixture(t *testing.T, be kernels.Backend) {
	fx := loadFixture(t)
	m := fixtureModel(t, be, fx)
	info := m.Info()
	if info.Vocab != fx.Ref.V || info.Hidden != fx.Ref.H || info.Layers != 4 || info.Arch != "glm5_next" {
		t.Fatalf("info %+v, fixture V %d H %d", info, fx.Ref.V, fx.Ref.H)
	}
	prompt := mustInts(t, fx, "prompt_ids")
	T, H, hc := len(prompt), info.Hidden, m.p.hc
	wantStreams := mustFloats(t, fx, "hidden_states") // (L, T, hc, H): [0] = embedding, [i] = after layer i−1
	wantLast := mustFloats(t, fx, "last_layer_output")
	e := newEnv(t, m, 2*T+64, 2)

	rec := &record{dev: m.dev}
	m.trace = rec.add
	s := e.newSeq()
	out := e.run(s, prompt, model.AllLogits, true)
	m.trace = nil
	per := T * hc * H
	for i, l := range rec.keys {
		if l+1 < info.Layers {
			check(t, fmt.Sprintf("streams after layer %d", l), rec.f32(i), wantStreams[(l+1)*per:(l+2)*per], fixtureTol)
		} else {
			check(t, "last layer output", rec.f32(i), wantLast, fixtureTol)
		}
	}
	if len(rec.keys) != info.Layers {
		t.Fatalf("%d layers traced, want %d", len(rec.keys), info.Layers)
	}
	check(t, "prompt logits", out.Logits, mustFloats(t, fx, "prompt_logits"), fixtureTol)
	check(t, "final hidden", out.Hidden, mustFloats(t, fx, "final_hidden"), fixtureTol)
	finalHidden := out.Hidden

	var dec []float32
	for _, id := range mustInts(t, fx, "decode_ids") {
		dec = append(dec, e.run(s, []int32{id}, model.LastLogits, false).Logits...)
	}
	check(t, "decode logits", dec, mustFloats(t, fx, "decode_logits"), fixtureTol)
	e.free(s)

	t.Run("greedy", func(t *testing.T) { greedy(t, e, fx, prompt) })

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
		out, err := mtpModel.ForwardMTP(&model.Batch{Cache: e.Cache, Seqs: []model.Seq{
			{Tokens: prompt[1:], Pos: 0, KV: s.KV, Logits: model.AllLogits, Hidden: true},
		}}, [][]float32{finalHidden[:(T-1)*H]})
		if err != nil {
			t.Fatal(err)
		}
		check(t, "MTP logits", out.Seqs[0].Logits, mustFloats(t, fx, "mtp_logits"), fixtureTol)
		if len(out.Seqs[0].Hidden) != (T-1)*H {
			t.Errorf("MTP hidden: %d values, want %d", len(out.Seqs[0].Hidden), (T-1)*H)
		}
	})
	if st := e.Cache.Stats(); st.BlocksUsed != 0 {
		t.Errorf("cache not empty after Free: %+v", st)
	}

	t.Run("kv=BF16", func(t *testing.T) {
		if err := m.SetCacheDType(kernels.BF16); err != nil {
			t.Fatal(err)
		}
		if got := m.Info().KVBytesPerToken; got != m.CacheLayout().BytesPerToken() || m.CacheLayout()[1].DType != kernels.BF16 {
			t.Fatalf("KVBytesPerToken %d with layout %v", got, m.CacheLayout())
		}
		e := newEnv(t, m, 2*T+64, 2)
		s := e.newSeq()
		check(t, "prompt logits (BF16 KV)", e.run(s, prompt, model.AllLogits, false).Logits, mustFloats(t, fx, "prompt_logits"), bf16KVTol)
		e.free(s)
		greedy(t, e, fx, prompt)
	})
}

// bf16KVTol bounds the fixture error with a BF16 KV cache (latents and
// index keys rounded to 8 significant bits, relative error ≤ 2⁻⁹ each),
// as engine's fixture tests state it.
const bf16KVTol = 1e-2

// greedy checks the fixture's greedy continuation of prompt.
func greedy(t *testing.T, e *env, fx *fixtures.Fixture, prompt []int32) {
	t.Helper()
	want := mustInts(t, fx, "greedy_ids")
	g := e.newSeq()
	defer e.free(g)
	next := fixtures.Argmax(e.run(g, prompt, model.LastLogits, false).Logits)
	var got []int32
	for range len(want) {
		got = append(got, next)
		next = fixtures.Argmax(e.run(g, []int32{next}, model.LastLogits, false).Logits)
	}
	if !slices.Equal(got, want) {
		t.Errorf("greedy tokens\n got %v\nwant %v", got, want)
	}
}
