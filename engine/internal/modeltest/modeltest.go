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
				if got, want := m.Info().KVBytesPerToken, m.CacheLayout().BytesPerToken(); got != want || m.CacheLayout()[0].DType != kv {
					t.Fatalf("KVBytesPerToken %d, layout %d (%v)", got, want, m.CacheLayout()[0].DType)
				}
				Run(t, m)
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

// runner runs single-sequence steps against one cache.
type runner struct {
	t *testing.T
	m model.Model
	c *kvcache.Cache
}

// step runs tokens at the end of s and returns all their logits (n, vocab).
func (r *runner) step(s *kvcache.Seq, tokens []int32, mode model.Logits) []float32 {
	r.t.Helper()
	pos := s.Len()
	if err := r.c.Reserve(s, pos+len(tokens)); err != nil {
		r.t.Fatal(err)
	}
	out, err := r.m.Forward(&model.Batch{Cache: r.c, Seqs: []model.Seq{{Tokens: tokens, Pos: pos, KV: s, Logits: mode}}})
	if err != nil {
		r.t.Fatal(err)
	}
	return out.Seqs[0].Logits
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

// Run runs the conformance suite on m.
func Run(t *testing.T, m model.Model) {
	info := m.Info()
	vocab := info.Vocab
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := randTokens(rng, 23, vocab)
	c := NewCache(t, m, 64)
	r := &runner{t: t, m: m, c: c}

	// Reference: the whole prompt in one chunk.
	ref := c.NewSeq()
	full := r.step(ref, prompt, model.AllLogits)
	row := func(i int) []float32 { return full[i*vocab : (i+1)*vocab] }

	t.Run("incremental", func(t *testing.T) {
		r := &runner{t: t, m: m, c: c}
		s := c.NewSeq()
		defer c.Free(s)
		got := r.step(s, prompt[:5], model.AllLogits)
		Compare(t, "prefill rows", got, full[:5*vocab], Tol)
		for i := 5; i < len(prompt); i++ {
			got := r.step(s, prompt[i:i+1], model.LastLogits)
			Compare(t, fmt.Sprintf("decode position %d", i), got, row(i), Tol)
		}
	})

	t.Run("chunked", func(t *testing.T) {
		r := &runner{t: t, m: m, c: c}
		s := c.NewSeq()
		defer c.Free(s)
		var got []float32
		at := 0
		for _, n := range []int{7, 1, 9, 6} {
			got = append(got, r.step(s, prompt[at:at+n], model.AllLogits)...)
			at += n
		}
		Compare(t, "chunked prefill", got, full, Tol)
	})

	t.Run("batch", func(t *testing.T) {
		// Three sequences in one pass: A continues a prefill with a chunk,
		// B decodes one token, C is a fresh prompt wanting hidden states.
		promptB := randTokens(rng, 9, vocab)
		promptC := randTokens(rng, 4, vocab)
		r := &runner{t: t, m: m, c: c}
		a, b, cs := c.NewSeq(), c.NewSeq(), c.NewSeq()
		defer func() { c.Free(a); c.Free(b); c.Free(cs) }()
		r.step(a, prompt[:6], model.NoLogits)
		aloneB := r.step(b, promptB, model.AllLogits)
		for _, s := range []struct {
			seq *kvcache.Seq
			n   int
		}{{a, 11}, {b, 10}, {cs, 4}} {
			if err := c.Reserve(s.seq, s.n); err != nil {
				t.Fatal(err)
			}
		}
		next := int32(rng.IntN(vocab))
		out, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{
			{Tokens: prompt[6:11], Pos: 6, KV: a, Logits: model.AllLogits},
			{Tokens: []int32{next}, Pos: 9, KV: b, Logits: model.LastLogits},
			{Tokens: promptC, Pos: 0, KV: cs, Logits: model.LastLogits, Hidden: true},
		}})
		if err != nil {
			t.Fatal(err)
		}
		Compare(t, "batched A", out.Seqs[0].Logits, full[6*vocab:11*vocab], Tol)

		// B and C alone, on fresh sequences.
		b2, c2 := c.NewSeq(), c.NewSeq()
		defer func() { c.Free(b2); c.Free(c2) }()
		Compare(t, "B prefill (separate cache)", r.step(b2, promptB, model.AllLogits), aloneB, Tol)
		Compare(t, "batched B", out.Seqs[1].Logits, r.step(b2, []int32{next}, model.LastLogits), Tol)
		aloneC := r.step(c2, promptC, model.AllLogits)
		Compare(t, "batched C", out.Seqs[2].Logits, aloneC[3*vocab:], Tol)

		h := out.Seqs[2].Hidden
		if len(h) != 4*info.Hidden {
			t.Fatalf("hidden states: %d values, want %d", len(h), 4*info.Hidden)
		}
		c3 := c.NewSeq()
		defer c.Free(c3)
		if err := c.Reserve(c3, 4); err != nil {
			t.Fatal(err)
		}
		alone, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: promptC, KV: c3, Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(alone.Seqs[0].Logits) != 0 {
			t.Fatal("logits returned with NoLogits")
		}
		Compare(t, "batched C hidden", h, alone.Seqs[0].Hidden, Tol)
		if len(out.Seqs[0].Hidden) != 0 {
			t.Fatal("hidden states returned without being asked for")
		}
	})

	t.Run("fork-and-rollback", func(t *testing.T) {
		r := &runner{t: t, m: m, c: c}
		s := c.NewSeq()
		defer c.Free(s)
		r.step(s, prompt[:10], model.NoLogits)
		f, err := c.Fork(s, 10)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Free(f)
		// The fork continues with the real prompt; the original speculates
		// three wrong tokens, rolls them back, then continues too.
		Compare(t, "fork continues", r.step(f, prompt[10:14], model.AllLogits), full[10*vocab:14*vocab], Tol)
		r.step(s, randTokens(rng, 3, vocab), model.AllLogits)
		c.Truncate(s, 10)
		Compare(t, "after rollback", r.step(s, prompt[10:13], model.AllLogits), full[10*vocab:13*vocab], Tol)
		Compare(t, "fork unaffected", r.step(f, prompt[14:15], model.LastLogits), row(14), Tol)
	})

	t.Run("errors", func(t *testing.T) {
		s := c.NewSeq()
		defer c.Free(s)
		bad := []model.Batch{
			{Cache: c, Seqs: []model.Seq{{Tokens: []int32{0}, Pos: 0, KV: s}}},                                  // not reserved
			{Cache: c, Seqs: []model.Seq{{Tokens: []int32{int32(vocab)}, Pos: 0, KV: ref}}},                     // token out of range
			{Cache: c, Seqs: []model.Seq{{Tokens: []int32{1}, Pos: 0, KV: ref}, {Tokens: []int32{1}, KV: ref}}}, // same handle twice
			{Cache: nil, Seqs: []model.Seq{{Tokens: []int32{1}, KV: ref}}},
		}
		for i, b := range bad {
			if _, err := m.Forward(&b); err == nil {
				t.Errorf("bad batch %d: no error", i)
			}
		}
	})

	c.Free(ref)
	if st := c.Stats(); st.BlocksUsed != 0 || st.Seqs != 0 {
		t.Fatalf("cache after freeing everything: %+v", st)
	}
}
