package nn

import "math"

// RMSNorm is y = w ⊙ x·rsqrt(mean(x²) + eps), or (1 + w) ⊙ … in the
// zero-centred form (Qwen3-Next), computed in fp32 with a float64 sum.
type RMSNorm struct {
	W      []float32 // (dim)
	Eps    float32
	Offset bool // zero-centred: scale by 1 + W
}

// Forward normalises n rows of len(W) values: y (n, dim) from x (n, dim).
// y may be x. A per-head norm (QK norm) is n·heads rows of head_dim.
func (r *RMSNorm) Forward(y, x []float32, n int) {
	d := len(r.W)
	for i := range n {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		// The reference computes mean(x²) in fp32, adds eps and takes rsqrt.
		ms := float32(ss / float64(d))
		inv := float32(1 / math.Sqrt(float64(ms+r.Eps)))
		if r.Offset {
			for j, v := range xr {
				yr[j] = (1 + r.W[j]) * (v * inv)
			}
		} else {
			for j, v := range xr {
				yr[j] = r.W[j] * (v * inv)
			}
		}
	}
}
