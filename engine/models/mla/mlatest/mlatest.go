// Package mlatest runs a transformers fixture (testdata/models) against an
// architecture that uses engine/models/mla or its NextN layer: prompt,
// cached-decode and MTP logits against the references, greedy tokens, the
// naive and absorbed MLA forms, DSA selections, chunked prefill and mixed
// batches. It is imported by tests only.
package mlatest

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/mla"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// Tol bounds max|engine − transformers| / max|transformers|, as the engine's
// other fixture tests do: only fp32 summation order separates the two.
const Tol = 1e-4

// FormTol bounds the relative difference between two engine paths (naive vs
// absorbed form, chunked vs whole, batched vs alone).
const FormTol = 2e-5

// Load builds the named fixture's model on be (a 2-thread CPU backend when
// nil); the returned function releases what Load opened. The test is
// skipped when the fixture is absent. The model gets a float32 KV cache,
// so the float32 tolerances hold; engine's TestFixtures checks the BF16
// default.
func Load(t testing.TB, name string, be kernels.Backend) (*fixtures.Fixture, model.Model, func()) {
	t.Helper()
	fx, err := fixtures.Load(name)
	if os.IsNotExist(err) || (err != nil && !fileExists(fixtures.Dir(name))) {
		t.Skipf("fixture %s not present", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	set, err := weights.Open(fx.Dir)
	if err != nil {
		t.Fatal(err)
	}
	closeBe := func() {}
	if be == nil {
		c := cpu.New(2)
		be, closeBe = c, c.Close
	}
	m, err := model.New(cfg, set, be)
	if err == nil {
		if dm := model.AsDevice(m); dm != nil {
			err = dm.SetCacheDType(kernels.F32)
		}
	}
	if err != nil {
		closeBe()
		set.Close()
		t.Fatal(err)
	}
	return fx, m, func() { closeBe(); set.Close() }
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Check fails t when got differs from want by more than tol relative to
// max|want|, logs the errors and returns the relative one.
func Check(t testing.TB, what string, got, want []float32, tol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	rel, abs := fixtures.RelErr(got, want)
	t.Logf("%-28s max abs error %.3g, relative %.3g", what, abs, rel)
	if rel > tol {
		t.Errorf("%s: relative error %.3g > %g (max abs %.3g)", what, rel, tol, abs)
	}
	return rel
}

// suite is one fixture's model, references and cache.
type suite struct {
	fx     *fixtures.Fixture
	m      model.Model
	c      *kvcache.Cache
	vocab  int
	hidden int

	prompt, decode, greedy      []int32
	logits, final, decLog, mtpL []float32
}

func (s *suite) floats(t testing.TB, name string) []float32 {
	v, _, err := s.fx.Floats(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (s *suite) ints(t testing.TB, name string) []int32 {
	v, _, err := s.fx.Ints(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// run reserves and runs toks at the end of seq.
func (s *suite) run(t testing.TB, seq *kvcache.Seq, toks []int32, mode model.Logits, hidden bool) model.SeqOutput {
	t.Helper()
	pos := seq.Len()
	if err := s.c.Reserve(seq, pos+len(toks)); err != nil {
		t.Fatal(err)
	}
	out, err := s.m.Forward(&model.Batch{Cache: s.c, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: seq, Logits: mode, Hidden: hidden}}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Seqs[0]
}

// prefill runs the prompt (or any tokens) on a fresh sequence.
func (s *suite) prefill(t testing.TB, toks []int32, mode model.Logits) (*kvcache.Seq, model.SeqOutput) {
	seq := s.c.NewSeq()
	return seq, s.run(t, seq, toks, mode, false)
}

// Run checks the named fixture end to end (see the package doc) on the
// CPU and on the strict backend.
func Run(t *testing.T, name string) {
	t.Run("cpu", func(t *testing.T) { RunOn(t, name, nil) })
	t.Run("strict", func(t *testing.T) { RunOn(t, name, strict.New()) })
}

// RunOn checks the named fixture on be (nil: the CPU).
func RunOn(t *testing.T, name string, be kernels.Backend) {
	fx, m, done := Load(t, name, be)
	defer done()
	info := m.Info()
	s := &suite{fx: fx, m: m, vocab: info.Vocab, hidden: info.Hidden}
	if info.Vocab != fx.Ref.V || info.Hidden != fx.Ref.H {
		t.Fatalf("vocab %d hidden %d, fixture %d %d", info.Vocab, info.Hidden, fx.Ref.V, fx.Ref.H)
	}
	if want := m.CacheLayout().BytesPerToken(); info.KVBytesPerToken != want {
		t.Fatalf("KVBytesPerToken %d, layout says %d", info.KVBytesPerToken, want)
	}
	s.prompt, s.decode, s.greedy = s.ints(t, "prompt_ids"), s.ints(t, "decode_ids"), s.ints(t, "greedy_ids")
	s.logits, s.final, s.decLog = s.floats(t, "prompt_logits"), s.floats(t, "final_hidden"), s.floats(t, "decode_logits")
	T := len(s.prompt)
	c, err := model.NewCache(m, kvcache.Options{BlockSize: 8, Budget: int64(8*(T+32)) * info.KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	s.c = c

	// The whole prompt in one pass: the reference every subtest leans on.
	seq := c.NewSeq()
	full := s.run(t, seq, s.prompt, model.AllLogits, true)
	c.Free(seq)

	t.Run("prompt", func(t *testing.T) {
		Check(t, "prompt logits", full.Logits, s.logits, Tol)
		Check(t, "final hidden", full.Hidden, s.final, Tol)
	})

	t.Run("decode", func(t *testing.T) {
		seq, _ := s.prefill(t, s.prompt, model.NoLogits)
		defer c.Free(seq)
		var got []float32
		for _, id := range s.decode {
			got = append(got, s.run(t, seq, []int32{id}, model.LastLogits, false).Logits...)
		}
		Check(t, "decode logits", got, s.decLog, Tol)
	})

	t.Run("greedy", func(t *testing.T) {
		seq, out := s.prefill(t, s.prompt, model.LastLogits)
		defer c.Free(seq)
		next := fixtures.Argmax(out.Logits)
		var got []int32
		for range len(s.greedy) {
			got = append(got, next)
			next = fixtures.Argmax(s.run(t, seq, []int32{next}, model.LastLogits, false).Logits)
		}
		if !slices.Equal(got, s.greedy) {
			t.Errorf("greedy tokens\n got %v\nwant %v", got, s.greedy)
		}
	})

	t.Run("chunked", func(t *testing.T) {
		seq := c.NewSeq()
		defer c.Free(seq)
		var got []float32
		at := 0
		for _, n := range chunks(T) {
			got = append(got, s.run(t, seq, s.prompt[at:at+n], model.AllLogits, false).Logits...)
			at += n
		}
		Check(t, fmt.Sprintf("chunks %v vs fixture", chunks(T)), got, s.logits, Tol)
		Check(t, "chunks vs one pass", got, full.Logits, FormTol)
	})

	t.Run("batch", func(t *testing.T) { s.batch(t, full.Logits) })

	if fm, ok := m.(interface{ SetForm(kernels.MLAForm) }); ok && be == nil {
		t.Run("forms", func(t *testing.T) { s.forms(t, fm) })
	}
	if am, ok := m.(interface{ Attention(int) *mla.Attention }); ok && hasDSA(m) {
		t.Run("dsa", func(t *testing.T) { s.dsa(t, am) })
	}
	if fx.Ref.HasMTP() {
		t.Run("mtp", func(t *testing.T) { s.mtp(t, full.Hidden) })
	}

	if st := c.Stats(); st.BlocksUsed != 0 || st.Seqs != 0 {
		t.Errorf("cache not empty after the suite: %+v", st)
	}
}

// hasDSA reports whether any layer of an MLA model has an indexer.
func hasDSA(m model.Model) bool {
	am, ok := m.(interface{ Attention(int) *mla.Attention })
	if !ok {
		return false
	}
	for i := range m.Info().Layers {
		if a := am.Attention(i); a.Indexer != nil || a.Share != nil {
			return true
		}
	}
	return false
}

// chunks splits a prompt of n tokens into uneven chunks, one of them a
// single token (n ≥ 4).
func chunks(n int) []int {
	a := n / 3
	b := 1
	c := (n - a - b) / 2
	return []int{a, b, c, n - a - b - c}
}

// batch runs four sequences of different lengths and kinds in one pass and
// compares each with the same work done alone.
func (s *suite) batch(t *testing.T, full []float32) {
	c, V, T := s.c, s.vocab, len(s.prompt)
	row := func(i int) []float32 { return full[i*V : (i+1)*V] }
	a := c.NewSeq()                        // fresh whole prompt
	b, _ := s.prefill(t, s.prompt[:50], 0) // decodes token 50
	d, _ := s.prefill(t, s.prompt[:60], 0) // continues with the rest of the prompt
	e := c.NewSeq()                        // a different short prompt
	other := slices.Clone(s.prompt[20:45]) // 25 tokens at positions 0..24
	defer func() { c.Free(a); c.Free(b); c.Free(d); c.Free(e) }()
	for _, r := range []struct {
		seq *kvcache.Seq
		n   int
	}{{a, T}, {b, 51}, {d, T}, {e, len(other)}} {
		if err := c.Reserve(r.seq, r.n); err != nil {
			t.Fatal(err)
		}
	}
	out, err := s.m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{
		{Tokens: s.prompt, Pos: 0, KV: a, Logits: model.AllLogits},
		{Tokens: s.prompt[50:51], Pos: 50, KV: b, Logits: model.LastLogits},
		{Tokens: s.prompt[60:], Pos: 60, KV: d, Logits: model.AllLogits},
		{Tokens: other, Pos: 0, KV: e, Logits: model.AllLogits, Hidden: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	Check(t, "batched whole prompt", out.Seqs[0].Logits, full, FormTol)
	Check(t, "batched decode", out.Seqs[1].Logits, row(50), FormTol)
	Check(t, "batched continuation", out.Seqs[2].Logits, full[60*V:], FormTol)
	alone, _ := s.prefill(t, other, model.AllLogits)
	defer c.Free(alone)
	e2 := c.NewSeq()
	defer c.Free(e2)
	ref := s.run(t, e2, other, model.AllLogits, true)
	Check(t, "batched short prompt", out.Seqs[3].Logits, ref.Logits, FormTol)
	Check(t, "batched short prompt hidden", out.Seqs[3].Hidden, ref.Hidden, FormTol)
}

// forms checks the naive and the absorbed MLA form each against the
// fixture and against one another, on the prompt and on cached decode.
func (s *suite) forms(t *testing.T, fm interface{ SetForm(kernels.MLAForm) }) {
	defer fm.SetForm(kernels.MLAAuto)
	var got [2][]float32
	for k, f := range []kernels.MLAForm{kernels.MLANaive, kernels.MLAAbsorbed} {
		name := []string{"naive", "absorbed"}[k]
		fm.SetForm(f)
		seq, out := s.prefill(t, s.prompt, model.AllLogits)
		Check(t, name+" prompt logits", out.Logits, s.logits, Tol)
		var dec []float32
		for _, id := range s.decode {
			dec = append(dec, s.run(t, seq, []int32{id}, model.LastLogits, false).Logits...)
		}
		Check(t, name+" decode logits", dec, s.decLog, Tol)
		got[k] = append(out.Logits, dec...)
		s.c.Free(seq)
	}
	Check(t, "naive vs absorbed", got[0], got[1], FormTol)
}

// dsa checks that the indexer really drops tokens on the prompt: every
// query past index_topk attends to exactly index_topk earlier positions,
// the others to all; shared layers reuse their source's selection; and
// attending to everything instead changes the logits.
func (s *suite) dsa(t *testing.T, am interface{ Attention(int) *mla.Attention }) {
	L, T := s.m.Info().Layers, len(s.prompt)
	seq, _ := s.prefill(t, s.prompt, model.NoLogits)
	defer s.c.Free(seq)
	for i := range L {
		a := am.Attention(i)
		if a.TopK() == 0 {
			continue
		}
		sel := a.Selection()
		src := a
		if a.Share != nil {
			src = a.Share
			if !slices.EqualFunc(sel, src.Selection(), slices.Equal) {
				t.Errorf("layer %d: shared layer does not use layer %d's selection", i, src.Layer)
			}
			t.Logf("layer %d: shared, reuses layer %d's top-k", i, src.Layer)
		}
		topK := src.TopK()
		if len(sel) != T {
			t.Fatalf("layer %d: %d selection rows for %d positions", i, len(sel), T)
		}
		dropped := 0
		for p, idx := range sel {
			want := min(p+1, topK)
			if len(idx) != want {
				t.Fatalf("layer %d position %d: %d selected, want %d of %d", i, p, len(idx), want, p+1)
			}
			for j, v := range idx {
				if v < 0 || int(v) > p || (j > 0 && idx[j-1] >= v) {
					t.Fatalf("layer %d position %d: bad selection %v", i, p, idx)
				}
			}
			if want < p+1 {
				dropped++
			}
		}
		if want := T - topK; dropped != want {
			t.Errorf("layer %d: %d queries attend to fewer positions than visible, want %d", i, dropped, want)
		}
		if a.Share == nil {
			t.Logf("layer %d: %d/%d queries sparse; the last attends to %d of %d positions", i, dropped, T, len(sel[T-1]), T)
		}
	}

	// Dense attention over every visible position must not match the
	// fixture: the selections matter.
	var saved []int
	for i := range L {
		if ix := am.Attention(i).Indexer; ix != nil {
			saved = append(saved, ix.Shape.TopK)
			ix.Shape.TopK = math.MaxInt32
		}
	}
	dense, out := s.prefill(t, s.prompt, model.AllLogits)
	s.c.Free(dense)
	k := 0
	for i := range L {
		if ix := am.Attention(i).Indexer; ix != nil {
			ix.Shape.TopK = saved[k]
			k++
		}
	}
	rel, abs := fixtures.RelErr(out.Logits, s.logits)
	t.Logf("dense attention instead of top-k: max abs error %.3g, relative %.3g", abs, rel)
	if rel < 100*Tol {
		t.Errorf("dense attention matches the fixture (relative error %.3g): the indexer selects nothing that matters", rel)
	}
}

// mtp runs the NextN layer over the prompt: row p takes final_hidden[p] and
// token p+1 at position p. It checks mtp_logits with the fixture's hidden
// states and with the engine's own, in one pass, in chunks, and batched.
func (s *suite) mtp(t *testing.T, ownHidden []float32) {
	mm, ok := s.m.(model.MTPModel)
	if !ok {
		t.Fatal("the fixture has an MTP layer but the model is not a model.MTPModel")
	}
	want := s.floats(t, "mtp_logits")
	c, T, H, V := s.c, len(s.prompt), s.hidden, s.vocab
	toks := s.prompt[1:]
	fwd := func(seqs []model.Seq, hidden [][]float32) *model.Output {
		t.Helper()
		for _, q := range seqs {
			if err := c.Reserve(q.KV, q.Pos+len(q.Tokens)); err != nil {
				t.Fatal(err)
			}
		}
		out, err := mm.ForwardMTP(&model.Batch{Cache: c, Seqs: seqs}, hidden)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	a := c.NewSeq()
	defer c.Free(a)
	out := fwd([]model.Seq{{Tokens: toks, KV: a, Logits: model.AllLogits, Hidden: true}}, [][]float32{s.final[:(T-1)*H]})
	Check(t, "mtp logits", out.Seqs[0].Logits, want, Tol)
	if len(out.Seqs[0].Hidden) != (T-1)*H {
		t.Errorf("mtp hidden: %d values, want %d", len(out.Seqs[0].Hidden), (T-1)*H)
	}

	b := c.NewSeq()
	defer c.Free(b)
	own := fwd([]model.Seq{{Tokens: toks, KV: b, Logits: model.AllLogits}}, [][]float32{ownHidden[:(T-1)*H]})
	Check(t, "mtp logits (engine hidden)", own.Seqs[0].Logits, want, Tol)

	// Chunked, the last rows one at a time as drafting runs them.
	d := c.NewSeq()
	defer c.Free(d)
	var got []float32
	at := 0
	for _, n := range []int{40, 1, T - 1 - 40 - 1 - 2, 1, 1} {
		o := fwd([]model.Seq{{Tokens: toks[at : at+n], Pos: at, KV: d, Logits: model.AllLogits}}, [][]float32{s.final[at*H : (at+n)*H]})
		got = append(got, o.Seqs[0].Logits...)
		at += n
	}
	Check(t, "mtp chunked vs one pass", got, out.Seqs[0].Logits, FormTol)

	// Batched with a shorter sequence; the latter alone.
	e, f, g := c.NewSeq(), c.NewSeq(), c.NewSeq()
	defer func() { c.Free(e); c.Free(f); c.Free(g) }()
	bo := fwd([]model.Seq{
		{Tokens: toks[:30], KV: e, Logits: model.LastLogits},
		{Tokens: toks, KV: f, Logits: model.AllLogits},
	}, [][]float32{s.final[:30*H], s.final[:(T-1)*H]})
	if am, ok := s.m.(interface{ Attention(int) *mla.Attention }); ok {
		a := am.Attention(s.m.Info().Layers)
		if a.Indexer != nil {
			// The batch's rows are [short (30) | long (T-1)].
			if sel := a.Selection(); len(sel) != 30+T-1 || len(sel[30+T-2]) != a.TopK() {
				t.Errorf("mtp indexer: %d selection rows, want %d; the last must keep %d of %d positions", len(sel), 30+T-1, a.TopK(), T-1)
			}
		}
	}

	alone := fwd([]model.Seq{{Tokens: toks[:30], KV: g, Logits: model.AllLogits}}, [][]float32{s.final[:30*H]})
	Check(t, "mtp batched short", bo.Seqs[0].Logits, alone.Seqs[0].Logits[29*V:], FormTol)
	Check(t, "mtp batched long", bo.Seqs[1].Logits, out.Seqs[0].Logits, FormTol)

	// Errors: a hidden slice of the wrong size.
	if _, err := mm.ForwardMTP(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks[:2], KV: a}}}, [][]float32{s.final[:H]}); err == nil {
		t.Error("ForwardMTP accepted a short hidden slice")
	}
}
