package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestFusedMatMulsMatchSeparate checks that LinearCat and SwiGLULinear,
// whose BF16 weights run as one parallel call (matMulsTo), give the bits of
// separate MatMuls (and of SwiGLU over their products), for one and
// several x rows, on 1 and 2 workers, on this CPU's bf16 path and on the
// Go twin (and LinearCat of more than maxFused weights, one by one).
func TestFusedMatMulsMatchSeparate(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	mat := func(rows, cols int) *kernels.Mat {
		d := make([]byte, 2*rows*cols)
		for i := range rows * cols {
			v := kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
			d[2*i], d[2*i+1] = byte(v), byte(v>>8)
		}
		return &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols, Data: d}
	}
	const cols = 96
	q, k, v := mat(64, cols), mat(24, cols), mat(40, cols)
	gate, up := mat(56, cols), mat(56, cols)
	for _, generic := range []bool{false, true} {
		for _, threads := range []int{1, 2} {
			for _, n := range []int{1, 5} {
				t.Run(fmt.Sprintf("generic=%v/threads=%d/n=%d", generic, threads, n), func(t *testing.T) {
					if generic {
						old := forceGenericBF16.Swap(true)
						defer forceGenericBF16.Store(old)
					}
					b := New(threads)
					defer b.Close()
					b.SetBF16Activations(true)
					xs := make([]float32, n*cols)
					for i := range xs {
						xs[i] = float32(rng.NormFloat64())
					}
					x, _ := b.Alloc(kernels.F32, n, cols)
					b.WriteF32(x, xs)
					same := func(what string, got, want []float32) {
						t.Helper()
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s: [%d] = %g, separately %g", what, i, got[i], want[i])
							}
						}
					}
					sep := func(ws ...*kernels.Mat) []float32 { // columns of each weight's MatMul side by side
						total := 0
						for _, w := range ws {
							total += w.Rows
						}
						out := make([]float32, n*total)
						c0 := 0
						for _, w := range ws {
							y := make([]float32, n*w.Rows)
							b.MatMul(y, xs, w, n)
							for i := range n {
								copy(out[i*total+c0:], y[i*w.Rows:(i+1)*w.Rows])
							}
							c0 += w.Rows
						}
						return out
					}
					for _, ws := range [][]*kernels.Mat{{q, k, v}, {gate, up}, {q, k, v, gate}} {
						total := 0
						for _, w := range ws {
							total += w.Rows
						}
						dst, _ := b.Alloc(kernels.F32, n, total)
						b.LinearCat(dst, x, ws, kernels.Epilogue{})
						got := make([]float32, n*total)
						b.ReadF32(got, dst)
						same(fmt.Sprintf("LinearCat of %d", len(ws)), got, sep(ws...))
					}
					dst, _ := b.Alloc(kernels.F32, n, gate.Rows)
					b.SwiGLULinear(dst, x, gate, up, 0)
					got := make([]float32, n*gate.Rows)
					b.ReadF32(got, dst)
					gu := sep(gate, up)
					want := make([]float32, n*gate.Rows)
					for i := range n {
						g, u := gu[i*2*gate.Rows:], gu[i*2*gate.Rows+gate.Rows:]
						swiglu(want[i*gate.Rows:(i+1)*gate.Rows], g[:gate.Rows], u[:gate.Rows], 0)
					}
					same("SwiGLULinear", got, want)
				})
			}
		}
	}
}
