package glm5next

import (
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
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
	site kernels.Hyper // Fn ((2+hc)·hc, hc·hidden), Scale, Streams, Iters, Eps, NormEps
	base []float32     // ((2+hc)·hc) hc_*_base
}

func loadHyper(l *nn.Loader, prefix string, p *params) *hyper {
	m := (2 + p.hc) * p.hc
	h := &hyper{
		site: kernels.Hyper{Fn: l.Mat(prefix+"_fn", m, p.hc*p.hidden), Streams: p.hc, Iters: p.hcIters, Eps: p.hcEps, NormEps: p.eps},
		base: l.Vec(prefix+"_base", m),
	}
	if sc := l.Vec(prefix+"_scale", 3); len(sc) == 3 {
		h.site.Scale = [3]float32(sc)
	}
	return h
}

// pre computes, for the n rows of streams X (n, hc, hidden), the collapsed
// sublayer input y (n, hidden) and coef (n, hc+hc·hc) = [post | comb]
// (kernels/ref's mHC references).
func (h *hyper) pre(be kernels.Backend, a *nn.Arena, X, y, coef []float32, n int) {
	mark := a.Mark()
	hc, w := h.site.Streams, len(X)/max(n, 1)
	hidden := w / hc
	m, cw := (2+hc)*hc, hc+hc*hc
	xn := a.Get(n * w)  // (n, hc·hidden) rmsnorm(vec(X)) without weight
	mix := a.Get(n * m) // (n, (2+hc)·hc)
	for i := range n {
		ref.HyperNorm(xn[i*w:(i+1)*w], X[i*w:(i+1)*w], h.site.NormEps)
	}
	be.MatMul(mix, xn, h.site.Fn, n)
	pw, work := make([]float64, hc), make([]float64, hc*hc)
	for i := range n {
		ref.HyperCoef(pw, coef[i*cw:(i+1)*cw], mix[i*m:(i+1)*m], h.base, &h.site, work)
		ref.HyperPre(y[i*hidden:(i+1)*hidden], X[i*w:(i+1)*w], pw)
	}
	a.Release(mark)
}
