//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestDecSplits checks ferrite_dattn's split choice without a GPU: the
// splits cover the keys, at most decMaxSplits of a multiple of 8 keys,
// none under minKeys unless one split holds them all, and no more blocks
// than the target asks for when the keys allow more.
func TestDecSplits(t *testing.T) {
	for _, cols := range []int{1, 4, 8, 16, 64, 1024} {
		for _, keys := range []int{1, 16, 128, 256, 1024, 4096, 65536} {
			for _, minKeys := range []int{0, 8, 64} {
				s, split := decSplits(cols, keys, 132, 0, minKeys, 0)
				mk := minKeys
				if mk == 0 {
					mk = decMinKeysDef
				}
				switch {
				case s < 1 || s > decMaxSplits || split%8 != 0 || s*split < keys || (s-1)*split >= keys:
					t.Errorf("cols %d, %d keys: %d splits of %d", cols, keys, s, split)
				case s > 1 && split < mk:
					t.Errorf("cols %d, %d keys: splits of %d keys under %d", cols, keys, split, mk)
				case s > 1 && cols*(s-1) >= 2*132 && split < keys/decMaxSplits+8:
					t.Errorf("cols %d, %d keys: %d splits, %d blocks", cols, keys, s, cols*s)
				}
			}
		}
	}
	if s, split := decSplits(8, 256, 132, 0, 0, 0); s != 8 || split != 32 {
		t.Errorf("Qwen3-8B at 256 keys: %d splits of %d, want 8 of 32", s, split)
	}
	if s, split := decSplits(4, 4096, 132, 0, 64, 16); s != 16 || split != 256 {
		t.Errorf("Qwen3-30B-A3B at 4,096 keys, at most 16 splits: %d splits of %d, want 16 of 256", s, split)
	}
}

// TestDecodeAttention checks ferrite_dattn against kernels/ref.Attention:
// one row at contexts 1 to 4,096 over a block table wider than the
// context (empty splits), for group sizes 1 to 16 (4 or 8 heads a block,
// head chunks), head dims 64 and 128, F32 and BF16 caches, with the
// default splits, small splits, long multi-tile splits and the split cap;
// and the op-set attention cases (kerneltest.RunAttentionOps: PrepareQKV
// and QKVAttention equal bit for bit) in both modes.
func TestDecodeAttention(t *testing.T) {
	b := openOps(t)
	defer b.SetDecodeAttention(decAttnOff, 0, 0)
	for _, mode := range []int{decAttnPlain, decAttnQKV} {
		b.SetDecodeAttention(mode, 0, 0)
		t.Run(fmt.Sprintf("ops/mode=%d", mode), func(t *testing.T) { kerneltest.RunAttentionOps(t, b) })
	}
	// Row-exact steps: ferrite_dattn takes every row (up to decMaxRows),
	// each with the bits of the row alone.
	b.SetRowExact(true)
	for _, mode := range []int{decAttnPlain, decAttnQKV} {
		b.SetDecodeAttention(mode, 0, 0)
		t.Run(fmt.Sprintf("ops/rowexact/mode=%d", mode), func(t *testing.T) { kerneltest.RunAttentionOps(t, b) })
	}
	t.Run("rowexact/bits", func(t *testing.T) { decodeRowsExact(t, b) })
	b.SetRowExact(false)
	b.dec.g4 = true // a group of 8 in two chunks of 4 (FERRITE_CUDA_DATTN_G4)
	for _, mode := range []int{decAttnPlain, decAttnQKV} {
		b.SetDecodeAttention(mode, 0, 0)
		t.Run(fmt.Sprintf("ops/g4/mode=%d", mode), func(t *testing.T) { kerneltest.RunAttentionOps(t, b) })
	}
	for _, ctx := range []int{17, 700} {
		t.Run(fmt.Sprintf("g4/ctx=%d", ctx), func(t *testing.T) { decodeAttnCase(t, b, kernels.BF16, 32, 4, 128, ctx, 7) })
	}
	b.dec.g4 = false
	b.SetDecodeAttention(decAttnPlain, 0, 0)
	for _, c := range []struct{ heads, kvh, hd int }{{32, 8, 128}, {32, 4, 128}, {8, 8, 128}, {40, 8, 128}, {64, 4, 128}, {16, 2, 64}, {8, 4, 64}} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
			for _, ctx := range []int{1, 2, 17, 130, 256, 700, 1024, 4096} {
				for _, tune := range [][2]int{{0, 0}, {8, 0}, {200, 1}, {8, 100000}} {
					if ctx > 1024 && (c.heads != 32 || tune != [2]int{}) {
						continue
					}
					b.SetDecodeAttention(decAttnPlain, tune[0], tune[1])
					name := fmt.Sprintf("%d-%d-%d/%v/ctx=%d/keys=%d/blocks=%d", c.heads, c.kvh, c.hd, dt, ctx, tune[0], tune[1])
					t.Run(name, func(t *testing.T) { decodeAttnCase(t, b, dt, c.heads, c.kvh, c.hd, ctx, uint64(ctx)) })
				}
			}
		}
	}
}

// decodeAttnCase runs one row at position ctx−1 over a cache of ctx
// random keys and values stored through StoreKV and compares the output
// with kernels/ref.Attention over the stored (rounded) keys and values,
// within kerneltest.AttentionTol of the largest value.
func decodeAttnCase(t *testing.T, b *Backend, dt kernels.DType, heads, kvh, hd, ctx int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 41))
	const bs = 16
	kw, qw := kvh*hd, heads*hd
	need := ceilDiv(ctx, bs)
	width := 1 // the block table's width, a power of two as the engine rounds it
	for width < need {
		width *= 2
	}
	width *= 2 // and wider: the last splits are empty
	perm := rng.Perm(width + 3)
	table := make([]int32, width)
	for i := range table {
		table[i] = int32(perm[i])
	}
	kv, vv := randF32(rng, ctx*kw), randF32(rng, ctx*kw)
	pos, seq, slot := make([]int32, ctx), make([]int32, ctx), make([]int32, ctx)
	for p := range ctx {
		pos[p], slot[p] = int32(p), table[p/bs]*bs+int32(p%bs)
	}
	kc, err := b.Alloc(dt, (width+3)*bs, kw)
	if err != nil {
		t.Fatal(err)
	}
	vc, _ := b.Alloc(dt, (width+3)*bs, kw)
	bt := i32Tensor(t, b, 1, width, table)
	all := &kernels.Paged{Pos: i32Tensor(t, b, ctx, 1, pos), Seq: i32Tensor(t, b, ctx, 1, seq), Slot: i32Tensor(t, b, ctx, 1, slot),
		Blocks: bt, BlockSize: bs}
	b.BeginStep()
	b.StoreKV(kc, vc, f32Tensor(t, b, ctx, kw, kv), f32Tensor(t, b, ctx, kw, vv), all)
	b.EndStep()
	qv := randF32(rng, qw)
	q, out := f32Tensor(t, b, 1, qw, qv), f32Tensor(t, b, 1, qw, make([]float32, qw))
	p := &kernels.Paged{Pos: all.Pos.Slice(ctx-1, ctx), Seq: all.Seq.Slice(ctx-1, ctx), Slot: all.Slot.Slice(ctx-1, ctx), Blocks: bt, BlockSize: bs}
	s := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	if !b.decAttnFits(out, q, kc, vc, p, s) {
		t.Fatal("ferrite_dattn does not take the case")
	}
	b.BeginStep()
	b.Attention(out, q, kc, vc, p, s)
	b.EndStep()
	got := make([]float32, qw)
	b.ReadF32(got, out)
	if dt == kernels.BF16 {
		for i := range kv {
			kv[i], vv[i] = kernels.BF16ToF32(kernels.F32ToBF16(kv[i])), kernels.BF16ToF32(kernels.F32ToBF16(vv[i]))
		}
	}
	want := make([]float32, qw)
	ref.Attention(want, qv, ctx, func(p int) []float32 { return kv[p*kw : (p+1)*kw] },
		func(p int) []float32 { return vv[p*kw : (p+1)*kw] }, s)
	scale := 0.0
	for _, v := range vv {
		scale = max(scale, math.Abs(float64(v)))
	}
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= kerneltest.AttentionTol*scale) {
			if bad++; bad <= 3 {
				t.Errorf("out[%d] = %g, want %g", i, got[i], want[i])
			}
		}
	}
}

// decodeRowsExact checks that ferrite_dattn gives each of 5 rows of one
// sequence (a verification's, positions 300–304, the step storing their
// keys) the bits QKVAttention gives that row alone after the rows before
// it were stored.
func decodeRowsExact(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(3, 4))
	const heads, kvh, hd, bs, hist, n = 32, 8, 128, 16, 300, 5
	qw, kw := heads*hd, kvh*hd
	width := 32 // block table (power of two ≥ 305/16)
	table := make([]int32, width)
	for i := range table {
		table[i] = int32(width - 1 - i)
	}
	total := hist + n
	pos, seq, slot := make([]int32, total), make([]int32, total), make([]int32, total)
	for p := range total {
		pos[p], slot[p] = int32(p), table[p/bs]*bs+int32(p%bs)
	}
	bt := i32Tensor(t, b, 1, width, table)
	all := &kernels.Paged{Pos: i32Tensor(t, b, total, 1, pos), Seq: i32Tensor(t, b, total, 1, seq), Slot: i32Tensor(t, b, total, 1, slot),
		Blocks: bt, BlockSize: bs}
	sub := func(lo, hi int) *kernels.Paged {
		return &kernels.Paged{Pos: all.Pos.Slice(lo, hi), Seq: all.Seq.Slice(lo, hi), Slot: all.Slot.Slice(lo, hi), Blocks: bt, BlockSize: bs}
	}
	s := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: 1 / float32(math.Sqrt(hd))}
	hn := &kernels.HeadNorm{W: f32Tensor(t, b, 1, hd, randF32(rng, hd)), Eps: 1e-6}
	inv := make([]float32, hd/2)
	for i := range inv {
		inv[i] = float32(math.Pow(1e6, -float64(2*i)/hd))
	}
	r := &kernels.Rotary{InvFreq: f32Tensor(t, b, 1, hd/2, inv), Dim: hd, Scale: 1}
	hk, hv := f32Tensor(t, b, hist, kw, randF32(rng, hist*kw)), f32Tensor(t, b, hist, kw, randF32(rng, hist*kw))
	qkvv := randF32(rng, n*(qw+2*kw))
	var outs [2][]float32
	for v := range outs {
		kc, _ := b.Alloc(kernels.BF16, width*bs, kw)
		vc, _ := b.Alloc(kernels.BF16, width*bs, kw)
		b.BeginStep()
		b.StoreKV(kc, vc, hk, hv, sub(0, hist))
		b.EndStep()
		qkv := f32Tensor(t, b, n, qw+2*kw, qkvv)
		out := f32Tensor(t, b, n, qw, make([]float32, n*qw))
		if v == 0 { // all rows at once, row-exact
			b.BeginStep()
			b.QKVAttention(out, kc, vc, qkv, hn, hn, r, sub(hist, total), s)
			b.EndStep()
		} else { // row by row, as plain decoding
			b.SetRowExact(false)
			for i := range n {
				b.BeginStep()
				b.QKVAttention(out.Slice(i, i+1), kc, vc, qkv.Slice(i, i+1), hn, hn, r, sub(hist+i, hist+i+1), s)
				b.EndStep()
			}
			b.SetRowExact(true)
		}
		outs[v] = make([]float32, n*qw)
		b.ReadF32(outs[v], out)
	}
	for i := range outs[0] {
		if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
			t.Errorf("row %d: out[%d] = %g in the row-exact step, %g alone", i/qw, i%qw, outs[0][i], outs[1][i])
			return
		}
	}
}

// TestDecodeNorm checks ferrite_rmsnorm_row against kernels/ref.RMSNorm
// (within kerneltest.RowOpTol) for RMSNorm and AddRMSNorm, with and
// without the offset, the sum output and in place, at model widths and
// one it leaves to ferrite_add_rmsnorm.
func TestDecodeNorm(t *testing.T) {
	b := openOps(t)
	defer b.SetDecodeNorm(b.SetDecodeNorm(true))
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dim := range []int{4096, 2048, 5120, 16384, 40, 6} {
		for _, offset := range []bool{false, true} {
			xv, dv, wv := randF32(rng, dim), randF32(rng, dim), randF32(rng, dim)
			w := f32Tensor(t, b, 1, dim, wv)
			want := make([]float32, dim)
			// RMSNorm.
			x, y := f32Tensor(t, b, 1, dim, xv), f32Tensor(t, b, 1, dim, make([]float32, dim))
			b.BeginStep()
			b.RMSNorm(y, x, w, 1e-6, offset)
			b.EndStep()
			ref.RMSNorm(want, xv, wv, 1e-6, offset, 1)
			decCompare(t, fmt.Sprintf("RMSNorm dim %d offset %v", dim, offset), b, y, want, kerneltest.RowOpTol)
			// AddRMSNorm: res += delta.
			res, delta := f32Tensor(t, b, 1, dim, xv), f32Tensor(t, b, 1, dim, dv)
			b.BeginStep()
			b.AddRMSNorm(y, res, delta, w, 1e-5, offset)
			b.EndStep()
			sum := make([]float32, dim)
			for i := range sum {
				sum[i] = xv[i] + dv[i]
			}
			ref.RMSNorm(want, sum, wv, 1e-5, offset, 1)
			decCompare(t, fmt.Sprintf("AddRMSNorm dim %d offset %v", dim, offset), b, y, want, kerneltest.RowOpTol)
			decCompare(t, fmt.Sprintf("AddRMSNorm residual dim %d", dim), b, res, sum, 0)
			// In place, the sum to another tensor (AddNormLinearCat's norm).
			res2, sumT := f32Tensor(t, b, 1, dim, xv), f32Tensor(t, b, 1, dim, make([]float32, dim))
			b.BeginStep()
			b.norm(dptr(res2), dptr(res2), dptr(delta), dptr(w), 1, dim, 1e-5, offset, dptr(sumT))
			b.EndStep()
			decCompare(t, fmt.Sprintf("norm with sum dim %d", dim), b, res2, want, kerneltest.RowOpTol)
			decCompare(t, fmt.Sprintf("norm's sum dim %d", dim), b, sumT, sum, 0)
		}
	}
}

// TestGemvNorm checks ferrite_gemv_*_1n (SetGemvNorm): a one-row Linear
// adding into x followed by RMSNorm(x) (and by NormSwiGLULinear, which
// norms x first) gives x bit for bit as without the fusion and the norm
// within kerneltest.RowOpTol of kernels/ref.RMSNorm over that x, for F32
// and BF16 weights at Qwen3-8B's and Qwen3-30B-A3B's widths, over three
// steps (the second captured as a graph, the third replayed: the counter
// must be back at 0); and that an op in between keeps the norm apart.
func TestGemvNorm(t *testing.T) {
	b := openOps(t)
	defer b.SetGemvNorm(b.SetGemvNorm(false))
	rng := rand.New(rand.NewPCG(8, 9))
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		for _, dim := range []int{4096, 2048} {
			for _, between := range []bool{false, true} {
				w := kerneltest.NewMat(rng, dt, dim, dim, 0, 0)
				nwv, x0 := randF32(rng, dim), randF32(rng, dim)
				nw := f32Tensor(t, b, 1, dim, nwv)
				in := f32Tensor(t, b, 1, dim, randF32(rng, dim))
				var xs, hs [2][]float32
				for v, on := range []bool{false, true} {
					b.SetGemvNorm(on)
					x := f32Tensor(t, b, 1, dim, x0)
					h, other := f32Tensor(t, b, 1, dim, make([]float32, dim)), f32Tensor(t, b, 1, dim, make([]float32, dim))
					for range 3 {
						b.WriteF32(x, x0)
						b.BeginStep()
						b.Linear(x, in, w, kernels.Epilogue{Accumulate: true})
						if between {
							b.RMSNorm(other, in, nw, 1e-6, false)
						}
						b.RMSNorm(h, x, nw, 1e-6, true)
						b.EndStep()
					}
					xs[v], hs[v] = make([]float32, dim), make([]float32, dim)
					b.ReadF32(xs[v], x)
					b.ReadF32(hs[v], h)
				}
				name := fmt.Sprintf("%v/%d/between=%v", dt, dim, between)
				for i := range xs[0] {
					if math.Float32bits(xs[0][i]) != math.Float32bits(xs[1][i]) {
						t.Errorf("%s: x[%d] = %g fused, %g not", name, i, xs[1][i], xs[0][i])
						break
					}
				}
				want := make([]float32, dim)
				ref.RMSNorm(want, xs[0], nwv, 1e-6, true, 1)
				for v := range hs {
					for i := range want {
						if d := math.Abs(float64(hs[v][i]) - float64(want[i])); !(d <= kerneltest.RowOpTol*max(1, math.Abs(float64(want[i])))) {
							t.Errorf("%s fused=%v: h[%d] = %g, want %g", name, v == 1, i, hs[v][i], want[i])
							break
						}
					}
				}
			}
		}
	}
	// The model's order: Linear into x, then NormSwiGLULinear of x.
	b.SetGemvNorm(true)
	const dim, inter = 4096, 256
	w := kerneltest.NewMat(rng, kernels.BF16, dim, dim, 0, 0)
	gate, up := kerneltest.NewMat(rng, kernels.BF16, inter, dim, 0, 0), kerneltest.NewMat(rng, kernels.BF16, inter, dim, 0, 0)
	nwv, x0, inv := randF32(rng, dim), randF32(rng, dim), randF32(rng, dim)
	nw, in := f32Tensor(t, b, 1, dim, nwv), f32Tensor(t, b, 1, dim, inv)
	var gs [2][]float32
	for v, on := range []bool{false, true} {
		b.SetGemvNorm(on)
		x, g := f32Tensor(t, b, 1, dim, x0), f32Tensor(t, b, 1, inter, make([]float32, inter))
		b.BeginStep()
		b.Linear(x, in, w, kernels.Epilogue{Accumulate: true})
		b.NormSwiGLULinear(g, x, &kernels.HeadNorm{W: nw, Eps: 1e-6}, gate, up, 0)
		b.EndStep()
		gs[v] = make([]float32, inter)
		b.ReadF32(gs[v], g)
	}
	for i := range gs[0] {
		if d := math.Abs(float64(gs[0][i] - gs[1][i])); !(d <= 1e-4*max(1, math.Abs(float64(gs[0][i])))) {
			t.Errorf("NormSwiGLULinear after the fused Linear: g[%d] = %g, %g without the fusion", i, gs[1][i], gs[0][i])
			break
		}
	}
}

// TestDecodeNormRowExact checks that in a row-exact step
// (kernels.RowExact) ferrite_rmsnorm_row gives each of 4 rows the bits of
// a one-row call.
func TestDecodeNormRowExact(t *testing.T) {
	b := openOps(t)
	defer b.SetDecodeNorm(b.SetDecodeNorm(true))
	rng := rand.New(rand.NewPCG(6, 7))
	const rows, dim = 4, 4096
	xv, dv, wv := randF32(rng, rows*dim), randF32(rng, rows*dim), randF32(rng, dim)
	w := f32Tensor(t, b, 1, dim, wv)
	var ys [2][]float32
	for v := range ys {
		x, d, y := f32Tensor(t, b, rows, dim, xv), f32Tensor(t, b, rows, dim, dv), f32Tensor(t, b, rows, dim, make([]float32, rows*dim))
		if v == 0 {
			b.SetRowExact(true)
			b.BeginStep()
			b.AddRMSNorm(y, x, d, w, 1e-6, false)
			b.EndStep()
			b.SetRowExact(false)
		} else {
			for i := range rows {
				b.BeginStep()
				b.AddRMSNorm(y.Slice(i, i+1), x.Slice(i, i+1), d.Slice(i, i+1), w, 1e-6, false)
				b.EndStep()
			}
		}
		ys[v] = make([]float32, rows*dim)
		b.ReadF32(ys[v], y)
	}
	for i := range ys[0] {
		if math.Float32bits(ys[0][i]) != math.Float32bits(ys[1][i]) {
			t.Fatalf("row %d: y[%d] = %g row-exact, %g alone", i/dim, i%dim, ys[0][i], ys[1][i])
		}
	}
}

// decCompare fails t where got (read back) is off want by more than
// tol·max(1, |want|).
func decCompare(t *testing.T, what string, b *Backend, got kernels.Tensor, want []float32, tol float64) {
	t.Helper()
	g := make([]float32, len(want))
	b.ReadF32(g, got)
	bad := 0
	for i := range want {
		if d := math.Abs(float64(g[i]) - float64(want[i])); !(d <= tol*max(1, math.Abs(float64(want[i])))) {
			if bad++; bad <= 3 {
				t.Errorf("%s: [%d] = %g, want %g", what, i, g[i], want[i])
			}
		}
	}
}

// BenchmarkDecodeAttention times one-row QKVAttention (a batch-1 decode
// step's attention with its q/k/v preparation) at the Qwen3-8B (32/8
// heads of 128) and Qwen3-30B-A3B (32/4) shapes over bf16 caches of ctx
// positions (the row at ctx−1, the block table rounded up to a power of
// two as the engine does): 36 calls a step over distinct cache layers,
// the step replayed as a CUDA graph with PDL (the defaults); µs/layer is
// the step's host wall time over 36. Variants: "old" PrepareQKV and the
// split-KV kernel with its merge kernel (the default now), "fuse" the old
// QKV form (FERRITE_CUDA_FUSE=1), "dattn" PrepareQKV and ferrite_dattn,
// "dattnqkv" ferrite_dattn's QKV form, "…/kN" with N keys a split at
// least, "…/sN" with N splits at most, "…/g4" 4 query heads a block for
// the 30B's group of 8 (two chunks). The outputs of the new variants are checked against "old".
func BenchmarkDecodeAttention(b *testing.B) {
	be := openOps(b)
	const hd, bs, layers = 128, 16, 36
	defer be.SetDecodeAttention(decAttnOff, 0, 0)
	defer func() { be.dec.splits, be.dec.g4 = 0, false }()
	defer be.SetFuse(false)
	for _, sh := range []struct {
		name       string
		heads, kvh int
	}{{"8b", 32, 8}, {"30b", 32, 4}} {
		for _, ctx := range []int{128, 256, 1024, 4096} {
			width := 1
			for width*bs < ctx {
				width *= 2
			}
			table := make([]int32, width)
			for i := range table {
				table[i] = int32(i)
			}
			kw := sh.kvh * hd
			kc, vc := randCaches(b, be, layers, width*bs, kw)
			p := &kernels.Paged{Pos: i32TensorB(b, be, []int32{int32(ctx - 1)}), Seq: i32TensorB(b, be, []int32{0}),
				Slot: i32TensorB(b, be, []int32{int32(ctx - 1)}), BlockSize: bs}
			bt, err := be.Alloc(kernels.I32, 1, width)
			if err != nil {
				b.Fatal(err)
			}
			be.WriteI32(bt, table)
			p.Blocks = bt
			rng := rand.New(rand.NewPCG(uint64(ctx), 3))
			qkv := f32Tensor(b, be, 1, (sh.heads+2*sh.kvh)*hd, randF32(rng, (sh.heads+2*sh.kvh)*hd))
			wv := make([]float32, hd)
			for i := range wv {
				wv[i] = 1 + float32(i%7)*0.01
			}
			hn := &kernels.HeadNorm{W: f32Tensor(b, be, 1, hd, wv), Eps: 1e-6}
			inv := make([]float32, hd/2)
			for i := range inv {
				inv[i] = float32(math.Pow(1e6, -float64(2*i)/hd))
			}
			rope := &kernels.Rotary{InvFreq: f32Tensor(b, be, 1, hd/2, inv), Dim: hd, Scale: 1}
			shape := kernels.AttnShape{Heads: sh.heads, KVHeads: sh.kvh, HeadDim: hd, Scale: 1 / float32(math.Sqrt(hd))}
			var ref0 []float32
			for _, v := range []struct {
				name              string
				fuse              bool
				mode, min, splits int
			}{{"old", false, decAttnOff, 0, 0}, {"fuse", true, decAttnOff, 0, 0}, {"dattn", false, decAttnPlain, 0, 0},
				{"dattnqkv", false, decAttnQKV, 0, 0}, {"dattnqkv/k16", false, decAttnQKV, 16, 0},
				{"dattnqkv/k64", false, decAttnQKV, 64, 0}, {"dattnqkv/k128", false, decAttnQKV, 128, 0},
				{"dattnqkv/k64/s16", false, decAttnQKV, 64, 16}, {"dattnqkv/k64/s8", false, decAttnQKV, 64, 8},
				{"dattnqkv/g4", false, decAttnQKV, 0, -1}, {"dattnqkv/k64/g4", false, decAttnQKV, 64, -1}} {
				be.SetFuse(v.fuse)
				be.SetDecodeAttention(v.mode, v.min, 0)
				be.dec.splits, be.dec.g4 = max(v.splits, 0), v.splits < 0
				var out kernels.Tensor
				step := func() {
					be.BeginStep()
					out = be.Scratch(kernels.F32, 1, sh.heads*hd)
					for l := range layers {
						be.QKVAttention(out, kc[l], vc[l], qkv, hn, hn, rope, p, shape)
					}
					be.EndStep()
				}
				b.Run(fmt.Sprintf("%s/ctx=%d/%s", sh.name, ctx, v.name), func(b *testing.B) {
					b.ReportMetric(timeSteps(b, be, step)/layers*1e6, "us/layer")
				})
				sameOutput(b, be, out, &ref0, fmt.Sprintf("%s ctx %d %s", sh.name, ctx, v.name))
			}
		}
	}
}

// BenchmarkDecodeNorm times 72 one-row RMSNorms of 4,096 a step (a
// Qwen3-8B step's count), alternating with a 4,096 × 4,096 bf16 GEMV so
// that each norm follows a kernel as in the step, graph + PDL: "old"
// ferrite_add_rmsnorm, "row" ferrite_rmsnorm_row, "gemv" the norm in the
// GEMV's last block (ferrite_gemv_bf16_1n), "none" the GEMVs alone (the
// difference is the norms' cost). µs/norm is the step over 72.
func BenchmarkDecodeNorm(b *testing.B) {
	be := openOps(b)
	const dim, norms = 4096, 72
	defer be.SetDecodeNorm(be.SetDecodeNorm(false))
	defer be.SetGemvNorm(be.SetGemvNorm(false))
	w := &kernels.Mat{DType: kernels.BF16, Rows: dim, Cols: dim}
	buf, err := be.dev.Alloc(int64(dim) * dim * 2)
	if err == nil {
		err = be.dev.FillBF16(buf, int64(dim)*dim, 9, 1/64.0)
	}
	if err != nil {
		b.Fatal(err)
	}
	be.weights[w] = &Weight{Buf: buf, DType: kernels.BF16, Rows: dim, Cols: dim}
	rng := rand.New(rand.NewPCG(1, 2))
	nw := f32Tensor(b, be, 1, dim, randF32(rng, dim))
	x0 := randF32(rng, dim)
	for _, v := range []struct {
		name      string
		norm, row bool
		gemv      bool
	}{{"none", false, false, false}, {"old", true, false, false}, {"row", true, true, false}, {"gemv", true, true, true}} {
		be.SetDecodeNorm(v.row)
		be.SetGemvNorm(v.gemv)
		step := func() {
			be.BeginStep()
			x, h := be.Scratch(kernels.F32, 1, dim), be.Scratch(kernels.F32, 1, dim)
			be.exec(func(d *Device) error { return d.uploadL(dptr(x), f32Bytes(x0)) })
			for range norms {
				be.Linear(x, h, w, kernels.Epilogue{Accumulate: true})
				if v.norm {
					be.RMSNorm(h, x, nw, 1e-6, false)
				}
			}
			be.EndStep()
		}
		b.Run(v.name, func(b *testing.B) {
			b.ReportMetric(timeSteps(b, be, step)/norms*1e6, "us/norm")
		})
	}
}
