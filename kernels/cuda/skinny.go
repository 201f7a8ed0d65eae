//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The skinny GEMM (src/skinny.cu, version 3): Linear, LinearCat and
// SwiGLULinear of 2 to 64 rows on a bf16 weight, the decode batches, in
// one kernel on the tensor cores, built to stream the weight at the full
// bandwidth. The weight streams from memory once, through a cp.async ring
// of shared-memory stages, 96–176 KiB of it in flight a multiprocessor;
// x's chunks ride in the same stages as float32 and are split into two
// bf16 terms as the fragments are loaded (the accuracy of the cuBLASLt
// path, linearSplit, whose split and epilogue kernels it saves, and
// SwiGLULinear's fourth); the SwiGLU, bias and residual add are its
// epilogue. One block a multiprocessor: the (row block, K chunk) units
// are dealt out evenly over the blocks (stream-K), so that a 4096-row
// layer fills the GPU as well as the LM head does, and the last block of a
// row block split between blocks adds the pieces in a fixed order.

const (
	skinnyMaxRows   = 64   // the most rows of x: eight MMA tiles of 8
	skinnyBlockRows = 128  // weight rows a row block (64 gate and 64 up rows with SwiGLU)
	skinnyChunk     = 64   // columns a unit
	skinnyWarps     = 8    // warps a block
	skinnyCounters  = 4096 // row blocks the split counters cover
)

// skinnyKernels[swiglu][i] is the kernel for up to 8·2^i rows of x.
var skinnyKernels = [2][4]string{
	{"ferrite_skinny_bf16_1", "ferrite_skinny_bf16_2", "ferrite_skinny_bf16_4", "ferrite_skinny_bf16_8"},
	{"ferrite_skinny_swiglu_bf16_1", "ferrite_skinny_swiglu_bf16_2", "ferrite_skinny_swiglu_bf16_4", "ferrite_skinny_swiglu_bf16_8"},
}

// The skinny kernels load with the module, start with FERRITE_PDL_WAIT
// (after their first weight copies) and take more than 48 KiB of dynamic
// shared memory.
func init() {
	for _, ks := range skinnyKernels {
		for _, k := range ks {
			kernelNames = append(kernelNames, k)
			bigSmemKernels = append(bigSmemKernels, k)
			pdlKernels[k] = true
		}
	}
}

// skinnyStages is src/skinny.cu's sk_stages: the ring's depth for the
// kernel of index tile (8·2^tile rows of x).
func skinnyStages(tile int) int {
	switch {
	case tile >= 3:
		return 7
	case tile == 2:
		return 9
	case tile == 1:
		return 11
	}
	return 12
}

// skinnySmem is the dynamic shared memory of the skinny kernel of index
// tile: the stages (a 128 × 64 bf16 weight tile and 8·2^tile rows of 64
// float32 of x each; a segment's sums tile takes the stage just
// multiplied) and the split hand-over's flag (16 bytes). The kernel has no
// static shared memory, so that its limit can be raised to the device's
// whole opt-in.
func skinnySmem(tile int) int {
	return skinnyStages(tile)*(skinnyBlockRows*128+(8<<tile)*256) + 16
}

// skinnyState is a Backend's skinny GEMM setting and split counters.
type skinnyState struct {
	rows     int // Linear of 2 to rows rows runs the skinny GEMM; 0: never
	l2       int // the kernel's L2 hints for the weights (skinnyL2Default)
	once     sync.Once
	counters *Buffer // skinnyCounters int32, zero between launches
}

// skinnyRowsDefault is a new Backend's skinny-GEMM limit: off (all three
// versions measured slower than cuBLASLt; version 3 re-reads x for every
// 128 weight rows, which costs more than its MMAs from 16 rows up,
// BENCHMARKS.md §9), or FERRITE_CUDA_SKINNY=N for batches of up to N rows
// (at most 64).
func skinnyRowsDefault() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_SKINNY")); err == nil && n >= 0 {
		return min(n, skinnyMaxRows)
	}
	return 0
}

// skinnyL2Default is a new Backend's L2 hints for the skinny GEMM's weight
// loads, FERRITE_CUDA_SKINNY_L2 (0 by default): bit 1 evict the weights
// first, bit 2 fetch 256 bytes into L2 a request.
func skinnyL2Default() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_SKINNY_L2")); err == nil && n >= 0 && n <= 3 {
		return n
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

// skinnyCounters returns the split counters, allocating and zeroing them
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

// skinnyGrid is the skinny GEMM's row blocks and K chunks for w.
func skinnyGrid(w *Weight, swiglu bool) (gx, chunks int) {
	if swiglu {
		return ceilDiv(w.Rows/2, skinnyBlockRows/2), ceilDiv(w.Cols, skinnyChunk)
	}
	return ceilDiv(w.Rows, skinnyBlockRows), ceilDiv(w.Cols, skinnyChunk)
}

// skinnyBlocks is the grid of a product of gx row blocks and chunks K
// chunks asked to run on g blocks (g ≤ 0: one a multiprocessor of sms):
// at most one block a unit, and one a row block, none split, when the row
// blocks outnumber the counters.
func skinnyBlocks(gx, chunks, g, sms int) int {
	if gx > skinnyCounters {
		return gx
	}
	if g <= 0 {
		g = sms
	}
	return max(1, min(g, gx*chunks))
}

// linearSkinny queues y (n, w.Rows) = x·wᵀ (+ bias) (+ y when acc) on the
// skinny GEMM, or with swiglu (w the stacked [gate; up]) y (n, w.Rows/2)
// = the SwiGLU of the two products, clamped at limit > 0.
func (b *Backend) linearSkinny(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32) {
	b.skinnyG(y, x, bias, w, n, acc, swiglu, limit, 0)
}

// skinnyG is linearSkinny on g blocks (0: one a multiprocessor; tests
// force others).
func (b *Backend) skinnyG(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32, g int) {
	gx, chunks := skinnyGrid(w, swiglu)
	g = skinnyBlocks(gx, chunks, g, b.dev.SMs)
	// (2·g, 128·xr) each block's first and last pieces' sums
	part := dptr(b.Scratch(kernels.F32, 2*g, skinnyBlockRows*8<<skinnyTile(n)))
	counters, l2 := b.skinny.counters.ptr, b.skinny.l2
	b.queue(func(d *Device) error { return d.skinnyL(y, x, bias, w, n, acc, swiglu, limit, g, part, counters, l2) })
}

// skinnyL launches the skinny GEMM on g blocks (skinnyBlocks) with the L2
// hints l2 (skinnyL2Default): part holds 2·g·128·8·2^skinnyTile(n)
// float32, counters skinnyCounters zeros.
func (d *Device) skinnyL(y, x, bias uint64, w *Weight, n int, acc, swiglu bool, limit float32, g int, part, counters uint64, l2 int) error {
	rows, sw := w.Rows, 0
	if swiglu {
		rows, sw = w.Rows/2, 1
	}
	tile := skinnyTile(n)
	return d.launchL(skinnyKernels[sw][tile], uint32(g), skinnyWarps*32, uint32(skinnySmem(tile)),
		y, x, w.Buf.ptr, i32(n), i32(rows), i32(w.Cols), bias, b32(acc), f32(limit), part, counters, i32(l2))
}
