package nn

import "github.com/ferrite-llm/ferrite/kernels/ref"

// RMSNorm is an RMSNorm's weights as loaded: y = w ⊙ x·rsqrt(mean(x²) +
// eps), or (1 + w) ⊙ … in the zero-centred form (Qwen3-Next)
// (kernels.NormOps runs it).
type RMSNorm struct {
	W      []float32 // (dim)
	Eps    float32
	Offset bool // zero-centred: scale by 1 + W
}

// Forward normalises n rows of len(W) values on the host: y (n, dim) from
// x (n, dim), ref.RMSNorm (the CUDA backend's tests compare against it).
func (r *RMSNorm) Forward(y, x []float32, n int) { ref.RMSNorm(y, x, r.W, r.Eps, r.Offset, n) }
