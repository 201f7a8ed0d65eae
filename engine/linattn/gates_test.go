package linattn

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestKDAGates(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	T, H, dk := 2, 3, 5
	gpre := randn(rng, T*H*dk, 4)
	aLog, dt := randn(rng, H, 1), randn(rng, H*dk, 1)
	for _, lb := range []float32{-5, 0} {
		g := make([]float32, len(gpre))
		KDAGates(g, gpre, aLog, dt, T, H, dk, lb)
		for i := range g {
			h, c := (i/dk)%H, i%dk
			x := float64(gpre[i] + dt[h*dk+c])
			a := math.Exp(float64(aLog[h]))
			var want float64
			if lb < 0 {
				want = float64(lb) / (1 + math.Exp(-a*x))
				if !(g[i] >= lb && g[i] <= 0) {
					t.Errorf("bounded gate %g outside [%g, 0]", g[i], lb)
				}
			} else {
				want = -a * math.Log1p(math.Exp(x))
			}
			if math.Abs(float64(g[i])-want) > 1e-6*math.Abs(want)+1e-30 {
				t.Errorf("lb=%g i=%d: %g want %g", lb, i, g[i], want)
			}
		}
	}
	// In place.
	g := append([]float32(nil), gpre...)
	KDAGates(g, g, aLog, dt, T, H, dk, -5)
	want := make([]float32, len(g))
	KDAGates(want, gpre, aLog, dt, T, H, dk, -5)
	for i := range g {
		if g[i] != want[i] {
			t.Fatal("in-place KDAGates differs")
		}
	}
}
