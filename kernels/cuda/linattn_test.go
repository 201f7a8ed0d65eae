//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The linear-attention and glm5_next kernels at the shapes the conformance
// cases (kerneltest.RunOps) do not reach: model-sized heads, long
// sequences, many pools, ties in the k-pool selection.

// maxRel returns max |got − want| / max(1, |want|) and where (+Inf for a
// NaN).
func maxRel(got, want []float32) (float64, int) {
	m, at := 0.0, -1
	for i := range want {
		d := math.Abs(float64(got[i])-float64(want[i])) / max(1, math.Abs(float64(want[i])))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		if d > m {
			m, at = d, i
		}
	}
	return m, at
}

// checkRel fails t when got is off want by more than tol·max(1, |want|),
// and logs the largest error either way.
func checkRel(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	m, at := maxRel(got, want)
	t.Logf("%s: max relative error %.3g (element %d of %d)", what, m, at, len(want))
	if !(m <= tol) {
		t.Errorf("%s: element %d = %g, want %g (relative error %.3g > %g)", what, at, got[at], want[at], m, tol)
	}
}

// deltaRun is one DeltaRule call on the GPU: rows of lens sequences in
// slots, from state sv (slots, StateWidth); it returns out and the state.
func deltaRun(t *testing.T, b *Backend, n *kernels.DeltaNet, lens []int, slots []int32, qkv, a, bv, sv []float32) (out, st []float32) {
	t.Helper()
	rows := len(qkv) / n.QKVWidth()
	x := f32Tensor(t, b, rows, n.QKVWidth(), qkv)
	at := f32Tensor(t, b, rows, len(a)/rows, a)
	bt := f32Tensor(t, b, rows, n.Heads, bv)
	o := f32Tensor(t, b, rows, n.Heads*n.DV, make([]float32, rows*n.Heads*n.DV))
	state := f32Tensor(t, b, len(sv)/n.StateWidth(), n.StateWidth(), sv)
	start := []int32{0}
	for _, l := range lens {
		start = append(start, start[len(start)-1]+int32(l))
	}
	r := &kernels.Recurrent{Start: i32Tensor(t, b, len(start), 1, start), Slot: i32Tensor(t, b, len(slots), 1, slots)}
	b.BeginStep()
	b.DeltaRule(o, x, at, bt, state, r, n)
	b.EndStep()
	out, st = make([]float32, rows*n.Heads*n.DV), make([]float32, len(sv))
	b.ReadF32(out, o)
	b.ReadF32(st, state)
	for _, v := range []kernels.Tensor{x, at, bt, o, state, r.Start, r.Slot} {
		b.Free(v)
	}
	return out, st
}

// deltaCase is one random DeltaRule call: lens sequences in slots in
// reverse order, A_log drawn from [0, alogMax) (larger: faster decays), the
// state scaled by 0.3; newDeltaCase also uploads n's ALog and DtBias.
type deltaCase struct {
	rows, gw, w, sw int
	slots           []int32
	aLog, dtB       []float32
	qkv, a, bv, sv  []float32
}

func newDeltaCase(t *testing.T, b *Backend, rng *rand.Rand, n *kernels.DeltaNet, lens []int, alogMax float64) *deltaCase {
	c := &deltaCase{gw: n.Heads, w: n.QKVWidth(), sw: n.StateWidth()}
	if n.PerChannel {
		c.gw *= n.DK
	}
	c.aLog, c.dtB = make([]float32, n.Heads), randF32(rng, c.gw)
	for j := range c.aLog {
		c.aLog[j] = float32(rng.Float64() * alogMax)
	}
	n.ALog, n.DtBias = f32Tensor(t, b, 1, n.Heads, c.aLog), f32Tensor(t, b, 1, c.gw, c.dtB)
	for _, l := range lens {
		c.rows += l
	}
	c.slots = make([]int32, len(lens))
	for j := range c.slots {
		c.slots[j] = int32(len(c.slots) - 1 - j)
	}
	c.qkv, c.a, c.bv = randF32(rng, c.rows*c.w), randF32(rng, c.rows*c.gw), randF32(rng, c.rows*n.Heads)
	c.sv = randF32(rng, len(c.slots)*c.sw)
	for j := range c.sv {
		c.sv[j] *= 0.3
	}
	return c
}

// TestDeltaRuleShapes checks the delta rule at model shapes (Qwen3-Next's
// Gated DeltaNet, ferrite-tiny's KDA, a key head of 200 over partial lanes
// and a partial column tile) against the recurrent reference, and that a
// sequence of up to 8 rows gives the same bits in one call as row by row
// (the token-by-token form speculative verification relies on).
func TestDeltaRuleShapes(t *testing.T) {
	b := openOps(t)
	for i, c := range []struct {
		name string
		n    kernels.DeltaNet
		lens []int
	}{
		{"gdn-qwen3-next", kernels.DeltaNet{Heads: 32, KeyHeads: 16, DK: 128, DV: 128}, []int{1, 5, 8, 40}},
		{"kda-ferrite-tiny", kernels.DeltaNet{Heads: 5, KeyHeads: 5, DK: 64, DV: 64, PerChannel: true, LowerBound: -5}, []int{1, 8, 9, 70}},
		{"kda-softplus-wide", kernels.DeltaNet{Heads: 2, KeyHeads: 1, DK: 200, DV: 20, PerChannel: true}, []int{3, 12}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 31))
			n := c.n
			d := newDeltaCase(t, b, rng, &n, c.lens, 1)
			rows, gw, w, sw, slots := d.rows, d.gw, d.w, d.sw, d.slots
			qkv, a, bv, sv, aLog, dtB := d.qkv, d.a, d.bv, d.sv, d.aLog, d.dtB
			got, gotSt := deltaRun(t, b, &n, c.lens, slots, qkv, a, bv, sv)

			want, wantSt := make([]float32, rows*n.Heads*n.DV), slices.Clone(sv)
			row, ow := 0, n.Heads*n.DV
			for j, l := range c.lens {
				s := wantSt[int(slots[j])*sw : int(slots[j]+1)*sw]
				ref.DeltaRule(want[row*ow:], qkv[row*w:], a[row*gw:], bv[row*n.Heads:], s, l, &n, aLog, dtB)
				row += l
			}
			checkRel(t, "out", got, want, kerneltest.DeltaRuleTol)
			checkRel(t, "state", gotSt, wantSt, kerneltest.DeltaRuleTol)

			// Row by row, each sequence of ≤ 8 rows alone from the same state:
			// bit for bit what the batched call gave.
			row = 0
			for j, l := range c.lens {
				if l > 8 {
					row += l
					continue
				}
				st := slices.Clone(sv)
				for k := range l {
					r := row + k
					o, s := deltaRun(t, b, &n, []int{1}, slots[j:j+1], qkv[r*w:(r+1)*w], a[r*gw:(r+1)*gw], bv[r*n.Heads:(r+1)*n.Heads], st)
					st = s
					for e, v := range o {
						if math.Float32bits(v) != math.Float32bits(got[r*ow+e]) {
							t.Fatalf("sequence %d row %d: output %d = %g alone, %g in the batch", j, k, e, v, got[r*ow+e])
						}
					}
				}
				sl := int(slots[j]) * sw
				for e := range sw {
					if math.Float32bits(st[sl+e]) != math.Float32bits(gotSt[sl+e]) {
						t.Fatalf("sequence %d: state %d = %g row by row, %g in the batch", j, e, st[sl+e], gotSt[sl+e])
					}
				}
				row += l
			}
		})
	}
}

// TestShortConvLong runs the convolution in place over a long sequence and
// several channel blocks against the reference.
func TestShortConvLong(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(3, 32))
	const C, K = 300, 4
	lens, slots := []int{1, 100, 7}, []int32{2, 0, 1}
	rows := 108
	xv, wv, sv := randF32(rng, rows*C), randF32(rng, C*K), randF32(rng, 3*(K-1)*C)
	x, w, st := f32Tensor(t, b, rows, C, xv), f32Tensor(t, b, C, K, wv), f32Tensor(t, b, 3, (K-1)*C, sv)
	r := &kernels.Recurrent{Start: i32Tensor(t, b, 4, 1, []int32{0, 1, 101, 108}), Slot: i32Tensor(t, b, 3, 1, slots)}
	b.BeginStep()
	b.ShortConv(x, x, w, st, r)
	b.EndStep()
	got, gotSt := make([]float32, rows*C), make([]float32, len(sv))
	b.ReadF32(got, x)
	b.ReadF32(gotSt, st)
	want, wantSt := make([]float32, rows*C), slices.Clone(sv)
	row, sw := 0, (K-1)*C
	for j, l := range lens {
		ref.ShortConv(want[row*C:], xv[row*C:], wv, wantSt[int(slots[j])*sw:int(slots[j]+1)*sw], l, C, K)
		row += l
	}
	checkRel(t, "y", got, want, kerneltest.RowOpTol)
	for i := range wantSt {
		if math.Float32bits(gotSt[i]) != math.Float32bits(wantSt[i]) {
			t.Fatalf("state %d = %g, want %g (raw inputs, exact)", i, gotSt[i], wantSt[i])
		}
	}
}

// TestKPoolSelectTies runs the selection kernel on scores drawn from a few
// values (ties everywhere, −0 among them) for rows with fewer, as many
// and many more complete pools than Keep, with and without the tail,
// against kernels/ref.SelectTopK and KPoolTokens.
func TestKPoolSelectTies(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(5, 33))
	values := []float32{-1, float32(math.Copysign(0, -1)), 0, 0.5, 1, 2}
	for _, tail := range []bool{true, false} {
		kp := &kernels.KPool{Size: 4, Keep: 16, Tail: tail}
		const L = 700
		positions := []int32{0, 2, 3, 40, 63, 64, 67, 300, 1030, 2799}
		n, sw := len(positions), kp.SelWidth()
		sv := make([]float32, n*L)
		for i := range sv {
			sv[i] = values[rng.IntN(len(values))]
		}
		scores, pos := f32Tensor(t, b, n, L, sv), i32Tensor(t, b, n, 1, positions)
		sel, err := b.Alloc(kernels.I32, n, sw)
		if err != nil {
			t.Fatal(err)
		}
		b.BeginStep()
		b.kpoolSelect(sel, scores, pos, kp)
		b.EndStep()
		got := make([]int32, n*sw)
		b.ReadI32(got, sel)
		for i, p := range positions {
			cand := (int(p) + 1) / kp.Size
			pools := make([]int32, kp.Keep)
			ref.SelectTopK(pools, sv[i*L:i*L+cand])
			want := make([]int32, sw)
			ref.KPoolTokens(want, pools, int(p), kp)
			if !slices.Equal(got[i*sw:(i+1)*sw], want) {
				t.Errorf("tail %v, position %d (%d pools): selection\n%v\nwant\n%v", tail, p, cand, got[i*sw:(i+1)*sw], want)
			}
		}
	}
}

// TestKPoolLong stores a 2100-token sequence's k-pool rows (525 pools, a
// shuffled block table) and selects for its last rows: the cache against
// the reference rows and pooled keys, the selection against
// kernels/ref.KPoolSelect (several score tiles and compaction rounds).
func TestKPoolLong(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(7, 34))
	const T, bs, size, dim, heads = 2100, 16, 4, 32, 4
	kp := &kernels.KPool{Size: size, Dim: dim, Heads: heads, Keep: 16, Tail: true, Scale: float32(1 / math.Sqrt(dim*heads)), NormEps: 1e-6}
	apeV, nw, nb := randF32(rng, size*dim), randF32(rng, dim), randF32(rng, dim)
	kp.Ape, kp.NormW, kp.NormB = f32Tensor(t, b, size, dim, apeV), f32Tensor(t, b, 1, dim, nw), f32Tensor(t, b, 1, dim, nb)
	nblocks := (T + bs - 1) / bs
	table := make([]int32, nblocks)
	for i, v := range rng.Perm(nblocks) {
		table[i] = int32(v)
	}
	slotOf := func(p int) int32 { return table[p/bs]*bs + int32(p%bs) }
	kv, gv := randF32(rng, T*dim), randF32(rng, T*dim)
	pos, seq, slot := make([]int32, T), make([]int32, T), make([]int32, T)
	for p := range T {
		pos[p], slot[p] = int32(p), slotOf(p)
	}
	cache, err := b.Alloc(kernels.F32, nblocks*bs, 2*dim)
	if err != nil {
		t.Fatal(err)
	}
	paged := func(lo, hi int) *kernels.Paged {
		return &kernels.Paged{Pos: i32Tensor(t, b, hi-lo, 1, pos[lo:hi]), Seq: i32Tensor(t, b, hi-lo, 1, seq[lo:hi]),
			Slot: i32Tensor(t, b, hi-lo, 1, slot[lo:hi]), Blocks: i32Tensor(t, b, 1, nblocks, table), BlockSize: bs}
	}
	// The prompt in two steps (the second completes a pool the first began).
	const split, last = 1001, 6
	for _, r := range [][2]int{{0, split}, {split, T}} {
		k, g := f32Tensor(t, b, r[1]-r[0], dim, kv[r[0]*dim:r[1]*dim]), f32Tensor(t, b, r[1]-r[0], dim, gv[r[0]*dim:r[1]*dim])
		b.BeginStep()
		b.StoreKPool(cache, k, g, paged(r[0], r[1]), kp)
		b.EndStep()
	}
	raw := make([][]float32, T)
	for p := range T {
		raw[p] = make([]float32, 2*dim)
		ref.LayerNorm(raw[p][:dim], kv[p*dim:(p+1)*dim], nw, nb, kp.NormEps, 1)
		copy(raw[p][dim:], gv[p*dim:(p+1)*dim])
	}
	keys := make([][]float32, T/size)
	prob := make([]float64, size)
	for P := range keys {
		keys[P] = make([]float32, dim)
		ref.KPoolKey(keys[P], raw[P*size:(P+1)*size], apeV, prob)
	}
	all := make([]float32, cache.Elems())
	b.ReadF32(all, cache)
	got, want := make([]float32, 0, T*2*dim), make([]float32, 0, T*2*dim)
	for p := range T {
		w := slices.Clone(raw[p])
		if p%size == size-1 {
			copy(w, keys[p/size])
		}
		s := int(slotOf(p))
		got, want = append(got, all[s*2*dim:(s+1)*2*dim]...), append(want, w...)
	}
	checkRel(t, "cache", got, want, kerneltest.KPoolTol)

	qv, wv := randF32(rng, last*heads*dim), randF32(rng, last*heads)
	q, w := f32Tensor(t, b, last, heads*dim, qv), f32Tensor(t, b, last, heads, wv)
	sw := kp.SelWidth()
	sel, err := b.Alloc(kernels.I32, last, sw)
	if err != nil {
		t.Fatal(err)
	}
	// In one round, then with the score scratch holding two rows (three
	// rounds).
	pg := paged(T-last, T)
	for _, elems := range []int{kpoolScoreElems, 2 * (nblocks * bs / size)} {
		defer func(e int) { kpoolScoreElems = e }(kpoolScoreElems)
		kpoolScoreElems = elems
		b.BeginStep()
		b.KPoolSelect(sel, q, w, cache, pg, kp)
		b.EndStep()
		gotSel := make([]int32, last*sw)
		b.ReadI32(gotSel, sel)
		for i := range last {
			p := T - last + i
			wantSel := make([]int32, sw)
			ref.KPoolSelect(wantSel, qv[i*heads*dim:(i+1)*heads*dim], wv[i*heads:(i+1)*heads], p, func(P int) []float32 { return keys[P] },
				kp, make([]float32, (p+1)/size), make([]int32, kp.Keep))
			if !slices.Equal(gotSel[i*sw:(i+1)*sw], wantSel) {
				t.Errorf("score scratch of %d: position %d: selection\n%v\nwant\n%v", elems, p, gotSel[i*sw:(i+1)*sw], wantSel)
			}
		}
	}
}

// TestHyperShapes runs HyperPre at glm5_next's stream count and widths with
// Sinkhorn's 20 rounds against the reference, for one row and for 37 (the
// mix kernel's blocks of 4 rows, the last one partial).
func TestHyperShapes(t *testing.T) {
	b := openOps(t)
	for _, n := range []int{1, 37} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), 35))
			const hc, hidden = 4, 320
			m, w, cw := (2+hc)*hc, hc*hidden, hc+hc*hc
			xv, bv := randF32(rng, n*w), randF32(rng, m)
			h := &kernels.Hyper{Fn: kerneltest.NewMat(rng, kernels.BF16, m, w, 0, 0), Base: f32Tensor(t, b, 1, m, bv),
				Scale: [3]float32{0.7, 0.9, 2}, Streams: hc, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
			X, x, coef := f32Tensor(t, b, n, w, xv), f32Tensor(t, b, n, hidden, make([]float32, n*hidden)), f32Tensor(t, b, n, cw, make([]float32, n*cw))
			b.BeginStep()
			b.HyperPre(x, coef, X, h)
			b.EndStep()
			gotX, gotC := make([]float32, n*hidden), make([]float32, n*cw)
			b.ReadF32(gotX, x)
			b.ReadF32(gotC, coef)
			wantX, wantC := make([]float32, n*hidden), make([]float32, n*cw)
			ref.Hyper(wantX, wantC, xv, bv, h, n)
			checkRel(t, "x", gotX, wantX, kerneltest.HyperTol)
			checkRel(t, "coef", gotC, wantC, kerneltest.HyperTol)
		})
	}
}

// TestShortConvRows runs ShortConv's every-row-at-once kernels (convRows:
// prompts) in place and out of place, over sequences shorter than the
// kernel's history, of one row, crossing and filling its runs of 16 rows,
// against the row-by-row kernel (FERRITE_CUDA_CONV_ROWS=0) bit for bit,
// outputs and states.
func TestShortConvRows(t *testing.T) {
	b := openOps(t)
	for i, c := range []struct {
		C, K int
		lens []int
	}{
		{300, 4, []int{1, 100, 2, 33, 16}},
		{8192, 4, []int{512}},
		{64, 2, []int{17, 1, 40}},
		{130, 8, []int{3, 60}},
	} {
		for _, inPlace := range []bool{false, true} {
			t.Run(fmt.Sprintf("C=%d/K=%d/lens=%v/inplace=%v", c.C, c.K, c.lens, inPlace), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 33))
				C, K, seqs := c.C, c.K, len(c.lens)
				start, slots, rows := []int32{0}, make([]int32, seqs), 0
				for j, l := range c.lens {
					rows += l
					start = append(start, int32(rows))
					slots[j] = int32(seqs - 1 - j)
				}
				if !b.convRows(rows, seqs, false) {
					t.Fatalf("%d rows of %d sequences: not the every-row kernels", rows, seqs)
				}
				xv, wv, sv := randF32(rng, rows*C), randF32(rng, C*K), randF32(rng, seqs*(K-1)*C)
				run := func(rowwise bool) (y, st []float32) {
					b.noConvRows = rowwise
					defer func() { b.noConvRows = false }()
					x, w := f32Tensor(t, b, rows, C, xv), f32Tensor(t, b, C, K, wv)
					s := f32Tensor(t, b, seqs, (K-1)*C, sv)
					dst := x
					if !inPlace {
						dst = f32Tensor(t, b, rows, C, make([]float32, rows*C))
					}
					r := &kernels.Recurrent{Start: i32Tensor(t, b, seqs+1, 1, start), Slot: i32Tensor(t, b, seqs, 1, slots)}
					b.BeginStep()
					b.ShortConv(dst, x, w, s, r)
					b.EndStep()
					y, st = make([]float32, rows*C), make([]float32, len(sv))
					b.ReadF32(y, dst)
					b.ReadF32(st, s)
					if !inPlace {
						b.Free(dst)
					}
					for _, v := range []kernels.Tensor{x, w, s, r.Start, r.Slot} {
						b.Free(v)
					}
					return y, st
				}
				got, gotSt := run(false)
				want, wantSt := run(true)
				for e := range want {
					if math.Float32bits(got[e]) != math.Float32bits(want[e]) {
						t.Fatalf("y[%d] = %g, the row-by-row kernel %g", e, got[e], want[e])
					}
				}
				for e := range wantSt {
					if math.Float32bits(gotSt[e]) != math.Float32bits(wantSt[e]) {
						t.Fatalf("state %d = %g, the row-by-row kernel %g", e, gotSt[e], wantSt[e])
					}
				}
			})
		}
	}
}

// TestConvRows checks which ShortConv calls run every row at once (no GPU
// needed).
func TestConvRows(t *testing.T) {
	b := &Backend{}
	for _, c := range []struct {
		rows, seqs int
		rec, off   bool
		want       bool
	}{
		{2048, 1, false, false, true},
		{9, 1, false, false, true},
		{8, 1, false, false, false},   // a verification's rows: row by row
		{64, 64, false, false, false}, // a decode batch
		{2048, 1, true, false, false}, // states recorded
		{2048, 1, false, true, false}, // FERRITE_CUDA_CONV_ROWS=0
	} {
		b.noConvRows = c.off
		if got := b.convRows(c.rows, c.seqs, c.rec); got != c.want {
			t.Errorf("%+v: convRows %v, want %v", c, got, c.want)
		}
	}
}

// TestDeltaChunked checks which DeltaRule calls take the chunked form
// (no GPU needed).
func TestDeltaChunked(t *testing.T) {
	b := &Backend{dev: &Device{SmemOptIn: 227 << 10}, deltaChunk: true}
	for _, c := range []struct {
		rows, seqs, dk int
		rec, off       bool
		want           int
	}{
		{4096, 1, 128, false, false, 2}, // a prompt at Qwen3-Next's heads
		{9, 1, 64, false, false, 1},     // the shortest sequence the chunked form takes
		{100, 3, 32, false, false, 0},
		{8, 1, 128, false, false, -1},   // token by token: the rounded form
		{64, 64, 128, false, false, -1}, // a decode batch: a row a sequence
		{71, 64, 128, false, false, -1}, // no sequence can pass 8 rows
		{72, 64, 128, false, false, 2},
		{4096, 1, 128, true, false, -1},  // states recorded after each row
		{4096, 1, 200, false, false, -1}, // key heads above 128
		{4096, 1, 30, false, false, -1},  // not a multiple of 4
		{4096, 1, 128, false, true, -1},  // without FERRITE_CUDA_DELTA_CHUNK=1
	} {
		b.deltaChunk = !c.off
		if got := b.deltaChunked(c.rows, c.seqs, c.dk, c.dk == 64, c.rec); got != c.want {
			t.Errorf("%+v: deltaChunked %d, want %d", c, got, c.want)
		}
	}
	b.deltaChunk = true
	for _, pc := range []bool{false, true} {
		if b.dev.SmemOptIn = deltaChunkSmem(128, pc) - 1; b.deltaChunked(4096, 1, 128, pc, false) != -1 {
			t.Errorf("per channel %v: the chunked kernel chosen where its shared memory does not fit", pc)
		}
		if got := deltaChunkSmem(128, pc); got > 227<<10 {
			t.Errorf("deltaChunkSmem(128, %v) = %d, more than an H100/H200 block's 227 KiB", pc, got)
		}
	}
}

// TestDeltaRuleChunkedShapes runs the delta rule's chunked form (sequences
// of more than 8 rows, 32 rows a chunk: whole and partial chunks, partial
// column tiles, per-head and per-channel decays, decays that vanish within
// a chunk) against kernels/ref.DeltaRule (and DeltaRuleChunked where that
// is quick), and against the row-by-row kernel (FERRITE_CUDA_DELTA_CHUNK=0),
// whose float64 form differs from it only in the order of float64 sums.
func TestDeltaRuleChunkedShapes(t *testing.T) {
	b := openOps(t)
	for i, c := range []struct {
		name    string
		n       kernels.DeltaNet
		lens    []int
		alogMax float64 // A_log up to this: larger, faster decays
	}{
		{"gdn-qwen3-next", kernels.DeltaNet{Heads: 32, KeyHeads: 16, DK: 128, DV: 128}, []int{1, 300, 5, 33, 64}, 1},
		{"kda-ferrite-tiny", kernels.DeltaNet{Heads: 5, KeyHeads: 5, DK: 64, DV: 64, PerChannel: true, LowerBound: -5}, []int{9, 100, 2}, 1},
		{"gdn-small-partial", kernels.DeltaNet{Heads: 4, KeyHeads: 2, DK: 32, DV: 40}, []int{70, 8, 41}, 1},
		{"gdn-vanishing", kernels.DeltaNet{Heads: 2, KeyHeads: 2, DK: 64, DV: 64}, []int{129}, 6},
		{"kda-softplus", kernels.DeltaNet{Heads: 3, KeyHeads: 1, DK: 128, DV: 96, PerChannel: true}, []int{50}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 77))
			n := c.n
			d := newDeltaCase(t, b, rng, &n, c.lens, c.alogMax)
			rows, gw, w, sw, slots := d.rows, d.gw, d.w, d.sw, d.slots
			qkv, a, bv, sv, aLog, dtB := d.qkv, d.a, d.bv, d.sv, d.aLog, d.dtB
			b.deltaChunk = true
			defer func() { b.deltaChunk = false }()
			if b.deltaChunked(rows, len(c.lens), n.DK, n.PerChannel, false) < 0 {
				t.Fatalf("%d rows of %d sequences, key heads of %d: not the chunked form", rows, len(c.lens), n.DK)
			}
			got, gotSt := deltaRun(t, b, &n, c.lens, slots, qkv, a, bv, sv)
			b.deltaChunk = false
			row, rowSt := deltaRun(t, b, &n, c.lens, slots, qkv, a, bv, sv)

			// The recurrent reference rounds the state after every row, the
			// chunked forms once: kerneltest.DeltaRuleTol covers the drift.
			// Where it is quick (small heads), the chunked reference too, in
			// chunks of 16: both sides float64 throughout, rounded once, so a
			// few float32 ulps apart (q, k and the gates are formed on each side).
			for _, chunked := range []bool{false, true} {
				if chunked && n.Heads*n.DK*n.DV > 1<<16 {
					continue
				}
				want, wantSt := make([]float32, rows*n.Heads*n.DV), slices.Clone(sv)
				r0, ow := 0, n.Heads*n.DV
				for j, l := range c.lens {
					s := wantSt[int(slots[j])*sw : int(slots[j]+1)*sw]
					if chunked && l > deltaRecurrentMax {
						ref.DeltaRuleChunked(want[r0*ow:], qkv[r0*w:], a[r0*gw:], bv[r0*n.Heads:], s, l, 16, &n, aLog, dtB)
					} else {
						ref.DeltaRule(want[r0*ow:], qkv[r0*w:], a[r0*gw:], bv[r0*n.Heads:], s, l, &n, aLog, dtB)
					}
					r0 += l
				}
				tol, what := kerneltest.DeltaRuleTol, "the recurrent reference"
				if chunked {
					tol, what = 1e-5, "the chunked reference"
				}
				checkRel(t, "out against "+what, got, want, tol)
				checkRel(t, "state against "+what, gotSt, wantSt, tol)
			}
			checkRel(t, "out against the row-by-row kernel", got, row, 1e-6)
			checkRel(t, "state against the row-by-row kernel", gotSt, rowSt, 1e-6)
		})
	}
}

// BenchmarkLinearAttention times one Gated DeltaNet layer's linear-attention
// ops at Qwen3-Next-80B-A3B's shape (32 value heads, 16 key heads, head
// size 128, a 4-tap convolution over the 8192 q/k/v channels): ShortConv,
// DeltaRule and GatedRMSNorm, for decode batches (one row per sequence: the
// token-by-token form) and one long prefill sequence (the float64 form).
// ms/call is host wall time from BeginStep to the end of EndStep.
func BenchmarkLinearAttention(b *testing.B) {
	be := openOps(b)
	const H, Hk, dk, dv, K = 32, 16, 128, 128, 4
	n := kernels.DeltaNet{Heads: H, KeyHeads: Hk, DK: dk, DV: dv}
	C := n.QKVWidth()
	tensor := func(rows, cols int, v float32) kernels.Tensor {
		t, err := be.Alloc(kernels.F32, rows, cols)
		if err != nil {
			b.Fatal(err)
		}
		s := make([]float32, rows*cols)
		for i := range s {
			s[i] = v * float32(math.Sin(float64(i)*0.37))
		}
		be.WriteF32(t, s)
		return t
	}
	n.ALog, n.DtBias = tensor(1, H, 0.5), tensor(1, H, 0.5)
	convW, normW := tensor(C, K, 0.5), tensor(1, dv, 1)
	for _, c := range []struct {
		name       string
		seqs, rows int  // sequences, rows each
		chunk      bool // FERRITE_CUDA_DELTA_CHUNK=1: the chunked delta rule
		rowConv    bool // FERRITE_CUDA_CONV_ROWS=0: ShortConv row by row
	}{{"decode/seqs=1", 1, 1, false, false}, {"decode/seqs=64", 64, 1, false, false},
		{"prefill/rows=512", 1, 512, false, false}, {"prefill/rows=512/chunk", 1, 512, true, false},
		{"prefill/rows=512/rowconv", 1, 512, false, true}, {"prefill/rows=4096", 1, 4096, false, false},
		{"prefill/rows=4096/chunk", 1, 4096, true, false}, {"prefill/rows=4096/rowconv", 1, 4096, false, true},
		{"prefill/seqs=8/rows=512", 8, 512, false, false}, {"prefill/seqs=8/rows=512/chunk", 8, 512, true, false}} {
		b.Run(c.name, func(b *testing.B) {
			be.deltaChunk, be.noConvRows = c.chunk, c.rowConv
			defer func() { be.deltaChunk, be.noConvRows = false, false }()
			N := c.seqs * c.rows
			x, a, bt := tensor(N, C, 1), tensor(N, H, 1), tensor(N, H, 1)
			out, z := tensor(N, H*dv, 0), tensor(N, H*dv, 1)
			conv, err := be.Alloc(kernels.F32, c.seqs, (K-1)*C)
			if err != nil {
				b.Fatal(err)
			}
			state, err := be.Alloc(kernels.F32, c.seqs, n.StateWidth())
			if err != nil {
				b.Fatal(err)
			}
			start, slot := make([]int32, c.seqs+1), make([]int32, c.seqs)
			for s := range slot {
				start[s+1], slot[s] = int32((s+1)*c.rows), int32(s)
			}
			r := &kernels.Recurrent{Start: i32TensorB(b, be, start), Slot: i32TensorB(b, be, slot)}
			step := func() {
				be.BeginStep()
				y := be.Scratch(kernels.F32, N, C)
				be.ShortConv(y, x, convW, conv, r)
				be.DeltaRule(out, y, a, bt, state, r, &n)
				be.GatedRMSNorm(out.Reshape(N*H, dv), out.Reshape(N*H, dv), z.Reshape(N*H, dv), normW, 1e-6, kernels.GateSiLU)
				be.EndStep()
			}
			step()
			b.ResetTimer()
			t0 := time.Now()
			for range b.N {
				step()
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1e3/float64(b.N), "ms/call")
			if err := be.Err(); err != nil {
				b.Fatal(err)
			}
			for _, t := range []kernels.Tensor{x, a, bt, out, z, conv, state, r.Start, r.Slot} {
				be.Free(t)
			}
		})
	}
}

// i32TensorB uploads an I32 column for a benchmark.
func i32TensorB(b *testing.B, be *Backend, v []int32) kernels.Tensor {
	t, err := be.Alloc(kernels.I32, len(v), 1)
	if err != nil {
		b.Fatal(err)
	}
	be.WriteI32(t, v)
	return t
}

// TestExpertsClampPaths checks ExpertsClamp against kernels/ref.ExpertsClamp
// for token counts on each of Experts' paths (one token, a few, many), with
// bf16 experts whose widths every kernel takes (the many-token one runs on
// tensor cores with x split into two bf16 terms), within
// kerneltest.ExpertsTol of max |y|; the clamp must change the result.
func TestExpertsClampPaths(t *testing.T) {
	b := openOps(t)
	const e, k, hidden, inter, limit = 6, 2, 128, 64, 0.5
	rng := rand.New(rand.NewPCG(41, 42))
	ex := randExperts(rng, e, hidden, inter)
	for _, n := range []int{1, 3, 9, 70} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			checkClampMoves(t, b, rng, ex, n, k, hidden, limit)
		})
	}
}

// checkClampMoves runs ExpertsClamp on n random tokens of k experts each
// (two distinct ids a token, k = 2) and checks it against
// kernels/ref.ExpertsClamp within kerneltest.ExpertsTol of max |y|; the
// clamp must move the result by at least 1 % of max |y|.
func checkClampMoves(t *testing.T, b *Backend, rng *rand.Rand, ex []kernels.Expert, n, k, hidden int, limit float32) {
	t.Helper()
	e := len(ex)
	xv, wv := randF32(rng, n*hidden), randF32(rng, n*k) // gate and up ~ N(0, 1.1): many beyond the limit
	ids := make([]int32, n*k)
	for i := range n {
		a := rng.IntN(e)
		ids[i*k], ids[i*k+1] = int32(a), int32((a+1+rng.IntN(e-1))%e)
	}
	x, w, it := f32Tensor(t, b, n, hidden, xv), f32Tensor(t, b, n, k, wv), i32Tensor(t, b, n, k, ids)
	y := f32Tensor(t, b, n, hidden, make([]float32, n*hidden))
	b.BeginStep()
	b.ExpertsClamp(y, x, it, w, ex, limit)
	b.EndStep()
	got := make([]float32, n*hidden)
	b.ReadF32(got, y)
	want, plain := make([]float32, n*hidden), make([]float32, n*hidden)
	ref.ExpertsClamp(want, xv, ids, wv, n, ex, limit)
	ref.Experts(plain, xv, ids, wv, n, ex)
	m, d, p := 0.0, 0.0, 0.0
	for i := range want {
		m = max(m, math.Abs(float64(want[i])))
		d = max(d, math.Abs(float64(got[i])-float64(want[i])))
		p = max(p, math.Abs(float64(plain[i])-float64(want[i])))
	}
	t.Logf("max |y| %.3g, max error %.3g (%.3g of it), the clamp moves y by %.3g", m, d, d/m, p)
	if !(d <= kerneltest.ExpertsTol*m) {
		t.Errorf("max error %.3g > %.3g", d, kerneltest.ExpertsTol*m)
	}
	if p < 1e-2*m {
		t.Errorf("the clamp at %g moves y by only %.3g: the case does not test it", limit, p)
	}
}

// randExperts returns e random bf16 experts of (inter, hidden), fused
// gate/up for the even ones, separate for the odd.
func randExperts(rng *rand.Rand, e, hidden, inter int) []kernels.Expert {
	ex := make([]kernels.Expert, e)
	for i := range ex {
		if i%2 == 0 {
			ex[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.BF16, 2*inter, hidden, 0, 0)}
		} else {
			ex[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0),
				Up: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)}
		}
		ex[i].Down = kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	}
	return ex
}
