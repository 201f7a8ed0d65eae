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
