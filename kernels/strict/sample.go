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
