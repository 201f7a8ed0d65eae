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

// TestNorms checks L2Normalize and GatedRMSNorm against their formulas, and
// the L2 norm's eps: a zero vector stays zero, a tiny one is not blown up.
func TestNorms(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 31))
	v := make([]float32, 16)
	for i := range v {
		v[i] = float32(2 * rng.NormFloat64())
	}
	x := append([]float32(nil), v...)
	ref.L2Normalize(x, 0.25)
	var ss float64
	for _, e := range v {
		ss += float64(e) * float64(e)
	}
	for i, e := range v {
		if want := float32(float64(e) * 0.25 / math.Sqrt(ss+1e-6)); x[i] != want {
			t.Fatalf("L2Normalize[%d] = %g, want %g", i, x[i], want)
		}
	}
	z := []float32{0, 0, 1e-5, 0}
	ref.L2Normalize(z[:2], 1)
	ref.L2Normalize(z[2:], 1)
	if z[0] != 0 || z[1] != 0 || !(z[2] > 0 && z[2] < 0.01) {
		t.Errorf("eps handling: %v", z)
	}

	const d, rows = 12, 5
	r := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(s * rng.NormFloat64())
		}
		return v
	}
	xs, zs, w := r(rows*d, 1.5), r(rows*d, 2), r(d, 1)
	for _, gate := range []kernels.Gate{kernels.GateSiLU, kernels.GateSigmoid} {
		got := make([]float32, len(xs))
		ref.GatedRMSNorm(got, xs, zs, w, 1e-5, gate)
		for r := range rows {
			var ms float64
			for i := range d {
				ms += float64(xs[r*d+i]) * float64(xs[r*d+i])
			}
			ms /= d
			for i := range d {
				zi := float64(zs[r*d+i])
				g := 1 / (1 + math.Exp(-zi))
				if gate == kernels.GateSiLU {
					g *= zi
				}
				want := float64(w[i]) * float64(xs[r*d+i]) / math.Sqrt(ms+1e-5) * g
				if math.Abs(float64(got[r*d+i])-want) > 1e-6*max(1, math.Abs(want)) {
					t.Errorf("gate %d [%d,%d] = %g, want %g", gate, r, i, got[r*d+i], want)
				}
			}
		}
	}
}

// TestShortConv checks the convolution against its formula over the
// history and the new rows, and that a sequence fed in pieces leaves the
// same outputs and state as in one call.
func TestShortConv(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 33))
	const C, K, T = 5, 4, 9
	r := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	x, w, s0 := r(T*C), r(C*K), r((K-1)*C)
	all := append(append([]float32(nil), s0...), x...) // (K−1+T, C) raw inputs
	state := append([]float32(nil), s0...)
	y := make([]float32, T*C)
	ref.ShortConv(y, x, w, state, T, C, K)
	for tt := range T {
		for ch := range C {
			var acc float64
			for j := range K {
				acc += float64(w[ch*K+j]) * float64(all[(tt+j)*C+ch])
			}
			want := acc / (1 + math.Exp(-acc))
			if math.Abs(float64(y[tt*C+ch])-want) > 1e-6*max(1, math.Abs(want)) {
				t.Fatalf("y[%d,%d] = %g, want %g", tt, ch, y[tt*C+ch], want)
			}
		}
	}
	near(t, "state", state, all[T*C:], 0)
	// In pieces of 1, 3 and 5 rows, in place.
	st := append([]float32(nil), s0...)
	xp := append([]float32(nil), x...)
	for _, p := range [][2]int{{0, 1}, {1, 4}, {4, 9}} {
		ref.ShortConv(xp[p[0]*C:p[1]*C], xp[p[0]*C:p[1]*C], w, st, p[1]-p[0], C, K)
	}
	near(t, "pieces", xp, y, 0)
	near(t, "pieces state", st, state, 0)
}
