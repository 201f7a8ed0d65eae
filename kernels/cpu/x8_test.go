package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestX8MatchesRowTiles checks the x8 and x16 kernels (the Go twins, and
// the assembly where this CPU runs it: AVX2, VNNI, VNNI on zmm) on packed
// weights against the Go tile run row by row on the stored ones: the same
// integer sums, the scales applied in another order, so they differ by
// float32 rounding. They must write y[r·ldy + Gg + l] and nothing else,
// one x row must get the same bits from the one- and four-row kernels, and
// the VNNI kernels (x8 and x16) the bits of the AVX2 ones. The assembly
// packers must write packX8Go's bytes.
func TestX8MatchesRowTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K} {
		sets := map[string]*x8Set{"go": &genericX8[dt]}
		if dt != kernels.Q4K {
			sets["go16"] = &genericX16[dt]
		}
		if a := asmX8(dt); a != nil {
			sets["asm"] = a
		}
		for name, set := range moreX8Sets(dt) {
			sets[name] = set
		}
		ks := []int{32, 96, 256, 1024}
		if dt == kernels.Q4K {
			ks = []int{256, 512, 1024}
		}
		for _, k := range ks {
			const rows, R = 48, 4 // three groups of 16, six of 8
			w := kerneltest.NewMat(rng, dt, rows, k, 0, 0)
			if dt == kernels.Q8_0 { // the extreme quants: −128 (a stored block may hold it) and 127
				w.Data[2], w.Data[3], w.Data[4*34+5] = 0x80, 0x7f, 0x80
			}
			x := kerneltest.RandN(rng, R*k)
			for i := 0; i < 32; i++ { // a zero block in x row 1
				x[k+i] = 0
			}
			x[5] = 30 // an outlier that sets a block's scale
			var qx qrows
			qx.quantize(x, R, k, xGroup(dt))
			packs := map[int][]byte{}
			for _, G := range []int{8, 16} {
				if G == 16 && dt == kernels.Q4K {
					continue
				}
				packed := make([]byte, rows/G*x8RowBytes(dt, k, G))
				packX8Go(packed, w.Data, dt, k, rows/G, G)
				if dt != kernels.Q4K && len(packed) != len(w.Data) {
					t.Fatalf("%v k=%d G=%d: packed %d bytes, stored %d", dt, k, G, len(packed), len(w.Data))
				}
				fast := make([]byte, len(packed)+1) // a guard byte
				fast[len(packed)] = 0xa5
				packX8(fast[:len(packed)], w.Data, dt, k, rows/G, G)
				if string(fast[:len(packed)]) != string(packed) || fast[len(packed)] != 0xa5 {
					t.Fatalf("%v k=%d G=%d: packX8 differs from packX8Go", dt, k, G)
				}
				packs[G] = packed
			}
			ldy := rows + 5
			want := make([]float32, R*rows)
			sums := make([]float64, R*rows) // Σ|xw| bounds the rounding
			row := make([]float32, k)
			for j := range rows {
				w.RowF32(row, j)
				for r := range R {
					genericQTiles[dt].r1(want[r*rows+j:], 1, qx.q[r*k:], qx.ds[2*r*k/32:], k, w.Data[j*dt.RowBytes(k):], k)
					for i, v := range row {
						sums[r*rows+j] += math.Abs(float64(v) * float64(x[r*k+i]))
					}
				}
			}
			bits := map[string][]float32{} // per set, x rows four at a time
			for name, set := range sets {
				var one []float32 // x rows one at a time
				for _, rr := range []int{1, R} {
					got := make([]float32, R*ldy)
					for i := range got {
						got[i] = -1
					}
					for r := 0; r < R; r += rr {
						f := set.r1
						if rr == 4 {
							f = set.r4
						}
						f(got[r*ldy:], ldy, qx.q[r*k:], qx.ds[2*r*k/32:], qx.bs[r*k/16:], k, packs[set.rows], k, rows/set.rows)
					}
					what := fmt.Sprintf("%s %v k=%d R%d", name, dt, k, rr)
					for i, v := range got {
						r, c := i/ldy, i%ldy
						if c >= rows {
							if v != -1 {
								t.Errorf("%s: wrote y[%d, %d] past the rows", what, r, c)
							}
							continue
						}
						wv, s := want[r*rows+c], sums[r*rows+c]
						if d := math.Abs(float64(v - wv)); !(d <= 1e-5*s) {
							t.Errorf("%s: y[%d, %d] = %g, Go tile %g (Σ|xw| %g)", what, r, c, v, wv, s)
						}
					}
					if one == nil {
						one = got
						continue
					}
					for i, v := range got {
						if math.Float32bits(v) != math.Float32bits(one[i]) {
							t.Errorf("%s: y[%d] = %g, one row at a time %g", what, i, v, one[i])
						}
					}
					bits[name] = got
				}
			}
			for _, name := range []string{"asm", "vnni8"} {
				if v, a := bits[name], bits["avx2"]; v != nil && a != nil {
					for i := range v {
						if math.Float32bits(v[i]) != math.Float32bits(a[i]) {
							t.Errorf("%v k=%d: %s y[%d] = %g, AVX2 %g", dt, k, name, i, v[i], a[i])
						}
					}
				}
			}
		}
	}
}

// BenchmarkX8Kernel runs the x8 kernels on one core over 64 rows of
// k = 1024 in L2, as BenchmarkQGemvKernel does the gemv kernels: GB/s of
// weights (counted once per x row) and the thread's CPU time per call.
func BenchmarkX8Kernel(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const k, rows = 1024, 64
	for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K} {
		sets := map[string]*x8Set{"go": &genericX8[dt]}
		if a := asmX8(dt); a != nil {
			sets["asm"] = a
		}
		for name, set := range moreX8Sets(dt) {
			sets[name] = set
		}
		w := kerneltest.NewMat(rng, dt, rows, k, 0, 0)
		x := kerneltest.RandN(rng, 4*k)
		var qx qrows
		qx.quantize(x, 4, k, xGroup(dt))
		y := make([]float32, 4*rows)
		for name, set := range sets {
			G := set.rows
			packed := make([]byte, rows/G*x8RowBytes(dt, k, G))
			packX8(packed, w.Data, dt, k, rows/G, G)
			for R, f := range map[int]x8Func{1: set.r1, 4: set.r4} {
				b.Run(fmt.Sprintf("%s/%v/R%d", name, dt, R), func(b *testing.B) {
					b.SetBytes(int64(R * len(w.Data)))
					cpuLoop(b, func() { f(y, rows, qx.q, qx.ds, qx.bs, k, packed, k, rows/G) })
				})
			}
			if name != "go" && name != "asm" {
				continue
			}
			b.Run(fmt.Sprintf("pack%s/%v/G%d", map[string]string{"go": "Go", "asm": ""}[name], dt, G), func(b *testing.B) {
				b.SetBytes(int64(len(w.Data)))
				pack := packX8
				if name == "go" {
					pack = packX8Go
				}
				cpuLoop(b, func() { pack(packed, w.Data, dt, k, rows/G, G) })
			})
		}
	}
}

// BenchmarkQPrefill runs one prefill-shaped MatMul (n = 512, Qwen3-0.6B's
// widest products) on one thread, all its tasks in turn, on the x8 path
// and off it: the thread's CPU time per call, which a busy machine
// disturbs less than the wall time.
func BenchmarkQPrefill(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 4))
	const n = 512
	for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K} {
		for _, s := range [][2]int{{3072, 1024}, {1024, 3072}} {
			w := kerneltest.NewMat(rng, dt, s[0], s[1], 0, 0)
			x := kerneltest.RandN(rng, n*s[1])
			y := make([]float32, n*s[0])
			for _, on := range []bool{false, true} {
				b.Run(fmt.Sprintf("%v/%dx%d/x8=%v", dt, s[0], s[1], on), func(b *testing.B) {
					defer x8Off.Store(x8Off.Load())
					x8Off.Store(!on)
					var m matmul
					var xs xbufs
					var scratch []float32
					var x8 x8Cache
					serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
					cpuLoop(b, func() {
						m.init(y, x, w, n, 1, &xs, false, x8.packed(w, serial, false))
						m.convertX(0, m.convertUnits())
						for t := range m.tasks {
							m.task(t, &scratch)
						}
					})
				})
			}
		}
	}
}

// TestLinearCatWritesInPlace checks that LinearCat, which has each
// weight's MatMul write straight into its columns of dst (row stride the
// total width), gives the bits of separate MatMuls plus the bias, on the
// x8 path (Q8_0 and Q4_0 kept packed, Q4_K packed per task) and off it, for a
// decode row and a prefill batch, leaving nothing unwritten.
func TestLinearCatWritesInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	b := New(2)
	defer b.Close()
	for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.BF16} {
		for _, n := range []int{1, 5, 37} {
			const cols = 256
			ws := []*kernels.Mat{kerneltest.NewMat(rng, dt, 40, cols, 0, 0), kerneltest.NewMat(rng, dt, 19, cols, 0, 0),
				kerneltest.NewMat(rng, dt, 24, cols, 0, 0)}
			total := 40 + 19 + 24
			xv := kerneltest.RandN(rng, n*cols)
			bv := kerneltest.RandN(rng, total)
			x, _ := b.Alloc(kernels.F32, n, cols)
			y, _ := b.Alloc(kernels.F32, n, total)
			bias, _ := b.Alloc(kernels.F32, 1, total)
			b.WriteF32(x, xv)
			b.WriteF32(bias, bv)
			poison := make([]float32, n*total)
			for i := range poison {
				poison[i] = float32(math.NaN())
			}
			b.WriteF32(y, poison)
			b.BeginStep()
			b.LinearCat(y, x, ws, kernels.Epilogue{Bias: bias})
			b.EndStep()
			got := make([]float32, n*total)
			b.ReadF32(got, y)
			c0 := 0
			for _, w := range ws {
				want := make([]float32, n*w.Rows)
				b.MatMul(want, xv, w, n)
				for i := range n {
					for j := range w.Rows {
						v, g := want[i*w.Rows+j]+bv[c0+j], got[i*total+c0+j]
						if math.Float32bits(v) != math.Float32bits(g) {
							t.Fatalf("%v n=%d: y[%d, %d] = %g, MatMul + bias %g", dt, n, i, c0+j, g, v)
						}
					}
				}
				c0 += w.Rows
			}
		}
	}
}

// TestScaleMinK4x8 checks the packer's scale unpacking against
// kernels.ScaleMinK4 on every byte value in every position.
func TestScaleMinK4x8(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	s := make([]byte, 12)
	for range 2000 {
		for i := range s {
			s[i] = byte(rng.Uint32())
		}
		sc, mn := scaleMinK4x8(s)
		for j := range 8 {
			ws, wm := kernels.ScaleMinK4(j, s)
			if byte(sc>>(8*j)) != ws || byte(mn>>(8*j)) != wm {
				t.Fatalf("scales % x, j %d: %d, %d; ScaleMinK4 %d, %d", s, j, byte(sc>>(8*j)), byte(mn>>(8*j)), ws, wm)
			}
		}
	}
}

// TestRowsIndependentOfGrouping checks that a weight row's products do not
// depend on the rows around it: two weights multiplied one by one give the
// bits of the same weights stacked into one matrix (as a fused gate/up or
// q/k/v weight is), although the tiles and x8 groups then split the rows
// differently (13 and 11 rows against 24). The float dtypes hold it on
// the AVX2 tiles (r4c3 with r4c1), not on the Go or AVX-512 ones, whose
// tiles for the left-over rows sum in another order.
func TestRowsIndependentOfGrouping(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	b := New(2)
	defer b.Close()
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q6K} {
		if !dt.Quantized() && tilesFor(dt).r4c3 == nil {
			continue
		}
		const cols = 512
		w1, w2 := kerneltest.NewMat(rng, dt, 13, cols, 0, 0), kerneltest.NewMat(rng, dt, 11, cols, 0, 0)
		st := &kernels.Mat{DType: dt, Rows: 24, Cols: cols, Data: append(append([]byte(nil), w1.Data...), w2.Data...)}
		for _, n := range []int{1, 5, 8, 37} {
			x := kerneltest.RandN(rng, n*cols)
			y1, y2, ys := make([]float32, n*13), make([]float32, n*11), make([]float32, n*24)
			b.MatMul(y1, x, w1, n)
			b.MatMul(y2, x, w2, n)
			b.MatMul(ys, x, st, n)
			for i := range n {
				for j := range 24 {
					want := ys[i*24+j]
					got := y1[i*13+min(j, 12)]
					if j >= 13 {
						got = y2[i*11+j-13]
					}
					if math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%v n=%d: y[%d, %d] = %g alone, %g stacked", dt, n, i, j, got, want)
					}
				}
			}
		}
	}
}
