package cpu

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var (
	_ kernels.HyperOps = (*Backend)(nil)
	_ kernels.ClampOps = (*Backend)(nil)
)

// hyperScratch is HyperPre's reusable host scratch.
type hyperScratch struct {
	xn  []float32 // (N, hc·hidden) normed streams
	mix []float32 // (N, (2+hc)·hc)
}

// hyperCheck panics unless streams are (N, hc·hidden) contiguous for y
// (N, hidden) contiguous, and returns hc.
func hyperCheck(streams, y kernels.Tensor) int {
	contiguous(streams)
	contiguous(y)
	if y.Cols <= 0 || streams.Rows != y.Rows || streams.Cols%y.Cols != 0 {
		panic("cpu: hyper-connection shapes do not match")
	}
	return streams.Cols / y.Cols
}

// HyperPre implements kernels.HyperOps: the weightless norm and the
// coefficients per row over the worker pool, the mix product through
// MatMul.
func (b *Backend) HyperPre(x, coef, streams kernels.Tensor, h *kernels.Hyper) {
	hc := h.Streams
	contiguous(coef)
	m, cw := (2+hc)*hc, hc+hc*hc
	if hyperCheck(streams, x) != hc || coef.Rows != x.Rows || coef.Cols != cw || h.Fn.Rows != m || h.Fn.Cols != streams.Cols || h.Base.Elems() != m {
		panic("cpu: HyperPre shapes do not match")
	}
	n, w, hidden := x.Rows, streams.Cols, x.Cols
	X, xs, cs, base := f32(streams), f32(x), f32(coef), f32(h.Base)[:m]
	xn, mix := grow(&b.hyper.xn, n*w), grow(&b.hyper.mix, n*m)
	b.Parallel(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ref.HyperNorm(xn[i*w:(i+1)*w], X[i*w:(i+1)*w], h.NormEps)
		}
	})
	// The mix product feeds exponentials and the Sinkhorn iterations, and
	// it is small ((2+hc)·hc outputs a row): x stays float32 whatever
	// SetBF16Activations allows.
	on := b.bf16x
	b.bf16x = false
	b.MatMul(mix, xn, h.Fn, n)
	b.bf16x = on
	b.Parallel(n, func(lo, hi int) {
		pre, work := make([]float64, hc), make([]float64, hc*hc)
		for i := lo; i < hi; i++ {
			ref.HyperCoef(pre, cs[i*cw:(i+1)*cw], mix[i*m:(i+1)*m], base, h, work)
			ref.HyperPre(xs[i*hidden:(i+1)*hidden], X[i*w:(i+1)*w], pre)
		}
	})
}

// HyperPost implements kernels.HyperOps.
func (b *Backend) HyperPost(streams, y, coef kernels.Tensor) {
	hc := hyperCheck(streams, y)
	contiguous(coef)
	cw := hc + hc*hc
	if coef.Rows != y.Rows || coef.Cols != cw {
		panic("cpu: HyperPost coefficients do not match the streams")
	}
	X, ys, cs, w, hidden := f32(streams), f32(y), f32(coef), streams.Cols, y.Cols
	b.Parallel(y.Rows, func(lo, hi int) {
		ref.HyperPost(X[lo*w:hi*w], ys[lo*hidden:hi*hidden], cs[lo*cw:hi*cw], hc, hi-lo)
	})
}

// HyperMerge implements kernels.HyperOps.
func (b *Backend) HyperMerge(dst, streams kernels.Tensor) {
	hc := hyperCheck(streams, dst)
	X, y, w, hidden := f32(streams), f32(dst), streams.Cols, dst.Cols
	b.Parallel(dst.Rows, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ref.HyperMerge(y[i*hidden:(i+1)*hidden], X[i*w:(i+1)*w], hc)
		}
	})
}
