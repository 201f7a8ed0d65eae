package ref

import (
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Sigmoid64 is 1/(1+e^-x) in float64, without overflow.
func Sigmoid64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// HyperNorm sets xn (len(X)) = X·rsqrt(mean(X²) + eps), the weightless
// RMSNorm of one token's streams before the mix product; the mean is
// rounded to float32 and eps added in float64, as transformers does.
func HyperNorm(xn, X []float32, eps float32) {
	var ss float64
	for _, v := range X {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(float64(float32(ss/float64(len(X))))+float64(eps)))
	for j, v := range X {
		xn[j] = v * inv
	}
}

// HyperCoef turns one token's mix ((2+hc)·hc, kernels.Hyper) into the pre
// weights pre (hc) and coef (hc+hc·hc) = [post | comb]. base is the site's
// Base; work is scratch of hc·hc values.
func HyperCoef(pre []float64, coef, mix, base []float32, h *kernels.Hyper, work []float64) {
	hc := h.Streams
	s0, s1, s2 := float64(h.Scale[0]), float64(h.Scale[1]), float64(h.Scale[2])
	for j := range hc {
		pre[j] = Sigmoid64(float64(mix[j])*s0+float64(base[j])) + float64(h.Eps)
		coef[j] = float32(2 * Sigmoid64(float64(mix[hc+j])*s1+float64(base[hc+j])))
	}
	logits := work[:hc*hc]
	for j := range logits {
		logits[j] = float64(mix[2*hc+j])*s2 + float64(base[2*hc+j])
	}
	Sinkhorn(coef[hc:hc+hc*hc], logits, hc, h.Iters, float64(h.Eps))
}

// HyperPre sets x (hidden) = Σ_i pre[i]·X[i] for one token's streams X
// (hc·hidden), summed in float64.
func HyperPre(x, X []float32, pre []float64) {
	hidden := len(x)
	for d := range hidden {
		var s float64
		for i, p := range pre {
			s += p * float64(X[i*hidden+d])
		}
		x[d] = float32(s)
	}
}

// HyperPost sets, in place, X[j] = post[j]·y + Σ_i comb[i][j]·X[i] for n
// tokens' streams X (n, hc·hidden), sublayer outputs y (n, hidden) and
// coef (n, hc+hc·hc) = [post | comb], in float64.
func HyperPost(X, y, coef []float32, hc, n int) {
	hidden := len(y) / max(n, 1)
	w, cw := hc*hidden, hc+hc*hc
	old := make([]float64, hc) // one column of X before the update
	for r := range n {
		xr, yr := X[r*w:(r+1)*w], y[r*hidden:(r+1)*hidden]
		post, comb := coef[r*cw:r*cw+hc], coef[r*cw+hc:(r+1)*cw]
		for d := range hidden {
			for s := range hc {
				old[s] = float64(xr[s*hidden+d])
			}
			o := float64(yr[d])
			for j := range hc {
				acc := float64(post[j]) * o
				for s := range hc {
					acc += float64(comb[s*hc+j]) * old[s]
				}
				xr[j*hidden+d] = float32(acc)
			}
		}
	}
}

// HyperMerge sets x (hidden) to the mean of one token's hc streams X
// (hc·hidden), summed in float64.
func HyperMerge(x, X []float32, hc int) {
	hidden := len(x)
	inv := 1 / float64(hc)
	for d := range hidden {
		var s float64
		for j := range hc {
			s += float64(X[j*hidden+d])
		}
		x[d] = float32(s * inv)
	}
}

// Sinkhorn sets comb (n, n) to the Sinkhorn–Knopp projection of logits
// (n, n) as transformers' Glm5NextTextHyperConnection computes it: a row
// softmax plus eps, a column normalisation, then iters−1 rounds of row and
// column normalisation, each dividing by (sum + eps). The last step
// normalises columns, so Σ_i comb[i][j] = 1 (up to eps) for every j.
// logits is overwritten.
func Sinkhorn(comb []float32, logits []float64, n, iters int, eps float64) {
	c := logits[:n*n]
	for i := range n {
		row := logits[i*n : (i+1)*n]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = max(mx, v)
		}
		var s float64
		for j, v := range row {
			c[i*n+j] = math.Exp(v - mx)
			s += c[i*n+j]
		}
		for j := range n {
			c[i*n+j] = c[i*n+j]/s + eps
		}
	}
	cols := func() {
		for j := range n {
			var s float64
			for i := range n {
				s += c[i*n+j]
			}
			s += eps
			for i := range n {
				c[i*n+j] /= s
			}
		}
	}
	rows := func() {
		for i := range n {
			var s float64
			for j := range n {
				s += c[i*n+j]
			}
			s += eps
			for j := range n {
				c[i*n+j] /= s
			}
		}
	}
	cols()
	for range iters - 1 {
		rows()
		cols()
	}
	for i, v := range c {
		comb[i] = float32(v)
	}
}

// Hyper is kernels.HyperOps.HyperPre over n tokens: streams (n,
// hc·hidden), x (n, hidden), coef (n, hc+hc·hc); base is h.Base.
func Hyper(x, coef, streams, base []float32, h *kernels.Hyper, n int) {
	hc := h.Streams
	w := len(streams) / max(n, 1)
	hidden, m, cw := w/hc, (2+hc)*hc, hc+hc*hc
	xn := make([]float32, n*w)
	for i := range n {
		HyperNorm(xn[i*w:(i+1)*w], streams[i*w:(i+1)*w], h.NormEps)
	}
	mix := make([]float32, n*m)
	kernels.MatMulRef(mix, xn, h.Fn, n)
	pre, work := make([]float64, hc), make([]float64, hc*hc)
	for i := range n {
		HyperCoef(pre, coef[i*cw:(i+1)*cw], mix[i*m:(i+1)*m], base, h, work)
		HyperPre(x[i*hidden:(i+1)*hidden], streams[i*w:(i+1)*w], pre)
	}
}
