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

// TestHyperPost checks the stream update X'[j] = post[j]·y + Σ_i
// comb[i][j]·X[i] (comb transposed) against a direct evaluation, and
// HyperMerge against the mean.
func TestHyperPost(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, hc, hidden = 3, 4, 5
	X := make([]float32, n*hc*hidden)
	y := make([]float32, n*hidden)
	coef := make([]float32, n*(hc+hc*hc))
	for _, s := range [][]float32{X, y, coef} {
		for i := range s {
			s[i] = float32(rng.NormFloat64())
		}
	}
	want := make([]float32, len(X))
	cw := hc + hc*hc
	for r := range n {
		for j := range hc {
			for d := range hidden {
				acc := float64(coef[r*cw+j]) * float64(y[r*hidden+d])
				for i := range hc {
					acc += float64(coef[r*cw+hc+i*hc+j]) * float64(X[r*hc*hidden+i*hidden+d])
				}
				want[r*hc*hidden+j*hidden+d] = float32(acc)
			}
		}
	}
	HyperPost(X, y, coef, hc, n)
	for i := range want {
		if math.Abs(float64(X[i]-want[i])) > 1e-6*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("stream value %d = %g, want %g", i, X[i], want[i])
		}
	}
	m := make([]float32, hidden)
	HyperMerge(m, X[:hc*hidden], hc)
	for d := range hidden {
		var s float64
		for j := range hc {
			s += float64(X[j*hidden+d])
		}
		if math.Abs(float64(m[d])-s/hc) > 1e-6 {
			t.Fatalf("merge %d = %g, want %g", d, m[d], s/hc)
		}
	}
}
