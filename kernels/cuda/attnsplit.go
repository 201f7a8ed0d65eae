//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"

	"github.com/ferrite-llm/ferrite/kernels"
)

// From prefillTile rows Attention launches the prefill kernel first, which
// takes the row tiles whose rows are all of one sequence, and the split-KV
// kernel takes the rest. In a decode batch every row is its own sequence
// (the block table has a row a row), so the prefill kernel owns no tile
// and only exits; GPU run 1 of session 15 had it at 4.4 µs a layer at 64
// sequences, and run 2's benchmark of the decode batch's attention
// measured 49.5 µs a layer without it against 53.1 with it (64 rows,
// 128–255 keys). So such a batch skips it: the split-KV kernel then runs
// every row as it ran them before (the same bits), when ferrite_dattn
// does not take the batch (decode.go's decBatch).
// FERRITE_CUDA_DECODE_PREFILL=1 launches it anyway, as before.
var decodePrefill = os.Getenv("FERRITE_CUDA_DECODE_PREFILL") == "1"

// decodeBatch reports whether the n rows of p are one a sequence, so that
// the prefill kernel would own no tile.
func decodeBatch(n int, p *kernels.Paged) bool { return !decodePrefill && p.Blocks.Rows >= n }
