package ref_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestDeltaRuleChunked checks the chunked WY reference against the
// recurrent one (the definition) for GDN and KDA, chunk sizes that do and
// do not divide the sequence, a nonzero starting state and decays strong
// enough to underflow e^Γ within a chunk.
func TestDeltaRuleChunked(t *testing.T) {
	for _, c := range []struct {
		n       kernels.DeltaNet
		T       int
		chunk   int
		decayLo float32
	}{
		{kernels.DeltaNet{Heads: 4, KeyHeads: 2, DK: 8, DV: 6}, 37, 16, 0},
		{kernels.DeltaNet{Heads: 2, KeyHeads: 2, DK: 8, DV: 8, PerChannel: true, LowerBound: -5}, 40, 8, 0},
		{kernels.DeltaNet{Heads: 2, KeyHeads: 1, DK: 4, DV: 4}, 20, 64, 30},
		{kernels.DeltaNet{Heads: 2, KeyHeads: 2, DK: 4, DV: 4, PerChannel: true}, 33, 7, 30},
	} {
		t.Run(fmt.Sprintf("%+v", c), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.T), 1))
			r := func(k int, lo float32) []float32 {
				v := make([]float32, k)
				for i := range v {
					v[i] = lo + float32(rng.NormFloat64())
				}
				return v
			}
			n, gw := &c.n, c.n.Heads
			if n.PerChannel {
				gw *= n.DK
			}
			qkv, a, b := r(c.T*n.QKVWidth(), 0), r(c.T*gw, c.decayLo), r(c.T*n.Heads, 0)
			aLog, dtB := r(n.Heads, 0), r(gw, 0)
			s0 := r(n.StateWidth(), 0)
			want, got := make([]float32, c.T*n.Heads*n.DV), make([]float32, c.T*n.Heads*n.DV)
			sw, sg := append([]float32(nil), s0...), append([]float32(nil), s0...)
			ref.DeltaRule(want, qkv, a, b, sw, c.T, n, aLog, dtB)
			ref.DeltaRuleChunked(got, qkv, a, b, sg, c.T, c.chunk, n, aLog, dtB)
			near(t, "out", got, want, 1e-5)
			near(t, "state", sg, sw, 1e-5)
		})
	}
}

// near fails t unless |got − want| ≤ tol·max(1, |want|) everywhere.
func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*max(1, math.Abs(float64(want[i])))) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestDeltaGates checks the gates against their formulas written out: GDN
// (one decay per head, softplus, with its threshold branch), KDA bounded
// and unbounded (one per key channel), and β.
func TestDeltaGates(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 41))
	const H, dk = 3, 5
	for _, n := range []kernels.DeltaNet{
		{Heads: H, KeyHeads: H, DK: dk, DV: 1},
		{Heads: H, KeyHeads: H, DK: dk, DV: 1, PerChannel: true, LowerBound: -5},
		{Heads: H, KeyHeads: H, DK: dk, DV: 1, PerChannel: true},
	} {
		per := 1
		if n.PerChannel {
			per = dk
		}
		r := func(k int, s float64) []float32 {
			v := make([]float32, k)
			for i := range v {
				v[i] = float32(s * rng.NormFloat64())
			}
			return v
		}
		a, b, aLog, dt := r(H*per, 4), r(H, 3), r(H, 1), r(H*per, 1)
		a[0] = 30 // softplus's threshold branch
		g, beta := make([]float32, H*per), make([]float32, H)
		ref.DeltaGates(g, beta, a, b, &n, aLog, dt)
		for i := range g {
			h := i / per
			x := float64(a[i] + dt[i])
			e := math.Exp(float64(aLog[h]))
			want := -e * math.Log1p(math.Exp(x))
			if x > 20 {
				want = -e * x
			}
			if n.LowerBound < 0 {
				want = float64(n.LowerBound) / (1 + math.Exp(-e*x))
			}
			if math.Abs(float64(g[i])-want) > 1e-6*math.Abs(want)+1e-30 || g[i] > 0 || g[i] < n.LowerBound && n.LowerBound < 0 {
				t.Errorf("%+v: g[%d] = %g, want %g", n, i, g[i], want)
			}
		}
		for h := range beta {
			if want := 1 / (1 + math.Exp(-float64(b[h]))); math.Abs(float64(beta[h])-want) > 1e-7 {
				t.Errorf("beta[%d] = %g, want %g", h, beta[h], want)
			}
		}
	}
}
