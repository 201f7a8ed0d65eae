//go:build !noasm

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

var quantTypes = []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q5K, kernels.Q6K}

// qtileSets are the quantized tile sets this CPU can run, by name.
func qtileSets() map[string]*[kernels.Q6K + 1]qtileSet {
	sets := map[string]*[kernels.Q6K + 1]qtileSet{"go": &genericQTiles}
	if cpuinfo.AVX2FMA() && cpuinfo.F16C() {
		sets["avx2"] = &avx2QTiles
	}
	if cpuinfo.VNNI() && cpuinfo.F16C() {
		sets["vnni"] = &vnniQTiles
		sets["vnni512"] = &vnni512QTiles
	}
	return sets
}

// TestQTilesMatchGo checks every assembly tile against the Go tile on the
// same quantized x: both sum the same integer products, so they differ only
// by float32 rounding of the per-block terms. The 4-row tiles write y with a
// stride and must leave the gaps alone.
func TestQTilesMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const R, ldy = 4, 3
	for name, set := range qtileSets() {
		if name == "go" {
			continue
		}
		for _, dt := range quantTypes {
			ks := []int{256, 512, 2816}
			if dt.BlockElems() == 32 {
				ks = append(ks, 32, 96, 288) // odd block counts
			}
			for _, k := range ks {
				w := kerneltest.NewMat(rng, dt, 1, k, 0, 0)
				x := kerneltest.RandN(rng, R*k)
				x[3] = 0 // and a zero block:
				for i := 32; i < 64; i++ {
					x[i] = 0
				}
				var qx qrows
				qx.quantize(x, R, k, xGroup(dt))
				want := make([]float32, R)
				for r := range R {
					genericQTiles[dt].r1(want[r:], 1, qx.q[r*k:], qx.ds[2*r*k/32:], k, w.Data, k)
				}
				var sums [R]float64 // Σ|xw| bounds the rounding
				row := make([]float32, k)
				w.RowF32(row, 0)
				for i, v := range row {
					for r := range R {
						sums[r] += math.Abs(float64(v) * float64(x[r*k+i]))
					}
				}
				check := func(tile string, got []float32, rows int) {
					for r := range rows {
						if d := math.Abs(float64(got[r*ldy] - want[r])); !(d <= 1e-5*sums[r]) {
							t.Errorf("%s %v %s k=%d row %d: %g, Go tile %g (Σ|xw| %g)", name, dt, tile, k, r, got[r*ldy], want[r], sums[r])
						}
					}
					for i, v := range got {
						if i%ldy != 0 && v != -1 {
							t.Errorf("%s %v %s: y[%d] between the rows written", name, dt, tile, i)
						}
					}
				}
				got := make([]float32, R*ldy)
				for i := range got {
					got[i] = -1
				}
				set[dt].r1(got, ldy, qx.q, qx.ds, k, w.Data, k)
				check("R1", got, 1)
				if set[dt].r4 != nil {
					set[dt].r4(got, ldy, qx.q, qx.ds, k, w.Data, k)
					check("R4", got, R)
				}
			}
		}
	}
}

// BenchmarkQTile runs each quantized tile on one core with the row in L1
// (k = 4096): GB/s of weights, counted once per x row, and the thread's CPU
// time per call.
func BenchmarkQTile(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const k = 4096
	for name, set := range qtileSets() {
		for _, dt := range quantTypes {
			w := kerneltest.NewMat(rng, dt, 1, k, 0, 0)
			x := kerneltest.RandN(rng, k)
			var qx qrows
			qx.quantize(x, 1, k, xGroup(dt))
			b.Run(fmt.Sprintf("%s/%v/R1", name, dt), func(b *testing.B) {
				y := make([]float32, 1)
				b.SetBytes(int64(len(w.Data)))
				cpuLoop(b, func() { set[dt].r1(y, 1, qx.q, qx.ds, k, w.Data, k) })
			})
			if set[dt].r4 == nil {
				continue
			}
			var qx4 qrows
			qx4.quantize(append(append(append(slices.Clone(x), x...), x...), x...), 4, k, xGroup(dt))
			b.Run(fmt.Sprintf("%s/%v/R4", name, dt), func(b *testing.B) {
				y := make([]float32, 4)
				b.SetBytes(int64(4 * len(w.Data))) // as four R1 calls
				cpuLoop(b, func() { set[dt].r4(y, 1, qx4.q, qx4.ds, k, w.Data, k) })
			})
		}
	}
}

// TestQGemvMatchGo checks every gemv kernel against the Go tile run row by
// row: the kernels sum the same integer products with the scales applied
// in another order (per 256 columns for the K-quants), so they differ by
// float32 rounding. They must write y[r·ldy + j], j < rows, and nothing
// else.
func TestQGemvMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for name, set := range qtileSets() {
		for _, dt := range quantTypes {
			for R, gemv := range map[int]qgemvFunc{1: set[dt].gemv, 4: set[dt].gemv4} {
				if gemv == nil {
					continue
				}
				for _, k := range []int{256, 512, 2816} {
					const rows, ldy = 5, 7
					w := kerneltest.NewMat(rng, dt, rows, k, 0, 0)
					x := kerneltest.RandN(rng, R*k)
					for i := 300; i < 340 && i < k; i++ { // a zero block
						x[i] = 0
					}
					x[7] = 40 // an outlier that sets a group's scale
					var qx qrows
					qx.quantize(x, R, k, xGroup(dt))
					got := make([]float32, R*ldy)
					for i := range got {
						got[i] = -1
					}
					gemv(got, ldy, qx.q, qx.ds, qx.bs, k, w.Data, k, rows, f16Table())
					row := make([]float32, k)
					for r := range R {
						for j := range rows {
							want := make([]float32, 1)
							genericQTiles[dt].r1(want, 1, qx.q[r*k:], qx.ds[2*r*k/32:], k, w.Data[j*dt.RowBytes(k):], k)
							w.RowF32(row, j)
							var sum float64 // Σ|xw| bounds the rounding
							for i, v := range row {
								sum += math.Abs(float64(v) * float64(x[r*k+i]))
							}
							if d := math.Abs(float64(got[r*ldy+j] - want[0])); !(d <= 1e-5*sum) {
								t.Errorf("%s %v R%d k=%d x row %d row %d: %g, Go tile %g (Σ|xw| %g)", name, dt, R, k, r, j, got[r*ldy+j], want[0], sum)
							}
						}
					}
					for i, v := range got {
						if i%ldy >= rows && v != -1 {
							t.Errorf("%s %v R%d k=%d: wrote y[%d]", name, dt, R, k, i)
						}
					}
				}
			}
		}
	}
}

// BenchmarkQGemvKernel runs each gemv kernel on one core over 64 rows of
// k = 1024 in L2, against the tiles row by row: GB/s of weights (counted
// once per x row) and the thread's CPU time per call.
func BenchmarkQGemvKernel(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const k, rows = 1024, 64
	for name, set := range qtileSets() {
		for _, dt := range quantTypes {
			w := kerneltest.NewMat(rng, dt, rows, k, 0, 0)
			x := kerneltest.RandN(rng, 4*k)
			var qx qrows
			qx.quantize(x, 4, k, xGroup(dt))
			y := make([]float32, 4*rows)
			tab := f16Table()
			rb := dt.RowBytes(k)
			for R, gemv := range map[int]qgemvFunc{1: set[dt].gemv, 4: set[dt].gemv4} {
				if gemv != nil {
					b.Run(fmt.Sprintf("%s/%v/gemv%d", name, dt, R), func(b *testing.B) {
						b.SetBytes(int64(R * len(w.Data)))
						cpuLoop(b, func() { gemv(y, rows, qx.q, qx.ds, qx.bs, k, w.Data, k, rows, tab) })
					})
				}
				tile := map[int]qtileFunc{1: set[dt].r1, 4: set[dt].r4}[R]
				if tile == nil {
					continue
				}
				b.Run(fmt.Sprintf("%s/%v/r%d", name, dt, R), func(b *testing.B) {
					b.SetBytes(int64(R * len(w.Data)))
					cpuLoop(b, func() {
						for j := range rows {
							tile(y[j:], rows, qx.q, qx.ds, k, w.Data[j*rb:], k)
						}
					})
				})
			}
		}
	}
}

// TestQuantizeXMatchesGo checks the assembly x quantizer bit for bit
// against the Go one, for both group sizes, with zero groups, zero blocks
// in a group, ties at .5 and values that round to ±127.
func TestQuantizeXMatchesGo(t *testing.T) {
	if !cpuinfo.AVX2FMA() {
		t.Skip("no AVX2")
	}
	rng := rand.New(rand.NewPCG(4, 4))
	for _, group := range []int{32, 256} {
		const n = 1024
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64()) * float32(1+i%7)
		}
		clear(x[256:512])          // a zero group
		clear(x[544:576])          // a zero block in a group
		x[600], x[601] = 127, -127 // with amax 127: exact ±127 and ±0.5 ties
		x[602], x[603] = 0.5, -2.5
		for i := 604; i < 640; i++ {
			x[i] = float32(i-620) + 0.5
		}
		q, ds, bs := make([]int8, n), make([]float32, 2*n/qk), make([]int16, 2*n/qk)
		wq, wds, wbs := make([]int8, n), make([]float32, 2*n/qk), make([]int16, 2*n/qk)
		quantizeX(q, ds, bs, x, group)
		quantizeXGo(wq, wds, wbs, x, group)
		for i := range q {
			if q[i] != wq[i] {
				t.Fatalf("group %d: q[%d] = %d, Go %d (x %g)", group, i, q[i], wq[i], x[i])
			}
		}
		for i := range ds {
			if math.Float32bits(ds[i]) != math.Float32bits(wds[i]) || bs[i] != wbs[i] {
				t.Fatalf("group %d: ds[%d], bs[%d] = %g, %d; Go %g, %d", group, i, i, ds[i], bs[i], wds[i], wbs[i])
			}
		}
	}
}
