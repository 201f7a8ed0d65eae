//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var quantTypes = []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q5K, kernels.Q6K}

// TestQuantLayout: the device layout gives back every block (no GPU), its
// scale section is 16-byte aligned, and every width of whole blocks can
// keep its blocks.
func TestQuantLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range quantTypes {
		for _, cols := range []int{256, 512, 2304, 4096} {
			a, b := kerneltest.NewMat(rng, dt, 3, cols, 0, 0), kerneltest.NewMat(rng, dt, 5, cols, 0, 0)
			if !quantWidthOK(dt, cols) {
				t.Fatalf("%v × %d: not kept in blocks", dt, cols)
			}
			data, dsec := quantLayout([]*kernels.Mat{a, b})
			if dsec%16 != 0 {
				t.Fatalf("%v × %d: scale section at %d", dt, cols, dsec)
			}
			want := append(append([]byte{}, a.Data...), b.Data...)
			if got := quantUnlayout(dt, 8, cols, data, dsec); !bytes.Equal(got, want) {
				t.Fatalf("%v × %d: the layout loses bytes", dt, cols)
			}
		}
	}
	one := kerneltest.NewMat(rng, kernels.Q4K, 2, 512, 0, 0)
	if data, dsec := quantLayout([]*kernels.Mat{one}); dsec != 0 || &data[0] != &one.Data[0] || len(data) != len(one.Data) {
		t.Fatal("one Q4_K matrix: the layout copies its blocks")
	}
	if quantWidthOK(kernels.Q8_0, 48) || quantWidthOK(kernels.BF16, 256) {
		t.Fatal("a width of partial blocks, or bf16, kept as blocks")
	}
}

// quantX8Round is x as the int8 GEMV multiplies it: d·q, each group of
// group columns quantized as kernels/cpu's quantizeXGo does (d = amax/127,
// q = x·(127/amax) rounded half away from zero).
func quantX8Round(x []float32, group int) []float32 {
	out := make([]float32, len(x))
	for g0 := 0; g0 < len(x); g0 += group {
		var amax float32
		for _, v := range x[g0 : g0+group] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if amax == 0 {
			continue
		}
		d, id := amax/127, 127/amax
		for i, v := range x[g0 : g0+group] {
			t := v * id
			var q int32
			if t >= 0 {
				q = min(int32(t+0.5), 127)
			} else {
				q = max(int32(t-0.5), -127)
			}
			out[g0+i] = d * float32(q)
		}
	}
	return out
}

// quantWant is y (n, w.Rows) = x · wᵀ through kernels.MatMulRef (the exact
// decoding) and, per element, Σ |w|·|x| for its tolerance; with x8, of x
// rounded as the int8 GEMV takes it (quantX8Round).
func quantWant(x []float32, w *kernels.Mat, n int, x8 bool) (want, mag []float32) {
	if x8 {
		x = quantX8Round(x[:n*w.Cols], quantXGroup(w.DType))
	}
	want, mag = make([]float32, n*w.Rows), make([]float32, n*w.Rows)
	kernels.MatMulRef(want, x, w, n)
	row := make([]float32, w.Cols)
	for r := range w.Rows {
		w.RowF32(row, r)
		for j := range n {
			s := 0.0
			for k, v := range row {
				s += math.Abs(float64(v) * float64(x[j*w.Cols+k]))
			}
			mag[j*w.Rows+r] = float32(s)
		}
	}
	return want, mag
}

// checkQuant fails where |got − want| > tol · mag.
func checkQuant(t *testing.T, what string, got, want, mag []float32, tol float64) {
	t.Helper()
	worst, at := 0.0, 0
	for i := range want {
		e := math.Abs(float64(got[i])-float64(want[i])) / max(float64(mag[i]), 1e-30)
		if math.IsNaN(float64(got[i])) {
			e = math.Inf(1)
		}
		if e > worst {
			worst, at = e, i
		}
	}
	if worst > tol {
		t.Errorf("%s: element %d = %g, want %g (error %.3g of Σ|w·x| > %g)", what, at, got[at], want[at], worst, tol)
	}
}

// quantTol is the tolerance of a quantized product of n rows against the
// exact decoding (x8: with x rounded as ferrite_qx8 rounds it), of
// Σ|w·x|: the GEMV and the tensor-core product (float32 sums of each
// part's or run's terms), the bf16 product of the weights' two bf16 terms
// with x's two, and from gemmRoundRows rows of one term each (2⁻⁹ a
// weight, 2⁻⁹ an input).
func quantTol(x8 bool, n int) float64 {
	switch {
	case x8 || n <= quantGemvRows:
		return 2e-5
	case n < gemmRoundRows:
		return 5e-5
	}
	return 8e-3
}

// TestQuantLinear runs Linear over every quantized dtype's blocks, for the
// GEMV's rows of x (1–8, with bias and the residual add) and the decoded
// bf16 product's (9 and more), against kernels.MatMulRef; each row of
// x alone gives the bits it gets in a batch.
func TestQuantLinear(t *testing.T) {
	b := openOps(t)
	defer func(s int, i bool) { b.noQX8, mmqMaxSplits, mmqInt = false, s, i }(mmqMaxSplits, mmqInt)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, m := range []struct {
		fx, ie bool
		splits int
	}{{false, false, mmqMaxSplits}, {false, false, 1}, {false, true, mmqMaxSplits}, {false, true, 1}, {true, false, mmqMaxSplits}} {
		// int8 x in the GEMV and the tensor-core product (the default); the
		// latter in one split, and its integer-combining forms; float32 x
		// (FERRITE_CUDA_QX8=0)
		b.noQX8, mmqInt, mmqMaxSplits = m.fx, m.ie, m.splits
		testQuantLinear(t, b, rng)
	}
}

func testQuantLinear(t *testing.T, b *Backend, rng *rand.Rand) {
	for _, dt := range quantTypes {
		for _, sh := range []struct{ rows, cols int }{{1, 256}, {7, 512}, {33, 1024}, {130, 2304}, {257, 4096}} {
			w := kerneltest.NewMat(rng, dt, sh.rows, sh.cols, 0, 0)
			for _, n := range []int{1, 3, 8, 9, 40, 300} {
				if n == 300 && sh.rows != 130 || (mmqMaxSplits == 1 || mmqInt) && !b.mmqFits(n, sh.cols) {
					continue
				}
				x8 := b.x8Rows(n, sh.cols)
				name := fmt.Sprintf("%v/%dx%d/n=%d/x8=%v/splits≤%d/int=%v", dt, sh.rows, sh.cols, n, x8, mmqMaxSplits, mmqInt)
				xv := randF32(rng, n*sh.cols)
				if n == 3 { // a row of zeros: its int8 scale is 0
					clear(xv[sh.cols : 2*sh.cols])
				}
				want, mag := quantWant(xv, w, n, x8)
				x, y := f32Tensor(t, b, n, sh.cols, xv), f32Tensor(t, b, n, sh.rows, make([]float32, (n)*(sh.rows)))
				b.BeginStep()
				b.Linear(y, x, w, kernels.Epilogue{})
				b.EndStep()
				got := make([]float32, n*sh.rows)
				b.ReadF32(got, y)
				checkQuant(t, name, got, want, mag, quantTol(x8, n))
				if n == 3 || n == 40 { // bias and the residual add
					bv, y0 := randF32(rng, sh.rows), randF32(rng, n*sh.rows)
					bias, y2 := f32Tensor(t, b, 1, sh.rows, bv), f32Tensor(t, b, n, sh.rows, y0)
					b.BeginStep()
					b.Linear(y2, x, w, kernels.Epilogue{Bias: bias, Accumulate: true})
					b.EndStep()
					b.ReadF32(got, y2)
					for j := range n {
						for r := range sh.rows {
							want[j*sh.rows+r] += bv[r] + y0[j*sh.rows+r]
							mag[j*sh.rows+r] += float32(math.Abs(float64(bv[r])) + math.Abs(float64(y0[j*sh.rows+r])))
						}
					}
					checkQuant(t, name+"/bias+acc", got, want, mag, quantTol(x8, n))
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	if b.mmqFits(40, 2304) { // the tensor-core product: a row's bits do not depend on the rows beside it
		w := kerneltest.NewMat(rng, kernels.Q6K, 300, 2304, 0, 0)
		xv := randF32(rng, 40*2304)
		var outs [2][]float32
		for i, n := range []int{40, 11} {
			x, y := f32Tensor(t, b, n, 2304, xv[:n*2304]), f32Tensor(t, b, n, 300, make([]float32, n*300))
			b.BeginStep()
			b.Linear(y, x, w, kernels.Epilogue{})
			b.EndStep()
			outs[i] = make([]float32, n*300)
			b.ReadF32(outs[i], y)
		}
		for i, v := range outs[1] {
			if math.Float32bits(v) != math.Float32bits(outs[0][i]) {
				t.Fatalf("tensor-core product: row %d output %d = %g among 11 rows, %g among 40", i/300, i%300, v, outs[0][i])
			}
		}
	}
	// Row-exact: 12 rows of x under SetRowExact take the GEMV, each row
	// the bits it gets alone.
	w := kerneltest.NewMat(rng, kernels.Q4K, 100, 1024, 0, 0)
	const n = 12
	xv := randF32(rng, n*1024)
	x, y := f32Tensor(t, b, n, 1024, xv), f32Tensor(t, b, n, 100, make([]float32, (n)*(100)))
	b.SetRowExact(true)
	b.BeginStep()
	b.Linear(y, x, w, kernels.Epilogue{})
	b.EndStep()
	b.SetRowExact(false)
	all := make([]float32, n*100)
	b.ReadF32(all, y)
	one := make([]float32, 100)
	for j := range n {
		x1, y1 := f32Tensor(t, b, 1, 1024, xv[j*1024:(j+1)*1024]), f32Tensor(t, b, 1, 100, make([]float32, (1)*(100)))
		b.BeginStep()
		b.Linear(y1, x1, w, kernels.Epilogue{})
		b.EndStep()
		b.ReadF32(one, y1)
		for r, v := range one {
			if math.Float32bits(v) != math.Float32bits(all[j*100+r]) {
				t.Fatalf("row-exact: row %d output %d = %g in the batch, %g alone", j, r, all[j*100+r], v)
			}
		}
	}
}

// TestQuantLinearCat stacks a Q4_K_M file's q, k and v (Q4_K, Q4_K,
// Q6_K: one segment each dtype) for LinearCat, and a gate and up for
// SwiGLULinear, against the reference on the exact decoding.
func TestQuantLinearCat(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(9, 10))
	const cols = 1024
	ws := []*kernels.Mat{kerneltest.NewMat(rng, kernels.Q4K, 64, cols, 0, 0), kerneltest.NewMat(rng, kernels.Q4K, 32, cols, 0, 0),
		kerneltest.NewMat(rng, kernels.Q6K, 32, cols, 0, 0)}
	for _, n := range []int{1, 2, 12} {
		xv := randF32(rng, n*cols)
		bv := randF32(rng, 128)
		x, y, bias := f32Tensor(t, b, n, cols, xv), f32Tensor(t, b, n, 128, make([]float32, (n)*(128))), f32Tensor(t, b, 1, 128, bv)
		b.BeginStep()
		b.LinearCat(y, x, ws, kernels.Epilogue{Bias: bias})
		b.EndStep()
		got := make([]float32, n*128)
		b.ReadF32(got, y)
		tol := quantTol(b.x8Rows(n, cols), n)
		c0 := 0
		for _, w := range ws {
			want, mag := quantWant(xv, w, n, b.x8Rows(n, cols))
			part := make([]float32, n*w.Rows)
			for j := range n {
				for r := range w.Rows {
					part[j*w.Rows+r] = got[j*128+c0+r] - bv[c0+r]
				}
			}
			checkQuant(t, fmt.Sprintf("LinearCat %v n=%d", w.DType, n), part, want, mag, tol)
			c0 += w.Rows
		}
	}
	gate, up := kerneltest.NewMat(rng, kernels.Q4K, 96, cols, 0, 0), kerneltest.NewMat(rng, kernels.Q4K, 96, cols, 0, 0)
	xv := randF32(rng, cols)
	x, y := f32Tensor(t, b, 1, cols, xv), f32Tensor(t, b, 1, 96, make([]float32, (1)*(96)))
	b.BeginStep()
	b.SwiGLULinear(y, x, gate, up, 0)
	b.EndStep()
	got := make([]float32, 96)
	b.ReadF32(got, y)
	g, gm := quantWant(xv, gate, 1, !b.noQX8)
	u, um := quantWant(xv, up, 1, !b.noQX8)
	for i := range got {
		s := float64(g[i]) / (1 + math.Exp(-float64(g[i])))
		want := s * float64(u[i])
		bound := 1e-5 * (float64(gm[i])*math.Abs(float64(u[i])) + math.Abs(s)*float64(um[i]) + 1e-20)
		if math.Abs(float64(got[i])-want) > bound {
			t.Fatalf("SwiGLULinear output %d = %g, want %g", i, got[i], want)
		}
	}
}

// BenchmarkQuantGEMV times the quantized products at Qwen3-8B's decode
// shapes for 1 and 8 rows of x (the GEMV) and 32 and 64 (the tensor-core
// product, "/int" its integer-combining forms; with float32 x, "/fx", the
// bf16 decoding's product), the
// weight's copies (512 MB) cycled past L2: µs a call and the weight's GB/s.
func BenchmarkQuantGEMV(b *testing.B) {
	be := openOps(b)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dt := range []kernels.DType{kernels.Q4K, kernels.Q6K, kernels.Q8_0} {
		for _, sh := range []struct {
			name       string
			rows, cols int
		}{{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 24576, 4096}, {"down", 4096, 12288}} {
			bytes := int64(sh.rows) * int64(dt.RowBytes(sh.cols))
			copies := int(max(1, (512<<20)/bytes))
			ws := make([]*kernels.Mat, copies)
			ws[0] = kerneltest.NewMat(rng, dt, sh.rows, sh.cols, 0, 0)
			for i := 1; i < copies; i++ { // the same values in buffers of their own
				ws[i] = &kernels.Mat{DType: dt, Rows: sh.rows, Cols: sh.cols, Data: ws[0].Data}
			}
			for _, n := range []int{1, 8, 32, 64} {
				x, y := f32Tensor(b, be, n, sh.cols, randF32(rng, n*sh.cols)), f32Tensor(b, be, n, sh.rows, make([]float32, n*sh.rows))
				for _, w := range ws { // upload outside the timing
					be.BeginStep()
					be.Linear(y, x, w, kernels.Epilogue{})
					be.EndStep()
				}
				for _, form := range []string{"", "/int", "/fx"} { // int8 x (the default), its integer-combining forms, float32 x
					if form == "/int" && n <= quantGemvRows {
						continue
					}
					be.noQX8, mmqInt = form == "/fx", form == "/int"
					name := fmt.Sprintf("%v/%s/n=%d%s", dt, sh.name, n, form)
					b.Run(name, func(b *testing.B) {
						const calls = 20
						for b.Loop() {
							be.BeginStep()
							for i := range calls {
								be.Linear(y, x, ws[i%copies], kernels.Epilogue{})
							}
							be.EndStep()
						}
						per := b.Elapsed().Seconds() / float64(b.N*calls)
						b.ReportMetric(per*1e6, "µs/call")
						b.ReportMetric(float64(bytes)/per/1e9, "GB/s")
					})
				}
				be.noQX8, mmqInt = false, false
			}
		}
	}
}

// TestQuantGemvForms runs the one-row GEMV at 2, 4 and 8 weight rows a
// block (quantRowsPerBlock) and the up-to-8-rows form on every quantized
// dtype: each row of the result must have the same bits in every form
// (the contract kernels.RowExact relies on between decode steps and
// verifications).
func TestQuantGemvForms(t *testing.T) {
	b := openOps(t)
	rng := rand.New(rand.NewPCG(13, 14))
	defer func(r int) { quantRowsPerBlock, b.noQX8 = r, false }(quantRowsPerBlock)
	const rows, cols, n = 37, 1280, 3
	for i := range 2 * len(quantTypes) {
		dt := quantTypes[i%len(quantTypes)]
		b.noQX8 = i >= len(quantTypes) // int8 x, then float32 x
		w := kerneltest.NewMat(rng, dt, rows, cols, 0, 0)
		xv := randF32(rng, n*cols)
		x := f32Tensor(t, b, n, cols, xv)
		run := func(x kernels.Tensor, n int) []float32 {
			y := f32Tensor(t, b, n, rows, make([]float32, n*rows))
			b.BeginStep()
			b.Linear(y, x, w, kernels.Epilogue{})
			b.EndStep()
			got := make([]float32, n*rows)
			b.ReadF32(got, y)
			return got
		}
		batch := run(x, n) // the up-to-8-rows form
		for _, r := range []int{2, 4, 8} {
			quantRowsPerBlock = r
			for j := range n {
				one := run(f32Tensor(t, b, 1, cols, xv[j*cols:(j+1)*cols]), 1)
				for i, v := range one {
					if math.Float32bits(v) != math.Float32bits(batch[j*rows+i]) {
						t.Fatalf("%v (float32 x %v), %d rows a block: row %d output %d = %g, %g in the batch", dt, b.noQX8, r, j, i, v, batch[j*rows+i])
					}
				}
			}
		}
	}
}

// quantExpertsTol bounds Experts on block-quantized experts against
// kernels/ref.Experts on their exact decoding, of max |y|, below
// gemmRoundRows tokens: the grouped GEMVs' sums of A·Σf·x − B·Σx and the
// CUDA-core tiles' float32 products of the exact decoding (the H200
// measured at most 1.2e-6). From gemmRoundRows tokens the experts are
// decoded into bf16 for the tensor cores (ferrite_moe_qdecode), a relative
// 2⁻⁹ a weight: about 1e-3 of max |y| for random rows, quantDecodedTol.
const (
	quantExpertsTol = 1e-5
	quantDecodedTol = 1e-2
)

// TestQuantExperts runs Experts on experts that keep their GGML blocks on
// the device (every quantized dtype, fused and separate gate/up, a Q6_K
// down under Q4_K as in Q4_K_M files, one gate quantized beside a bf16 up)
// on every path — the slot-a-pass GEMVs, the register tiles, the sorted
// CUDA-core tiles, and from gemmRoundRows tokens the bf16 decoding for the
// tensor cores — against kernels/ref.Experts, checks that the
// GEMV paths give each token the bits of its call alone
// (kernels.RowExact), and that the blocks, not a float32 decoding, are
// what the device holds.
func TestQuantExperts(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe = c }(b.moe)
	const e, k, hidden, inter = 11, 4, 512, 256
	rng := rand.New(rand.NewPCG(61, 62))
	ex := make([]kernels.Expert, e)
	for i := range ex {
		dt := quantTypes[i%len(quantTypes)]
		switch {
		case i == e-1:
			ex[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, kernels.Q4K, inter, hidden, 0, 0),
				Up: kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)}
		case i%2 == 0:
			ex[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, dt, 2*inter, hidden, 0, 0)}
		default:
			ex[i] = kernels.Expert{Gate: kerneltest.NewMat(rng, dt, inter, hidden, 0, 0), Up: kerneltest.NewMat(rng, dt, inter, hidden, 0, 0)}
		}
		down := dt
		if dt == kernels.Q4K && i%2 == 0 {
			down = kernels.Q6K
		}
		ex[i].Down = kerneltest.NewMat(rng, down, hidden, inter, 0, 0)
	}
	for _, c := range []moeConfig{{}, {slots8: true, v1: true}, {tiles: 1}, {pipe: -1}, {q1: true}} {
		b.moe = c
		for _, n := range []int{1, 3, 8, moeFewTokens + 1, moeGTTokens, moeGTTokens + 1, 200, gemmRoundRows + 44} {
			tol := quantExpertsTol
			if n >= gemmRoundRows {
				tol = quantDecodedTol
			}
			checkExpertsTol(t, b, fmt.Sprintf("quant/%+v/n=%d", c, n), ex, n, k, rng, tol)
		}
	}
	b.mu.Lock()
	for _, x := range ex {
		for _, m := range []*kernels.Mat{x.GateUp, x.Gate, x.Down} {
			if m != nil && b.qweights[m] == nil {
				t.Errorf("a %v expert matrix is not in its blocks on the device", m.DType)
			}
		}
	}
	b.mu.Unlock()

	// Row-exact: each token's bits those of its call alone.
	checkExpertsRowExact(t, b, rng, "quant ", ex, 12, k, []moeConfig{{}, {tiles: 1}, {tiles: 1, gt: 1}, {slots8: true}, {q1: true}},
		[]int{2, 8, 12})
}

// TestExpertKindsX8 checks which expert sets take the int8-activation
// kernels (expertKinds.x8, folded matrix by matrix in expertTable): every
// gate/up, and every down, block-quantized with one scale group each.
func TestExpertKindsX8(t *testing.T) {
	fold := func(gu, down []kernels.DType) expertKinds {
		var k expertKinds
		for _, dt := range gu {
			k.guGroup = foldXGroup(k.guGroup, dt)
		}
		for _, dt := range down {
			k.dGroup = foldXGroup(k.dGroup, dt)
		}
		return k
	}
	for _, c := range []struct {
		gu, down []kernels.DType
		x8       bool
	}{
		{[]kernels.DType{kernels.Q4K, kernels.Q4K}, []kernels.DType{kernels.Q6K, kernels.Q4K}, true}, // Q4_K_M: one group of 256
		{[]kernels.DType{kernels.Q8_0, kernels.Q4_0}, []kernels.DType{kernels.Q8_0}, true},           // groups of 32
		{[]kernels.DType{kernels.Q4K, kernels.Q8_0}, []kernels.DType{kernels.Q6K}, false},            // 256 beside 32
		{[]kernels.DType{kernels.Q4K, kernels.BF16}, []kernels.DType{kernels.Q6K}, false},            // a bf16 up
		{[]kernels.DType{kernels.Q4K}, []kernels.DType{kernels.Q6K, kernels.F32}, false},             // a float32 down
		{[]kernels.DType{kernels.BF16}, []kernels.DType{kernels.BF16}, false},
	} {
		if got := fold(c.gu, c.down).x8(); got != c.x8 {
			t.Errorf("gate/up %v, down %v: x8 %v, want %v", c.gu, c.down, got, c.x8)
		}
	}
	if quantX8Bytes(3, 512) != 3*512+3*32*8 || quantX8Bytes(1, 40) != 48+2*8 {
		t.Errorf("quantX8Bytes: %d, %d", quantX8Bytes(3, 512), quantX8Bytes(1, 40))
	}
}

// TestMMQRoute checks, without a GPU, which products take the tensor-core
// product over the blocks (mmqFits, x8Rows) and its column splits
// (mmqSplits): enough blocks for two a multiprocessor where the columns
// allow, never more splits than chunks or mmqMaxSplits, and one split for
// a weight wide enough alone.
func TestMMQRoute(t *testing.T) {
	var b Backend
	for _, c := range []struct {
		n, cols int
		mmq, x8 bool
	}{{1, 4096, false, true}, {quantGemvRows, 4096, false, true}, {quantGemvRows + 1, 4096, true, true}, {40, 2304, true, true},
		{40, 2300, false, false}, {quantMMQRows, 4096, true, true}, {quantMMQRows + 1, 4096, false, false}} {
		if got := b.mmqFits(c.n, c.cols); got != c.mmq {
			t.Errorf("mmqFits(%d, %d) = %v, want %v", c.n, c.cols, got, c.mmq)
		}
		if got := b.x8Rows(c.n, c.cols); got != c.x8 {
			t.Errorf("x8Rows(%d, %d) = %v, want %v", c.n, c.cols, got, c.x8)
		}
	}
	b.noQX8 = true
	if b.mmqFits(40, 4096) || b.x8Rows(1, 4096) {
		t.Errorf("FERRITE_CUDA_QX8=0 still takes int8 x")
	}
	d := &Device{SMs: 132}
	for _, c := range []struct{ rows, cols, want int }{
		{6144, 4096, 6}, {4096, 4096, 9}, {24576, 4096, 2}, {4096, 12288, 9}, {151936, 4096, 1}, {100, 256, 2}, {100, 128, 1}, {300, 2304, 16},
	} {
		got := d.mmqSplits(c.rows, c.cols)
		if got != c.want {
			t.Errorf("mmqSplits(%d, %d) = %d, want %d", c.rows, c.cols, got, c.want)
		}
		if blocks := ceilDiv(c.rows, mmqRows) * got; got < min(c.cols/mmqChunk, mmqMaxSplits) && blocks < 2*d.SMs {
			t.Errorf("mmqSplits(%d, %d) = %d: %d blocks, fewer than two a multiprocessor", c.rows, c.cols, got, blocks)
		}
	}
}

// quantX8ExpertsTol bounds the int8-activation experts (_q8) against
// ref.ExpertsRounded on the same rounding of x and of each SwiGLU output,
// of max |y|: the device's SwiGLU outputs differ from the reference's in
// float32 rounding, so one within that of a half step of its int8 grid
// rounds to the other neighbour (±d for that element, ~5e-4 of max |y| at
// these shapes); x itself is the same on both sides.
const quantX8ExpertsTol = 2e-3

// TestQuantExpertsX8 runs Experts on experts whose gates, ups and downs are
// all block-quantized with one int8 scale group each (a Q4_K_M file's Q4_K
// gate/up beside Q6_K downs; Q8_0; Q5_K beside Q4_K): up to moeFewTokens
// tokens take the int8-activation kernels (ferrite_qx8, then the _q8
// forms), from there to 255 the grouped tensor-core product
// (ferrite_moe_mmq_*), checked against ref.ExpertsRounded with x and every
// SwiGLU output rounded as ferrite_qx8 rounds them; up to moeFewTokens
// each token's bits are those of its call alone, past it those of any
// batch; with FERRITE_CUDA_QX8=0 the float32 forms against ref.Experts.
func TestQuantExpertsX8(t *testing.T) {
	b := openOps(t)
	defer func(c moeConfig) { b.moe, b.noQX8 = c, false }(b.moe)
	const e, k, hidden, inter = 9, 4, 512, 256
	rng := rand.New(rand.NewPCG(91, 92))
	for _, c := range []struct {
		gu, down kernels.DType
		fused    bool
	}{{kernels.Q4K, kernels.Q6K, true}, {kernels.Q8_0, kernels.Q8_0, false}, {kernels.Q5K, kernels.Q4K, false}} {
		ex := make([]kernels.Expert, e)
		for i := range ex {
			if c.fused {
				ex[i].GateUp = kerneltest.NewMat(rng, c.gu, 2*inter, hidden, 0, 0)
			} else {
				ex[i].Gate, ex[i].Up = kerneltest.NewMat(rng, c.gu, inter, hidden, 0, 0), kerneltest.NewMat(rng, c.gu, inter, hidden, 0, 0)
			}
			ex[i].Down = kerneltest.NewMat(rng, c.down, hidden, inter, 0, 0)
		}
		rx := func(v []float32) []float32 { return quantX8Round(v, quantXGroup(c.gu)) }
		rh := func(v []float32) []float32 { return quantX8Round(v, quantXGroup(c.down)) }
		b.moe, b.noQX8 = moeConfig{}, false
		for _, n := range []int{1, 3, moeFewTokens, moeFewTokens + 1, 40, 100, 200} { // from 9 tokens the grouped tensor-core product
			checkExpertsRounded(t, b, fmt.Sprintf("%v+%v/x8/n=%d", c.gu, c.down, n), ex, n, k, rng, quantX8ExpertsTol, rx, rh)
		}
		// The grouped tensor-core product: a token's bits do not depend on
		// the tokens beside it.
		checkBatchBits(t, b, fmt.Sprintf("%v+%v: ", c.gu, c.down), ex, k, rng)
		b.mu.Lock()
		kinds := b.qexperts[&ex[0]]
		b.mu.Unlock()
		if want := (expertKinds{quant: true, qbf16: true, guGroup: quantXGroup(c.gu), dGroup: quantXGroup(c.down), oneDT: true}); kinds != want {
			t.Errorf("%v+%v: expert kinds %+v, want %+v", c.gu, c.down, kinds, want)
		}
		checkExpertsRowExact(t, b, rng, fmt.Sprintf("%v+%v x8 ", c.gu, c.down), ex, moeFewTokens, k, []moeConfig{{}}, []int{2, moeFewTokens})
		// A verification of more tokens (the row-exact mode) keeps to them.
		b.SetRowExact(true)
		checkExpertsRowExact(t, b, rng, fmt.Sprintf("%v+%v x8 row-exact ", c.gu, c.down), ex, 12, k, []moeConfig{{}},
			[]int{moeFewTokens + 1, 12})
		b.SetRowExact(false)
		b.noQX8 = true
		checkExpertsTol(t, b, fmt.Sprintf("%v+%v/float32 x/n=3", c.gu, c.down), ex, 3, k, rng, quantExpertsTol)
	}
}

// TestQuantDecodeShared runs, in one step, six quantized Linear products
// of 40 rows (each decoding its weight into bf16) with a 300-token Experts
// call (decoding the chosen experts) between them: every op's decoding
// goes to the one shared decode buffer in stream order, so each output
// must still match its reference, the buffer must be as large as the
// largest decoding, and the step's arena must not hold the decodings (it
// did: a Q4_K 8B's benchmark sweep grew the arena to 59 GB, bf16's to 42.6).
func TestQuantDecodeShared(t *testing.T) {
	b := openOps(t)
	defer func(r int) { quantMMQRows = r }(quantMMQRows)
	quantMMQRows = 0 // 40 rows decode their weights
	rng := rand.New(rand.NewPCG(71, 72))
	const n, cols = 40, 1024
	type lin struct {
		w     *kernels.Mat
		x, y  kernels.Tensor
		want  []float32
		mag   []float32
		bytes int64 // the decoding's two bf16 terms
	}
	var lins []lin
	most := int64(0)
	for i := range 6 {
		w := kerneltest.NewMat(rng, quantTypes[i%len(quantTypes)], 256*(i+1), cols, 0, 0)
		xv := randF32(rng, n*cols)
		want, mag := quantWant(xv, w, n, false)
		l := lin{w: w, x: f32Tensor(t, b, n, cols, xv), y: f32Tensor(t, b, n, w.Rows, make([]float32, n*w.Rows)),
			want: want, mag: mag, bytes: 2 * alignUp(int64(w.Rows*cols*2), arenaAlign)}
		most = max(most, l.bytes)
		lins = append(lins, l)
	}
	const e, k, hidden, inter, tokens = 6, 2, 512, 256, 300
	ex := make([]kernels.Expert, e)
	for i := range ex {
		ex[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.Q4K, 2*inter, hidden, 0, 0),
			Down: kerneltest.NewMat(rng, kernels.Q6K, hidden, inter, 0, 0)}
	}
	most = max(most, alignUp(int64(3*e*inter*hidden*2), arenaAlign)+int64(3*e*expertDescBytes))
	xv, wv := randF32(rng, tokens*hidden), randF32(rng, tokens*k)
	ids := make([]int32, tokens*k)
	for i := range tokens {
		for j, p := range rng.Perm(e)[:k] {
			ids[i*k+j] = int32(p)
		}
	}
	xe, we := f32Tensor(t, b, tokens, hidden, xv), f32Tensor(t, b, tokens, k, wv)
	ie, ye := i32Tensor(t, b, tokens, k, ids), f32Tensor(t, b, tokens, hidden, make([]float32, tokens*hidden))
	b.BeginStep()
	for i, l := range lins {
		b.Linear(l.y, l.x, l.w, kernels.Epilogue{})
		if i == 2 {
			b.Experts(ye, xe, ie, we, ex)
		}
	}
	b.arena.mu.Lock()
	used := b.arena.used
	b.arena.mu.Unlock()
	b.EndStep()
	for i, l := range lins {
		got := make([]float32, n*l.w.Rows)
		b.ReadF32(got, l.y)
		checkQuant(t, fmt.Sprintf("linear %d (%v)", i, l.w.DType), got, l.want, l.mag, quantTol(false, n))
	}
	got := make([]float32, tokens*hidden)
	b.ReadF32(got, ye)
	want := make([]float32, tokens*hidden)
	ref.Experts(want, xv, ids, wv, tokens, ex)
	m, worst := 0.0, 0.0
	for i, v := range want {
		m = max(m, math.Abs(float64(v)))
		worst = max(worst, math.Abs(float64(got[i])-float64(v)))
	}
	if !(worst <= quantDecodedTol*m) {
		t.Errorf("experts between the products: max |Δ| %.3g, %.3g of max |y| %.3g", worst, worst/m, m)
	}
	if got := b.dbuf.size; got < most || got > alignUp(most, 1<<20) {
		t.Errorf("the decode buffer holds %d bytes, want the largest decoding's %d", got, most)
	}
	sum := int64(0)
	for _, l := range lins {
		sum += l.bytes
	}
	if used >= sum {
		t.Errorf("the step's arena took %d bytes, as much as the products' decodings (%d)", used, sum)
	}
}

// TestQuantDecodeFallback: where the device has no room for a decoding
// (decodeBuf fails), a wide quantized product takes the GEMV over the
// blocks, and a prefill's experts the grouped tensor-core product on int8 x
// (with FERRITE_CUDA_QX8=0, the CUDA-core tiles): the results hold at those
// paths' tolerances and nothing is decoded.
func TestQuantDecodeFallback(t *testing.T) {
	b := openOps(t)
	defer func(r int) { quantMMQRows, b.noQX8 = r, false }(quantMMQRows)
	quantMMQRows = 0 // 40 rows would decode their weight
	b.decodeMost = 1
	rng := rand.New(rand.NewPCG(81, 82))
	const n, cols = 40, 1024
	w := kerneltest.NewMat(rng, kernels.Q4K, 300, cols, 0, 0)
	xv := randF32(rng, n*cols)
	want, mag := quantWant(xv, w, n, !b.noQX8) // the GEMV, on int8 x
	x, y := f32Tensor(t, b, n, cols, xv), f32Tensor(t, b, n, w.Rows, make([]float32, n*w.Rows))
	b.BeginStep()
	b.Linear(y, x, w, kernels.Epilogue{})
	b.EndStep()
	got := make([]float32, n*w.Rows)
	b.ReadF32(got, y)
	checkQuant(t, "linear without a decoding", got, want, mag, quantTol(!b.noQX8, n))
	ex := make([]kernels.Expert, 5)
	for i := range ex {
		ex[i] = kernels.Expert{GateUp: kerneltest.NewMat(rng, kernels.Q4K, 2*256, 512, 0, 0),
			Down: kerneltest.NewMat(rng, kernels.Q6K, 512, 256, 0, 0)}
	}
	rx := func(v []float32) []float32 { return quantX8Round(v, quantXGroup(kernels.Q4K)) }
	rh := func(v []float32) []float32 { return quantX8Round(v, quantXGroup(kernels.Q6K)) }
	checkExpertsRounded(t, b, "experts without a decoding, int8 x", ex, gemmRoundRows+10, 2, rng, quantX8ExpertsTol, rx, rh)
	b.noQX8 = true
	checkExpertsTol(t, b, "experts without a decoding, float32 x", ex, gemmRoundRows+10, 2, rng, quantExpertsTol)
	if b.dbuf != nil {
		t.Errorf("a %d-byte decode buffer, want none", b.dbuf.size)
	}
}
