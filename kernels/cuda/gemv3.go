//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The one-row GEMV, version 3 (src/ops_gemv3.cu): persistent blocks, a few
// a multiprocessor, that stream their rows' weights through a ring of
// shared-memory stages with cp.async, the first stages issued before the
// PDL wait. FERRITE_CUDA_GEMV=v3 runs the one-row and row-exact products
// and SwiGLULinear's one-row GEMV with it; v3n also NormLinearCat,
// AddNormLinearCat and NormSwiGLULinear of one row (or row-exact rows), x
// normed into shared memory once a block. FERRITE_CUDA_GEMV3_BPS (1–3,
// default 2) is its blocks a multiprocessor. A row's sums depend only on
// its width, so row-exact steps and plain decoding agree.
//
// Measured slower than gemv_split at every shape (GPU run 3 of session
// 15, BENCHMARKS.md §9): off, and to be removed with its sources when the
// fatbin is next built.

const (
	gemv3Stages  = 4        // kGemv3Stages
	gemv3Tile    = 16 << 10 // bytes a stage
	gemv3Slice   = 2 << 10  // kGemv3Slice: a row is a whole number of them
	gemv3Rows    = 4        // kGemv3Rows: rows of x a launch
	gemv3MaxRows = 256      // kGemv3MaxRows: SwiGLU outputs a block
	gemv3Ring    = gemv3Stages * gemv3Tile
)

// gemv3Kernels names the version-3 GEMVs per dtype: [0] plain, [1] SwiGLU,
// [2] norm-fused, [3] norm-fused SwiGLU.
var gemv3Kernels = map[kernels.DType][4]string{
	kernels.F32:  {"ferrite_gemv3_f32", "ferrite_gemv3_swiglu_f32", "ferrite_gemv3n_f32", "ferrite_gemv3n_swiglu_f32"},
	kernels.BF16: {"ferrite_gemv3_bf16", "ferrite_gemv3_swiglu_bf16", "ferrite_gemv3n_bf16", "ferrite_gemv3n_swiglu_bf16"},
	kernels.F16:  {"ferrite_gemv3_f16", "ferrite_gemv3_swiglu_f16", "ferrite_gemv3n_f16", "ferrite_gemv3n_swiglu_f16"},
}

func init() {
	for _, k := range gemv3Kernels {
		for _, name := range k {
			kernelNames = append(kernelNames, name)
			pdlKernels[name] = true
			bigSmemKernels = append(bigSmemKernels, name)
		}
	}
}

// gemv3Default is a new Device's version-3 setting from FERRITE_CUDA_GEMV
// and FERRITE_CUDA_GEMV3_BPS: its blocks a multiprocessor, 0 for off.
func gemv3Default() int {
	switch os.Getenv("FERRITE_CUDA_GEMV") {
	case "v3", "v3n":
	default:
		return 0
	}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_GEMV3_BPS")); err == nil && n >= 1 && n <= 3 {
		return n
	}
	return 2
}

// SetGEMV3 sets the version-3 GEMV's blocks a multiprocessor (1–3) for
// later launches, 0 for off: a switch for benchmarks and tests.
func (d *Device) SetGEMV3(bps int) {
	d.do(func() error { d.gemv3 = min(max(bps, 0), 3); return nil })
}

// gemv3Grid returns the blocks and the outputs a block for outs outputs
// of a kernel taking smem bytes of dynamic shared memory:
// FERRITE_CUDA_GEMV3_BPS blocks a multiprocessor (2 when the plain
// version-3 GEMV is off and only the norm-fused one runs), at most 2 when
// the kernel takes more than the ring (three of the norm-fused blocks
// would not fit beside each other: the third would run as a second wave).
func (d *Device) gemv3Grid(outs, smem int) (grid uint32, rpb int) {
	bps := d.gemv3
	if bps == 0 {
		bps = 2
	}
	if smem > gemv3Ring {
		bps = min(bps, 2)
	}
	rpb = ceilDiv(outs, max(1, d.SMs*bps))
	return uint32(ceilDiv(outs, rpb)), rpb
}

// gemv3Fits returns the version-3 GEMV (kind: 0 plain, 1 SwiGLU, 2
// norm-fused, 3 norm-fused SwiGLU) for w with x at address x and the
// shared memory it takes, or ok false when it does not take them: another
// dtype, rows not whole slices, x or w not at 16-byte addresses, or more
// shared memory than optIn (Device.SmemOptIn).
func gemv3Fits(w *Weight, x uint64, kind, optIn int) (name string, smem int, ok bool) {
	k, ok := gemv3Kernels[w.DType]
	if !ok || int64(w.Cols)*int64(w.DType.Size())%gemv3Slice != 0 || (x|w.Buf.ptr)%16 != 0 {
		return "", 0, false
	}
	smem = gemv3Ring
	if kind >= 2 {
		smem += w.Cols * 4
	}
	if smem > optIn {
		return "", 0, false
	}
	return k[kind], smem, true
}

// gemv3Takes is gemv3Fits while the plain version-3 GEMV is on.
func (d *Device) gemv3Takes(w *Weight, x uint64, kind int) (name string, smem int, ok bool) {
	if d.gemv3 == 0 {
		return "", 0, false
	}
	return gemv3Fits(w, x, kind, d.SmemOptIn)
}

// linear3L launches the version-3 GEMV for n rows of x (gemv3Rows a
// launch) when it takes w, and reports whether it did (linearL's
// arguments).
func (d *Device) linear3L(y, x uint64, w *Weight, n int, bias uint64, acc bool) (bool, error) {
	name, smem, ok := d.gemv3Takes(w, x, 0)
	if !ok {
		return false, nil
	}
	grid, rpb := d.gemv3Grid(w.Rows, smem)
	for j := 0; j < n; j += gemv3Rows {
		err := d.launchL(name, grid, gemvBlock, uint32(smem), y+uint64(j*w.Rows*4), x+uint64(j*w.Cols*4), w.Buf.ptr,
			i32(min(gemv3Rows, n-j)), i32(w.Rows), i32(w.Cols), i32(rpb), bias, b32(acc), 0, 0, 0, 0, 0)
		if err != nil {
			return true, err
		}
	}
	return true, nil
}

// swiglu3L launches the version-3 GEMV with the SwiGLU epilogue over the
// stacked [gate; up] dw for n rows of x, and reports whether it did.
func (d *Device) swiglu3L(y, x uint64, dw *Weight, n, inter int, limit float32) (bool, error) {
	name, smem, ok := d.gemv3Takes(dw, x, 1)
	grid, rpb := d.gemv3Grid(inter, smem)
	if !ok || rpb > gemv3MaxRows {
		return false, nil
	}
	for j := 0; j < n; j += gemv3Rows {
		err := d.launchL(name, grid, gemvBlock, uint32(smem), y+uint64(j*inter*4), x+uint64(j*dw.Cols*4), dw.Buf.ptr,
			i32(min(gemv3Rows, n-j)), i32(inter), i32(dw.Cols), i32(rpb), f32(limit), 0, 0, 0)
		if err != nil {
			return true, err
		}
	}
	return true, nil
}

// norm3 reports whether the norm-fused version-3 GEMV (swiglu: its SwiGLU
// form) runs for x normed with n and then multiplied by dw: on
// (FERRITE_CUDA_GEMV=v3n, SetGEMV3Norm), one row or row-exact rows, x and
// the norm weight at 16-byte addresses, and a weight it takes (gemv3Fits;
// SwiGLU: at most gemv3MaxRows outputs a block at one block a
// multiprocessor). It does not depend on the plain version-3 switch.
func (b *Backend) norm3(x kernels.Tensor, n *kernels.HeadNorm, dw *Weight, swiglu bool) bool {
	kind := 2
	if swiglu {
		kind = 3
		if ceilDiv(dw.Rows/2, max(1, b.dev.SMs)) > gemv3MaxRows {
			return false
		}
	}
	_, _, ok := gemv3Fits(dw, dptr(x), kind, b.dev.SmemOptIn)
	return ok && b.gemv3Norm && (x.Rows == 1 || b.rowExact) && x.Cols%4 == 0 && dptr(n.W)%16 == 0
}

// SetGEMV3Norm turns the norm-fused version-3 GEMVs on or off for the ops
// that follow and returns the previous setting (benchmarks and tests).
func (b *Backend) SetGEMV3Norm(on bool) bool {
	prev := b.gemv3Norm
	b.gemv3Norm = on
	return prev
}

// normLinear3 queues NormLinearCat (AddNormLinearCat with delta valid: x +
// delta normed, written to sum) of x on dw as the norm-fused version-3
// GEMV, one row of x a launch, and reports whether it did.
func (b *Backend) normLinear3(dst, sum, x, delta kernels.Tensor, n *kernels.HeadNorm, dw *Weight, bias uint64, acc bool) bool {
	var dl, sp uint64
	if delta.Valid() {
		dl, sp = dptr(delta), dptr(sum)
	}
	if !b.norm3(x, n, dw, false) || (dl|sp)%16 != 0 {
		return false
	}
	name, smem, _ := gemv3Fits(dw, dptr(x), 2, b.dev.SmemOptIn)
	y, xp, nw, rows := dptr(dst), dptr(x), dptr(n.W), x.Rows
	b.queue(func(d *Device) error {
		grid, rpb := d.gemv3Grid(dw.Rows, smem)
		for j := range rows {
			xo := uint64(j * dw.Cols * 4)
			dj, sj := dl, sp
			if dl != 0 {
				dj, sj = dl+xo, sp+xo
			}
			err := d.launchL(name, grid, gemvBlock, uint32(smem), y+uint64(j*dw.Rows*4), xp+xo, dw.Buf.ptr, i32(1),
				i32(dw.Rows), i32(dw.Cols), i32(rpb), bias, b32(acc), nw, f32(n.Eps), b32(n.Offset), dj, sj)
			if err != nil {
				return err
			}
		}
		return nil
	})
	return true
}

// normSwiGLU3 queues NormSwiGLULinear of x on the stacked [gate; up] dw as
// the norm-fused version-3 GEMV, one row of x a launch, and reports
// whether it did.
func (b *Backend) normSwiGLU3(dst, x kernels.Tensor, n *kernels.HeadNorm, dw *Weight, limit float32) bool {
	if !b.norm3(x, n, dw, true) {
		return false
	}
	name, smem, _ := gemv3Fits(dw, dptr(x), 3, b.dev.SmemOptIn)
	y, xp, nw, rows, inter := dptr(dst), dptr(x), dptr(n.W), x.Rows, dw.Rows/2
	b.queue(func(d *Device) error {
		grid, rpb := d.gemv3Grid(inter, smem)
		for j := range rows {
			err := d.launchL(name, grid, gemvBlock, uint32(smem), y+uint64(j*inter*4), xp+uint64(j*dw.Cols*4), dw.Buf.ptr,
				i32(1), i32(inter), i32(dw.Cols), i32(rpb), f32(limit), nw, f32(n.Eps), b32(n.Offset))
			if err != nil {
				return err
			}
		}
		return nil
	})
	return true
}
