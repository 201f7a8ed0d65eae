package strict

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.HyperOps = (*Device)(nil)
var _ kernels.ClampOps = (*Device)(nil)

// hyperShape checks that streams are (N, hc·hidden) for y (N, hidden).
func hyperShape(op string, streams, y kernels.Tensor, hc int) {
	if hc <= 0 || y.Cols <= 0 {
		panic("strict: " + op + ": no streams")
	}
	shape(op, streams, y.Rows, hc*y.Cols)
}

// HyperPre implements kernels.HyperOps.
func (d *Device) HyperPre(x, coef, streams kernels.Tensor, h *kernels.Hyper) {
	hc := h.Streams
	hyperShape("HyperPre", streams, x, hc)
	shape("HyperPre coef", coef, x.Rows, hc+hc*hc)
	weight("HyperPre", h.Fn)
	if h.Fn.Rows != (2+hc)*hc || h.Fn.Cols != streams.Cols {
		panic("strict: HyperPre: Fn is not ((2+hc)·hc, hc·hidden)")
	}
	shape("HyperPre base", h.Base, 1, (2+hc)*hc)
	if h.Iters < 1 {
		panic("strict: HyperPre needs at least one Sinkhorn iteration")
	}
	xs := make([]float32, x.Elems())
	cs := make([]float32, coef.Elems())
	ref.Hyper(xs, cs, d.in("HyperPre", streams, kernels.F32), d.in("HyperPre", h.Base, kernels.F32), h, x.Rows)
	d.out(x, xs)
	d.out(coef, cs)
}

// HyperPost implements kernels.HyperOps.
func (d *Device) HyperPost(streams, y, coef kernels.Tensor) {
	hc := streamsOf("HyperPost", streams, y)
	hyperShape("HyperPost", streams, y, hc)
	shape("HyperPost coef", coef, y.Rows, hc+hc*hc)
	X, ys, cs := d.in("HyperPost", streams, kernels.F32), d.in("HyperPost", y, kernels.F32), d.in("HyperPost", coef, kernels.F32)
	ref.HyperPost(X, ys, cs, hc, y.Rows)
	d.out(streams, X)
}

// HyperMerge implements kernels.HyperOps.
func (d *Device) HyperMerge(dst, streams kernels.Tensor) {
	hc := streamsOf("HyperMerge", streams, dst)
	hyperShape("HyperMerge", streams, dst, hc)
	X := d.in("HyperMerge", streams, kernels.F32)
	y := make([]float32, dst.Elems())
	for i := range dst.Rows {
		ref.HyperMerge(y[i*dst.Cols:(i+1)*dst.Cols], X[i*streams.Cols:(i+1)*streams.Cols], hc)
	}
	d.out(dst, y)
}

// streamsOf is the stream count hc of streams (N, hc·hidden) for y (N,
// hidden).
func streamsOf(op string, streams, y kernels.Tensor) int {
	if y.Cols <= 0 || streams.Cols%y.Cols != 0 {
		panic("strict: " + op + ": streams are not a multiple of the hidden size")
	}
	return streams.Cols / y.Cols
}
