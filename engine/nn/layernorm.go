package nn

import "github.com/ferrite-llm/ferrite/kernels/ref"

// LayerNorm is y = (x − mean(x)) / sqrt(var(x) + eps) ⊙ W + B, the biased
// variance computed in fp32 (float64 sums), as torch.nn.LayerNorm
// (ref.LayerNorm).
type LayerNorm struct {
	W   []float32 // (dim)
	B   []float32 // (dim)
	Eps float32
}

// Forward normalises n rows: y (n, dim) from x (n, dim); y may be x.
func (l *LayerNorm) Forward(y, x []float32, n int) { ref.LayerNorm(y, x, l.W, l.B, l.Eps, n) }
