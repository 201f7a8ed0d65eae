package glm5next

import (
	"math"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// hyper is one manifold-constrained hyper-connection site (the attention
// site hc_attn_* or the FFN site hc_ffn_* of a layer). The residual of a
// token is hc streams X [hc, hidden]; with n = hc and M = (2+n)·n:
//
//	x⃗    = vec(X) (stream-major), r = rsqrt(mean(x⃗²) + rms_norm_eps)
//	mix  = (x⃗·r)·fnᵀ                                           [M]
//	pre  = sigmoid(mix[0:n]·scale[0] + base[0:n]) + hc_eps
//	post = 2·sigmoid(mix[n:2n]·scale[1] + base[n:2n])
//	comb = Sinkhorn(mix[2n:]·scale[2] + base[2n:])              [n, n], i = source row
//	y    = Σ_i pre[i]·X[i]                                      → the sublayer input
//	X'[j] = post[j]·Sublayer(norm(y)) + Σ_i comb[i][j]·X[i]      (combᵀ X)
//
// Everything is float32 storage with float64 sums.
type hyper struct {
	fn      *kernels.Mat // ((2+hc)·hc, hc·hidden)
	base    []float32    // ((2+hc)·hc)
	scale   []float32    // (3) pre, post, comb
	hc      int
	iters   int     // hc_sinkhorn_iters
	eps     float64 // hc_eps
	normEps float64 // rms_norm_eps of the weightless input norm
}

func loadHyper(l *nn.Loader, prefix string, p *params) *hyper {
	m := (2 + p.hc) * p.hc
	return &hyper{
		fn:      l.Mat(prefix+"_fn", m, p.hc*p.hidden),
		base:    l.Vec(prefix+"_base", m),
		scale:   l.Vec(prefix+"_scale", 3),
		hc:      p.hc,
		iters:   p.hcIters,
		eps:     float64(p.hcEps),
		normEps: float64(p.eps),
	}
}

// pre computes, for the n rows of streams X (n, hc, hidden), the collapsed
// sublayer input y (n, hidden), the output weights post (n, hc) and the
// doubly stochastic mixer comb (n, hc, hc).
func (h *hyper) pre(be kernels.Backend, a *nn.Arena, X, y, post, comb []float32, n int) {
	mark := a.Mark()
	hc, w := h.hc, len(X)/max(n, 1)
	hidden := w / hc
	m := (2 + hc) * hc
	xn := a.Get(n * w)  // (n, hc·hidden) rmsnorm(vec(X)) without weight
	mix := a.Get(n * m) // (n, (2+hc)·hc)
	for i := range n {
		row, out := X[i*w:(i+1)*w], xn[i*w:(i+1)*w]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(float64(float32(ss/float64(w)))+h.normEps))
		for j, v := range row {
			out[j] = v * inv
		}
	}
	be.MatMul(mix, xn, h.fn, n)
	s0, s1, s2 := float64(h.scale[0]), float64(h.scale[1]), float64(h.scale[2])
	pw := make([]float64, hc) // (hc) pre weights of one row
	logits := make([]float64, hc*hc)
	for i := range n {
		mx := mix[i*m : (i+1)*m]
		for j := range hc {
			pw[j] = sigmoid64(float64(mx[j])*s0+float64(h.base[j])) + h.eps
			post[i*hc+j] = float32(2 * sigmoid64(float64(mx[hc+j])*s1+float64(h.base[hc+j])))
		}
		for j := range hc * hc {
			logits[j] = float64(mx[2*hc+j])*s2 + float64(h.base[2*hc+j])
		}
		sinkhorn(comb[i*hc*hc:(i+1)*hc*hc], logits, hc, h.iters, h.eps)
		yr, xr := y[i*hidden:(i+1)*hidden], X[i*w:(i+1)*w]
		for d := range hidden {
			var s float64
			for j := range hc {
				s += pw[j] * float64(xr[j*hidden+d])
			}
			yr[d] = float32(s)
		}
	}
	a.Release(mark)
}

// apply sets, for n rows, X[j] = post[j]·out + Σ_i comb[i][j]·X[i] in place:
// X (n, hc, hidden), out (n, hidden), post (n, hc), comb (n, hc, hc).
func (h *hyper) apply(X, out, post, comb []float32, n int) {
	hc := h.hc
	hidden := len(out) / max(n, 1)
	old := make([]float64, hc) // one column of X before the update
	for i := range n {
		xr, or := X[i*hc*hidden:(i+1)*hc*hidden], out[i*hidden:(i+1)*hidden]
		pr, cr := post[i*hc:(i+1)*hc], comb[i*hc*hc:(i+1)*hc*hc]
		for d := range hidden {
			for s := range hc {
				old[s] = float64(xr[s*hidden+d])
			}
			o := float64(or[d])
			for j := range hc {
				acc := float64(pr[j]) * o
				for s := range hc {
					acc += float64(cr[s*hc+j]) * old[s]
				}
				xr[j*hidden+d] = float32(acc)
			}
		}
	}
}

// sinkhorn sets comb (n, n) to the Sinkhorn–Knopp projection of logits
// (n, n) as transformers' Glm5NextTextHyperConnection computes it: a row
// softmax plus eps, a column normalisation, then iters−1 rounds of row and
// column normalisation, each dividing by (sum + eps). The last step
// normalises columns, so Σ_i comb[i][j] = 1 (up to eps) for every j.
func sinkhorn(comb []float32, logits []float64, n, iters int, eps float64) {
	c := make([]float64, n*n)
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
