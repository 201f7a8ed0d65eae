//go:build !noasm

package cpu

import (
	"fmt"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
)

// BenchmarkTile runs each tile on one core with everything in L1 (k = 1024):
// the compute ceiling the MatMul driver works towards.
func BenchmarkTile(b *testing.B) {
	sets := []struct {
		name string
		ok   bool
		t    *[4]tileSet
	}{
		{"go", true, &genericTiles},
		{"avx2", cpuinfo.AVX2FMA() && cpuinfo.F16C(), &asmTiles},
		{"avx512", cpuinfo.AVX2FMA() && cpuinfo.F16C() && cpuinfo.AVX512(), &avx512Tiles},
	}
	for _, s := range sets {
		if !s.ok {
			continue
		}
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3} {
			ts := &s.t[dt]
			for _, sh := range []struct {
				r, c int
				f    tileFunc
			}{{1, 1, ts.r1c1}, {2, 4, ts.r2c4}, {4, 4, ts.r4c4}, {4, 3, ts.r4c3}} {
				if sh.f == nil {
					continue
				}
				b.Run(fmt.Sprintf("%s/%v/R%dC%d", s.name, dt, sh.r, sh.c), func(b *testing.B) {
					const k = 1024
					x := make([]float32, 4*k)
					w := make([]byte, 4*k*dt.Size())
					y := make([]float32, 16)
					cpuLoop(b, func() { sh.f(y, 4, x, k, w, k, k) })
					b.ReportMetric(float64(2*sh.r*sh.c*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
