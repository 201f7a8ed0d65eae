//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The one-row GEMV, version 2 (src/ops_gemv2.cu): S warps a weight row,
// each lane with U 16-byte weight loads in flight, the first chunk of them
// issued before the PDL wait. FERRITE_CUDA_GEMV picks it for the n = 1
// Linear, the row-exact Linear and SwiGLULinear's one-row GEMV:
//
//	v2    S = 2, U = 8 (every float dtype)
//	v2s1  S = 1, U = 16 (bf16; other dtypes v2)
//	v2s4  S = 4, U = 4 (bf16; other dtypes v2): gemv_split's layout
//
// Anything else leaves the four-warps-a-row gemv_split (or gemv_rows with
// FERRITE_CUDA_GEMV_ROWS). A row's sums depend only on the variant, so
// row-exact steps and plain decoding agree within one variant.

// gemv2Kernels names the version-2 GEMVs per variant (S) and dtype: [0]
// plain, [1] with the SwiGLU epilogue.
var gemv2Kernels = map[int]map[kernels.DType][2]string{
	2: {
		kernels.F32:  {"ferrite_gemv2_f32_s2", "ferrite_gemv2_swiglu_f32_s2"},
		kernels.BF16: {"ferrite_gemv2_bf16_s2", "ferrite_gemv2_swiglu_bf16_s2"},
		kernels.F16:  {"ferrite_gemv2_f16_s2", "ferrite_gemv2_swiglu_f16_s2"},
	},
	1: {kernels.BF16: {"ferrite_gemv2_bf16_s1", "ferrite_gemv2_swiglu_bf16_s1"}},
	4: {kernels.BF16: {"ferrite_gemv2_bf16_s4", "ferrite_gemv2_swiglu_bf16_s4"}},
}

func init() {
	for _, m := range gemv2Kernels {
		for _, k := range m {
			for _, name := range k {
				kernelNames = append(kernelNames, name)
				pdlKernels[name] = true
			}
		}
	}
}

// gemv2Default is a new Device's version-2 GEMV variant from
// FERRITE_CUDA_GEMV: the warps a row (1, 2 or 4), 0 for off.
func gemv2Default() int {
	switch os.Getenv("FERRITE_CUDA_GEMV") {
	case "v2":
		return 2
	case "v2s1":
		return 1
	case "v2s4":
		return 4
	}
	return 0
}

// SetGEMV2 picks the version-2 GEMV variant for later launches: the warps
// a row (1, 2 or 4), 0 for off. A switch for benchmarks and tests.
func (d *Device) SetGEMV2(s int) error {
	if _, ok := gemv2Kernels[s]; !ok && s != 0 {
		return fmt.Errorf("cuda: SetGEMV2(%d): want 0, 1, 2 or 4", s)
	}
	return d.do(func() error { d.gemv2 = s; return nil })
}

// gemv2Kernel returns the version-2 kernel (swiglu: its SwiGLU form) for
// w and the rows it takes a block, or ok false when the variant is off or
// has no kernel for w (its rows not whole 16-byte loads, another dtype).
func (d *Device) gemv2Kernel(w *Weight, swiglu bool) (name string, rowsPerBlock int, ok bool) {
	if d.gemv2 == 0 || int64(w.Cols)*int64(w.DType.Size())%16 != 0 || w.Buf.ptr%16 != 0 {
		return "", 0, false
	}
	s := d.gemv2
	k, ok := gemv2Kernels[s][w.DType]
	if !ok {
		s = 2
		if k, ok = gemv2Kernels[s][w.DType]; !ok {
			return "", 0, false
		}
	}
	if swiglu {
		return k[1], gemvBlock / 32 / s / 2, true
	}
	return k[0], gemvBlock / 32 / s, true
}

// linear2L launches the version-2 GEMV for n rows of x when the variant
// is on and takes w and x (16-byte aligned), and reports whether it did
// (linearL's arguments).
func (d *Device) linear2L(y, x uint64, w *Weight, n int, bias uint64, acc bool) (bool, error) {
	name, per, ok := d.gemv2Kernel(w, false)
	if !ok || x%16 != 0 {
		return false, nil
	}
	return true, d.launchL(name, uint32(ceilDiv(w.Rows, per)), gemvBlock, 0, y, x, w.Buf.ptr, i32(n), i32(w.Rows), i32(w.Cols), bias, b32(acc))
}

// swiglu2L launches the version-2 GEMV with the SwiGLU epilogue over the
// stacked [gate; up] dw (2·inter rows) for n rows of x, and reports
// whether it did.
func (d *Device) swiglu2L(y, x uint64, dw *Weight, n, inter int, limit float32) (bool, error) {
	name, per, ok := d.gemv2Kernel(dw, true)
	if !ok || x%16 != 0 {
		return false, nil
	}
	return true, d.launchL(name, uint32(ceilDiv(inter, per)), gemvBlock, 0, y, x, dw.Buf.ptr, i32(n), i32(inter), i32(dw.Cols), f32(limit))
}
