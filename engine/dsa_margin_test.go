package engine

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/mla"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
)

// dsaFlipGap bounds a legitimate DSA selection flip between the float32
// and the BF16 cache: every position the BF16 run selects instead of one
// the float32 run selects must have scored, in the float32 run, within
// dsaFlipGap × the row's largest |score| of it. The BF16 run's latents
// and index keys are rounded to 8 significant bits (2⁻⁹ relative, about
// 2e-3), which moves logits by up to bf16KVTol relative; the scores the
// indexer ranks move by as much (measured: up to 1.2e-2 of the row's
// largest), so two scores trade places only within 2·bf16KVTol. Only
// primary flips are held to it (see dsaFlips); on the fixtures their gaps
// are at most 2.3e-3, about one bf16 step. A wrong score or selection
// kernel swaps positions far apart.
const dsaFlipGap = 2 * bf16KVTol

// dsaRun is one loaded fixture model with its cache, stepping one
// sequence and recording every indexer's selection and scores.
type dsaRun struct {
	t    *testing.T
	l    *Loaded
	c    *kvcache.Cache
	am   interface{ Attention(int) *mla.Attention }
	seq  *kvcache.Seq
	name string
}

// dsaStep is one forward pass's logits and, per layer with its own
// indexer (nil elsewhere and when the pass attended densely), the
// selections and scores of its rows.
type dsaStep struct {
	logits []float32
	sel    [][][]int32
	scores [][][]float32
}

func newDSARun(t *testing.T, dir string, kv32 bool, tokens int) *dsaRun {
	t.Helper()
	l, err := Load(dir, Options{Threads: 2, KVFloat32: kv32, Device: os.Getenv("FERRITE_TEST_DEVICE")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	am, ok := l.Model.(interface{ Attention(int) *mla.Attention })
	if !ok {
		t.Skipf("%T does not expose its MLA layers", l.Model)
	}
	c, err := l.NewCache(int64(tokens)*l.Model.Info().KVBytesPerToken, 16)
	if err != nil {
		t.Fatal(err)
	}
	name := "f32"
	if l.Model.CacheLayout()[0].DType == kernels.BF16 {
		name = "bf16"
	}
	return &dsaRun{t: t, l: l, c: c, am: am, seq: c.NewSeq(), name: name}
}

// reset starts a new sequence.
func (r *dsaRun) reset() {
	r.c.Free(r.seq)
	r.seq = r.c.NewSeq()
}

func (r *dsaRun) step(toks []int32, mode model.Logits) dsaStep {
	r.t.Helper()
	pos := r.seq.Len()
	if err := r.c.Reserve(r.seq, pos+len(toks)); err != nil {
		r.t.Fatal(err)
	}
	out, err := r.l.Model.Forward(&model.Batch{Cache: r.c, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: r.seq, Logits: mode}}})
	if err != nil {
		r.t.Fatal(err)
	}
	L := r.l.Model.Info().Layers
	st := dsaStep{logits: out.Seqs[0].Logits, sel: make([][][]int32, L), scores: make([][][]float32, L)}
	for i := range L {
		if a := r.am.Attention(i); a.Indexer != nil {
			st.sel[i], st.scores[i] = a.Selection(), a.Indexer.Scores()
			if st.sel[i] != nil && st.scores[i] == nil {
				r.t.Fatalf("%s layer %d: selection without scores (chunked?)", r.name, i)
			}
			for j, sel := range st.sel[i] {
				if !isTopK(sel, st.scores[i][j][:pos+j+1]) {
					r.t.Fatalf("%s layer %d row %d: selection %v is not the top %d of the scores read back", r.name, i, j, sel, len(sel))
				}
			}
		}
	}
	return st
}

// dsaFlips compares the BF16 run's selections with the float32 run's for
// one pass whose first row is at position pos0. A flip in layer i at
// position p is primary when no layer before i has flipped at a position
// ≤ p (firstFlip, per layer, carried across the sequence's passes): its
// inputs then differ by rounding alone, and it must be a near-tie within
// dsaFlipGap. Later flips follow from attending to other positions
// upstream and are only counted. dsaFlips returns the rows of the pass
// with a flip in any layer (nil when every layer was dense), the number
// of secondary flips, and the largest primary gap.
func dsaFlips(t *testing.T, what string, pos0 int, firstFlip []int, ref, got dsaStep) (flipped []bool, secondary int, maxGap float64) {
	t.Helper()
	upstream := math.MaxInt // the first flipped position of the layers before i
	for i := range ref.sel {
		a, b := ref.sel[i], got.sel[i]
		if (a == nil) != (b == nil) || len(a) != len(b) {
			t.Fatalf("%s layer %d: %d and %d selection rows", what, i, len(a), len(b))
		}
		if flipped == nil && a != nil {
			flipped = make([]bool, len(a))
		}
		for r := range a {
			in, out := setDiff(b[r], a[r]), setDiff(a[r], b[r])
			if len(in) == 0 && len(out) == 0 {
				continue
			}
			flipped[r] = true
			firstFlip[i] = min(firstFlip[i], pos0+r)
			if pos0+r >= upstream {
				secondary++
				continue
			}
			t.Logf("%s layer %d position %d: primary flip", what, i, pos0+r)
			sc := ref.scores[i][r][:pos0+r+1]
			var scale float64
			for _, v := range sc {
				scale = max(scale, math.Abs(float64(v)))
			}
			lost, gained := math.Inf(-1), math.Inf(1)
			for _, p := range out {
				lost = max(lost, float64(sc[p]))
			}
			for _, p := range in {
				gained = min(gained, float64(sc[p]))
			}
			gap := (lost - gained) / scale
			maxGap = max(maxGap, gap)
			if len(in) != len(out) || gap > dsaFlipGap {
				t.Errorf("%s layer %d row %d (position %d): BF16 selects %v instead of %v, float32 score gap %.3g of the row's scale %.3g (bound %g)",
					what, i, r, pos0+r, in, out, gap, scale, dsaFlipGap)
			}
		}
		upstream = min(upstream, firstFlip[i])
	}
	return flipped, secondary, maxGap
}

// isTopK reports whether sel holds positions of sc none of which scores
// below a position outside sel.
func isTopK(sel []int32, sc []float32) bool {
	low := math.Inf(1)
	for _, p := range sel {
		low = min(low, float64(sc[p]))
	}
	for p, v := range sc {
		if float64(v) > low && !slices.Contains(sel, int32(p)) {
			return false
		}
	}
	return true
}

// setDiff is a \ b.
func setDiff(a, b []int32) []int32 {
	var d []int32
	for _, p := range a {
		if !slices.Contains(b, p) {
			d = append(d, p)
		}
	}
	return d
}

// dsaMarginFixture checks a DSA fixture on the default BF16 cache against
// the float32 cache run and transformers, the way a rounded backend is
// judged: every selection flip is a near-tie (dsaFlipGap); prompt and
// decode rows before the first flip are within bf16KVTol of transformers;
// greedy tokens (fed back from the fixture) match up to the first step
// after a flip or where the float32 run's top-2 margin is below
// 2·bf16KVTol of the row's largest logit. Both fixtures' prompts flip
// (deepseek_v32 at row 73, glm_moe_dsa at 21), so their greedy tokens
// are all past a flip and only counted; a fixture without flips checks
// them.
func dsaMarginFixture(t *testing.T, name string) {
	fx, err := fixtures.Load(name)
	if os.IsNotExist(err) {
		t.Skipf("fixture %s not present", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	prompt, _, err := fx.Ints("prompt_ids")
	if err != nil {
		t.Fatal(err)
	}
	wantLogits, _, _ := fx.Floats("prompt_logits")
	decodeIDs, _, _ := fx.Ints("decode_ids")
	wantDecode, _, _ := fx.Floats("decode_logits")
	greedy, _, _ := fx.Ints("greedy_ids")
	tokens := len(prompt) + max(len(decodeIDs), len(greedy)) + 16
	ref, bf := newDSARun(t, fx.Dir, true, tokens), newDSARun(t, fx.Dir, false, tokens)
	if bf.name != "bf16" {
		t.Fatalf("default cache is not BF16")
	}
	V := fx.Ref.V
	var maxRef float64
	for _, v := range wantLogits {
		maxRef = max(maxRef, math.Abs(float64(v)))
	}
	rowOK := func(got, want []float32) bool {
		_, a := fixtures.RelErr(got, want)
		return a <= bf16KVTol*maxRef
	}

	// Prompt: flips, then rows before the first one against transformers.
	firstFlip := make([]int, ref.l.Model.Info().Layers)
	for i := range firstFlip {
		firstFlip[i] = math.MaxInt
	}
	r32, r16 := ref.step(prompt, model.AllLogits), bf.step(prompt, model.AllLogits)
	flipped, secondary, gap := dsaFlips(t, "prompt", 0, firstFlip, r32, r16)
	promptFlips := slices.Clone(firstFlip)
	first := slices.Index(flipped, true)
	if first < 0 {
		first = len(prompt)
	}
	for r := range first {
		if !rowOK(r16.logits[r*V:(r+1)*V], wantLogits[r*V:(r+1)*V]) {
			t.Errorf("prompt row %d (before any flip) beyond relative error %g", r, bf16KVTol)
		}
	}
	nflip := 0
	for _, f := range flipped {
		if f {
			nflip++
		}
	}
	t.Logf("prompt: %d of %d rows with a flipped selection, first at %d; %d secondary flips", nflip, len(prompt), first, secondary)

	// Decode rows, fed the fixture's tokens.
	clean := first == len(prompt)
	for j, id := range decodeIDs {
		d32, d16 := ref.step([]int32{id}, model.LastLogits), bf.step([]int32{id}, model.LastLogits)
		f, n, g := dsaFlips(t, "decode", len(prompt)+j, firstFlip, d32, d16)
		gap, secondary = max(gap, g), secondary+n
		clean = clean && !slices.Contains(f, true)
		if clean && !rowOK(d16.logits, wantDecode[j*V:(j+1)*V]) {
			t.Errorf("decode step %d (before any flip) beyond relative error %g", j, bf16KVTol)
		}
	}

	// Greedy: the fixture's tokens fed back; each step's argmax must match
	// while no selection has flipped and the reference margin is clear.
	ref.reset()
	bf.reset()
	toks := prompt
	clean = first == len(prompt)
	checked := 0
	for j, want := range greedy {
		g32, g16 := ref.step(toks, model.LastLogits), bf.step(toks, model.LastLogits)
		if j > 0 {
			f, n, g := dsaFlips(t, "greedy", len(prompt)+j-1, promptFlips, g32, g16)
			gap, secondary = max(gap, g), secondary+n
			clean = clean && !slices.Contains(f, true)
		}
		if got := fixtures.Argmax(g32.logits); got != want {
			t.Fatalf("greedy step %d: the float32 cache picks %d, transformers %d", j, got, want)
		}
		if clean && fixtures.Top2Gap(g32.logits) >= 2*bf16KVTol*maxAbs(g32.logits) {
			checked++
			if got := fixtures.Argmax(g16.logits); got != want {
				t.Errorf("greedy step %d (no flip, clear margin): BF16 cache picks %d, transformers %d", j, got, want)
			}
		}
		toks = []int32{want}
	}
	t.Logf("greedy: %d of %d tokens checked; largest primary flip gap %.3g (bound %g), %d secondary flips in all", checked, len(greedy), gap, dsaFlipGap, secondary)
}

func maxAbs(v []float32) float64 {
	var m float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}
