//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestPresplit checks the down projection that takes its split input from
// the SwiGLU kernel before it (presplit) against the same product split on
// its own (an op in between clears the presplit): the two must agree bit
// for bit, for SwiGLULinear and NormSwiGLULinear, with the residual add.
func TestPresplit(t *testing.T) {
	b := openOps(t)
	if !b.useGemm() {
		t.Skipf("no cuBLASLt: %v", b.gemmErr)
	}
	const n, hidden, inter = 24, 128, 200
	rng := rand.New(rand.NewPCG(5, 6))
	gate, up := kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0), kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)
	down := kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	x := f32Tensor(t, b, n, hidden, randF32(rng, n*hidden))
	nw := f32Tensor(t, b, 1, hidden, randF32(rng, hidden))
	hn := &kernels.HeadNorm{W: nw, Eps: 1e-6}
	res := randF32(rng, n*hidden)
	for _, norm := range []bool{false, true} {
		var outs [2][]float32
		for i := range outs {
			g := f32Tensor(t, b, n, inter, make([]float32, n*inter))
			y := f32Tensor(t, b, n, hidden, res)
			other := f32Tensor(t, b, 1, 4, make([]float32, 4))
			b.BeginStep()
			if norm {
				b.NormSwiGLULinear(g, x, hn, gate, up, 0)
			} else {
				b.SwiGLULinear(g, x, gate, up, 0)
			}
			if b.presplit.x != dptr(g) {
				t.Fatalf("norm %v: the SwiGLU left no split input for the down projection", norm)
			}
			if i == 1 {
				b.SwiGLU(other, other, other) // any op: the split is done again
			}
			b.Linear(y, g, down, kernels.Epilogue{Accumulate: true})
			b.EndStep()
			outs[i] = make([]float32, n*hidden)
			b.ReadF32(outs[i], y)
		}
		for i, v := range outs[0] {
			if math.Float32bits(v) != math.Float32bits(outs[1][i]) {
				t.Fatalf("norm %v: y[%d] = %g with the SwiGLU's split, %g split apart", norm, i, v, outs[1][i])
			}
		}
	}
}
