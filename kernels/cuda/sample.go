//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ferrite-llm/ferrite/kernels"

// kernels.SampleOps on the GPU, the kernels of src/sample.cu: one block of
// sampleThreads threads per row; k = 1 runs the argmax kernel.

var _ kernels.SampleOps = (*Backend)(nil)

const (
	sampleThreads = 1024
	sampleMaxK    = 1024 // the kernel's bitonic sort: one candidate per thread
)

func init() {
	kernelNames = append(kernelNames, "ferrite_argmax_rows", "ferrite_topk_rows")
}

// TopKRows implements kernels.SampleOps for k ≤ 1024 (a larger k panics).
func (b *Backend) TopKRows(out, logits kernels.Tensor) {
	if out.DType != kernels.F32 || logits.DType != kernels.F32 {
		panic("cuda: TopKRows wants F32 tensors")
	}
	k, v := out.Cols/2, logits.Cols
	if out.Rows != logits.Rows || out.Cols%2 != 0 || k < 1 || k > v || v > 1<<24 {
		panic("cuda: TopKRows: out must be (R, 2k) with 1 ≤ k ≤ V ≤ 2^24")
	}
	if k > sampleMaxK {
		panic("cuda: TopKRows k above 1024")
	}
	rows := out.Rows
	if rows == 0 {
		return
	}
	op, os, lp, ls := dptr(out), uint64(out.Stride), dptr(logits), uint64(logits.Stride)
	b.queue(func(d *Device) error {
		if k == 1 {
			return d.launchL("ferrite_argmax_rows", uint32(rows), sampleThreads, 0, op, os, lp, ls, i32(v))
		}
		return d.launchL("ferrite_topk_rows", uint32(rows), sampleThreads, 0, op, os, lp, ls, i32(v), i32(k))
	})
}
