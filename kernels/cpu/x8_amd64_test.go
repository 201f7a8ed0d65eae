//go:build !noasm

package cpu

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
)

// moreX8Sets are the x8 kernels this CPU runs besides asmX8's: with VNNI
// (whose asmX8 is the x16 set), the AVX2 and the ymm VNNI ones.
func moreX8Sets(dt kernels.DType) map[string]*x8Set {
	if !cpuinfo.VNNI() || asmX8(dt) == nil {
		return nil
	}
	return map[string]*x8Set{"avx2": &avx2X8[dt], "vnni8": &vnniX8[dt]}
}
