package linattn

import (
	"fmt"
	"math"
)

// L2NormEps is the epsilon inside the square root of the q/k L2 norm
// (HF/FLA l2norm, eps = 1e-6).
const L2NormEps = 1e-6

// L2Norm normalises, in place, every head vector of T rows of heads·d values:
// x ← scale · x / sqrt(Σx² + 1e-6). Row t starts at x[t*stride]; stride 0
// means heads·d. Use scale = DK^-½ for q and 1 for k (q is normalised
// before it is scaled, as in HF). Sums are float64.
func L2Norm(x []float32, T, heads, d, stride int, scale float32) {
	if stride == 0 {
		stride = heads * d
	}
	if T > 0 && len(x) < (T-1)*stride+heads*d {
		panic(fmt.Sprintf("linattn: L2Norm: %d values, need %d", len(x), (T-1)*stride+heads*d))
	}
	for t := 0; t < T; t++ {
		for h := 0; h < heads; h++ {
			v := x[t*stride+h*d : t*stride+h*d+d] // [d]
			var ss float64
			for _, e := range v {
				ss += float64(e) * float64(e)
			}
			f := float64(scale) / math.Sqrt(ss+L2NormEps)
			for i, e := range v {
				v[i] = float32(float64(e) * f)
			}
		}
	}
}

// Gate selects the output gate of GatedRMSNorm.
type Gate uint8

const (
	GateSiLU    Gate = iota // Qwen3-Next GDN: w ⊙ rmsnorm(x) ⊙ silu(z)
	GateSigmoid             // glm5_next KDA: w ⊙ rmsnorm(x) ⊙ sigmoid(z)
)

// GatedRMSNorm sets out = w ⊙ rmsnorm(x) ⊙ gate(z) for every d-wide head
// vector: x, z and out are [rows, d] (rows = T·heads), w is [d] (a plain
// weight, not 1+w), rmsnorm(x) = x / sqrt(mean(x²) + eps). out may alias x
// or z. Computed in float64, rounded once.
func GatedRMSNorm(out, x, z, w []float32, d int, eps float32, gate Gate) {
	if d <= 0 || len(x)%d != 0 || len(z) < len(x) || len(out) < len(x) || len(w) < d {
		panic(fmt.Sprintf("linattn: GatedRMSNorm: bad sizes x %d z %d out %d w %d d %d", len(x), len(z), len(out), len(w), d))
	}
	w = w[:d]
	for r := 0; r < len(x)/d; r++ {
		xr, zr, or := x[r*d:r*d+d], z[r*d:r*d+d], out[r*d:r*d+d]
		var ss float64
		for _, e := range xr {
			ss += float64(e) * float64(e)
		}
		inv := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		for i, e := range xr {
			zi := float64(zr[i])
			var gz float64
			if gate == GateSiLU {
				gz = zi * sigmoid64(zi)
			} else {
				gz = sigmoid64(zi)
			}
			or[i] = float32(float64(w[i]) * (float64(e) * inv) * gz)
		}
	}
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

// softplus64 is torch's softplus with beta 1 and threshold 20: x when
// x > 20, else log(1 + e^x).
func softplus64(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}
