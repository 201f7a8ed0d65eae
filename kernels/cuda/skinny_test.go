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

// TestSkinnyUnits checks the stream-K bookkeeping of src/skinny.cu in a Go
// emulation of it: over g blocks every unit is taken once, a block holds
// at most two pieces (its first and last segment) and never two in one
// slot, and the blocks the kernel counts for a split row block (from the
// owners of its first and last chunk) are exactly those holding a piece;
// and every kernel's shared memory fits an H200 block.
// It also logs the Qwen3-8B layers' chunks a block on 132 multiprocessors.
func TestSkinnyUnits(t *testing.T) {
	for _, gx := range []int{1, 2, 3, 7, 16, 32, 48, 192, 1187} {
		for _, chunks := range []int{1, 2, 3, 64, 192} {
			for _, g0 := range []int{0, 1, 3, 7, 131, 1 << 20} {
				g := skinnyBlocks(gx, chunks, g0, 132)
				u := gx * chunks
				if g < 1 || g > u {
					t.Fatalf("gx %d, chunks %d: %d blocks", gx, chunks, g)
				}
				pieces := map[int][]int{} // row block: blocks with a piece of it, in order
				slots := map[[2]int]bool{}
				seen := 0
				for blk := range g {
					u0, u1 := int(int64(blk)*int64(u)/int64(g)), int((int64(blk)+1)*int64(u)/int64(g))
					if u0 >= u1 {
						t.Fatalf("gx %d, chunks %d, %d blocks: block %d has no unit", gx, chunks, g, blk)
					}
					seen += u1 - u0
					first := u0 / chunks
					n := 0
					for s := u0; s < u1; {
						rb := s / chunks
						e := min(u1, (rb+1)*chunks)
						if s%chunks != 0 || e%chunks != 0 { // a piece
							n++
							slot := 1
							if rb == first {
								slot = 0
							}
							if slots[[2]int{blk, slot}] {
								t.Fatalf("block %d: slot %d twice", blk, slot)
							}
							slots[[2]int{blk, slot}] = true
							pieces[rb] = append(pieces[rb], blk)
						}
						s = e
					}
					if n > 2 {
						t.Fatalf("block %d: %d pieces", blk, n)
					}
				}
				if seen != u {
					t.Fatalf("%d of %d units taken", seen, u)
				}
				owner := func(v int) int { return int((int64(v+1)*int64(g)+int64(u)-1)/int64(u)) - 1 }
				for rb, bs := range pieces {
					bf, bl := owner(rb*chunks), owner(rb*chunks+chunks-1)
					if bs[0] != bf || bs[len(bs)-1] != bl || len(bs) != bl-bf+1 || bl-bf < 1 {
						t.Fatalf("gx %d, chunks %d, %d blocks: row block %d pieces %v, counted %d…%d", gx, chunks, g, rb, bs, bf, bl)
					}
				}
			}
		}
	}
	for tile := range 4 { // an H100/H200 block may opt in to 227 KiB
		if sm := skinnySmem(tile); sm > 227<<10 {
			t.Errorf("tile %d: %d bytes of shared memory", tile, sm)
		}
	}
	for _, c := range qwen3_8B {
		gx, chunks := ceilDiv(c.rows, skinnyBlockRows), ceilDiv(c.cols, skinnyChunk)
		if c.name == "gate_up" {
			gx = ceilDiv(c.rows/2, skinnyBlockRows/2)
		}
		g := skinnyBlocks(gx, chunks, 0, 132)
		t.Logf("%s: %d row blocks × %d chunks over %d blocks: %.1f chunks a block", c.name, gx, chunks, g, float64(gx*chunks)/float64(g))
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
// scale as kerneltest states it): rows of x from 1 to 64 (each kernel
// size, partial tiles), weight heights that end mid-tile and mid-block,
// widths that end mid-chunk, the units dealt over 1, 3, 7 blocks, one a
// multiprocessor or one a unit (each with another of the L2 hints), bias,
// residual add, the SwiGLU with and without its clamp. A guard row after y must keep its poison, and the
// split counters must be back at zero. It logs each case's worst error as
// a fraction of its allowance. TestSkinnyShapes runs the Qwen3-8B shapes.
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
		{40, 129, 64, true, 2, false, false}, {1, 300, 200, false, 0, true, true}, {1, 70, 72, true, 0, false, false},
		{57, 384, 1216, false, 0, true, true}, {24, 640, 776, true, 0, false, false},
	}
	for _, c := range cases {
		for gi, g := range []int{0, 1, 3, 7, 1 << 20} {
			b.skinny.l2 = gi % 4 // the L2 hints do not change a bit
			name := fmt.Sprintf("n=%d,%dx%d,swiglu=%v,limit=%v,bias=%v,acc=%v,g=%d", c.n, c.rows, c.cols, c.swiglu, c.limit, c.bias, c.acc, g)
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
				if c.n > 1 && !b.useSkinny(w, c.n, dptr(x)) || b.skinnyCounters() == nil {
					t.Fatal("the skinny GEMM does not take this case")
				}
				b.BeginStep()
				b.skinnyG(dptr(y), dptr(x), bias, w, c.n, c.acc, c.swiglu, c.limit, g)
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

// TestSkinnyOps runs the op-set conformance suite (kerneltest.RunOps) with
// the skinny GEMM taking the products of 2 to 64 rows: Linear, LinearCat,
// SwiGLULinear and their norm forms at the suite's tolerances.
func TestSkinnyOps(t *testing.T) {
	batchTest(t)
	b := openOps(t)
	b.SetSkinnyRows(skinnyMaxRows)
	kerneltest.RunOps(t, b)
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

// TestSkinnyShapes checks the skinny GEMM at Qwen3-8B's shapes (q/k/v
// with a bias, o and down adding into y, gate/up with the SwiGLU, the LM
// head) for 1, 8, 17, 32 and 64 rows of x against float64 sums of sampled
// output rows (every 61st, at most 600 of them, and the last three), at
// TestSkinny's tolerance;
// the weights are random on the device and read back for the reference.
func TestSkinnyShapes(t *testing.T) {
	batchTest(t)
	b := openOps(t)
	d := b.dev
	if b.skinnyCounters() == nil {
		t.Fatal("no split counters")
	}
	for si, s := range qwen3_8B {
		buf, err := d.Alloc(int64(s.rows) * int64(s.cols) * 2)
		if err == nil {
			err = d.FillBF16(buf, int64(s.rows)*int64(s.cols), uint64(si+7), 0.05)
		}
		if err != nil {
			t.Fatal(err)
		}
		host := make([]byte, s.rows*s.cols*2)
		if err := buf.Download(host, 0); err != nil {
			t.Fatal(err)
		}
		w := &Weight{Buf: buf, DType: kernels.BF16, Rows: s.rows, Cols: s.cols}
		wAt := func(r, k int) float64 {
			i := 2 * (r*s.cols + k)
			return float64(math.Float32frombits(uint32(host[i])<<16 | uint32(host[i+1])<<24))
		}
		swiglu, out := s.name == "gate_up", s.rows
		if swiglu {
			out = s.rows / 2
		}
		acc, hasBias := s.name == "o" || s.name == "down", s.name == "qkv"
		var sample []int
		for r := 0; r < out-3; r += max(61, out/600) {
			sample = append(sample, r)
		}
		sample = append(sample, out-3, out-2, out-1)
		for _, n := range []int{1, 8, 17, 32, 64} {
			t.Run(fmt.Sprintf("%s_%dx%d/n=%d", s.name, s.rows, s.cols, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), uint64(si)))
				xv := randF32(rng, n*s.cols)
				y0 := make([]float32, (n+1)*out)
				for i := range y0 {
					y0[i] = math.Float32frombits(0x7fc0dead)
				}
				if acc {
					copy(y0, randF32(rng, n*out))
				}
				var bv []float32
				var bias uint64
				if hasBias {
					bv = randF32(rng, out)
					bias = dptr(f32Tensor(t, b, 1, out, bv))
				}
				x, y := f32Tensor(t, b, n, s.cols, xv), f32Tensor(t, b, n+1, out, y0)
				b.BeginStep()
				b.skinnyG(dptr(y), dptr(x), bias, w, n, acc, swiglu, 0, 0)
				b.EndStep()
				got := make([]float32, (n+1)*out)
				b.ReadF32(got, y)
				for i, v := range got[n*out:] {
					if math.Float32bits(v) != 0x7fc0dead {
						t.Fatalf("guard row written at %d: %g", i, v)
					}
				}
				// dot is x row i times weight row r in float64, and Σ|x·w|.
				dot := func(i, r int) (v, a float64) {
					for k := range s.cols {
						p := float64(xv[i*s.cols+k]) * wAt(r, k)
						v += p
						a += math.Abs(p)
					}
					return v, a
				}
				var gv, wv []float32
				var abs []float64
				for i := range n {
					for _, r := range sample {
						v, a := dot(i, r)
						want := float32(v)
						if swiglu {
							u, ua := dot(i, out+r)
							sw := make([]float32, 1)
							ref.SwiGLUClamp(sw, []float32{float32(v)}, []float32{float32(u)}, 0)
							want = sw[0]
							a = 1.1*a*math.Abs(u) + ua*math.Abs(v) + a*ua + max(1, math.Abs(float64(want)))*kerneltest.RowOpTol/kerneltest.LinearTol
						} else {
							if hasBias {
								want += bv[r]
								a += math.Abs(float64(bv[r]))
							}
							if acc {
								want += y0[i*out+r]
								a += math.Abs(float64(y0[i*out+r]))
							}
						}
						gv, wv, abs = append(gv, got[i*out+r]), append(wv, want), append(abs, a)
					}
				}
				worst := 0.0
				for i := range wv {
					worst = max(worst, math.Abs(float64(gv[i])-float64(wv[i]))/(kerneltest.LinearTol*abs[i]))
				}
				t.Logf("worst error %.3g of the allowance (%d outputs)", worst, len(wv))
				compare(t, gv, wv, abs, kerneltest.LinearTol)
			})
		}
		buf.Free()
	}
}

// BenchmarkSkinny times the decode-batch products at Qwen3-8B's shapes for
// 8 to 64 rows of float32 x: the skinny GEMM (one kernel, one block a
// multiprocessor) against what Linear runs without it, cuBLASLt with x
// split into two bf16 terms (the split kernel, the GEMM over 2n rows, the
// epilogue kernel: ferrite_add_halves, for gate_up
// ferrite_add_halves_swiglu). gate_up is
// SwiGLULinear (the stacked 24576 × 4096 weight in, 12288 outputs a row),
// the others Linear. Weights rotate over ≥ 1 GiB of copies so none is in
// L2; GB/s counts the weight's bytes once per call. At 32 and 64 rows the
// skinny GEMM also runs with each of its L2 hints (skinny/l2=N); at every
// n without its lo-term MMAs (skinny/flags=4) and without any MMA
// (skinny/flags=8), wrong sums, to show what each part costs.
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
		g := skinnyBlocks(gx, chunks, 0, d.SMs)
		part := benchF32(b, d, 2*g*skinnyBlockRows*maxN)
		xb := benchF32(b, d, maxN*s.cols)   // the split x (2n, cols) bf16
		tb := benchF32(b, d, 2*maxN*s.rows) // the GEMM's (2n, rows) products
		for _, n := range []int{8, 16, 32, 64} {
			run := func(name string, launch func(w *Weight) error) {
				b.Run(fmt.Sprintf("%s_%dx%d/n=%d/%s", s.name, s.rows, s.cols, n, name), func(b *testing.B) {
					el := timeLaunches(b, d, b.N, func(i int) error { return launch(ws[i%len(ws)]) })
					b.ReportMetric(float64(bytes)*float64(b.N)/el.Seconds()/1e9, "GB/s")
					b.ReportMetric(el.Seconds()*1e6/float64(b.N), "us/call")
				})
			}
			for l2 := range 4 { // the L2 hints, all at 32 and 64 rows
				if l2 > 0 && n < 32 {
					break
				}
				name := "skinny"
				if l2 > 0 {
					name = fmt.Sprintf("skinny/l2=%d", l2)
				}
				run(name, func(w *Weight) error {
					return d.skinnyL(y.ptr, x.ptr, 0, w, n, false, swiglu, 0, g, part.ptr, counters.ptr, l2)
				})
			}
			// The cost breakdown (wrong sums): without the lo-term MMAs, without any MMA.
			for _, f := range []int{4, 8} {
				run(fmt.Sprintf("skinny/flags=%d", f), func(w *Weight) error {
					return d.skinnyL(y.ptr, x.ptr, 0, w, n, false, swiglu, 0, g, part.ptr, counters.ptr, f)
				})
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
				half := int64(n) * int64(out)
				return d.launchL("ferrite_add_halves_swiglu", d.elementwiseGrid(half), 256, 0, y.ptr, tb.ptr, uint64(half), i32(out), f32(0), uint64(0))
			})
		}
	}
}
