//go:build !noasm

package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkBF16GEMM is one worker's MatMul over BF16 weights at the shapes
// of a Qwen3-0.6B layer (q, k/v, o, gate/up, down; LM head for decode), x
// in float32 (the float tiles) and rounded to bfloat16 (the VDPBF16PS
// path), thread CPU time: the per-core rate prefill and batched decode get,
// less sensitive to a shared machine than BenchmarkMatMulBF16's wall time.
func BenchmarkBF16GEMM(b *testing.B) {
	for _, s := range []benchShape{
		{512, 2048, 1024}, {512, 1024, 1024}, {512, 1024, 2048}, {512, 3072, 1024}, {512, 1024, 3072},
		{8, 3072, 1024}, {8, 1024, 3072},
	} {
		for _, path := range []string{"f32", "vdp4x4", "gemm"} {
			b.Run(fmt.Sprintf("%s/n=%d/%dx%d", path, s.n, s.rows, s.cols), func(b *testing.B) {
				be := New(1)
				defer be.Close()
				be.SetBF16Activations(path != "f32")
				gemmTilesOff.Store(path == "vdp4x4")
				defer gemmTilesOff.Store(false)
				rng := rand.New(rand.NewPCG(1, 2))
				w := kerneltest.NewMat(rng, kernels.BF16, s.rows, s.cols, 128, 128)
				x := make([]float32, s.n*s.cols)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				y := make([]float32, s.n*s.rows)
				t0 := threadCPU()
				cpuLoop(b, func() { be.MatMul(y, x, w, s.n) })
				b.ReportMetric(float64(s.n*s.rows*s.cols)*float64(b.N)/float64(threadCPU()-t0), "GMAC/cpu-s")
			})
		}
	}
}

type benchShape struct{ n, rows, cols int }

func BenchmarkSwiGLUTmp(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 64 * 3072
	g, u, y := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		g[i], u[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	cpuLoop(b, func() { swiglu(y, g, u, 0) })
}
