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

// Per-op tolerances against the kernels/ref golden references, as
// |got − want| ≤ tol·scale, with scale stated per op:
const (
	// LinearTol: scale is Σₖ|x·w| (+|bias|, +|dst| when accumulating), as
	// for MatMul.
	LinearTol = Tol
	// RowOpTol (SwiGLU, norms, RoPE, Route weights): scale is max(1, |want|).
	// Element-wise float32 math differs from the reference by a few ulp at
	// most.
	RowOpTol = 1e-6
	// AttentionTol: scale is the largest |v| the row reads. A float32 exp
	// and float32 sums against the float64 reference; BF16 caches are
	// compared with a reference over the same rounded keys and values.
	AttentionTol = 1e-5
	// AttentionBF16Tol replaces AttentionTol for a backend that rounds x to
	// bfloat16 for products with BF16 operands (XRounder, asked about a
	// Transient BF16 matrix): the queries and the probabilities, off by up
	// to 2⁻⁹ each. It also holds for an AttnRounder's tensor-core
	// attention, which rounds an F32 cache's keys and values too (2⁻⁹ of
	// each value adds at most 2⁻⁹·scale; the score errors are the queries'
	// and keys' 2⁻⁹ relative of Σ|q·k|·Scale, a few 10⁻³ for random data):
	// the H200 measured at most 2.5e-3 (F32 cache) and 1.2e-3 (BF16).
	AttentionBF16Tol = 1.0 / (1 << 7)
	// ExpertsTol: scale is max |y| of the call (two chained products and a
	// SwiGLU per expert).
	ExpertsTol = 1e-5
	// HyperTol (HyperPre): scale is max(1, |want|). The mix product is a
	// float32 MatMul against the float64 reference; its error passes
	// through sigmoid and the Sinkhorn exponentials (factors ≤ |Scale|) into
	// the coefficients and the pre-weighted sum of the streams. HyperPost
	// and HyperMerge are the reference loops and must match to RowOpTol.
	HyperTol = 2e-5
	// KPoolTol (the pooled keys StoreKPool writes): scale is max(1, |want|);
	// a softmax-weighted mean of the members per channel. KPoolSelect's
	// selection must be identical (random scores have no near-ties).
	KPoolTol = RowOpTol
	// ExpertsBF16Tol replaces ExpertsTol for a backend that rounds x to
	// bfloat16 for BF16 weights (XRounder): both products' inputs, x and
	// the SwiGLU output, are then off by up to 2⁻⁹ per element, and the
	// errors of up to 24 terms add (5.4e-3 seen on the CPU backend). One
	// missing term of 24 is ~4 %.
	ExpertsBF16Tol = 1.0 / (1 << 6)
)

// i32Reader is implemented by backends whose I32 tensors a test can read
// back (kernels.SparseOps has it); the k-pool selection test needs it.
type i32Reader interface {
	ReadI32(dst []int32, t kernels.Tensor)
}

// RunOps runs the op-set conformance suite against d as subtests (the
// MLAOps and SparseOps cases too when d implements both). Every
// destination is a view with guard rows on both sides that must stay
// bit-identical, and starts poisoned with NaN so every element must be
// written.
func RunOps(t *testing.T, d kernels.Device) {
	t.Run("Linear", func(t *testing.T) { linearTest(t, d) })
	t.Run("LinearCat", func(t *testing.T) { linearCatTest(t, d) })
	t.Run("SwiGLU", func(t *testing.T) { swigluTest(t, d) })
	t.Run("SwiGLULinear", func(t *testing.T) { swigluLinearTest(t, d) })
	t.Run("NormLinearCat", func(t *testing.T) { normLinearCatTest(t, d) })
	t.Run("NormSwiGLULinear", func(t *testing.T) { normSwigluLinearTest(t, d) })
	t.Run("AddNormLinearCat", func(t *testing.T) { addNormLinearCatTest(t, d) })
	if _, ok := d.(kernels.RowExact); ok {
		t.Run("RowExact", func(t *testing.T) { rowExactTest(t, d) })
	}
	t.Run("PrepareQKV", func(t *testing.T) { prepareQKVTest(t, d) })
	t.Run("QKVAttention", func(t *testing.T) { qkvAttentionTest(t, d) })
	t.Run("Embed", func(t *testing.T) { embedTest(t, d) })
	t.Run("GatherRows", func(t *testing.T) { gatherTest(t, d) })
	t.Run("RMSNorm", func(t *testing.T) { normTest(t, d) })
	t.Run("RoPE", func(t *testing.T) { ropeTest(t, d) })
	t.Run("Attention", func(t *testing.T) { attentionTest(t, d) })
	t.Run("Route", func(t *testing.T) { routeTest(t, d) })
	t.Run("Experts", func(t *testing.T) { expertsTest(t, d, d.Experts, 0) })
	if c, ok := d.(kernels.ClampOps); ok {
		t.Run("SwiGLUClamp", func(t *testing.T) { swigluClampTest(t, d, c) })
		t.Run("ExpertsClamp", func(t *testing.T) {
			expertsTest(t, d, func(dst, x, ids, w kernels.Tensor, ex []kernels.Expert) { c.ExpertsClamp(dst, x, ids, w, ex, 0.75) }, 0.75)
		})
	} else {
		t.Log("no ClampOps: clamped SwiGLU not tested")
	}
	if k, ok := d.(kernels.KPoolOps); ok {
		t.Run("KPool", func(t *testing.T) { kpoolTest(t, d, k) })
	} else {
		t.Log("no KPoolOps: the k-pool indexer not tested")
	}
	if h, ok := d.(kernels.HyperOps); ok {
		t.Run("Hyper", func(t *testing.T) { hyperTest(t, d, h) })
	} else {
		t.Log("no HyperOps: hyper-connections not tested")
	}
	// The MLA and DSA capabilities, where the device has them.
	mla, ok := d.(kernels.MLAOps)
	sp, ok2 := d.(kernels.SparseOps)
	if ok && ok2 {
		t.Run("AttentionMLA", func(t *testing.T) { mlaTest(t, d, mla) })
		t.Run("IndexerScores", func(t *testing.T) { indexerTest(t, d, sp) })
		t.Run("TopK", func(t *testing.T) { topKTest(t, d, sp) })
	}
	t.Run("LinearAttention", func(t *testing.T) { linearAttentionTests(t, d) })
	if so, ok := d.(kernels.SampleOps); ok {
		t.Run("TopKRows", func(t *testing.T) { sampleTest(t, d, so) })
	} else {
		t.Log("no SampleOps: on-device sampling not tested")
	}
	if do, ok := d.(kernels.DraftOps); ok {
		t.Run("FeedIDs", func(t *testing.T) { feedTest(t, d, do) })
	} else {
		t.Log("no DraftOps: on-device draft feeding not tested")
	}
}

// RunNormOps runs the norm-fused linear ops' cases of RunOps alone
// (NormLinearCat, AddNormLinearCat, NormSwiGLULinear, and row-exact with
// the RowVariances check where d is a kernels.RowExact): for a backend
// switched to another form of them.
func RunNormOps(t *testing.T, d kernels.Device) {
	t.Run("NormLinearCat", func(t *testing.T) { normLinearCatTest(t, d) })
	t.Run("AddNormLinearCat", func(t *testing.T) { addNormLinearCatTest(t, d) })
	t.Run("NormSwiGLULinear", func(t *testing.T) { normSwigluLinearTest(t, d) })
	if _, ok := d.(kernels.RowExact); ok {
		t.Run("RowExact", func(t *testing.T) { rowExactTest(t, d) })
	}
}

// RunAttentionOps runs RunOps' attention cases alone (Attention,
// PrepareQKV, QKVAttention): for a backend switched to another form of
// them.
func RunAttentionOps(t *testing.T, d kernels.Device) {
	t.Run("Attention", func(t *testing.T) { attentionTest(t, d) })
	t.Run("PrepareQKV", func(t *testing.T) { prepareQKVTest(t, d) })
	t.Run("QKVAttention", func(t *testing.T) { qkvAttentionTest(t, d) })
}

const guardRows = 2

// buf is a device tensor with guard rows: t is the body view.
type buf struct {
	d     kernels.Device
	whole kernels.Tensor
	t     kernels.Tensor
	host  []float32 // the whole tensor's F32 contents as written
}

// newBuf allocates (rows, cols) F32 with guard rows of yGuard and the
// body set to body (poisoned with yPoison when body is nil).
func newBuf(t *testing.T, d kernels.Device, rows, cols int, body []float32) *buf {
	t.Helper()
	whole, err := d.Alloc(kernels.F32, rows+2*guardRows, cols)
	if err != nil {
		t.Fatal(err)
	}
	host := make([]float32, whole.Elems())
	for i := range host {
		host[i] = yGuard
	}
	b := host[guardRows*cols : (guardRows+rows)*cols]
	if body == nil {
		for i := range b {
			b[i] = yPoison
		}
	} else {
		copy(b, body)
	}
	d.WriteF32(whole, host)
	return &buf{d: d, whole: whole, t: whole.Slice(guardRows, guardRows+rows), host: host}
}

// read returns the body and fails t when a guard changed.
func (b *buf) read(t *testing.T, name string) []float32 {
	t.Helper()
	all := make([]float32, b.whole.Elems())
	b.d.ReadF32(all, b.whole)
	cols := b.whole.Cols
	body := all[guardRows*cols : (b.whole.Rows-guardRows)*cols]
	for i, v := range all {
		if i >= guardRows*cols && i < (b.whole.Rows-guardRows)*cols {
			continue
		}
		if math.Float32bits(v) != math.Float32bits(b.host[i]) {
			t.Fatalf("%s: guard element %d overwritten", name, i)
		}
	}
	return body
}

// ints uploads an I32 tensor.
func ints(t *testing.T, d kernels.Device, rows, cols int, v []int32) kernels.Tensor {
	t.Helper()
	x, err := d.Alloc(kernels.I32, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	d.WriteI32(x, v)
	return x
}

func randn(rng *rand.Rand, n int) []float32 { return RandN(rng, n) }

// RandN returns n standard normal values drawn from rng: the inputs of
// most cases, here and in the backends' own tests.
func RandN(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// compare fails t for elements outside tol·scale(i).
func compare(t *testing.T, what string, got, want []float32, tol float64, scale func(i int) float64) {
	t.Helper()
	bad := 0
	for i := range want {
		lim := tol * scale(i)
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= lim) {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d] = %g, want %g ± %.3g", what, i, got[i], want[i], lim)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d wrong", what, bad, len(want))
	}
}

func rowScale(want []float32) func(int) float64 {
	return func(i int) float64 { return max(1, math.Abs(float64(want[i]))) }
}

// step runs fn inside BeginStep/EndStep.
func step(d kernels.Device, fn func()) {
	d.BeginStep()
	defer d.EndStep()
	fn()
}

func linearTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n, rows, cols int
		dt            kernels.DType
		bias, acc     bool
	}{{1, 7, 33, kernels.F32, false, false}, {3, 16, 64, kernels.BF16, true, false}, {5, 9, 17, kernels.BF16, true, true}, {20, 33, 40, kernels.F32, false, true},
		// decode batches: partial tiles of rows and weight rows, widths mid-chunk
		{2, 45, 200, kernels.BF16, true, true}, {33, 45, 136, kernels.BF16, false, false}, {64, 130, 72, kernels.BF16, true, false}} {
		t.Run(fmt.Sprintf("%v/n=%d,%dx%d,bias=%v,acc=%v", c.dt, c.n, c.rows, c.cols, c.bias, c.acc), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.rows)))
			w := NewMat(rng, c.dt, c.rows, c.cols, 0, 0)
			xv := randn(rng, c.n*c.cols)
			x := newBuf(t, d, c.n, c.cols, xv)
			var y0 []float32
			if c.acc {
				y0 = randn(rng, c.n*c.rows)
			}
			y := newBuf(t, d, c.n, c.rows, y0)
			var e kernels.Epilogue
			var bv []float32
			if c.bias {
				bv = randn(rng, c.rows)
				e.Bias = newBuf(t, d, 1, c.rows, bv).t
			}
			e.Accumulate = c.acc
			step(d, func() { d.Linear(y.t, x.t, w, e) })
			got := y.read(t, "y")
			want := make([]float32, c.n*c.rows)
			copy(want, y0)
			xr, _ := RoundX(d, xv, w, c.n)
			ref.Linear(want, xr, w, bv, c.acc, c.n)
			abs := make([]float32, c.cols)
			compare(t, "y", got, want, LinearTol, func(i int) float64 {
				r, j := i/c.rows, i%c.rows
				w.RowF32(abs, j)
				s := 0.0
				for k, v := range abs {
					s += math.Abs(float64(v * xv[r*c.cols+k]))
				}
				if bv != nil {
					s += math.Abs(float64(bv[j]))
				}
				if y0 != nil {
					s += math.Abs(float64(y0[i]))
				}
				return s + 1e-30
			})
		})
	}
}

func swigluTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(5, 6))
	gv, uv := randn(rng, 7*19), randn(rng, 7*19)
	g, u, y := newBuf(t, d, 7, 19, gv), newBuf(t, d, 7, 19, uv), newBuf(t, d, 7, 19, nil)
	step(d, func() { d.SwiGLU(y.t, g.t, u.t) })
	want := make([]float32, len(gv))
	ref.SwiGLU(want, gv, uv)
	compare(t, "y", y.read(t, "y"), want, RowOpTol, rowScale(want))
}

func embedTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		dt   kernels.DType
		cols int
	}{{kernels.F32, 24}, {kernels.BF16, 24}, {kernels.Q8_0, 64}, {kernels.Q4_0, 96}, {kernels.Q4K, 256}, {kernels.Q5K, 512},
		{kernels.Q6K, 256}} { // a GGUF's table keeps its blocks; each row decodes exactly
		w := NewMat(rng, c.dt, 11, c.cols, 0, 0)
		id := []int32{3, 0, 10, 3, 7}
		y := newBuf(t, d, len(id), c.cols, nil)
		it := ints(t, d, len(id), 1, id)
		step(d, func() { d.Embed(y.t, w, it) })
		got := y.read(t, "y")
		want := make([]float32, len(id)*c.cols)
		for i, r := range id {
			w.RowF32(want[i*c.cols:(i+1)*c.cols], int(r))
		}
		compare(t, c.dt.String(), got, want, 0, rowScale(want))
	}
}

func gatherTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(9, 10))
	xv := randn(rng, 9*13)
	rows := []int32{8, 0, 4, 4}
	x, y := newBuf(t, d, 9, 13, xv), newBuf(t, d, len(rows), 13, nil)
	rt := ints(t, d, len(rows), 1, rows)
	step(d, func() { d.GatherRows(y.t, x.t, rt) })
	want := make([]float32, len(rows)*13)
	for i, r := range rows {
		copy(want[i*13:], xv[int(r)*13:(int(r)+1)*13])
	}
	compare(t, "y", y.read(t, "y"), want, 0, rowScale(want))
}

func normTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, offset := range []bool{false, true} {
		const n, dim = 6, 40
		xv, dv, wv := randn(rng, n*dim), randn(rng, n*dim), randn(rng, dim)
		x, w, y := newBuf(t, d, n, dim, xv), newBuf(t, d, 1, dim, wv), newBuf(t, d, n, dim, nil)
		step(d, func() { d.RMSNorm(y.t, x.t, w.t, 1e-6, offset) })
		want := make([]float32, n*dim)
		ref.RMSNorm(want, xv, wv, 1e-6, offset, n)
		compare(t, "RMSNorm", y.read(t, "y"), want, RowOpTol, rowScale(want))

		// AddRMSNorm: res += delta, y = norm(res); per-head shape too.
		res, delta, y2 := newBuf(t, d, n, dim, xv), newBuf(t, d, n, dim, dv), newBuf(t, d, n, dim, nil)
		step(d, func() { d.AddRMSNorm(y2.t, res.t, delta.t, w.t, 1e-5, offset) })
		sum := make([]float32, n*dim)
		for i := range sum {
			sum[i] = xv[i] + dv[i]
		}
		ref.RMSNorm(want, sum, wv, 1e-5, offset, n)
		compare(t, "AddRMSNorm residual", res.read(t, "res"), sum, 0, rowScale(sum))
		compare(t, "AddRMSNorm", y2.read(t, "y"), want, RowOpTol, rowScale(want))
	}
}

func ropeTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct {
		heads, hd, dim int
		inter          bool
		scale          float32
	}{{4, 16, 16, false, 1}, {3, 12, 6, false, 1.2}, {2, 8, 8, true, 1}} {
		n := 5
		pos := []int32{0, 1, 7, 300, 4095}
		xv := randn(rng, n*c.heads*c.hd)
		inv := make([]float32, c.dim/2)
		for i := range inv {
			inv[i] = float32(math.Pow(10000, -float64(2*i)/float64(c.dim)))
		}
		x := newBuf(t, d, n, c.heads*c.hd, xv)
		r := &kernels.Rotary{InvFreq: newBuf(t, d, 1, len(inv), inv).t, Dim: c.dim, Interleaved: c.inter, Scale: c.scale}
		pt := ints(t, d, n, 1, pos)
		step(d, func() { d.RoPE(x.t, c.heads, c.hd, pt, r) })
		want := append([]float32(nil), xv...)
		ref.RoPE(want, c.heads, c.hd, pos, inv, c.inter, c.scale)
		compare(t, fmt.Sprintf("rope %+v", c), x.read(t, "x"), want, RowOpTol, rowScale(want))
	}
}

// attnSeq is one sequence of an attention case: rows positions from start
// (earlier positions are cached from a previous step).
type attnSeq struct{ start, rows int }

// AttnRounder is implemented by a backend whose Attention multiplies on
// tensor cores in bfloat16 for some batches (the CUDA prefill kernel): the
// queries, the probabilities and an F32 cache's keys and values are
// rounded to bfloat16, every sum is float32. The attention cases then use
// AttentionBF16Tol.
type AttnRounder interface {
	// AttentionRoundsToBF16 reports whether Attention over a batch of n
	// rows of shape s may round so.
	AttentionRoundsToBF16(s kernels.AttnShape, n int) bool
}

func attentionTest(t *testing.T, d kernels.Device) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range []struct {
			heads, kvHeads, hd, bs int
			seqs                   []attnSeq
		}{
			{4, 2, 16, 4, []attnSeq{{0, 1}}},
			{4, 2, 16, 4, []attnSeq{{9, 1}, {0, 3}, {20, 1}}},   // decode rows
			{6, 2, 8, 16, []attnSeq{{0, 40}}},                   // one prefill chunk
			{3, 3, 12, 8, []attnSeq{{5, 1}, {0, 70}, {33, 17}}}, // mixed: decode, chunk, continued chunk
			{8, 1, 32, 4, []attnSeq{{130, 2}, {0, 20}}},         // MQA, odd-tile remainders
			// Many rows over many keys at a head dim no tensor-core kernel
			// takes: enough blocks that a backend may give each row one
			// split, which must still cover all of its keys.
			{8, 4, 32, 16, []attnSeq{{200, 150}}},
			// Prefill-sized batches (many rows of one sequence) at the head
			// dims GPU tensor-core kernels take: a chunk with a partial last
			// row tile; decode rows around a fresh and a continued chunk,
			// whose rows start off any 64-row boundary; a continued chunk
			// over a small block size that is no power of two.
			{4, 2, 64, 16, []attnSeq{{0, 150}}},
			{4, 2, 128, 16, []attnSeq{{3, 1}, {0, 200}, {90, 140}, {40, 1}}},
			{4, 4, 128, 12, []attnSeq{{100, 130}}},
			// Decode batches (a row a sequence) at model head dims, over
			// contexts from 1 to 701 positions: a backend may split the
			// keys of every row many ways and leave a short row's last
			// splits empty.
			{32, 8, 128, 16, []attnSeq{{0, 1}, {5, 1}, {63, 1}, {64, 1}, {100, 1}, {127, 1}, {200, 1}, {255, 1}, {700, 1}}},
			{8, 8, 64, 16, []attnSeq{{31, 1}, {0, 1}, {300, 1}, {47, 1}, {128, 1}}},
			{16, 2, 256, 8, []attnSeq{{90, 1}, {3, 1}, {260, 1}}},
			// A single decode row at model shapes (a batch-1 step, which a
			// backend may split into many small key chunks): Qwen3-8B's
			// group of 4 and Qwen3-30B-A3B's of 8.
			{32, 8, 128, 16, []attnSeq{{200, 1}}},
			{32, 4, 128, 16, []attnSeq{{700, 1}}},
			{16, 2, 64, 16, []attnSeq{{40, 1}}},
			// Decode rows of 1 to 4,100 keys (a block of 16 exactly, one
			// key less and more) at groups of 1, 2 and 4, several lengths
			// in one call and single rows: a backend may split a row's
			// blocks into ranges and merge their partial softmaxes, which
			// must weigh each range by its own maximum.
			{8, 8, 64, 16, []attnSeq{{0, 1}, {14, 1}, {15, 1}, {16, 1}, {299, 1}, {999, 1}}},
			{16, 8, 64, 16, []attnSeq{{4099, 1}}},
			{16, 8, 128, 16, []attnSeq{{16, 1}}},
			{16, 4, 128, 16, []attnSeq{{999, 1}, {16, 1}, {299, 1}, {0, 1}}},
			{8, 2, 64, 16, []attnSeq{{14, 1}}},
			{8, 2, 32, 16, []attnSeq{{299, 3}, {999, 2}}}, // short verification chunks
		} {
			t.Run(fmt.Sprintf("%v/%d", dt, ci), func(t *testing.T) {
				attentionCase(t, d, dt, c.heads, c.kvHeads, c.hd, c.bs, c.seqs, uint64(ci))
			})
		}
	}
}

// scatteredBlocks is a block table of n distinct blocks of a cache of
// pool blocks, in random order (rng.Perm(pool)'s first n).
func scatteredBlocks(rng *rand.Rand, n, pool int) []int32 {
	perm := rng.Perm(pool)
	blocks := make([]int32, n)
	for i := range blocks {
		blocks[i] = int32(perm[i])
	}
	return blocks
}

func attentionCase(t *testing.T, d kernels.Device, dt kernels.DType, heads, kvHeads, hd, bs int, seqs []attnSeq, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 15))
	qw, kw := heads*hd, kvHeads*hd
	maxBlocks := 0
	for _, s := range seqs {
		maxBlocks = max(maxBlocks, (s.start+s.rows+bs-1)/bs)
	}
	nBlocks := len(seqs)*maxBlocks + 3
	// Block tables: a random permutation, so sequences interleave.
	blocks := scatteredBlocks(rng, len(seqs)*maxBlocks, nBlocks)
	kc, err := d.Alloc(dt, nBlocks*bs, kw)
	if err != nil {
		t.Fatal(err)
	}
	vc, _ := d.Alloc(dt, nBlocks*bs, kw)
	round := func(v []float32) {
		if dt == kernels.BF16 {
			for i, x := range v {
				v[i] = kernels.BF16ToF32(kernels.F32ToBF16(x))
			}
		}
	}
	// Host copies of every sequence's keys and values, all positions.
	keys := make([][]float32, len(seqs))
	vals := make([][]float32, len(seqs))
	var pos, seq, slot []int32
	var prePos, preSeq, preSlot []int32
	var preK, preV, stepK, stepV []float32
	for si, s := range seqs {
		n := s.start + s.rows
		keys[si], vals[si] = randn(rng, n*kw), randn(rng, n*kw)
		for p := range n {
			sl := blocks[si*maxBlocks+p/bs]*int32(bs) + int32(p%bs)
			k, v := keys[si][p*kw:(p+1)*kw], vals[si][p*kw:(p+1)*kw]
			if p < s.start {
				prePos, preSeq, preSlot = append(prePos, int32(p)), append(preSeq, int32(si)), append(preSlot, sl)
				preK, preV = append(preK, k...), append(preV, v...)
			} else {
				pos, seq, slot = append(pos, int32(p)), append(seq, int32(si)), append(slot, sl)
				stepK, stepV = append(stepK, k...), append(stepV, v...)
			}
		}
		round(keys[si])
		round(vals[si])
	}
	bt := ints(t, d, len(seqs), maxBlocks, blocks)
	paged := func(pos, seq, slot []int32) *kernels.Paged {
		n := len(pos)
		return &kernels.Paged{Pos: ints(t, d, n, 1, pos), Seq: ints(t, d, n, 1, seq), Slot: ints(t, d, n, 1, slot), Blocks: bt, BlockSize: bs}
	}
	if len(prePos) > 0 {
		pk, pv := newBuf(t, d, len(prePos), kw, preK), newBuf(t, d, len(prePos), kw, preV)
		p := paged(prePos, preSeq, preSlot)
		step(d, func() { d.StoreKV(kc, vc, pk.t, pv.t, p) })
	}
	n := len(pos)
	qv := randn(rng, n*qw)
	q, k, v, out := newBuf(t, d, n, qw, qv), newBuf(t, d, n, kw, stepK), newBuf(t, d, n, kw, stepV), newBuf(t, d, n, qw, nil)
	p := paged(pos, seq, slot)
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	step(d, func() {
		d.StoreKV(kc, vc, k.t, v.t, p)
		d.Attention(out.t, q.t, kc, vc, p, shape)
	})
	got := out.read(t, "out")
	want := make([]float32, n*qw)
	scale := make([]float64, n)
	for i := range n {
		s := int(seq[i])
		ln := int(pos[i]) + 1
		ref.Attention(want[i*qw:(i+1)*qw], qv[i*qw:(i+1)*qw], ln,
			func(p int) []float32 { return keys[s][p*kw : (p+1)*kw] },
			func(p int) []float32 { return vals[s][p*kw : (p+1)*kw] }, shape)
		for _, x := range vals[s][:ln*kw] {
			scale[i] = max(scale[i], math.Abs(float64(x)))
		}
	}
	tol := AttentionTol
	probe := &kernels.Mat{DType: kernels.BF16, Rows: 64, Cols: 64, Transient: true}
	if r, ok := d.(XRounder); ok && dt == kernels.BF16 && r.RoundsXToBF16(probe, 64) {
		tol = AttentionBF16Tol
	}
	if r, ok := d.(AttnRounder); ok && r.AttentionRoundsToBF16(shape, n) {
		tol = AttentionBF16Tol
	}
	worst := 0.0 // the largest error in units of the row's scale, for tuning tolerances
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i])-float64(want[i]))/scale[i/qw])
	}
	t.Logf("%d rows, heads %d/%d, head dim %d: max error %.3g·scale (tol %.3g)", n, heads, kvHeads, hd, worst, tol)
	compare(t, "out", got, want, tol, func(i int) float64 { return scale[i/qw] })
}

func routeTest(t *testing.T, d kernels.Device) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, r := range []kernels.Router{
		{Scoring: kernels.SoftmaxScoring, TopK: 2, NormTopK: true, Scale: 1},
		{Scoring: kernels.SoftmaxScoring, TopK: 3, Scale: 1},
		{Scoring: kernels.SigmoidScoring, TopK: 4, NormTopK: true, Scale: 2.5, Groups: 4, TopKGroups: 2},
		{Scoring: kernels.SigmoidScoring, TopK: 3, NormTopK: true, Scale: 1.8, Shared: 2},
	} {
		const n, e = 9, 16
		k := r.Width()
		lv := randn(rng, n*e)
		var bias []float32
		if r.Scoring == kernels.SigmoidScoring {
			bias = randn(rng, e)
			r.Bias = newBuf(t, d, 1, e, bias).t
		}
		lg := newBuf(t, d, n, e, lv)
		ids, err := d.Alloc(kernels.I32, n, k)
		if err != nil {
			t.Fatal(err)
		}
		w := newBuf(t, d, n, k, nil)
		step(d, func() { d.Route(ids, w.t, lg.t, &r) })
		wantID := make([]int32, n*k)
		wantW := make([]float32, n*k)
		for i := range n {
			ref.Route(wantID[i*k:(i+1)*k], wantW[i*k:(i+1)*k], append([]float32(nil), lv[i*e:(i+1)*e]...), &r, bias)
			// The shared experts follow the routed ones with weight 1,
			// which are routed as without them.
			plainID, plainW := make([]int32, r.TopK), make([]float32, r.TopK)
			plain := r
			plain.Shared = 0
			ref.Route(plainID, plainW, append([]float32(nil), lv[i*e:(i+1)*e]...), &plain, bias)
			for j := range k {
				id, wt := wantID[i*k+j], wantW[i*k+j]
				if j >= r.TopK && (id != int32(e+j-r.TopK) || wt != 1) || j < r.TopK && (id != plainID[j] || wt != plainW[j]) {
					t.Fatalf("%+v: kernels/ref.Route's row %d column %d is expert %d weight %g", r, i, j, id, wt)
				}
			}
		}
		compare(t, "weights", w.read(t, "w"), wantW, RowOpTol, rowScale(wantW))
		// The ids are checked by gathering the rows of an identity table.
		table := make([]float32, e+r.Shared)
		for i := range table {
			table[i] = float32(i)
		}
		tb := newBuf(t, d, len(table), 1, table)
		g := newBuf(t, d, n*k, 1, nil)
		step(d, func() { d.GatherRows(g.t, tb.t, ids.Reshape(n*k, 1)) })
		got := g.read(t, "ids")
		for i, id := range wantID {
			if got[i] != float32(id) {
				t.Fatalf("%+v: id %d = %g, want %d", r, i, got[i], id)
			}
		}
	}
}

// expertsTest runs op (Experts, or ExpertsClamp at limit) on a mix of
// fused and separate, BF16 and F32 experts: 11 tokens (several per
// expert), and 2 (one or two per expert, as in a decode step, where a
// backend may run the experts side by side).
func expertsTest(t *testing.T, d kernels.Device, op func(dst, x, ids, w kernels.Tensor, ex []kernels.Expert), limit float32) {
	rng := rand.New(rand.NewPCG(19, 20))
	const k, e, hidden, inter = 2, 5, 24, 16
	ex := make([]kernels.Expert, e)
	for i := range ex {
		if i%2 == 0 {
			ex[i] = kernels.Expert{GateUp: NewMat(rng, kernels.BF16, 2*inter, hidden, 0, 0)}
		} else {
			ex[i] = kernels.Expert{Gate: NewMat(rng, kernels.BF16, inter, hidden, 0, 0), Up: NewMat(rng, kernels.F32, inter, hidden, 0, 0)}
		}
		ex[i].Down = NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	}
	for _, n := range []int{11, 2} {
		xv := randn(rng, n*hidden)
		ids := make([]int32, n*k)
		wv := randn(rng, n*k)
		for i := range n {
			a := rng.IntN(e)
			ids[i*k], ids[i*k+1] = int32(a), int32((a+1+rng.IntN(e-1))%e) // distinct, any order
		}
		x, y, w := newBuf(t, d, n, hidden, xv), newBuf(t, d, n, hidden, nil), newBuf(t, d, n, k, wv)
		it := ints(t, d, n, k, ids)
		step(d, func() { op(y.t, x.t, it, w.t, ex) })
		want := make([]float32, n*hidden)
		ref.ExpertsClamp(want, xv, ids, wv, n, ex, limit)
		if limit != 0 && n == 11 {
			// The clamp must matter: the unclamped experts differ.
			plain := make([]float32, n*hidden)
			ref.Experts(plain, xv, ids, wv, n, ex)
			if rel, _ := maxDiff(plain, want); rel < 1e-3 {
				t.Fatalf("the clamp at %g changes the experts' output by only %.3g", limit, rel)
			}
		}
		m := 0.0
		for _, v := range want {
			m = max(m, math.Abs(float64(v)))
		}
		tol := ExpertsTol
		if r, ok := d.(XRounder); ok && r.RoundsXToBF16(ex[0].Down, 1) {
			tol = ExpertsBF16Tol
		}
		compare(t, fmt.Sprintf("y (%d tokens)", n), y.read(t, "y"), want, tol, func(int) float64 { return m })
	}
}

// maxDiff is max|a−b| / max|b| and max|a−b|.
func maxDiff(a, b []float32) (rel, abs float64) {
	m := 0.0
	for i := range b {
		abs = max(abs, math.Abs(float64(a[i])-float64(b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return abs / m, abs
}

func swigluClampTest(t *testing.T, d kernels.Device, c kernels.ClampOps) {
	rng := rand.New(rand.NewPCG(21, 22))
	const n, inter, limit = 7, 19, 0.8
	gv, uv := randn(rng, n*inter), randn(rng, n*inter)
	clamped := 0
	for i := range gv {
		gv[i] *= 2
		uv[i] *= 2
		if gv[i] > limit || math.Abs(float64(uv[i])) > limit {
			clamped++
		}
	}
	if clamped < n*inter/4 {
		t.Fatalf("only %d of %d inputs reach the clamp", clamped, n*inter)
	}
	g, u, y := newBuf(t, d, n, inter, gv), newBuf(t, d, n, inter, uv), newBuf(t, d, n, inter, nil)
	step(d, func() { c.SwiGLUClamp(y.t, g.t, u.t, limit) })
	want := make([]float32, len(gv))
	for i := range want { // silu(min(g, L))·clamp(u, −L, L), written out
		gc := float64(min(gv[i], limit))
		want[i] = float32(gc/(1+math.Exp(-gc))) * max(min(uv[i], limit), -limit)
	}
	compare(t, "y", y.read(t, "y"), want, RowOpTol, rowScale(want))
	// In place (dst = gate).
	step(d, func() { c.SwiGLUClamp(g.t, g.t, u.t, limit) })
	compare(t, "in place", g.read(t, "gate"), want, RowOpTol, rowScale(want))
}

func hyperTest(t *testing.T, d kernels.Device, h kernels.HyperOps) {
	for _, c := range []struct {
		n, hc, hidden int
		dt            kernels.DType
		iters         int
	}{{1, 1, 16, kernels.F32, 1}, {5, 4, 24, kernels.BF16, 20}, {9, 3, 40, kernels.F32, 7}} {
		t.Run(fmt.Sprintf("%v/n=%d,hc=%d", c.dt, c.n, c.hc), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.hc)))
			m, w, cw := (2+c.hc)*c.hc, c.hc*c.hidden, c.hc+c.hc*c.hc
			xv := randn(rng, c.n*w)
			for i := range xv {
				xv[i] *= 3 // the norm must not be the identity
			}
			bv := randn(rng, m)
			hp := &kernels.Hyper{
				Fn: NewMat(rng, c.dt, m, w, 0, 0), Base: newBuf(t, d, 1, m, bv).t,
				Scale:   [3]float32{0.5 + rng.Float32(), 0.5 + rng.Float32(), 1 + 2*rng.Float32()},
				Streams: c.hc, Iters: c.iters, Eps: 1e-6, NormEps: 1e-5,
			}
			X, x, coef := newBuf(t, d, c.n, w, xv), newBuf(t, d, c.n, c.hidden, nil), newBuf(t, d, c.n, cw, nil)
			step(d, func() { h.HyperPre(x.t, coef.t, X.t, hp) })
			wantX, wantC := make([]float32, c.n*c.hidden), make([]float32, c.n*cw)
			ref.Hyper(wantX, wantC, xv, bv, hp, c.n)
			compare(t, "x", x.read(t, "x"), wantX, HyperTol, rowScale(wantX))
			gotC := coef.read(t, "coef")
			compare(t, "coef", gotC, wantC, HyperTol, rowScale(wantC))
			// The last Sinkhorn step normalises columns.
			for r := range c.n {
				for j := range c.hc {
					var col float64
					for i := range c.hc {
						col += float64(gotC[r*cw+c.hc+i*c.hc+j])
					}
					if math.Abs(col-1) > 1e-5 {
						t.Fatalf("row %d: comb column %d sums to %g", r, j, col)
					}
				}
			}

			// HyperPost with the reference coefficients, then HyperMerge.
			yv := randn(rng, c.n*c.hidden)
			y, cf := newBuf(t, d, c.n, c.hidden, yv), newBuf(t, d, c.n, cw, wantC)
			merged := newBuf(t, d, c.n, c.hidden, nil)
			step(d, func() {
				h.HyperPost(X.t, y.t, cf.t)
				h.HyperMerge(merged.t, X.t)
			})
			want := append([]float32(nil), xv...)
			ref.HyperPost(want, yv, wantC, c.hc, c.n)
			compare(t, "streams", X.read(t, "streams"), want, RowOpTol, rowScale(want))
			wantM := make([]float32, c.n*c.hidden)
			for r := range c.n {
				ref.HyperMerge(wantM[r*c.hidden:(r+1)*c.hidden], want[r*w:(r+1)*w], c.hc)
			}
			compare(t, "merge", merged.read(t, "merged"), wantM, RowOpTol, rowScale(wantM))
		})
	}
}

func kpoolTest(t *testing.T, d kernels.Device, k kernels.KPoolOps) {
	rd, ok := d.(i32Reader)
	if !ok {
		t.Skip("the backend cannot read I32 tensors back")
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range []struct {
			size, dim, heads, keep, bs int
			tail                       bool
			seqs                       []attnSeq
		}{
			{4, 8, 2, 2, 4, true, []attnSeq{{0, 1}, {0, 23}, {9, 1}, {14, 3}}},
			{3, 16, 3, 3, 8, false, []attnSeq{{0, 40}, {17, 7}, {30, 1}, {5, 2}}},
			{5, 8, 1, 1, 16, true, []attnSeq{{0, 64}, {63, 1}}},
		} {
			t.Run(fmt.Sprintf("%v/%d", dt, ci), func(t *testing.T) {
				kpoolCase(t, d, k, rd, dt, c.size, c.dim, c.heads, c.keep, c.bs, c.tail, c.seqs, uint64(ci))
			})
		}
	}
}

func kpoolCase(t *testing.T, d kernels.Device, k kernels.KPoolOps, rd i32Reader, dt kernels.DType, size, dim, heads, keep, bs int, tail bool, seqs []attnSeq, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 23))
	g := newPaged(t, d, rng, seqs, bs)
	cache, err := d.Alloc(dt, g.slots(), 2*dim)
	if err != nil {
		t.Fatal(err)
	}
	round := func(v []float32) []float32 {
		if dt == kernels.BF16 {
			for i, x := range v {
				v[i] = kernels.BF16ToF32(kernels.F32ToBF16(x))
			}
		}
		return v
	}
	apeV, nw, nb := randn(rng, size*dim), randn(rng, dim), randn(rng, dim)
	kp := &kernels.KPool{Size: size, Dim: dim, Heads: heads, Keep: keep, Tail: tail,
		Ape: newBuf(t, d, size, dim, apeV).t, Scale: float32(1 / math.Sqrt(float64(dim*heads))),
		NormW: newBuf(t, d, 1, dim, nw).t, NormB: newBuf(t, d, 1, dim, nb).t, NormEps: 1e-6}

	// Every position's wk output and gate, and its raw cache row
	// [LayerNorm(k) | γ].
	ks, gs, raw := make([][][]float32, len(seqs)), make([][][]float32, len(seqs)), make([][][]float32, len(seqs))
	for si, s := range seqs {
		for range s.start + s.rows {
			kv, gv := randn(rng, dim), randn(rng, dim)
			for i := range gv {
				gv[i] *= 2
			}
			kn := make([]float32, dim)
			ref.LayerNorm(kn, kv, nw, nb, kp.NormEps, 1)
			ks[si], gs[si] = append(ks[si], kv), append(gs[si], gv)
			raw[si] = append(raw[si], append(round(kn), round(append([]float32(nil), gv...))...))
		}
	}
	// store uploads the k and γ of the given rows and stores them.
	store := func(seq, pos []int32) *kernels.Paged {
		var kv, gv []float32
		for i := range pos {
			kv, gv = append(kv, ks[seq[i]][pos[i]]...), append(gv, gs[seq[i]][pos[i]]...)
		}
		kb, gb, p := newBuf(t, d, len(pos), dim, kv), newBuf(t, d, len(pos), dim, gv), g.paged(seq, pos)
		step(d, func() { k.StoreKPool(cache, kb.t, gb.t, p, kp) })
		return p
	}
	if preSeq, prePos := g.rows(true); len(prePos) > 0 {
		store(preSeq, prePos)
	}
	curSeq, curPos := g.rows(false)
	p := store(curSeq, curPos)
	n, sw := len(curPos), kp.SelWidth()
	qv, wv := randn(rng, n*heads*dim), randn(rng, n*heads)
	q, w := newBuf(t, d, n, heads*dim, qv), newBuf(t, d, n, heads, wv)
	sel, err := d.Alloc(kernels.I32, n, sw)
	if err != nil {
		t.Fatal(err)
	}
	step(d, func() { k.KPoolSelect(sel, q.t, w.t, cache, p, kp) })

	// The pools' keys, then what the cache must hold.
	keys := make([][][]float32, len(seqs))
	prob := make([]float64, size)
	for si := range seqs {
		for P := range len(raw[si]) / size {
			key := make([]float32, dim)
			ref.KPoolKey(key, raw[si][P*size:(P+1)*size], apeV, prob)
			keys[si] = append(keys[si], round(key))
		}
	}
	if dt == kernels.F32 {
		all := make([]float32, cache.Elems())
		d.ReadF32(all, cache)
		for si := range seqs {
			for pos, r := range raw[si] {
				want := append([]float32(nil), r...)
				if pos%size == size-1 {
					copy(want, keys[si][pos/size])
				}
				s := int(g.slot(si, pos))
				compare(t, fmt.Sprintf("cache seq %d pos %d", si, pos), all[s*2*dim:(s+1)*2*dim], want, KPoolTol, rowScale(want))
			}
		}
	}
	got := make([]int32, n*sw)
	rd.ReadI32(got, sel)
	want := make([]int32, n*sw)
	dropped := 0
	for i := range n {
		si, pos := int(curSeq[i]), int(curPos[i])
		key := func(P int) []float32 { return keys[si][P] }
		ref.KPoolSelect(want[i*sw:(i+1)*sw], qv[i*heads*dim:(i+1)*heads*dim], wv[i*heads:(i+1)*heads], pos, key, kp,
			make([]float32, (pos+1)/size), make([]int32, keep))
		if (pos+1)/size > keep {
			dropped++
		}
		if !slices.Equal(got[i*sw:(i+1)*sw], want[i*sw:(i+1)*sw]) {
			t.Errorf("row %d (seq %d, position %d): selection %v, want %v", i, si, pos, got[i*sw:(i+1)*sw], want[i*sw:(i+1)*sw])
		}
	}
	if dropped == 0 {
		t.Error("no row drops a pool: the case does not test the selection")
	}
}

// linearScale is LinearTol's scale for element (r, j) of x·wᵀ: Σₖ|x·w|
// (+ extra).
func linearScale(x []float32, w *kernels.Mat, r, j int, extra float64) float64 {
	row := make([]float32, w.Cols)
	w.RowF32(row, j)
	s := extra
	for k, v := range row {
		s += math.Abs(float64(v * x[r*w.Cols+k]))
	}
	return s + 1e-30
}

// compareCat holds got, LinearCat's output (n, total) over the input x
// (n rows), to the reference of x rounded as d rounds it, with bias bv and,
// when acc, y0 accumulated (bv, y0 nil for none), at LinearTol.
func compareCat(t *testing.T, d kernels.Device, got, x []float32, ws []*kernels.Mat, bv, y0 []float32, acc bool, n, total int) {
	t.Helper()
	want := append(make([]float32, 0, n*total), y0...)[:n*total]
	xr, _ := RoundX(d, x, ws[0], n)
	ref.LinearCat(want, xr, ws, bv, acc, n)
	compare(t, "y", got, want, LinearTol, catScale(x, ws, total, bv, y0))
}

// catScale is LinearTol's scale for element i of LinearCat's output
// (total wide) over the input x: Σₖ|x·w| of its weight row, + |bias| and,
// when accumulating, + |y0[i]| (bv, y0 nil for none).
func catScale(x []float32, ws []*kernels.Mat, total int, bv, y0 []float32) func(int) float64 {
	return func(i int) float64 {
		r, j := i/total, i%total
		extra := 0.0
		if bv != nil {
			extra += math.Abs(float64(bv[j]))
		}
		if y0 != nil {
			extra += math.Abs(float64(y0[i]))
		}
		for _, w := range ws {
			if j < w.Rows {
				return linearScale(x, w, r, j, extra)
			}
			j -= w.Rows
		}
		return extra
	}
}

func linearCatTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n    int
		rows []int
		cols int
		dt   kernels.DType
		bias bool
		acc  bool
	}{
		{1, []int{16, 8, 8}, 64, kernels.BF16, false, false}, // decode q/k/v
		{1, []int{7, 3, 3}, 33, kernels.F32, true, false},    // unaligned rows
		{3, []int{32, 8, 8}, 64, kernels.BF16, true, true},   // rows through the GEMM
		{20, []int{9, 5}, 40, kernels.F16, false, true},
		{31, []int{40, 24, 24}, 136, kernels.BF16, true, false}, // a decode batch's q/k/v
	} {
		t.Run(fmt.Sprintf("%v/n=%d,%vx%d,bias=%v,acc=%v", c.dt, c.n, c.rows, c.cols, c.bias, c.acc), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.cols)))
			ws, total := catWeights(rng, c.dt, c.rows, c.cols)
			xv := randn(rng, c.n*c.cols)
			x := newBuf(t, d, c.n, c.cols, xv)
			y, y0, bv, e := catOutput(t, d, rng, c.n, total, c.acc, c.bias)
			// Twice: the second call finds the stacked weights cached.
			for range 2 {
				if c.acc {
					d.WriteF32(y.t, y0)
				}
				step(d, func() { d.LinearCat(y.t, x.t, ws, e) })
			}
			got := y.read(t, "y")
			compareCat(t, d, got, xv, ws, bv, y0, c.acc, c.n, total)
		})
	}
}

func swigluLinearTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n, inter, cols int
		dt             kernels.DType
		limit          float32
	}{{1, 24, 64, kernels.BF16, 0}, {1, 5, 33, kernels.F32, 0}, {4, 16, 64, kernels.BF16, 0}, {1, 16, 64, kernels.F16, 0.5}, {3, 8, 40, kernels.BF16, 0.5},
		{17, 40, 136, kernels.BF16, 0}, {64, 33, 72, kernels.BF16, 0.5}} { // decode batches
		t.Run(fmt.Sprintf("%v/n=%d,%dx%d,limit=%v", c.dt, c.n, c.inter, c.cols, c.limit), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.inter), uint64(c.cols)))
			gate, up := NewMat(rng, c.dt, c.inter, c.cols, 0, 0), NewMat(rng, c.dt, c.inter, c.cols, 0, 0)
			xv := randn(rng, c.n*c.cols)
			x, y := newBuf(t, d, c.n, c.cols, xv), newBuf(t, d, c.n, c.inter, nil)
			step(d, func() { d.SwiGLULinear(y.t, x.t, gate, up, c.limit) })
			checkSwiGLULinear(t, d, y.read(t, "y"), xv, gate, up, c.n, c.limit)
		})
	}
}

// checkSwiGLULinear compares got (n, inter) with the reference
// SwiGLUClamp(x·gateᵀ, x·upᵀ, limit) of the n rows x, rounded as d rounds
// them.
func checkSwiGLULinear(t *testing.T, d kernels.Device, got, x []float32, gate, up *kernels.Mat, n int, limit float32) {
	t.Helper()
	inter := gate.Rows
	xr, _ := RoundX(d, x, gate, n)
	g, u := make([]float32, n*inter), make([]float32, n*inter)
	ref.Linear(g, xr, gate, nil, false, n)
	ref.Linear(u, xr, up, nil, false, n)
	want := make([]float32, len(g))
	ref.SwiGLUClamp(want, g, u, limit)
	// silu'(g) ≤ 1.1 and |silu(g)| ≤ |g|, so the products' errors reach y
	// scaled by |u| and |g| (+ the SwiGLU's own rounding).
	compare(t, "y", got, want, LinearTol, func(i int) float64 {
		r, j := i/inter, i%inter
		gs, us := linearScale(x, gate, r, j, 0), linearScale(x, up, r, j, 0)
		return 1.1*gs*math.Abs(float64(u[i])) + us*math.Abs(float64(g[i])) + gs*us + max(1, math.Abs(float64(want[i])))*RowOpTol/LinearTol
	})
}

// catWeights returns random weights of dtype dt for the *LinearCat ops,
// (rows[i], cols) each, and their rows in all.
func catWeights(rng *rand.Rand, dt kernels.DType, rows []int, cols int) (ws []*kernels.Mat, total int) {
	for _, r := range rows {
		ws = append(ws, NewMat(rng, dt, r, cols, 0, 0))
		total += r
	}
	return ws, total
}

// catOutput is a *LinearCat op's destination y (n, total), holding random
// y0 when acc, and its epilogue: accumulating when acc, with a random bias
// bv (1, total) when bias.
func catOutput(t *testing.T, d kernels.Device, rng *rand.Rand, n, total int, acc, bias bool) (y *buf, y0, bv []float32, e kernels.Epilogue) {
	if acc {
		y0 = randn(rng, n*total)
	}
	y = newBuf(t, d, n, total, y0)
	e.Accumulate = acc
	if bias {
		bv = randn(rng, total)
		e.Bias = newBuf(t, d, 1, total, bv).t
	}
	return y, y0, bv, e
}

// normCase is a fused norm's input for the Norm* linear ops: x (n, cols),
// the norm weight (1, cols) (around 1, or around 0 with offset) on the
// device, and the reference's normed rows.
func normCase(t *testing.T, d kernels.Device, rng *rand.Rand, n, cols int, offset bool) (x *buf, xv []float32, hn *kernels.HeadNorm, h []float32) {
	xv = randn(rng, n*cols)
	for i := range xv {
		xv[i] *= 3 // a mean square away from 1
	}
	wv := randn(rng, cols)
	for i := range wv {
		wv[i] *= 0.2
		if !offset {
			wv[i]++
		}
	}
	hn = &kernels.HeadNorm{W: newBuf(t, d, 1, cols, wv).t, Eps: 1e-6, Offset: offset}
	h = make([]float32, n*cols)
	ref.RMSNorm(h, xv, wv, hn.Eps, offset, n)
	return newBuf(t, d, n, cols, xv), xv, hn, h
}

// normLinearCatTest holds NormLinearCat to LinearCat's reference over the
// reference's normed rows, with LinearTol over those rows' products (a
// backend that scales after the sums rounds each term a few ulp apart).
func normLinearCatTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n         int
		rows      []int
		cols      int
		dt        kernels.DType
		bias, acc bool
		offset    bool
	}{
		{1, []int{16, 8, 8}, 64, kernels.BF16, false, false, false}, // decode q/k/v
		{1, []int{9, 5, 5}, 36, kernels.BF16, true, false, true},    // rows not in 16-byte loads
		{1, []int{7, 3, 3}, 36, kernels.F32, false, true, false},    // o-proj-like accumulate
		{1, []int{7, 3}, 33, kernels.F32, false, false, false},      // x not 16-byte aligned
		{3, []int{32, 8, 8}, 64, kernels.BF16, true, true, false},   // rows through the GEMM
		{20, []int{9, 5}, 40, kernels.F16, false, false, true},
		{5, []int{24, 8, 8}, 72, kernels.BF16, false, true, true}, // a decode batch, zero-centred norm
	} {
		t.Run(fmt.Sprintf("%v/n=%d,%vx%d,bias=%v,acc=%v,offset=%v", c.dt, c.n, c.rows, c.cols, c.bias, c.acc, c.offset), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n)+100, uint64(c.cols)))
			ws, total := catWeights(rng, c.dt, c.rows, c.cols)
			x, xv, hn, h := normCase(t, d, rng, c.n, c.cols, c.offset)
			y, y0, bv, e := catOutput(t, d, rng, c.n, total, c.acc, c.bias)
			for range 2 { // the second call finds the stacked weights cached
				if c.acc {
					d.WriteF32(y.t, y0)
				}
				step(d, func() { d.NormLinearCat(y.t, x.t, hn, ws, e) })
			}
			got := y.read(t, "y")
			if in := x.read(t, "x"); !slices.Equal(in, xv) {
				t.Error("NormLinearCat modified x")
			}
			compareCat(t, d, got, h, ws, bv, y0, c.acc, c.n, total)
		})
	}
}

// addNormLinearCatTest holds AddNormLinearCat's sum to x + delta bit for
// bit and its product to LinearCat's reference over the reference's norm
// of that sum (normLinearCatTest's tolerance).
func addNormLinearCatTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n      int
		rows   []int
		cols   int
		dt     kernels.DType
		bias   bool
		offset bool
	}{
		{1, []int{16, 8, 8}, 64, kernels.BF16, false, false},
		{1, []int{9, 5, 5}, 36, kernels.F32, true, true},
		{1, []int{7, 3}, 36, kernels.BF16, false, false}, // rows not in 16-byte loads
		{3, []int{32, 8, 8}, 64, kernels.BF16, true, false},
	} {
		t.Run(fmt.Sprintf("%v/n=%d,%vx%d,bias=%v,offset=%v", c.dt, c.n, c.rows, c.cols, c.bias, c.offset), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n)+300, uint64(c.cols)))
			ws, total := catWeights(rng, c.dt, c.rows, c.cols)
			x, xv, hn, _ := normCase(t, d, rng, c.n, c.cols, c.offset)
			dv := randn(rng, c.n*c.cols)
			delta, sum := newBuf(t, d, c.n, c.cols, dv), newBuf(t, d, c.n, c.cols, nil)
			sv := make([]float32, len(xv))
			for i := range sv {
				sv[i] = xv[i] + dv[i]
			}
			wv := make([]float32, c.cols)
			d.ReadF32(wv, hn.W)
			h := make([]float32, len(sv))
			ref.RMSNorm(h, sv, wv, hn.Eps, c.offset, c.n)
			y, _, bv, e := catOutput(t, d, rng, c.n, total, false, c.bias)
			step(d, func() { d.AddNormLinearCat(y.t, sum.t, x.t, delta.t, hn, ws, e) })
			for i, v := range sum.read(t, "sum") {
				if math.Float32bits(v) != math.Float32bits(sv[i]) {
					t.Errorf("sum[%d] = %g, want x + delta = %g", i, v, sv[i])
					break
				}
			}
			if in := x.read(t, "x"); !slices.Equal(in, xv) {
				t.Error("AddNormLinearCat modified x")
			}
			compareCat(t, d, y.read(t, "y"), h, ws, bv, nil, false, c.n, total)
		})
	}
}

// normSwigluLinearTest holds NormSwiGLULinear to SwiGLULinear's reference
// over the reference's normed rows, with swigluLinearTest's tolerance.
func normSwigluLinearTest(t *testing.T, d kernels.Device) {
	for _, c := range []struct {
		n, inter, cols int
		dt             kernels.DType
		limit          float32
		offset         bool
	}{
		{1, 24, 64, kernels.BF16, 0, false},
		{1, 5, 36, kernels.BF16, 0.5, true}, // rows not in 16-byte loads
		{1, 8, 64, kernels.F32, 0, true},
		{4, 16, 64, kernels.F16, 0, false},
		{3, 8, 40, kernels.BF16, 0.5, false},
		{6, 12, 40, kernels.BF16, 0, true}, // a decode batch, zero-centred norm
	} {
		t.Run(fmt.Sprintf("%v/n=%d,%dx%d,limit=%v,offset=%v", c.dt, c.n, c.inter, c.cols, c.limit, c.offset), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.inter)+200, uint64(c.cols)))
			gate, up := NewMat(rng, c.dt, c.inter, c.cols, 0, 0), NewMat(rng, c.dt, c.inter, c.cols, 0, 0)
			x, _, hn, h := normCase(t, d, rng, c.n, c.cols, c.offset)
			y := newBuf(t, d, c.n, c.inter, nil)
			step(d, func() { d.NormSwiGLULinear(y.t, x.t, hn, gate, up, c.limit) })
			checkSwiGLULinear(t, d, y.read(t, "y"), h, gate, up, c.n, c.limit)
		})
	}
}

func prepareQKVTest(t *testing.T, d kernels.Device) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for ci, c := range []struct {
			heads, kvHeads, hd, dim int
			qn, kn, inter           bool
		}{
			{4, 2, 16, 16, true, true, false},
			{3, 1, 12, 6, true, false, true},  // partial rotation, q norm only
			{2, 2, 8, 0, false, false, false}, // neither norm nor rotation
			{8, 2, 128, 128, true, true, false},
		} {
			t.Run(fmt.Sprintf("%v/%d", dt, ci), func(t *testing.T) {
				prepareQKVCase(t, d, dt, c.heads, c.kvHeads, c.hd, c.dim, c.qn, c.kn, c.inter, uint64(ci))
			})
		}
	}
}

func prepareQKVCase(t *testing.T, d kernels.Device, dt kernels.DType, heads, kvHeads, hd, dim int, qn, kn, inter bool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 31))
	const n, bs, start = 5, 4, 6 // rows at positions start… of one sequence
	qw, kw := heads*hd, kvHeads*hd
	maxBlocks := (start + n + bs - 1) / bs
	nBlocks := maxBlocks + 2
	blocks := scatteredBlocks(rng, maxBlocks, nBlocks)
	pos, seq, slot := make([]int32, n), make([]int32, n), make([]int32, n)
	for i := range n {
		p := start + i
		pos[i], slot[i] = int32(p), blocks[p/bs]*bs+int32(p%bs)
	}
	p := &kernels.Paged{Pos: ints(t, d, n, 1, pos), Seq: ints(t, d, n, 1, seq), Slot: ints(t, d, n, 1, slot), Blocks: ints(t, d, 1, maxBlocks, blocks), BlockSize: bs}
	s := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	norm := func(on bool) (*kernels.HeadNorm, *ref.Norm) {
		if !on {
			return nil, nil
		}
		w := randn(rng, hd)
		off := rng.IntN(2) == 1
		return &kernels.HeadNorm{W: newBuf(t, d, 1, hd, w).t, Eps: 1e-6, Offset: off}, &ref.Norm{W: w, Eps: 1e-6, Offset: off}
	}
	qnd, qnr := norm(qn)
	knd, knr := norm(kn)
	var r *kernels.Rotary
	var rr *ref.Rope
	if dim > 0 {
		inv := make([]float32, dim/2)
		for i := range inv {
			inv[i] = float32(math.Pow(10000, -float64(2*i)/float64(dim)))
		}
		r = &kernels.Rotary{InvFreq: newBuf(t, d, 1, len(inv), inv).t, Dim: dim, Interleaved: inter, Scale: 1}
		rr = &ref.Rope{InvFreq: inv, Interleaved: inter, Scale: 1}
	}
	qkvv := randn(rng, n*(qw+2*kw))
	qkv, q := newBuf(t, d, n, qw+2*kw, qkvv), newBuf(t, d, n, qw, nil)
	kc, err := d.Alloc(dt, nBlocks*bs, kw)
	if err != nil {
		t.Fatal(err)
	}
	vc, _ := d.Alloc(dt, nBlocks*bs, kw)
	step(d, func() { d.PrepareQKV(q.t, kc, vc, qkv.t, qnd, knd, r, p, s) })
	wq, wk, wv := make([]float32, n*qw), make([]float32, n*kw), make([]float32, n*kw)
	ref.PrepareQKV(wq, wk, wv, qkvv, n, s, qnr, knr, rr, pos)
	compare(t, "q", q.read(t, "q"), wq, RowOpTol, rowScale(wq))
	if got := qkv.read(t, "qkv"); !slices.Equal(got, qkvv) {
		t.Errorf("PrepareQKV modified qkv")
	}
	if dt == kernels.F32 {
		for _, c := range []struct {
			name  string
			cache kernels.Tensor
			want  []float32
		}{{"k", kc, wk}, {"v", vc, wv}} {
			all := make([]float32, c.cache.Elems())
			d.ReadF32(all, c.cache)
			got := make([]float32, 0, n*kw)
			for _, sl := range slot {
				got = append(got, all[int(sl)*kw:int(sl+1)*kw]...)
			}
			compare(t, c.name+" cache", got, c.want, RowOpTol, rowScale(c.want))
		}
		return
	}
	// A BF16 cache cannot be read back through the op set: attention over
	// it must match attention over a cache StoreKV filled with the
	// reference keys and values.
	kc2, _ := d.Alloc(dt, nBlocks*bs, kw)
	vc2, _ := d.Alloc(dt, nBlocks*bs, kw)
	k2, v2 := newBuf(t, d, n, kw, wk), newBuf(t, d, n, kw, wv)
	o1, o2 := newBuf(t, d, n, qw, nil), newBuf(t, d, n, qw, nil)
	step(d, func() {
		d.StoreKV(kc2, vc2, k2.t, v2.t, p)
		d.Attention(o1.t, q.t, kc, vc, p, s)
		d.Attention(o2.t, q.t, kc2, vc2, p, s)
	})
	want := o2.read(t, "attention over the reference cache")
	compare(t, "attention over the cache", o1.read(t, "attention"), want, AttentionBF16Tol, rowScale(want))
}

// qkvAttentionTest holds QKVAttention to PrepareQKV then Attention on the
// same backend bit for bit (those two are held to the references), over a
// cached history long enough to be split, for one row (the decode step a
// backend fuses) and for three rows of one sequence: the output, and the
// keys and values it stored, which attention over its cache with the
// unfused q must find.
func qkvAttentionTest(t *testing.T, d kernels.Device) {
	for ci, c := range []struct {
		heads, kvHeads, hd, dim int
		qn, kn, inter           bool
		hist, n                 int
	}{
		{8, 2, 128, 128, true, true, false, 300, 1}, // Qwen3-like, splits
		{8, 2, 128, 128, true, true, false, 300, 3}, // rows of one sequence
		{16, 2, 64, 32, true, false, true, 40, 1},   // wide group, partial interleaved rotation
		{4, 4, 96, 0, false, false, false, 700, 1},  // neither norm nor rotation, long history
		{6, 1, 40, 40, false, true, false, 150, 1},  // head dim not a multiple of 8
	} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			t.Run(fmt.Sprintf("%v/%d/n=%d", dt, ci, c.n), func(t *testing.T) {
				qkvAttentionCase(t, d, dt, c.heads, c.kvHeads, c.hd, c.dim, c.qn, c.kn, c.inter, c.hist, c.n, uint64(ci))
			})
		}
	}
}

func qkvAttentionCase(t *testing.T, d kernels.Device, dt kernels.DType, heads, kvHeads, hd, dim int, qn, kn, inter bool, hist, n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 37))
	const bs = 16
	qw, kw := heads*hd, kvHeads*hd
	total := hist + n
	maxBlocks := (total + bs - 1) / bs
	nBlocks := maxBlocks + 2
	blocks := scatteredBlocks(rng, maxBlocks, nBlocks)
	pos, seq, slot := make([]int32, total), make([]int32, total), make([]int32, total)
	for p := range total {
		pos[p], slot[p] = int32(p), blocks[p/bs]*bs+int32(p%bs)
	}
	bt := ints(t, d, 1, maxBlocks, blocks)
	all := &kernels.Paged{Pos: ints(t, d, total, 1, pos), Seq: ints(t, d, total, 1, seq), Slot: ints(t, d, total, 1, slot),
		Blocks: bt, BlockSize: bs}
	hp := &kernels.Paged{Pos: all.Pos.Slice(0, hist), Seq: all.Seq.Slice(0, hist), Slot: all.Slot.Slice(0, hist), Blocks: bt, BlockSize: bs}
	p := &kernels.Paged{Pos: all.Pos.Slice(hist, total), Seq: all.Seq.Slice(hist, total), Slot: all.Slot.Slice(hist, total),
		Blocks: bt, BlockSize: bs}
	s := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	norm := func(on bool) *kernels.HeadNorm {
		if !on {
			return nil
		}
		return &kernels.HeadNorm{W: newBuf(t, d, 1, hd, randn(rng, hd)).t, Eps: 1e-6, Offset: rng.IntN(2) == 1}
	}
	qnd, knd := norm(qn), norm(kn)
	var r *kernels.Rotary
	if dim > 0 {
		inv := make([]float32, dim/2)
		for i := range inv {
			inv[i] = float32(math.Pow(10000, -float64(2*i)/float64(dim)))
		}
		r = &kernels.Rotary{InvFreq: newBuf(t, d, 1, len(inv), inv).t, Dim: dim, Interleaved: inter, Scale: 1}
	}
	hk, hv := newBuf(t, d, hist, kw, randn(rng, hist*kw)), newBuf(t, d, hist, kw, randn(rng, hist*kw))
	var caches [2][2]kernels.Tensor // [unfused, fused][k, v]
	for i := range caches {
		for j := range caches[i] {
			c, err := d.Alloc(dt, nBlocks*bs, kw)
			if err != nil {
				t.Fatal(err)
			}
			caches[i][j] = c
		}
	}
	qkvv := randn(rng, n*(qw+2*kw))
	qkv, q := newBuf(t, d, n, qw+2*kw, qkvv), newBuf(t, d, n, qw, nil)
	oA, oB, oC := newBuf(t, d, n, qw, nil), newBuf(t, d, n, qw, nil), newBuf(t, d, n, qw, nil)
	step(d, func() {
		for _, c := range caches {
			d.StoreKV(c[0], c[1], hk.t, hv.t, hp)
		}
		d.PrepareQKV(q.t, caches[0][0], caches[0][1], qkv.t, qnd, knd, r, p, s)
		d.Attention(oA.t, q.t, caches[0][0], caches[0][1], p, s)
	})
	step(d, func() { d.QKVAttention(oB.t, caches[1][0], caches[1][1], qkv.t, qnd, knd, r, p, s) })
	step(d, func() { d.Attention(oC.t, q.t, caches[1][0], caches[1][1], p, s) })
	want := oA.read(t, "PrepareQKV and Attention")
	for _, o := range []struct {
		name string
		got  []float32
	}{{"QKVAttention", oB.read(t, "QKVAttention")}, {"Attention over QKVAttention's cache", oC.read(t, "attention")}} {
		for i, v := range o.got {
			if math.Float32bits(v) != math.Float32bits(want[i]) {
				t.Errorf("%s: out[%d] = %g, %g from PrepareQKV and Attention", o.name, i, v, want[i])
				break
			}
		}
	}
	if got := qkv.read(t, "qkv"); !slices.Equal(got, qkvv) {
		t.Errorf("QKVAttention modified qkv")
	}
}
