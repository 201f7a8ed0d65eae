package nn

import "github.com/ferrite-llm/ferrite/kernels/ref"

// RMSNorm is y = w ⊙ x·rsqrt(mean(x²) + eps), or (1 + w) ⊙ … in the
// zero-centred form (Qwen3-Next), computed in fp32 with a float64 sum.
type RMSNorm struct {
	W      []float32 // (dim)
	Eps    float32
	Offset bool // zero-centred: scale by 1 + W
}

// Forward normalises n rows of len(W) values: y (n, dim) from x (n, dim).
// y may be x. A per-head norm (QK norm) is n·heads rows of head_dim.
func (r *RMSNorm) Forward(y, x []float32, n int) { ref.RMSNorm(y, x, r.W, r.Eps, r.Offset, n) }
