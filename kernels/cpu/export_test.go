package cpu

import "github.com/ferrite-llm/ferrite/kernels"

// ForceGenericBF16 sends BF16 weights through the bf16 path with its pure-Go
// tiles, on any CPU, until restore is called.
func ForceGenericBF16() (restore func()) {
	old := forceGenericBF16.Swap(true)
	return func() { forceGenericBF16.Store(old) }
}

// ForceGenericX8 sends Q8_0 and Q4_0 weights through the x8 path (x8.go)
// with its pure-Go kernels, on any CPU, until restore is called.
func ForceGenericX8() (restore func()) {
	old := forceGenericX8.Swap(true)
	return func() { forceGenericX8.Store(old) }
}

// HeadMatMuls is headMatMuls (the absorbed MLA's per-head products, side
// by side over the workers), for the benchmarks.
func (b *Backend) HeadMatMuls(ys []float32, yn int, xs []float32, xn int, ws []*kernels.Mat, m int) {
	b.headMatMuls(ys, yn, xs, xn, ws, m)
}
