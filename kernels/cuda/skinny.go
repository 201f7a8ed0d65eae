//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The skinny GEMM (src/skinny.cu): Linear, LinearCat and SwiGLULinear of
// 2 to 64 rows on a bf16 weight, the decode batches, in one kernel on the
// tensor cores. The weight streams from memory once, through a cp.async
// ring of shared-memory stages; x is split into two bf16 terms in shared memory inside the
// kernel (the accuracy of the cuBLASLt path, linearSplit, whose split and
// epilogue kernels it saves, and SwiGLULinear's fourth); the SwiGLU, bias
// and residual add are its epilogue. Layers with few row blocks (Qwen3-8B's
// q/k/v, o and down) split K over the blocks, and the last block of a row
// block to finish adds the splits in a fixed order.

const (
	skinnyMaxRows   = 64   // the most rows of x: eight MMA tiles of 8
	skinnyBlockRows = 256  // weight rows a block (128 gate and 128 up rows with SwiGLU)
	skinnyChunk     = 64   // columns a pipeline stage
	skinnyWarpSums  = 256  // float32 sums a warp per MMA tile of x rows (2·4·32)
	skinnyWarps     = 8    // warps a block
	skinnyMaxSplits = 16   // the most K splits
	skinnyCounters  = 4096 // row blocks the split-K counters cover
)

// skinnyKernels[swiglu][i] is the kernel for up to 8·2^i rows of x.
var skinnyKernels = [2][4]string{
	{"ferrite_skinny_bf16_1", "ferrite_skinny_bf16_2", "ferrite_skinny_bf16_4", "ferrite_skinny_bf16_8"},
	{"ferrite_skinny_swiglu_bf16_1", "ferrite_skinny_swiglu_bf16_2", "ferrite_skinny_swiglu_bf16_4", "ferrite_skinny_swiglu_bf16_8"},
}

// The skinny kernels load with the module, start with FERRITE_PDL_WAIT and
// take more than 48 KiB of dynamic shared memory.
func init() {
	for _, ks := range skinnyKernels {
		for _, k := range ks {
			kernelNames = append(kernelNames, k)
			bigSmemKernels = append(bigSmemKernels, k)
			pdlKernels[k] = true
		}
	}
}

// skinnyStages is src/skinny.cu's weight stages in shared memory.
const skinnyStages = 4

// skinnySmem is the dynamic shared memory of the skinny kernel of index
// tile: the weight stages (256 rows of 128 bytes each), x's two chunk
// buffers of two terms (8·2^tile rows of 128 bytes) and the split
// hand-over's flag (16 bytes). The kernel has no static shared memory, so
// that its limit can be raised to the device's whole opt-in.
func skinnySmem(tile int) int {
	return skinnyStages*skinnyBlockRows*128 + 2*2*(8<<tile)*128 + 16
}

// skinnyState is a Backend's skinny GEMM setting and split-K counters.
type skinnyState struct {
	rows     int // Linear of 2 to rows rows runs the skinny GEMM; 0: never
	once     sync.Once
	counters *Buffer // skinnyCounters int32, zero between launches
}

// skinnyRowsDefault is a new Backend's skinny-GEMM limit: off (GPU run 2
// measured the first version 1.3–5× slower than cuBLASLt), or
// FERRITE_CUDA_SKINNY=N for batches of up to N rows (at most 64).
func skinnyRowsDefault() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_SKINNY")); err == nil && n >= 0 {
		return min(n, skinnyMaxRows)
	}
	return 0
}

// SetSkinnyRows sets the most rows Linear, LinearCat and SwiGLULinear run
// the skinny GEMM for (0 never, at most 64) and returns the old value: a
// switch for tests and benchmarks, outside a step.
func (b *Backend) SetSkinnyRows(n int) int {
	old := b.skinny.rows
	b.skinny.rows = max(0, min(n, skinnyMaxRows))
	return old
}

// useSkinny reports whether a product of n rows of x (device address x)
// by w runs the skinny GEMM: a bf16 weight of a width of 8s, aligned
// operands, counters allocated.
func (b *Backend) useSkinny(w *Weight, n int, x uint64) bool {
	if n < 2 || n > b.skinny.rows || w.DType != kernels.BF16 || w.Cols%8 != 0 || x%16 != 0 || w.Buf.ptr%16 != 0 ||
		b.dev.SmemOptIn < skinnySmem(skinnyTile(n)) {
		return false
	}
	return b.skinnyCounters() != nil
}

// skinnyCounters returns the split-K counters, allocating and zeroing them
// on first use (nil if that failed: the products then take cuBLASLt).
func (b *Backend) skinnyCounters() *Buffer {
	b.skinny.once.Do(func() {
		c, err := b.dev.Alloc(skinnyCounters * 4)
		if err == nil {
			if err = c.Fill32(0, skinnyCounters, 0); err != nil {
				c.Free()
			}
		}
		if err == nil {
			b.skinny.counters = c
		}
	})
	return b.skinny.counters
}

// skinnyTile is the kernel index for n rows of x: tiles of 8·2^i rows.
func skinnyTile(n int) int {
	i := 0
	for 8<<i < n {
		i++
	}
	return i
}

// skinnySplits picks how many K splits a product of gx row blocks and
// chunks K-chunks takes on sms multiprocessors (one block each, the
// kernel's register use): the fewest block-chunks the slowest
// multiprocessor streams, counting two for each block's start-up and the
// split sums' traffic (each split writes and the last block reads n·256
// float32 a row block) in block-chunks (32 KiB of weight). Every split gets
// at least one chunk.
func skinnySplits(gx, chunks, sms, n int) int {
	if gx > skinnyCounters {
		return 1
	}
	best, bestCost := 1, 0.0
	for ks := 1; ks <= min(skinnyMaxSplits, chunks); ks++ {
		cps := ceilDiv(chunks, ks)
		if ceilDiv(chunks, cps) != ks {
			continue // an empty split: the same work as fewer splits
		}
		cost := float64(ceilDiv(gx*ks, sms) * (cps + 2))
		if ks > 1 {
			cost += float64(ks*n*gx*skinnyBlockRows*8) / float64(sms*skinnyBlockRows*skinnyChunk*2)
		}
		if ks == 1 || cost < bestCost {
			best, bestCost = ks, cost
		}
	}
	return best
}

// linearSkinny queues y (n, w.Rows) = x·wᵀ (+ bias) (+ y when acc) on the
// skinny GEMM, or with swiglu (w the stacked [gate; up]) y (n, w.Rows/2)
// = the SwiGLU of the two products, clamped at limit > 0.
func (b *Backend) linearSkinny(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32) {
	gx, chunks := skinnyGrid(w, swiglu)
	b.skinnyKS(y, x, bias, w, n, acc, swiglu, limit, skinnySplits(gx, chunks, b.dev.SMs, n))
}

// skinnyKS is linearSkinny with ks K splits (tests force them).
func (b *Backend) skinnyKS(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32, ks int) {
	gx, _ := skinnyGrid(w, swiglu)
	var part uint64
	if ks > 1 { // (splits·row blocks, warps·sums) each block's sums, in fragment order
		part = dptr(b.Scratch(kernels.F32, ks*gx, skinnyWarps*skinnyWarpSums<<skinnyTile(n)))
	}
	counters := b.skinny.counters.ptr
	b.queue(func(d *Device) error { return d.skinnyL(y, x, bias, w, n, acc, swiglu, limit, ks, part, counters) })
}

// skinnyGrid is the skinny GEMM's row blocks and K chunks for w.
func skinnyGrid(w *Weight, swiglu bool) (gx, chunks int) {
	if swiglu {
		return ceilDiv(w.Rows/2, skinnyBlockRows/2), ceilDiv(w.Cols, skinnyChunk)
	}
	return ceilDiv(w.Rows, skinnyBlockRows), ceilDiv(w.Cols, skinnyChunk)
}

// skinnyL launches the skinny GEMM with ks K splits (1 when the row blocks
// outnumber the counters): part holds ks·gx·skinnyWarps·skinnyWarpSums<<
// skinnyTile(n) float32 when ks > 1, counters skinnyCounters zeros.
func (d *Device) skinnyL(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32, ks int, part, counters uint64) error {
	gx, chunks := skinnyGrid(w, swiglu)
	rows, sw := w.Rows, 0
	if swiglu {
		rows, sw = w.Rows/2, 1
	}
	ks = max(1, min(ks, chunks))
	if gx > skinnyCounters {
		ks = 1
	}
	tile := skinnyTile(n)
	return d.launch3L(skinnyKernels[sw][tile], [3]uint32{uint32(gx), uint32(ks), 1}, skinnyWarps*32, uint32(skinnySmem(tile)),
		y, x, w.Buf.ptr, i32(n), i32(rows), i32(w.Cols), bias, b32(acc), f32(limit), part, counters, i32(ceilDiv(chunks, ks)))
}
