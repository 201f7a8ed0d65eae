//go:build !noasm

package cpu

import "github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"

func streamSum(x []float32) float32 {
	if cpuinfo.AVX2FMA() {
		return sumF32(x)
	}
	return sumGo(x)
}
