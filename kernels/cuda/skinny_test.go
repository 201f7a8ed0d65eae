//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestSkinnySplits checks the split choice: every split gets a chunk, at
// most skinnyMaxSplits, none past the counters, and the Qwen3-8B layers
// on 132 multiprocessors fill them (row blocks × splits within one wave
// for the small layers, the LM head split at most in two, which evens
// its 4.5 waves).
func TestSkinnySplits(t *testing.T) {
	for gx := 1; gx <= 700; gx += 7 {
		for _, chunks := range []int{1, 2, 3, 7, 64, 192} {
			for _, n := range []int{2, 64} {
				ks := skinnySplits(gx, chunks, 132, n)
				if ks < 1 || ks > skinnyMaxSplits || ks > chunks || ceilDiv(chunks, ceilDiv(chunks, ks)) != ks {
					t.Fatalf("gx %d, chunks %d, n %d: %d splits", gx, chunks, n, ks)
				}
			}
		}
	}
	if ks := skinnySplits(skinnyCounters+1, 64, 132, 8); ks != 1 {
		t.Errorf("%d splits past the counters", ks)
	}
	for _, c := range []struct {
		name       string
		gx, chunks int
	}{{"qkv", 24, 64}, {"o", 16, 64}, {"down", 16, 192}, {"lm_head", 594, 64}} {
		for _, n := range []int{8, 32, 64} {
			ks := skinnySplits(c.gx, c.chunks, 132, n)
			t.Logf("%s n=%d: %d splits, %d blocks", c.name, n, ks, ks*c.gx)
			if c.name == "lm_head" && ks > 2 || c.name != "lm_head" && (ks*c.gx > 132 || ks*c.gx < 100) {
				t.Errorf("%s n=%d: %d splits of %d row blocks", c.name, n, ks, c.gx)
			}
		}
	}
}

// batchTest skips t unless FERRITE_TEST_BATCH=1: the decode-batch kernels
// that are off by default (skinny GEMM, rowattn) run their GPU tests in
// their own process (device stage batch), so that a fault there cannot
// take the rest of the suite's device with it.
func batchTest(t *testing.T) {
	t.Helper()
	if os.Getenv("FERRITE_TEST_BATCH") != "1" {
		t.Skip("FERRITE_TEST_BATCH=1 runs the decode-batch kernels' tests")
	}
}

// TestSkinny checks the skinny GEMM against kernels/ref at the conformance
// tolerance (kerneltest.LinearTol of Σ|x·w| (+|bias| +|y|); SwiGLULinear's
// scale as kerneltest states it): rows of x from 2 to 64 (each kernel
// size, partial tiles), weight heights that end mid-tile and mid-block,
// widths that end mid-chunk, K split 1 to 7 ways or as the heuristic
// picks, bias, residual add, the SwiGLU with and without its clamp. A
// guard row after y must keep its poison, and the split counters must be
// back at zero. It logs each case's worst error as a fraction of its
// allowance.
func TestSkinny(t *testing.T) {
	batchTest(t)
	b := openOps(t)
	b.SetSkinnyRows(skinnyMaxRows)
	type tcase struct {
		n, rows, cols int
		swiglu        bool
		limit         float32
		bias, acc     bool
	}
	cases := []tcase{
		{2, 37, 72, false, 0, true, true}, {7, 300, 448, false, 0, false, false}, {8, 256, 64, false, 0, true, false},
		{9, 513, 136, false, 0, false, true}, {16, 100, 1032, false, 0, true, true}, {31, 260, 200, false, 0, false, false},
		{33, 64, 448, false, 0, true, true}, {64, 257, 320, false, 0, false, true}, {64, 1000, 640, false, 0, true, false},
		{3, 77, 136, true, 0, false, false}, {17, 128, 448, true, 0.5, false, false}, {64, 200, 264, true, 0, false, false},
		{40, 129, 64, true, 2, false, false},
	}
	for _, c := range cases {
		for _, ks := range []int{0, 1, 3, 7} {
			name := fmt.Sprintf("n=%d,%dx%d,swiglu=%v,limit=%v,bias=%v,acc=%v,ks=%d", c.n, c.rows, c.cols, c.swiglu, c.limit, c.bias, c.acc, ks)
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(c.n*1000+c.rows), uint64(c.cols)))
				m := kerneltest.NewMat(rng, kernels.BF16, c.rows, c.cols, 0, 0)
				up := kerneltest.NewMat(rng, kernels.BF16, c.rows, c.cols, 0, 0)
				var w *Weight
				var err error
				if c.swiglu {
					w, err = b.stacked(m, up)
				} else {
					w, err = b.weight(m)
				}
				if err != nil {
					t.Fatal(err)
				}
				xv := randF32(rng, c.n*c.cols)
				y0 := make([]float32, (c.n+1)*c.rows) // one guard row after y
				for i := range y0 {
					y0[i] = math.Float32frombits(0x7fc0dead)
				}
				if c.acc {
					copy(y0, randF32(rng, c.n*c.rows))
				}
				var bv []float32
				var bias uint64
				if c.bias {
					bv = randF32(rng, c.rows)
					bias = dptr(f32Tensor(t, b, 1, c.rows, bv))
				}
				x, y := f32Tensor(t, b, c.n, c.cols, xv), f32Tensor(t, b, c.n+1, c.rows, y0)
				if !b.useSkinny(w, c.n, dptr(x)) {
					t.Fatal("the skinny GEMM does not take this case")
				}
				b.BeginStep()
				if ks == 0 {
					b.linearSkinny(dptr(y), dptr(x), bias, w, c.n, c.acc, c.swiglu, c.limit)
				} else {
					b.skinnyKS(dptr(y), dptr(x), bias, w, c.n, c.acc, c.swiglu, c.limit, ks)
				}
				b.EndStep()
				got := make([]float32, (c.n+1)*c.rows)
				b.ReadF32(got, y)
				for i, v := range got[c.n*c.rows:] {
					if math.Float32bits(v) != 0x7fc0dead {
						t.Fatalf("guard row written at %d: %g", i, v)
					}
				}
				got = got[:c.n*c.rows]
				want, abs := skinnyWant(xv, y0[:c.n*c.rows], bv, m, up, c.n, c.acc, c.swiglu, c.limit)
				worst := 0.0
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i])-float64(want[i]))/(kerneltest.LinearTol*abs[i]))
				}
				t.Logf("worst error %.3g of the allowance", worst)
				compare(t, got, want, abs, kerneltest.LinearTol)
			})
		}
	}
	cnt := download(t, b.skinny.counters, skinnyCounters)
	for i, v := range cnt {
		if math.Float32bits(v) != 0 {
			t.Fatalf("split counter %d left at %d", i, math.Float32bits(v))
		}
	}
}

// skinnyWant is the reference of a TestSkinny case and the scale its
// tolerance multiplies: y = x·mᵀ (+ bias) (+ y0), or the SwiGLU of x·mᵀ
// (gate) and x·upᵀ.
func skinnyWant(xv, y0, bv []float32, m, up *kernels.Mat, n int, acc, swiglu bool, limit float32) (want []float32, abs []float64) {
	rows, cols := m.Rows, m.Cols
	// scale is Σ_k |x[i,k]·w[j,k]| for every (i, j).
	scale := func(w *kernels.Mat) []float64 {
		s := make([]float64, n*rows)
		row := make([]float32, cols)
		for j := range rows {
			w.RowF32(row, j)
			for i := range n {
				for k, v := range row {
					s[i*rows+j] += math.Abs(float64(v) * float64(xv[i*cols+k]))
				}
			}
		}
		return s
	}
	gs := scale(m)
	want = make([]float32, n*rows)
	if !swiglu {
		if acc {
			copy(want, y0)
		}
		ref.Linear(want, xv, m, bv, acc, n)
		for i := range gs {
			if bv != nil {
				gs[i] += math.Abs(float64(bv[i%rows]))
			}
			if acc {
				gs[i] += math.Abs(float64(y0[i]))
			}
		}
		return want, gs
	}
	us := scale(up)
	g, u := make([]float32, n*rows), make([]float32, n*rows)
	ref.Linear(g, xv, m, nil, false, n)
	ref.Linear(u, xv, up, nil, false, n)
	ref.SwiGLUClamp(want, g, u, limit)
	abs = make([]float64, n*rows)
	for i := range abs { // as kerneltest's SwiGLULinear case
		abs[i] = 1.1*gs[i]*math.Abs(float64(u[i])) + us[i]*math.Abs(float64(g[i])) + gs[i]*us[i] +
			max(1, math.Abs(float64(want[i])))*kerneltest.RowOpTol/kerneltest.LinearTol
	}
	return want, abs
}

// BenchmarkSkinny times the decode-batch products at Qwen3-8B's shapes for
// 8 to 64 rows of float32 x: the skinny GEMM (one kernel, its split
// heuristic) against what Linear ran before it, cuBLASLt with x split into
// two bf16 terms (the split kernel, the GEMM over 2n rows, the epilogue
// kernel; for gate_up also ferrite_swiglu_cat). gate_up is SwiGLULinear
// (the stacked 24576 × 4096 weight in, 12288 outputs a row), the others
// Linear. Weights rotate over ≥ 1 GiB of copies so none is in L2; GB/s
// counts the weight's bytes once per call. At 32 and 64 rows the layers but
// the LM head also run other split counts (skinny/ks=N).
func BenchmarkSkinny(b *testing.B) {
	be := openOps(b)
	d := be.dev
	if err := d.HasGemm(); err != nil {
		b.Skip(err)
	}
	counters := be.skinnyCounters()
	if counters == nil {
		b.Fatal("no split counters")
	}
	if d.SmemOptIn < skinnySmem(3) {
		b.Skipf("%d bytes of shared memory a block, the skinny GEMM takes %d", d.SmemOptIn, skinnySmem(3))
	}
	const maxN = 64
	for _, s := range qwen3_8B {
		bytes := int64(s.rows) * int64(s.cols) * 2
		ws := benchWeights(b, d, int(max(2, (1<<30)/bytes)), s.rows, s.cols)
		swiglu := s.name == "gate_up"
		out := s.rows
		if swiglu {
			out = s.rows / 2
		}
		x, y := benchF32(b, d, maxN*s.cols), benchF32(b, d, maxN*out)
		gx, chunks := skinnyGrid(ws[0], swiglu)
		sweep := s.name != "lm_head" // other split counts at 32 and 64 rows
		sums := 1                    // the largest split sums of the four n
		for tile, n := range []int{8, 16, 32, 64} {
			ks := skinnySplits(gx, chunks, d.SMs, n)
			if sweep && n >= 32 {
				ks = skinnyMaxSplits
			}
			if ks > 1 {
				sums = max(sums, ks*gx*skinnyWarps*skinnyWarpSums<<tile)
			}
		}
		part := benchF32(b, d, sums)
		xb := benchF32(b, d, maxN*s.cols)   // the split x (2n, cols) bf16
		tb := benchF32(b, d, 2*maxN*s.rows) // the GEMM's (2n, rows) products
		for _, n := range []int{8, 16, 32, 64} {
			ks := skinnySplits(gx, chunks, d.SMs, n)
			run := func(name string, launch func(w *Weight) error) {
				b.Run(fmt.Sprintf("%s_%dx%d/n=%d/%s", s.name, s.rows, s.cols, n, name), func(b *testing.B) {
					el := timeLaunches(b, d, b.N, func(i int) error { return launch(ws[i%len(ws)]) })
					b.ReportMetric(float64(bytes)*float64(b.N)/el.Seconds()/1e9, "GB/s")
					b.ReportMetric(el.Seconds()*1e6/float64(b.N), "us/call")
					if name == "skinny" {
						b.ReportMetric(float64(ks), "splits")
					}
				})
			}
			run("skinny", func(w *Weight) error {
				return d.skinnyL(y.ptr, x.ptr, 0, w, n, false, swiglu, 0, ks, part.ptr, counters.ptr)
			})
			for _, k := range []int{1, 2, 4, 8, 16} {
				if sweep && n >= 32 && k != ks {
					run(fmt.Sprintf("skinny/ks=%d", k), func(w *Weight) error {
						return d.skinnyL(y.ptr, x.ptr, 0, w, n, false, swiglu, 0, k, part.ptr, counters.ptr)
					})
				}
			}
			run("cublas", func(w *Weight) error {
				cnt := int64(n) * int64(s.cols)
				if err := d.launchL("ferrite_f32_to_bf16x2", d.elementwiseGrid(cnt), 256, 0, xb.ptr, x.ptr, uint64(cnt)); err != nil {
					return err
				}
				if err := d.gemmL(tb.ptr, xb.ptr, w, 2*n, false); err != nil {
					return err
				}
				total := int64(n) * int64(s.rows)
				if !swiglu {
					return d.launchL("ferrite_add_halves", d.elementwiseGrid(total), 256, 0, y.ptr, tb.ptr, uint64(0), uint64(total), i32(s.rows), b32(false))
				}
				if err := d.launchL("ferrite_add_halves", d.elementwiseGrid(total), 256, 0, tb.ptr, tb.ptr, uint64(0), uint64(total), i32(s.rows), b32(false)); err != nil {
					return err
				}
				half := int64(n) * int64(out)
				return d.launchL("ferrite_swiglu_cat", d.elementwiseGrid(half), 256, 0, y.ptr, tb.ptr, uint64(half), i32(out), f32(0))
			})
		}
	}
}
