// Package modeltest is the conformance suite every architecture runs with
// random weights: incremental decode equals the full forward, chunked
// prefill equals one chunk, a mixed batch equals each sequence alone,
// fork and rollback give the same logits as a fresh sequence, hidden states
// reproduce the logits, and the cache gets every block back.
package modeltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/device"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// Tol is the largest allowed |a−b| / max|ref| between two ways of computing
// the same logits.
const Tol = 2e-5

// BF16KVTol replaces Tol on a BF16 KV cache: the one-row (decode) and
// many-row (prefill) products may sum in different orders (the AVX2 tiles
// do), and a key or value that differs in its last float32 bits can then
// round to the neighbouring bf16 (2⁻⁸ relative) in one run and not in the
// other, which moves the logits by up to ~1e-4 of their largest. A wrong
// position, slot or mask moves them by O(1), so this still catches every
// bookkeeping error; the F32 cache runs keep Tol.
const BF16KVTol = 1e-3

// BF16StateTol replaces Tol for a model with recurrent state on a BF16 KV
// cache: its linear-attention layers compute the same rows with float32
// differences that depend on the chunking (the delta rule's chunked and
// recurrent forms), and a key or value the attention layers store may then
// round to the neighbouring bf16 (2⁻⁹ relative) in one run and not in the
// other.
const BF16StateTol = 1e-2

// Build makes the model described by cfgJSON with random weights of dtype
// on the suites' backend (see Backend).
func Build(t testing.TB, cfgJSON string, dtype kernels.DType, missing func(string) bool) model.Model {
	t.Helper()
	be, err := Backend()
	if err != nil {
		t.Fatal(err)
	}
	return BuildOn(t, be, cfgJSON, dtype, missing)
}

// BuildOn is Build on backend be.
func BuildOn(t testing.TB, be kernels.Backend, cfgJSON string, dtype kernels.DType, missing func(string) bool) model.Model {
	t.Helper()
	m, err := TryBuildOn(be, cfgJSON, dtype, missing)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TryBuild is Build returning the error; missing names the tensors the
// random source pretends not to have.
func TryBuild(cfgJSON string, dtype kernels.DType, missing func(string) bool) (model.Model, error) {
	be, err := Backend()
	if err != nil {
		return nil, err
	}
	return TryBuildOn(be, cfgJSON, dtype, missing)
}

// TryBuildOn is TryBuild on backend be.
func TryBuildOn(be kernels.Backend, cfgJSON string, dtype kernels.DType, missing func(string) bool) (model.Model, error) {
	cfg, err := config.Parse("config.json", []byte(cfgJSON))
	if err != nil {
		return nil, err
	}
	src := randweights.New(1, dtype)
	src.Missing = missing
	// A backend that makes random weights itself (the GPU; strict, to
	// catch host code that reads a weight) gets them without their bytes.
	if g, ok := be.(kernels.RandomGenerator); ok && g.GeneratesRandom() {
		src.Deferred = true
	}
	return model.New(cfg, src, be)
}

// Devices are the backends every op-set architecture runs its suite on:
// the CPU, the strict test backend and, with FERRITE_TEST_DEVICE set, the
// device backend it names (see Backend).
func Devices() map[string]func() (kernels.Backend, error) {
	d := map[string]func() (kernels.Backend, error){
		"cpu":    func() (kernels.Backend, error) { return cpu.New(0), nil },
		"strict": func() (kernels.Backend, error) { return strict.New(), nil },
	}
	if os.Getenv("FERRITE_TEST_DEVICE") != "" {
		d["device"] = Backend
	}
	return d
}

// RunDevices runs the suite on every backend of Devices, with the KV
// cache in BF16 (the default) and F32, and checks the model went through
// the op set (strict saw its steps).
func RunDevices(t *testing.T, cfgJSON string, dtype kernels.DType, missing func(string) bool) {
	for name, newBackend := range Devices() {
		for _, kv := range []kernels.DType{kernels.BF16, kernels.F32} {
			t.Run(name+"/kv="+kv.String(), func(t *testing.T) {
				be, err := newBackend()
				if err != nil {
					t.Fatal(err)
				}
				m := BuildOn(t, be, cfgJSON, dtype, missing)
				dm, ok := m.(model.DeviceModel)
				if !ok {
					t.Fatalf("%T is not on the op set", m)
				}
				if err := dm.SetCacheDType(kv); err != nil {
					t.Fatal(err)
				}
				layout := m.CacheLayout()
				if got, want := m.Info().KVBytesPerToken, layout.BytesPerToken(); got != want {
					t.Fatalf("KVBytesPerToken %d, layout %d", got, want)
				}
				for i, w := range layout {
					if w.K+w.V > 0 && w.DType != kv {
						t.Fatalf("cache layer %d is %v, want %v", i, w.DType, kv)
					}
				}
				tol := Tol
				if kv == kernels.BF16 {
					tol = BF16KVTol
				}
				if sm, ok := m.(model.StateModel); ok && len(sm.StateLayout()) > 0 && kv == kernels.BF16 {
					tol = BF16StateTol
				}
				RunTol(t, m, tol)
				if s, ok := be.(*strict.Device); ok && s.Steps() == 0 {
					t.Fatal("the strict backend ran no step")
				}
			})
		}
	}
}

var shared struct {
	once sync.Once
	be   kernels.Backend
	err  error
}

// Backend is the backend the suites build models on: a new CPU backend, or
// with FERRITE_TEST_DEVICE set ("cuda", "cuda:1", "auto") one device
// backend shared by the whole test binary, so that every architecture's
// suite runs on the GPU unchanged.
func Backend() (kernels.Backend, error) {
	spec := os.Getenv("FERRITE_TEST_DEVICE")
	if spec == "" {
		return cpu.New(0), nil
	}
	shared.once.Do(func() {
		s, err := device.Parse(spec)
		if err != nil {
			shared.err = fmt.Errorf("FERRITE_TEST_DEVICE: %w", err)
			return
		}
		b, err := device.Open(s, 0)
		if err != nil {
			shared.err = err
			return
		}
		shared.be = b.Backend // the backend itself: the CPU one implements the op set
	})
	return shared.be, shared.err
}

// NewCache returns a cache for m with small blocks (so short sequences span
// several) holding about blocks blocks.
func NewCache(t testing.TB, m model.Model, blocks int) *kvcache.Cache {
	t.Helper()
	const bs = 4
	c, err := model.NewCache(m, kvcache.Options{BlockSize: bs, Budget: int64(blocks*bs) * m.Info().KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Compare fails t when got and want differ by more than Tol relative to
// want's largest magnitude, and returns the relative error.
func Compare(t testing.TB, what string, got, want []float32, tol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var maxRef, maxErr float64
	for i := range want {
		maxRef = max(maxRef, math.Abs(float64(want[i])))
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(float64(got[i])) {
			d = math.Inf(1)
		}
		maxErr = max(maxErr, d)
	}
	rel := maxErr / max(maxRef, 1e-30)
	if rel > tol || maxRef == 0 {
		t.Errorf("%s: max abs error %.3g, relative %.3g (max |ref| %.3g)", what, maxErr, rel, maxRef)
	}
	return rel
}

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// Run runs the conformance suite on m; a model with recurrent state runs
// it with a state pool (forks copy the state, rollbacks restore a
// snapshot).
func Run(t *testing.T, m model.Model) { RunTol(t, m, Tol) }

// RunTol is Run comparing the ways of computing the same logits within tol
// (relative to the largest reference magnitude).
func RunTol(t *testing.T, m model.Model, tol float64) {
	info := m.Info()
	vocab := info.Vocab
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := randTokens(rng, 23, vocab)
	const bs = 4 // small blocks, so that short sequences span several
	e := NewEnv(t, m, bs, 64*bs, 12)

	// Reference: the whole prompt in one chunk.
	ref := e.NewSeq(t)
	full := e.Step(t, ref, prompt, model.AllLogits)
	row := func(i int) []float32 { return full[i*vocab : (i+1)*vocab] }

	t.Run("incremental", func(t *testing.T) {
		s := e.NewSeq(t)
		defer e.Free(s)
		got := e.Step(t, s, prompt[:5], model.AllLogits)
		Compare(t, "prefill rows", got, full[:5*vocab], tol)
		for i := 5; i < len(prompt); i++ {
			got := e.Step(t, s, prompt[i:i+1], model.LastLogits)
			Compare(t, fmt.Sprintf("decode position %d", i), got, row(i), tol)
		}
	})

	t.Run("chunked", func(t *testing.T) {
		s := e.NewSeq(t)
		defer e.Free(s)
		var got []float32
		at := 0
		for _, n := range []int{7, 1, 9, 6} {
			got = append(got, e.Step(t, s, prompt[at:at+n], model.AllLogits)...)
			at += n
		}
		Compare(t, "chunked prefill", got, full, tol)
	})

	t.Run("batch", func(t *testing.T) {
		// Three sequences in one pass: A continues a prefill with a chunk,
		// B decodes one token, C is a fresh prompt wanting hidden states.
		promptB := randTokens(rng, 9, vocab)
		promptC := randTokens(rng, 4, vocab)
		a, b, cs := e.NewSeq(t), e.NewSeq(t), e.NewSeq(t)
		defer func() { e.Free(a); e.Free(b); e.Free(cs) }()
		e.Step(t, a, prompt[:6], model.NoLogits)
		aloneB := e.Step(t, b, promptB, model.AllLogits)
		next := int32(rng.IntN(vocab))
		out := e.Run(t,
			Entry{S: a, Tokens: prompt[6:11], Logits: model.AllLogits},
			Entry{S: b, Tokens: []int32{next}, Logits: model.LastLogits},
			Entry{S: cs, Tokens: promptC, Logits: model.LastLogits, Hidden: true})
		Compare(t, "batched A", out[0].Logits, full[6*vocab:11*vocab], tol)

		// B and C alone, on fresh sequences.
		b2, c2 := e.NewSeq(t), e.NewSeq(t)
		defer func() { e.Free(b2); e.Free(c2) }()
		Compare(t, "B prefill (separate cache)", e.Step(t, b2, promptB, model.AllLogits), aloneB, tol)
		Compare(t, "batched B", out[1].Logits, e.Step(t, b2, []int32{next}, model.LastLogits), tol)
		aloneC := e.Step(t, c2, promptC, model.AllLogits)
		Compare(t, "batched C", out[2].Logits, aloneC[3*vocab:], tol)

		h := out[2].Hidden
		if len(h) != 4*info.Hidden {
			t.Fatalf("hidden states: %d values, want %d", len(h), 4*info.Hidden)
		}
		c3 := e.NewSeq(t)
		defer e.Free(c3)
		alone := e.Run(t, Entry{S: c3, Tokens: promptC, Hidden: true})
		if len(alone[0].Logits) != 0 {
			t.Fatal("logits returned with NoLogits")
		}
		Compare(t, "batched C hidden", h, alone[0].Hidden, tol)
		if len(out[0].Hidden) != 0 {
			t.Fatal("hidden states returned without being asked for")
		}
	})

	t.Run("fork-and-rollback", func(t *testing.T) {
		s := e.NewSeq(t)
		defer e.Free(s)
		e.Step(t, s, prompt[:10], model.NoLogits)
		f := e.Fork(t, s, 10)
		defer e.Free(f)
		// The fork continues with the real prompt; the original speculates
		// three wrong tokens, rolls them back, then continues too.
		Compare(t, "fork continues", e.Step(t, f, prompt[10:14], model.AllLogits), full[10*vocab:14*vocab], tol)
		rollback := e.Checkpoint(t, s)
		e.Step(t, s, randTokens(rng, 3, vocab), model.AllLogits)
		rollback()
		Compare(t, "after rollback", e.Step(t, s, prompt[10:13], model.AllLogits), full[10*vocab:13*vocab], tol)
		Compare(t, "fork unaffected", e.Step(t, f, prompt[14:15], model.LastLogits), row(14), tol)
	})

	t.Run("errors", func(t *testing.T) {
		s := e.NewSeq(t)
		defer e.Free(s)
		c, st := e.Cache, e.States
		one := []int32{1}
		bad := map[string]model.Batch{
			"not reserved":     {Cache: c, States: st, Seqs: []model.Seq{{Tokens: []int32{0}, Pos: 0, KV: s.KV, State: s.Slot}}},
			"token past vocab": {Cache: c, States: st, Seqs: []model.Seq{{Tokens: []int32{int32(vocab)}, Pos: 0, KV: ref.KV, State: ref.Slot}}},
			"same handle":      {Cache: c, States: st, Seqs: []model.Seq{{Tokens: one, KV: ref.KV, State: ref.Slot}, {Tokens: one, KV: ref.KV, State: s.Slot}}},
			"no cache":         {States: st, Seqs: []model.Seq{{Tokens: one, KV: ref.KV, State: ref.Slot}}},
		}
		if st != nil {
			bad["no state slot"] = model.Batch{Cache: c, States: st, Seqs: []model.Seq{{Tokens: one, KV: ref.KV}}}
			bad["no state pool"] = model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: one, KV: ref.KV, State: ref.Slot}}}
		}
		for name, b := range bad {
			if _, err := m.Forward(&b); err == nil {
				t.Errorf("bad batch (%s): no error", name)
			}
		}
	})

	e.Free(ref)
	e.CheckEmpty(t)
}
