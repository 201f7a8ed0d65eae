package linattn

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestL2Norm(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 31))
	T, H, d, stride := 3, 2, 16, 40
	x := randn(rng, T*stride, 2)
	orig := append([]float32(nil), x...)
	L2Norm(x, T, H, d, stride, 0.25)
	for tt := 0; tt < T; tt++ {
		for h := 0; h < H; h++ {
			o := tt*stride + h*d
			var ss float64
			for _, e := range orig[o : o+d] {
				ss += float64(e) * float64(e)
			}
			f := 0.25 / math.Sqrt(ss+1e-6)
			for i := 0; i < d; i++ {
				if want := float32(float64(orig[o+i]) * f); x[o+i] != want {
					t.Fatalf("t=%d h=%d i=%d: %g want %g", tt, h, i, x[o+i], want)
				}
			}
		}
		// Gaps between rows are untouched.
		for i := tt*stride + H*d; i < (tt+1)*stride; i++ {
			if x[i] != orig[i] {
				t.Fatalf("L2Norm wrote outside the heads at %d", i)
			}
		}
	}
	// eps inside the sqrt: a zero vector stays zero, a tiny one is not blown up.
	z := []float32{0, 0, 1e-5, 0}
	L2Norm(z, 1, 2, 2, 0, 1)
	if z[0] != 0 || z[1] != 0 || !(z[2] > 0 && z[2] < 0.01) {
		t.Errorf("eps handling: %v", z)
	}
}

func TestGatedRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 32))
	d, rows := 12, 5
	x, z, w := randn(rng, rows*d, 1.5), randn(rng, rows*d, 2), randn(rng, d, 1)
	for _, gate := range []Gate{GateSiLU, GateSigmoid} {
		out := make([]float32, len(x))
		GatedRMSNorm(out, x, z, w, d, 1e-5, gate)
		want := make([]float64, len(x))
		for r := 0; r < rows; r++ {
			var ms float64
			for i := 0; i < d; i++ {
				ms += float64(x[r*d+i]) * float64(x[r*d+i])
			}
			ms /= float64(d)
			for i := 0; i < d; i++ {
				zi := float64(z[r*d+i])
				sg := 1 / (1 + math.Exp(-zi))
				if gate == GateSiLU {
					sg *= zi
				}
				want[r*d+i] = float64(w[i]) * float64(x[r*d+i]) / math.Sqrt(ms+1e-5) * sg
			}
		}
		if e := relErr(out, want); e > 1e-7 {
			t.Errorf("gate %d: err %.3g", gate, e)
		}
		// In place over x.
		xc := append([]float32(nil), x...)
		GatedRMSNorm(xc, xc, z, w, d, 1e-5, gate)
		for i := range xc {
			if xc[i] != out[i] {
				t.Fatalf("gate %d: in-place result differs at %d", gate, i)
			}
		}
	}
}

func TestActivations(t *testing.T) {
	x := []float32{-800, -20, -1, 0, 1, 20, 800}
	s := append([]float32(nil), x...)
	SiLU(s)
	g := make([]float32, len(x))
	Sigmoid(g, x)
	for i, v := range x {
		sg := 1 / (1 + math.Exp(-float64(v)))
		if math.Abs(float64(g[i])-sg) > 1e-7 || math.Abs(float64(s[i])-float64(v)*sg) > 1e-6*math.Max(1, math.Abs(float64(v))) {
			t.Errorf("x=%g: sigmoid %g silu %g", v, g[i], s[i])
		}
	}
}
