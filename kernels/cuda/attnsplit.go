//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"
)

// FERRITE_CUDA_ATTN_LENSPLIT=k (off by default until measured) changes how
// a decode batch's split-KV attention splits the keys. By default the
// splits cut the block table, which is up to twice as wide as the longest
// row (engine/gqa's tableWidth: a power of two, so that graphs replay), in
// equal parts: a row's keys fill the first splits and leave the last short
// or empty, and the splits are as many as give about 2 blocks an SM. With
// k each row's own keys are dealt evenly over the splits (src/ops.cu's
// attn_split), and the splits are as many as give about k blocks an SM.
// The splits' partial sums merge as before, in split order; a row's sums
// then depend on its length's split, not the table's (the bits differ from
// the default, the tolerance does not).

// attnLenSplitDefault is FERRITE_CUDA_ATTN_LENSPLIT: blocks an SM (1–64),
// 0 when unset or not a number in range.
func attnLenSplitDefault() int {
	k, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_ATTN_LENSPLIT"))
	if err != nil || k < 1 || k > 64 {
		return 0
	}
	return k
}

// SetAttnLenSplit sets FERRITE_CUDA_ATTN_LENSPLIT's blocks an SM for the
// steps that follow (0: off) and returns the previous setting.
func (b *Backend) SetAttnLenSplit(k int) int {
	prev := b.attnLenSplit
	b.attnLenSplit = k
	return prev
}
