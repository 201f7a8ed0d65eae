//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"

	"github.com/ferrite-llm/ferrite/kernels"
)

// A decode batch's o and down projections add their split product's two
// halves into the residual stream (ferrite_add_halves with acc), and the
// next sublayer's norm reads the stream back to write its split input
// (ferrite_rmsnorm_bf16x2); the q/k/v product's halves are added
// (ferrite_add_halves) and read back by PrepareQKV. By default
// (FERRITE_CUDA_FUSE_HALVES=0 turns it off) each pair runs as one kernel
// with the same bits, ferrite_halves_rmsnorm_bf16x2 and
// ferrite_prepare_qkv_halves: the product's epilogue waits, as a
// halvesFix, for the op that follows. When that op is NormLinearCat or
// NormSwiGLULinear of the stream just written (normSplit), it fills the
// fix and the epilogue launches the fused kernel in its place, the norm's
// own launch dropped; when it is PrepareQKV of the q/k/v just computed,
// the epilogue launches nothing and PrepareQKV's kernel adds the halves
// (writing the sums to q/k/v too, as the epilogue would). Anything else
// queued in between (queue clears halvesPend) leaves the plain epilogue.
// The same switch has a decode batch's split-KV attention (and its
// ferrite_attn_combine) write its output split as well, for the o
// projection that follows (presplit), in place of ferrite_f32_to_bf16x2:
// four launches a layer fewer in all. GPU run 3 of session 15 (Qwen3-8B,
// 128 + 128, with EndStep's long poll): the step's GPU time 6,312 → 6,217
// µs at 32 sequences, 4,793 → 4,839 and 4,878 tok/s; 64 sequences 7,886 →
// 8,069 and 8,038.

// halvesFix is what the fused epilogue needs from the norm that joins it:
// the split input it writes, the norm's weight, epsilon, offset and block
// size. y2 == 0: no norm joined.
type halvesFix struct {
	y2, nw uint64
	eps    float32
	off    bool
	block  uint32
	prep   bool // PrepareQKV adds the halves: the epilogue launches nothing
	ran    bool // the epilogue ran as it was (the queue was run early): too late to join
}

// halvesPend is the product just queued whose epilogue a norm (acc: the
// stream's add) or PrepareQKV (not acc) may join: its output y (n, dim),
// its products t (2n, dim) and bias (0: none).
type halvesPend struct {
	y, t, bias uint64
	n, dim     int
	acc        bool
	fix        *halvesFix
}

// fuseHalvesDefault is the fusion's setting: on unless
// FERRITE_CUDA_FUSE_HALVES=0.
func fuseHalvesDefault() bool { return os.Getenv("FERRITE_CUDA_FUSE_HALVES") != "0" }

// SetFuseHalves turns the fused epilogue-and-norm on or off for the steps
// that follow and returns the previous setting (tests compare both).
func (b *Backend) SetFuseHalves(on bool) bool {
	prev := b.fuseHalves
	b.fuseHalves = on
	return prev
}

// halvesOrNorm is linearSplit's epilogue (plain: addHalves with acc) for
// y (n, w.Rows) that a norm may join through fix.
func halvesOrNorm(y, bias uint64, w *Weight, n int, fix *halvesFix, plain func(d *Device, t uint64) error) func(d *Device, t uint64) error {
	return func(d *Device, t uint64) error {
		if fix.y2 == 0 {
			fix.ran = true
			return plain(d, t)
		}
		return d.launchL("ferrite_halves_rmsnorm_bf16x2", uint32(n), fix.block, 0, fix.y2, y, t, bias, fix.nw, i32(n),
			i32(w.Rows), f32(fix.eps), b32(fix.off))
	}
}

// halvesOrPrep is the q/k/v product's epilogue (plain: addHalves) that
// PrepareQKV may take over through fix.
func halvesOrPrep(fix *halvesFix, plain func(d *Device, t uint64) error) func(d *Device, t uint64) error {
	return func(d *Device, t uint64) error {
		if fix.prep {
			return nil
		}
		fix.ran = true
		return plain(d, t)
	}
}

// normBlock is the norm kernels' block size for rows rows: 256, or 1,024
// for fewer rows than multiprocessors (a few rows are latency).
func (b *Backend) normBlock(rows int) uint32 {
	if rows < b.dev.SMs {
		return 1024
	}
	return 256
}

// normSplit returns the split input (2·rows, cols) bf16 of RMSNorm(x, hn)
// for NormLinearCat and NormSwiGLULinear and the launch that writes it
// (splitNorm), or, when the product queued just before wrote x and waits
// for a norm (halvesPend), a nil launch: that product's epilogue writes it.
func (b *Backend) normSplit(x kernels.Tensor, hn *kernels.HeadNorm) (uint64, func(d *Device, xb uint64) error) {
	xb := dptr(b.Scratch(kernels.BF16, 2*x.Rows, x.Cols)) // (2·rows, cols) the normed rows as bf16 hi, then lo
	if p := b.halves; p.fix != nil && !p.fix.ran && p.acc && p.y == dptr(x) && p.n == x.Rows && p.dim == x.Cols && b.inStep {
		*p.fix = halvesFix{y2: xb, nw: dptr(hn.W), eps: hn.Eps, off: hn.Offset, block: b.normBlock(x.Rows)}
		b.halves = halvesPend{}
		return xb, nil
	}
	return xb, b.splitNorm(x, hn)
}
