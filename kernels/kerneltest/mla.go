package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// Tolerances of the MLA and DSA ops, as |got − want| ≤ tol·scale:
const (
	// MLATol (AttentionMLA): scale is the row's bound on |output|,
	// max over (head, v) of Σ_c |W_UV[h,v,c]|·max_t |c_t[c]| over the
	// latents it attends to. Two chained float32 products around a float32
	// softmax against the float64 reference, in either form.
	MLATol = 2e-5
	// MLABF16Tol replaces MLATol for a backend that rounds x to bfloat16
	// for the BF16 kv_b_proj halves (XRounder): the absorbed query and the
	// attended latents enter those products off by up to 2⁻⁹ each, which
	// against the bound above stays below 2⁻⁹ (up to 1.5e-4 seen on the
	// CPU backend), while the outputs themselves are a few per cent of it.
	MLABF16Tol = 1.0 / (1 << 9)
	// MLASplitTol replaces MLATol for a kv_b_proj whose halves are
	// block-quantized and stored split (Mat.KVB, a GGUF's attn_k_b and
	// attn_v_b): a backend may quantize both products' x to int8
	// (QuantTol), each element off by up to max|x|/254 of its block,
	// which the softmax carries on from the scores. The CPU backend's
	// int8 products stray up to 3.9e-3 of the bound in these cases; a
	// head's part taken from the next head strays 2.3e-2 to 0.69.
	MLASplitTol = 1.0 / (1 << 7)
	// IndexerTol (IndexerScores): scale is Σ_h |w_h|·Scale·max_t Σ_d
	// |q_h,d·k_t,d|, the bound on a row's scores.
	IndexerTol = 1e-5
)

// paged is a test's cache geometry: random block tables, so sequences
// interleave, and every sequence's positions with their slots.
type paged struct {
	t         *testing.T
	d         kernels.Device
	seqs      []attnSeq
	bs        int
	maxBlocks int
	blocks    []int32 // (seqs, maxBlocks)
	bt        kernels.Tensor
}

func newPaged(t *testing.T, d kernels.Device, rng *rand.Rand, seqs []attnSeq, bs int) *paged {
	g := &paged{t: t, d: d, seqs: seqs, bs: bs}
	for _, s := range seqs {
		g.maxBlocks = max(g.maxBlocks, (s.start+s.rows+bs-1)/bs)
	}
	g.blocks = scatteredBlocks(rng, len(seqs)*g.maxBlocks, g.slots()/bs)
	g.bt = ints(t, d, len(seqs), g.maxBlocks, g.blocks)
	return g
}

// slots is the cache size in slots (three spare blocks).
func (g *paged) slots() int { return (len(g.seqs)*g.maxBlocks + 3) * g.bs }

func (g *paged) slot(si, p int) int32 {
	return g.blocks[si*g.maxBlocks+p/g.bs]*int32(g.bs) + int32(p%g.bs)
}

// rows lists the (sequence, position) pairs of the cached prefixes
// (pre) or of the step.
func (g *paged) rows(pre bool) (seq, pos []int32) {
	for si, s := range g.seqs {
		lo, hi := s.start, s.start+s.rows
		if pre {
			lo, hi = 0, s.start
		}
		for p := lo; p < hi; p++ {
			seq, pos = append(seq, int32(si)), append(pos, int32(p))
		}
	}
	return seq, pos
}

// paged uploads the row maps of the given rows.
func (g *paged) paged(seq, pos []int32) *kernels.Paged {
	slot := make([]int32, len(pos))
	for i := range pos {
		slot[i] = g.slot(int(seq[i]), int(pos[i]))
	}
	n := len(pos)
	return &kernels.Paged{Pos: ints(g.t, g.d, n, 1, pos), Seq: ints(g.t, g.d, n, 1, seq), Slot: ints(g.t, g.d, n, 1, slot), Blocks: g.bt, BlockSize: g.bs}
}

// invFreq is a RoPE frequency table of dim rotated dims.
func invFreq(dim int) []float32 {
	inv := make([]float32, dim/2)
	for i := range inv {
		inv[i] = float32(math.Pow(10000, -float64(2*i)/float64(dim)))
	}
	return inv
}

// hostAngles is ref.RopeAngles at position p.
func hostAngles(inv []float32, p int) (cos, sin []float32) {
	cos, sin = make([]float32, len(inv)), make([]float32, len(inv))
	ref.RopeAngles(cos, sin, inv, p, 1)
	return cos, sin
}

// roundTo rounds v to the cache dtype in place.
func roundTo(dt kernels.DType, v []float32) {
	if dt == kernels.BF16 {
		for i, x := range v {
			v[i] = kernels.BF16ToF32(kernels.F32ToBF16(x))
		}
	}
}

// checkCache reads back an F32 cache and compares the slots of every
// position with want (slot → row).
func checkCache(t *testing.T, d kernels.Device, c kernels.Tensor, want map[int32][]float32) {
	t.Helper()
	if c.DType != kernels.F32 {
		return
	}
	all := make([]float32, c.Elems())
	d.ReadF32(all, c)
	for s, w := range want {
		row := all[int(s)*c.Cols : (int(s)+1)*c.Cols]
		compare(t, fmt.Sprintf("cache slot %d", s), row, w, RowOpTol, rowScale(w))
	}
}

type mlaCase struct {
	heads, nope, rope, v, kl, bs int
	seqs                         []attnSeq
	topK                         int // 0: dense; else a random selection of at most topK positions
	inter                        bool
	wdt                          kernels.DType
	// split, when set, stores kv_b_proj's halves per head as a GGUF does
	// (Mat.KVB): W_UK_hᵀ in split[0], W_UV_h in split[1]; the matrix's
	// Data is their exact float32 rebuild (wdt is then unused).
	split *[2]kernels.DType
}

func mlaTest(t *testing.T, d kernels.Device, ops kernels.MLAOps) {
	cases := []mlaCase{
		{4, 8, 4, 6, 16, 4, []attnSeq{{0, 1}}, 0, true, kernels.BF16, nil},
		{2, 8, 4, 8, 24, 4, []attnSeq{{9, 1}, {0, 3}, {20, 1}}, 0, false, kernels.F32, nil},   // decode rows
		{3, 4, 8, 4, 12, 8, []attnSeq{{5, 1}, {0, 40}, {33, 17}}, 0, true, kernels.BF16, nil}, // mixed
		{2, 8, 4, 8, 16, 4, []attnSeq{{0, 30}, {25, 2}, {10, 1}}, 6, true, kernels.F8E4M3, nil},
		{5, 16, 8, 16, 32, 16, []attnSeq{{40, 3}, {0, 20}}, 9, false, kernels.BF16, nil},
		{2, 8, 0, 8, 16, 4, []attnSeq{{0, 9}, {12, 1}}, 5, false, kernels.BF16, nil}, // NoPE (no rotary)
		{3, 6, 2, 5, 15, 4, []attnSeq{{0, 5}, {7, 1}}, 0, true, kernels.F32, nil},    // odd widths: no vector loads
		// kv_b_proj split per head as a GGUF stores it (Mat.KVB): Q8_0
		// rows of 32 and 64, F16 W_UK beside Q8_0 W_UV (GLM-4.7-Flash's
		// usual file), K-quant rows of 256 (the latent's width).
		{3, 32, 8, 16, 64, 4, []attnSeq{{0, 5}, {9, 1}, {3, 2}}, 0, true, 0, &[2]kernels.DType{kernels.Q8_0, kernels.Q8_0}},
		{2, 32, 4, 8, 64, 4, []attnSeq{{12, 1}, {0, 6}}, 5, false, 0, &[2]kernels.DType{kernels.F16, kernels.Q8_0}},
		{2, 64, 8, 8, 256, 8, []attnSeq{{20, 1}, {0, 3}}, 0, true, 0, &[2]kernels.DType{kernels.Q4_0, kernels.Q6K}},
		{2, 32, 8, 16, 256, 8, []attnSeq{{0, 2}, {7, 1}}, 0, false, 0, &[2]kernels.DType{kernels.Q8_0, kernels.Q4K}},
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range cases {
			for _, form := range []kernels.MLAForm{kernels.MLAAuto, kernels.MLANaive, kernels.MLAAbsorbed} {
				t.Run(fmt.Sprintf("%v/%d/form=%d", dt, ci, form), func(t *testing.T) {
					mlaCaseRun(t, d, ops, dt, c, form, uint64(ci))
				})
			}
		}
	}
}

func mlaCaseRun(t *testing.T, d kernels.Device, ops kernels.MLAOps, dt kernels.DType, c mlaCase, form kernels.MLAForm, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 31))
	kw, qw := c.kl+c.rope, c.heads*(c.nope+c.rope)
	g := newPaged(t, d, rng, c.seqs, c.bs)
	cache, err := d.Alloc(dt, g.slots(), kw)
	if err != nil {
		t.Fatal(err)
	}
	inv := invFreq(c.rope)
	var r *kernels.Rotary
	if c.rope > 0 {
		r = &kernels.Rotary{InvFreq: newBuf(t, d, 1, len(inv), inv).t, Dim: c.rope, Interleaved: c.inter, Scale: 1}
	}
	normV := randn(rng, c.kl)
	norm := newBuf(t, d, 1, c.kl, normV).t
	const eps = 1e-6
	var kvB *kernels.Mat
	if c.split != nil {
		kvB = SplitKVB(rng, kernels.MLAShape{Heads: c.heads, Nope: c.nope, V: c.v, KVLora: c.kl}, c.split[0], c.split[1])
	} else {
		kvB = NewMat(rng, c.wdt, c.heads*(c.nope+c.v), c.kl, 4, 8)
	}
	s := kernels.MLAShape{Heads: c.heads, Nope: c.nope, Rope: c.rope, V: c.v, KVLora: c.kl, Scale: float32(1 / math.Sqrt(float64(c.nope+c.rope))), Form: form}

	// Every position's kv_a output and its expected cache row: the cached
	// prefixes are stored by a step of their own, the step's rows by the
	// step itself, before the attention.
	want := map[int32][]float32{} // slot → cache row
	inputs := func(pre bool) (seq, pos []int32, kv []float32) {
		seq, pos = g.rows(pre)
		kv = randn(rng, len(pos)*kw)
		for i := range pos {
			row := make([]float32, kw)
			cos, sin := hostAngles(inv, int(pos[i]))
			ref.LatentRow(row, kv[i*kw:(i+1)*kw], normV, eps, cos, sin, c.inter)
			roundTo(dt, row)
			want[g.slot(int(seq[i]), int(pos[i]))] = row
		}
		return seq, pos, kv
	}
	if seq, pos, kv := inputs(true); len(pos) > 0 {
		x, p := newBuf(t, d, len(pos), kw, kv), g.paged(seq, pos)
		step(d, func() { ops.StoreLatent(cache, x.t, norm, eps, r, p) })
		compare(t, "kv after StoreLatent", x.read(t, "kv"), kv, 0, rowScale(kv))
	}
	seq, pos, kvStep := inputs(false)
	n := len(pos)
	p := g.paged(seq, pos)

	// Selections: every visible position while there are at most topK,
	// else a random ascending subset (one row in five short of topK).
	var selRows [][]int32
	var selT kernels.Tensor
	if c.topK > 0 {
		flat := make([]int32, n*c.topK)
		for i := range n {
			ln := int(pos[i]) + 1
			var idx []int32
			if ln <= c.topK {
				for q := range ln {
					idx = append(idx, int32(q))
				}
			} else {
				k := c.topK
				if i%5 == 0 {
					k -= 2
				}
				for _, q := range rng.Perm(ln)[:k] {
					idx = append(idx, int32(q))
				}
				slices.Sort(idx)
			}
			selRows = append(selRows, idx)
			row := flat[i*c.topK : (i+1)*c.topK]
			for j := range row {
				row[j] = -1
				if j < len(idx) {
					row[j] = idx[j]
				}
			}
		}
		selT = ints(t, d, n, c.topK, flat)
	}
	qv := randn(rng, n*qw)
	kvx, q, out := newBuf(t, d, n, kw, kvStep), newBuf(t, d, n, qw, qv), newBuf(t, d, n, c.heads*c.v, nil)
	step(d, func() {
		ops.StoreLatent(cache, kvx.t, norm, eps, r, p)
		ops.AttentionMLA(out.t, q.t, cache, kvB, r, p, s, selT)
	})
	checkCache(t, d, cache, want)

	// The reference over the expected cache rows.
	kvb := ref.MatF32(kvB)
	qRot := slices.Clone(qv)
	wantOut := make([]float32, n*c.heads*c.v)
	scale := make([]float64, n)
	uvAbs := make([]float64, c.heads*c.v*c.kl) // |W_UV|
	for h := range c.heads {
		for j := range c.v {
			for cc := range c.kl {
				uvAbs[(h*c.v+j)*c.kl+cc] = math.Abs(float64(kvb[(h*(c.nope+c.v)+c.nope+j)*c.kl+cc]))
			}
		}
	}
	for i := range n {
		cos, sin := hostAngles(inv, int(pos[i]))
		ref.RotateMLAQuery(qRot[i*qw:(i+1)*qw], s, cos, sin, c.inter)
		var idx []int32
		if selRows != nil {
			idx = selRows[i]
		} else {
			for q := range pos[i] + 1 {
				idx = append(idx, q)
			}
		}
		row := func(q int) []float32 { return want[g.slot(int(seq[i]), q)] }
		ref.AttentionMLA(wantOut[i*c.heads*c.v:(i+1)*c.heads*c.v], qRot[i*qw:(i+1)*qw], idx, row, kvb, s)
		latMax := make([]float64, c.kl)
		for _, q := range idx {
			for cc, x := range row(int(q))[:c.kl] {
				latMax[cc] = max(latMax[cc], math.Abs(float64(x)))
			}
		}
		for hj := range c.heads * c.v {
			var b float64
			for cc, x := range latMax {
				b += uvAbs[hj*c.kl+cc] * x
			}
			scale[i] = max(scale[i], b)
		}
	}
	compare(t, "q rotated in place", q.read(t, "q"), qRot, RowOpTol, rowScale(qRot))
	tol := MLATol
	if r, ok := d.(XRounder); ok && slices.ContainsFunc([]int{1, 2, 3, 8, 64, 512}, func(rows int) bool { return r.RoundsXToBF16(kvB, rows) }) {
		// The op multiplies kv_b_proj by as many rows as it likes (query
		// rows absorbed, or every attended latent in the naive form).
		tol = MLABF16Tol
	}
	if c.split != nil && (c.split[0].Quantized() || c.split[1].Quantized()) {
		tol = max(tol, MLASplitTol)
	}
	compare(t, "out", out.read(t, "out"), wantOut, tol, func(k int) float64 { return scale[k/(c.heads*c.v)] + 1e-30 })
}

// SplitKVB returns a kv_b_proj of shape s stored split per head
// (Mat.KVB) in the dtypes uk (W_UK_hᵀ, (KVLora, Nope) a head) and uv
// (W_UV_h, (V, KVLora)), random values, as engine/gguf's joinKVB gives a
// GGUF's attn_k_b and attn_v_b: each head's part a view of one matrix of
// all heads, Data the exact float32 rebuild (Heads·(Nope+V), KVLora).
func SplitKVB(rng *rand.Rand, s kernels.MLAShape, uk, uv kernels.DType) *kernels.Mat {
	nh, dn, dv, kl := s.Heads, s.Nope, s.V, s.KVLora
	ukAll := NewMat(rng, uk, nh*kl, dn, 4, 8) // (heads·kl, nope): W_UK_hᵀ stacked
	uvAll := NewMat(rng, uv, nh*dv, kl, 4, 8) // (heads·v, kl): W_UV_h stacked
	hs := &kernels.KVBHeads{UK: make([]*kernels.Mat, nh), UV: make([]*kernels.Mat, nh)}
	kr, vr := kl*uk.RowBytes(dn), dv*uv.RowBytes(kl)
	for h := range nh {
		hs.UK[h] = &kernels.Mat{DType: uk, Rows: kl, Cols: dn, Data: ukAll.Data[h*kr : (h+1)*kr]}
		hs.UV[h] = &kernels.Mat{DType: uv, Rows: dv, Cols: kl, Data: uvAll.Data[h*vr : (h+1)*vr]}
	}
	ukF, uvF := ref.MatF32(ukAll), ref.MatF32(uvAll)
	w := make([]float32, nh*(dn+dv)*kl)
	for h := range nh {
		base := h * (dn + dv) * kl
		for c := range kl {
			for k := range dn {
				w[base+k*kl+c] = ukF[(h*kl+c)*dn+k]
			}
		}
		copy(w[base+dn*kl:base+(dn+dv)*kl], uvF[h*dv*kl:(h+1)*dv*kl])
	}
	m := &kernels.Mat{DType: kernels.F32, Rows: nh * (dn + dv), Cols: kl, Data: make([]byte, 4*len(w)), KVB: hs}
	for i, v := range w {
		putU32(m.Data[4*i:], math.Float32bits(v))
	}
	return m
}

type indexerCase struct {
	heads, dim, rope, bs, topK int
	seqs                       []attnSeq
	inter                      bool
}

func indexerTest(t *testing.T, d kernels.Device, sp kernels.SparseOps) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range []indexerCase{
			{4, 16, 8, 4, 0, []attnSeq{{0, 1}, {7, 1}, {0, 13}}, false},
			{3, 8, 8, 8, 6, []attnSeq{{3, 1}, {0, 21}, {30, 2}}, true},
			{8, 32, 4, 16, 10, []attnSeq{{0, 40}, {50, 1}}, false},
		} {
			t.Run(fmt.Sprintf("%v/%d", dt, ci), func(t *testing.T) { indexerCaseRun(t, d, sp, dt, c, uint64(ci)) })
		}
	}
}

func indexerCaseRun(t *testing.T, d kernels.Device, sp kernels.SparseOps, dt kernels.DType, c indexerCase, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 37))
	g := newPaged(t, d, rng, c.seqs, c.bs)
	keys, err := d.Alloc(dt, g.slots(), c.dim)
	if err != nil {
		t.Fatal(err)
	}
	inv := invFreq(c.rope)
	r := &kernels.Rotary{InvFreq: newBuf(t, d, 1, len(inv), inv).t, Dim: c.rope, Interleaved: c.inter, Scale: 1}
	wv, bv := randn(rng, c.dim), randn(rng, c.dim)
	w, b := newBuf(t, d, 1, c.dim, wv).t, newBuf(t, d, 1, c.dim, bv).t
	const eps = 1e-6
	want := map[int32][]float32{}
	store := func(pre bool) (seq, pos []int32, p *kernels.Paged, run func()) {
		seq, pos = g.rows(pre)
		kv := randn(rng, len(pos)*c.dim)
		for i := range pos {
			row := make([]float32, c.dim)
			cos, sin := hostAngles(inv, int(pos[i]))
			ref.IndexKeyRow(row, kv[i*c.dim:(i+1)*c.dim], wv, bv, eps, cos, sin, c.inter)
			roundTo(dt, row)
			want[g.slot(int(seq[i]), int(pos[i]))] = row
		}
		p = g.paged(seq, pos)
		x := newBuf(t, d, len(pos), c.dim, kv)
		return seq, pos, p, func() { sp.StoreIndexKey(keys, x.t, w, b, eps, r, p) }
	}
	if _, pos, _, run := store(true); len(pos) > 0 {
		step(d, run)
	}
	seq, pos, p, run := store(false)
	n := len(pos)
	L := int(slices.Max(pos)) + 4 // columns past every row's length
	s := kernels.IndexerShape{Heads: c.heads, Dim: c.dim, Scale: float32(1 / math.Sqrt(float64(c.dim*c.heads))), TopK: c.topK}
	qv, hw := randn(rng, n*c.heads*c.dim), randn(rng, n*c.heads)
	q, hwt, sc := newBuf(t, d, n, c.heads*c.dim, qv), newBuf(t, d, n, c.heads, hw), newBuf(t, d, n, L, nil)
	step(d, func() {
		run()
		sp.IndexerScores(sc.t, q.t, hwt.t, keys, p, s)
	})
	checkCache(t, d, keys, want)
	got := sc.read(t, "scores")
	wantS := make([]float32, n*L)
	scale := make([]float64, n)
	qr := func(i int) []float32 { return qv[i*c.heads*c.dim : (i+1)*c.heads*c.dim] }
	for i := range n {
		ln := int(pos[i]) + 1
		for tt := range L {
			switch {
			case tt >= ln:
				if !math.IsInf(float64(got[i*L+tt]), -1) {
					t.Fatalf("row %d column %d past the length: %g, want −∞", i, tt, got[i*L+tt])
				}
				got[i*L+tt] = 0 // checked: compared as equal below
			case ln <= c.topK:
				wantS[i*L+tt] = 0
			default:
				k := want[g.slot(int(seq[i]), tt)]
				wantS[i*L+tt] = ref.IndexerScore(qr(i), hw[i*c.heads:(i+1)*c.heads], k, s)
				var bound float64
				for h := range c.heads {
					var dd float64
					for j, x := range qr(i)[h*c.dim : (h+1)*c.dim] {
						dd += math.Abs(float64(x * k[j]))
					}
					bound += math.Abs(float64(hw[i*c.heads+h])) * dd * float64(s.Scale)
				}
				scale[i] = max(scale[i], bound)
			}
		}
	}
	compare(t, "scores", got, wantS, IndexerTol, func(k int) float64 { return scale[k/L] + 1e-30 })
}

func topKTest(t *testing.T, d kernels.Device, sp kernels.SparseOps) {
	rng := rand.New(rand.NewPCG(41, 42))
	const n, L, k = 7, 23, 5
	sc := make([]float32, n*L)
	for i := range n {
		row := sc[i*L : (i+1)*L]
		for j := range row {
			row[j] = float32(rng.IntN(4)) // many ties
			if i%2 == 1 {
				row[j] = float32(rng.NormFloat64())
			}
		}
		// Rows whose tails are −∞ (positions past the length), one with
		// fewer finite columns than k.
		for j := L - 3*i; j < L && j >= 0; j++ {
			row[j] = float32(math.Inf(-1))
		}
	}
	for j := 3; j < L; j++ {
		sc[6*L+j] = float32(math.Inf(-1))
	}
	want := checkTopK(t, d, sp, sc, n, L, k)
	if !slices.Equal(want[6*k:], []int32{0, 1, 2, -1, -1}) {
		t.Fatalf("reference: row 6 = %v", want[6*k:])
	}
}

// checkTopK runs TopK (k) over the scores sc (n, L) and compares the
// selection with ref.SelectTopK's, which it returns.
func checkTopK(t *testing.T, d kernels.Device, sp kernels.SparseOps, sc []float32, n, L, k int) []int32 {
	t.Helper()
	s := newBuf(t, d, n, L, sc)
	sel, err := d.Alloc(kernels.I32, n, k)
	if err != nil {
		t.Fatal(err)
	}
	step(d, func() { sp.TopK(sel, s.t) })
	got := make([]int32, n*k)
	sp.ReadI32(got, sel)
	want := make([]int32, n*k)
	for i := range n {
		ref.SelectTopK(want[i*k:(i+1)*k], sc[i*L:(i+1)*L])
	}
	for i := range n {
		g, w := got[i*k:(i+1)*k], want[i*k:(i+1)*k]
		if !slices.Equal(g, w) {
			j := 0
			for g[j] == w[j] {
				j++
			}
			t.Fatalf("TopK (k %d of %d) row %d differs from column %d of the selection on:\n got %v\nwant %v", k, L, i, j, g[j:min(k, j+16)], w[j:min(k, j+16)])
		}
	}
	return want
}

// MLAWide runs the AttentionMLA cases at a real model's width
// (GLM-4.7-Flash: 20 heads of 192 + 64 query dims and 256 value dims over a
// 512-wide latent) over long contexts, dense and with a 2048-wide
// selection, and a 120-row prefill chunk beside a 601-key decode row: the
// wide-latent, split-context (both many splits and too many rows to split)
// and long-selection paths of a GPU kernel that RunOps' small cases leave
// out; then the same latent under other head counts (DeepSeek-V3's 128
// heads of 128 + 64, 8 heads with a 37-wide selection, a 12-head prefill
// chunk whose early rows leave splits empty), for kernels that tile the
// heads; and GLM-4.7-Flash's kv_b_proj stored split as a GGUF stores it. The float64 reference
// takes seconds: for devices (kernels/cuda's tests), not for RunOps.
func MLAWide(t *testing.T, d kernels.Device, ops kernels.MLAOps) {
	cases := []mlaCase{
		{20, 192, 64, 256, 512, 16, []attnSeq{{1200, 1}, {0, 3}, {700, 2}}, 0, true, kernels.BF16, nil},
		{20, 192, 64, 256, 512, 64, []attnSeq{{2200, 1}, {2080, 2}}, 2048, false, kernels.BF16, nil},
		// A prefill chunk beside a long decode row: too many blocks to
		// split the context, so each split must take all of it.
		{20, 192, 64, 256, 512, 16, []attnSeq{{0, 120}, {600, 1}}, 0, true, kernels.BF16, nil},
		{128, 128, 64, 128, 512, 16, []attnSeq{{300, 1}, {0, 2}, {77, 1}}, 0, false, kernels.BF16, nil},
		{8, 64, 64, 64, 512, 16, []attnSeq{{150, 1}, {31, 3}}, 37, true, kernels.BF16, nil},
		{12, 32, 64, 32, 512, 16, []attnSeq{{0, 40}}, 0, true, kernels.BF16, nil},
		// GLM-4.7-Flash from a GGUF: kv_b_proj's halves as stored
		// (Mat.KVB), Q8_0 both (llama-quantize's Q8_0 file), F16 W_UK
		// beside Q6_K W_UV (a K-quant file's).
		{20, 192, 64, 256, 512, 16, []attnSeq{{900, 1}, {0, 3}, {40, 1}}, 0, true, 0, &[2]kernels.DType{kernels.Q8_0, kernels.Q8_0}},
		{20, 192, 64, 256, 512, 16, []attnSeq{{0, 24}, {300, 1}}, 0, true, 0, &[2]kernels.DType{kernels.F16, kernels.Q6K}},
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range cases {
			for _, form := range []kernels.MLAForm{kernels.MLAAuto, kernels.MLANaive} {
				t.Run(fmt.Sprintf("%v/%d/form=%d", dt, ci, form), func(t *testing.T) {
					mlaCaseRun(t, d, ops, dt, c, form, uint64(100+ci))
				})
			}
		}
	}
}

// SparseWide runs IndexerScores at DeepSeek-V3.2's indexer width (64 heads
// of 128 dims) over a long context, and TopK with k = 2048 over rows of
// thousands of columns full of ties, −∞ tails and a row with fewer finite
// scores than k: the device paths RunOps' small cases leave out.
func SparseWide(t *testing.T, d kernels.Device, sp kernels.SparseOps) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(fmt.Sprintf("IndexerScores/%v", dt), func(t *testing.T) {
			indexerCaseRun(t, d, sp, dt, indexerCase{64, 128, 64, 64, 2048, []attnSeq{{3000, 1}, {0, 2}, {2500, 2}}, true}, 7)
		})
	}
	t.Run("TopK", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(43, 44))
		const n, L, k = 5, 5000, 2048
		sc := make([]float32, n*L)
		for i := range n {
			row := sc[i*L : (i+1)*L]
			for j := range row {
				switch i {
				case 0, 3: // few distinct values: long runs of ties at the cut
					row[j] = float32(rng.IntN(7)) - 3
				case 1: // −0 and +0 tie
					row[j] = float32(math.Copysign(0, float64(rng.IntN(2))-0.5)) * float32(rng.IntN(2))
				default:
					row[j] = float32(rng.NormFloat64())
				}
			}
			for j := L - 700*i; j < L; j++ {
				row[j] = float32(math.Inf(-1))
			}
		}
		for j := 1000; j < L; j++ { // row 4: fewer finite scores than k
			sc[4*L+j] = float32(math.Inf(-1))
		}
		checkTopK(t, d, sp, sc, n, L, k)
	})
}
