//go:build !amd64 || noasm

package cpu

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// softmaxRow replaces x with softmax(scale·x).
func softmaxRow(x []float32, scale float32) { softmax(x, scale) }

// scaledMax returns the largest x[i]·scale, −inf for an empty x.
func scaledMax(x []float32, scale float32) float32 { return scaledMaxGo(x, scale) }

// expSum sets x[i] = exp(x[i]·scale − m) and returns their sum in
// float64.
func expSum(x []float32, scale, m float32) float64 { return expSumGo(x, scale, m) }

// swiglu sets y[i] = silu(min(g[i], limit))·clamp(u[i], −limit, limit)
// (limit 0: no clamp); y may be g.
func swiglu(y, g, u []float32, limit float32) { ref.SwiGLUClamp(y, g, u, limit) }

// pv adds P (rows, ldp) · V to o (rows, ldo), V's hd-wide rows at element
// offsets offs of v (F32 or BF16).
func pv(dt kernels.DType, o []float32, ldo int, p []float32, ldp int, v []byte, offs []int, hd, rows int) {
	pvGo(dt, o, ldo, p, ldp, v, offs, hd, rows)
}

// prefetchRows does nothing: Go has no prefetch.
func prefetchRows(dt kernels.DType, b []byte, offs []int, n int) {}

// rmsNorm is ref.RMSNorm.
func rmsNorm(y, x, w []float32, eps float32, offset bool, rows int) {
	ref.RMSNorm(y, x, w, eps, offset, rows)
}
