//go:build !noasm

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
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
	}
	return sets
}

// TestQTilesMatchGo checks every assembly tile against the Go tile on the
// same quantized x: both sum the same integer products, so they differ only
// by float32 rounding of the per-block terms.
func TestQTilesMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for name, set := range qtileSets() {
		if name == "go" {
			continue
		}
		for _, dt := range quantTypes {
			for _, k := range []int{256, 512, 2816} {
				w := kerneltest.NewMat(rng, dt, 1, k, 0, 0)
				x := make([]float32, k)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				x[3] = 0 // and a zero block:
				for i := 64; i < 96; i++ {
					x[i] = 0
				}
				var qx qrows
				qx.quantize(x, 1, k)
				var got, want [1]float32
				set[dt].r1(got[:], 1, qx.q, qx.d, qx.s, k, w.Data, k)
				genericQTiles[dt].r1(want[:], 1, qx.q, qx.d, qx.s, k, w.Data, k)
				var scale float64 // Σ|per-block terms| bounds the rounding
				row := make([]float32, k)
				w.RowF32(row, 0)
				for i, v := range row {
					scale += math.Abs(float64(v) * float64(x[i]))
				}
				if d := math.Abs(float64(got[0] - want[0])); d > 1e-5*scale {
					t.Errorf("%s %v k=%d: %g, Go tile %g (Σ|xw| %g)", name, dt, k, got[0], want[0], scale)
				}
			}
		}
	}
}

// BenchmarkQTile runs each quantized tile on one core with the row in L1
// (k = 4096): GB/s of weights.
func BenchmarkQTile(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const k = 4096
	for name, set := range qtileSets() {
		for _, dt := range quantTypes {
			w := kerneltest.NewMat(rng, dt, 1, k, 0, 0)
			x := make([]float32, k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			var qx qrows
			qx.quantize(x, 1, k)
			b.Run(fmt.Sprintf("%s/%v", name, dt), func(b *testing.B) {
				y := make([]float32, 1)
				b.SetBytes(int64(len(w.Data)))
				for b.Loop() {
					set[dt].r1(y, 1, qx.q, qx.d, qx.s, k, w.Data, k)
				}
			})
		}
	}
}
