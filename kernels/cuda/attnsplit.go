//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"

	"github.com/ferrite-llm/ferrite/kernels"
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
// the default, the tolerance does not). With it on, a batch of one row a
// sequence (a decode batch: as many block-table rows as rows) also skips
// the prefill kernel, which from prefillTile rows is launched first and
// takes only tiles of rows of one sequence — none there (GPU run 1 of
// session 15: 4.4 µs a layer at 64 sequences doing nothing).

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

// lenSplitDecode reports whether the length split is on and the batch of n
// rows is a decode batch: one row a sequence (p.Blocks has a row a
// sequence), so the prefill kernel would own no tile.
func (b *Backend) lenSplitDecode(n int, p *kernels.Paged) bool {
	return b.attnLenSplit > 0 && p.Blocks.Rows >= n
}
