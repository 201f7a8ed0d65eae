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
	kernelNames = append(kernelNames, "ferrite_argmax_rows", "ferrite_topk_rows", "ferrite_feed_ids")
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

var _ kernels.DraftOps = (*Backend)(nil)

// FeedIDs implements kernels.DraftOps (src/sample.cu's ferrite_feed_ids).
func (b *Backend) FeedIDs(dst, src, idx kernels.Tensor) {
	if dst.DType != kernels.I32 || idx.DType != kernels.I32 || src.DType != kernels.F32 {
		panic("cuda: FeedIDs wants I32 dst and idx, F32 src")
	}
	if dst.Cols != 1 || idx.Cols != 1 || idx.Rows != dst.Rows || !src.Contiguous() {
		panic("cuda: FeedIDs wants dst, idx (M, 1) and a contiguous src")
	}
	m := dst.Rows
	if m == 0 {
		return
	}
	dp, ds, sp, n, ip, is := dptr(dst), i32(dst.Stride), dptr(src), uint64(src.Elems()), dptr(idx), i32(idx.Stride)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_feed_ids", uint32((m+255)/256), 256, 0, dp, ds, sp, n, ip, is, i32(m))
	})
}
