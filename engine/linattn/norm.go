package linattn

import (
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// L2NormEps is the epsilon inside the square root of the q/k L2 norm
// (HF/FLA l2norm, eps = 1e-6).
const L2NormEps = 1e-6

// L2Norm normalises, in place, every head vector of T rows of heads·d values:
// x ← scale · x / sqrt(Σx² + 1e-6) (ref.L2Normalize). Row t starts at
// x[t*stride]; stride 0 means heads·d. Use scale = DK^-½ for q and 1 for k
// (q is normalised before it is scaled, as in HF).
func L2Norm(x []float32, T, heads, d, stride int, scale float32) {
	if stride == 0 {
		stride = heads * d
	}
	if T > 0 && len(x) < (T-1)*stride+heads*d {
		panic(fmt.Sprintf("linattn: L2Norm: %d values, need %d", len(x), (T-1)*stride+heads*d))
	}
	for t := 0; t < T; t++ {
		for h := 0; h < heads; h++ {
			ref.L2Normalize(x[t*stride+h*d:t*stride+h*d+d], scale)
		}
	}
}

// Gate selects the output gate of GatedRMSNorm.
type Gate = kernels.Gate

const (
	GateSiLU    = kernels.GateSiLU    // Qwen3-Next GDN: w ⊙ rmsnorm(x) ⊙ silu(z)
	GateSigmoid = kernels.GateSigmoid // glm5_next KDA: w ⊙ rmsnorm(x) ⊙ sigmoid(z)
)

// GatedRMSNorm sets out = w ⊙ rmsnorm(x) ⊙ gate(z) for every d-wide head
// vector (ref.GatedRMSNorm): x, z and out are [rows, d] (rows = T·heads),
// w is [d] (a plain weight, not 1+w), rmsnorm(x) = x / sqrt(mean(x²) +
// eps). out may alias x or z. Computed in float64, rounded once.
func GatedRMSNorm(out, x, z, w []float32, d int, eps float32, gate Gate) {
	if d <= 0 || len(x)%d != 0 || len(z) < len(x) || len(out) < len(x) || len(w) < d {
		panic(fmt.Sprintf("linattn: GatedRMSNorm: bad sizes x %d z %d out %d w %d d %d", len(x), len(z), len(out), len(w), d))
	}
	ref.GatedRMSNorm(out[:len(x)], x, z[:len(x)], w[:d], eps, gate)
}

// SiLU sets x ← x·sigmoid(x) in place.
func SiLU(x []float32) {
	for i, e := range x {
		v := float64(e)
		x[i] = float32(v * sigmoid64(v))
	}
}

// Sigmoid sets dst = 1/(1+e^{−x}); dst may alias x. (KDA's β = sigmoid(b_proj x).)
func Sigmoid(dst, x []float32) {
	dst = dst[:len(x)]
	for i, e := range x {
		dst[i] = float32(sigmoid64(float64(e)))
	}
}

func sigmoid64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}
