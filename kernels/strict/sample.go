package strict

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.SampleOps = (*Device)(nil)

// TopKRows implements kernels.SampleOps.
func (d *Device) TopKRows(out, logits kernels.Tensor) {
	shape("TopKRows", out, logits.Rows, -1)
	k, v := out.Cols/2, logits.Cols
	if out.Cols%2 != 0 || k < 1 || k > v || v > 1<<24 {
		panic("strict: TopKRows: out must be (R, 2k) with 1 ≤ k ≤ V ≤ 2^24")
	}
	x := d.in("TopKRows", logits, kernels.F32)
	y := make([]float32, out.Elems())
	cols := make([]int32, k)
	for i := range logits.Rows {
		o := y[i*2*k : (i+1)*2*k]
		ref.TopKRow(o[:k], cols, x[i*v:(i+1)*v])
		for j, c := range cols {
			o[k+j] = float32(c)
		}
	}
	d.out(out, y)
}

var _ kernels.DraftOps = (*Device)(nil)

// FeedIDs implements kernels.DraftOps.
func (d *Device) FeedIDs(dst, src, idx kernels.Tensor) {
	shape("FeedIDs", dst, -1, 1)
	shape("FeedIDs idx", idx, dst.Rows, 1)
	contiguous("FeedIDs", src)
	ix := d.ints("FeedIDs", idx)
	x := d.in("FeedIDs", src, kernels.F32)
	v := d.view(dst, kernels.I32)
	for i, j := range ix {
		if j >= 0 && int(j) < len(x) {
			f := x[j]
			if f != float32(int32(f)) {
				panic("strict: FeedIDs: source element is not an integer")
			}
			v.i32[i*dst.Stride] = int32(f)
		}
	}
}
