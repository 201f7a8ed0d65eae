package ref

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSinkhorn checks the mHC mixer is doubly stochastic on random logits:
// after hc_sinkhorn_iters (20) every column sums to 1 (the last
// normalisation) and no entry is negative; rows reach 1 as the iteration
// converges.
func TestSinkhorn(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 4, 8} {
		for trial := range 50 {
			logits := make([]float64, n*n)
			spread := 0.5 + 3*rng.Float64()
			for i := range logits {
				logits[i] = spread * rng.NormFloat64()
			}
			comb := make([]float32, n*n)
			Sinkhorn(comb, append([]float64(nil), logits...), n, 20, 1e-6)
			for j := range n {
				var col float64
				for i := range n {
					if comb[i*n+j] < 0 {
						t.Fatalf("n %d trial %d: negative entry", n, trial)
					}
					col += float64(comb[i*n+j])
				}
				if math.Abs(col-1) > 1e-5 {
					t.Errorf("n %d trial %d: column %d sums to %.8f", n, trial, j, col)
				}
			}
			// Rows converge more slowly on spiky logits: check them after
			// more iterations.
			Sinkhorn(comb, append([]float64(nil), logits...), n, 500, 1e-6)
			for i := range n {
				var row float64
				for j := range n {
					row += float64(comb[i*n+j])
				}
				if math.Abs(row-1) > 1e-4 {
					t.Errorf("n %d trial %d: row %d sums to %.6f after 500 iterations", n, trial, i, row)
				}
			}
		}
	}
}
