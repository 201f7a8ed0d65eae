//go:build !noasm

//go:generate go run -C ../_generate . -set attn -out ../cpu/attn_amd64.s -stubs ../cpu/attn_stub_amd64.go -pkg cpu

package cpu

import (
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The AVX2/FMA attention and elementwise kernels (kernels/_generate/attn.go)
// behind the Go twins of attn.go, chosen per call so that tests can switch
// the CPU features off.

// softmaxRow replaces x with softmax(scale·x): softmaxF32, or softmax.
func softmaxRow(x []float32, scale float32) {
	if cpuinfo.AVX2FMA() {
		softmaxF32(x, scale)
		return
	}
	softmax(x, scale)
}

// scaledMax returns the largest x[i]·scale, −inf for an empty x:
// scaledMaxF32, or scaledMaxGo.
func scaledMax(x []float32, scale float32) float32 {
	if cpuinfo.AVX2FMA() {
		return scaledMaxF32(x, scale)
	}
	return scaledMaxGo(x, scale)
}

// expSum sets x[i] = exp(x[i]·scale − m) and returns their sum in
// float64: expSumF32, or expSumGo.
func expSum(x []float32, scale, m float32) float64 {
	if cpuinfo.AVX2FMA() {
		return expSumF32(x, scale, m)
	}
	return expSumGo(x, scale, m)
}

// swiglu sets y[i] = silu(min(g[i], limit))·clamp(u[i], −limit, limit)
// (limit 0: no clamp), y may be g: swigluF32 without a clamp, else
// ref.SwiGLUClamp.
func swiglu(y, g, u []float32, limit float32) {
	if limit == 0 && cpuinfo.AVX2FMA() {
		swigluF32(y[:len(g)], g, u[:len(g)]) // the slices check what the assembly assumes
		return
	}
	ref.SwiGLUClamp(y, g, u, limit)
}

// pvAsm are the attnPV kernels by ISA (AVX2, AVX-512), dtype (F32, BF16)
// and rows − 1.
var pvAsm = [2][kernels.BF16 + 1][2]func(o []float32, ldo int, p []float32, ldp int, v []byte, offs []int, hd int){{
	kernels.F32:  {attnPVF32R1, attnPVF32R2},
	kernels.BF16: {attnPVBF16R1, attnPVBF16R2},
}, {
	kernels.F32:  {attnPVF32R1AVX512, attnPVF32R2AVX512},
	kernels.BF16: {attnPVBF16R1AVX512, attnPVBF16R2AVX512},
}}

// pv adds P (rows, ldp) · V to o (rows, ldo) for rows 1 or 2, V's hd-wide
// rows at element offsets offs of v (F32 or BF16): the AVX-512 attnPV
// kernels for a head dim of whole 128s, the AVX2 ones, or pvGo for a head
// dim they do not take (they want a multiple of 64 for one row, 32 for
// two; one row of a multiple of 32 runs as two equal rows).
func pv(dt kernels.DType, o []float32, ldo int, p []float32, ldp int, v []byte, offs []int, hd, rows int) {
	if !cpuinfo.AVX2FMA() || hd%32 != 0 {
		pvGo(dt, o, ldo, p, ldp, v, offs, hd, rows)
		return
	}
	// The slices check what the assembly assumes.
	_ = o[(rows-1)*ldo+hd-1]
	if len(offs) > 0 {
		_ = p[(rows-1)*ldp+len(offs)-1]
		first, last := offs[0], 0
		for _, e := range offs {
			first, last = min(first, e), max(last, e)
		}
		_ = v[first*dt.Size() : (last+hd)*dt.Size()]
	}
	if cpuinfo.AVX512() && hd%128 == 0 {
		pvAsm[1][dt][rows-1](o, ldo, p, ldp, v, offs, hd)
		return
	}
	if rows == 1 && hd%64 != 0 {
		rows, ldo, ldp = 2, 0, 0
	}
	pvAsm[0][dt][rows-1](o, ldo, p, ldp, v, offs, hd)
}

// prefetchRows asks for the elements [e, e+n) of the F32 or BF16 data b
// into L1 for every e in offs, reading nothing.
func prefetchRows(dt kernels.DType, b []byte, offs []int, n int) {
	if dt == kernels.BF16 {
		prefetchRowsBF16(b, offs, n)
	} else {
		prefetchRowsF32(b, offs, n)
	}
}

// rmsNorm is ref.RMSNorm over rows of x with the sum of squares
// (float64, sumSquaresF64) and the scaling (normScaleF32) in assembly: the
// same roundings, the sum in another order.
func rmsNorm(y, x, w []float32, eps float32, offset bool, rows int) {
	if !cpuinfo.AVX2FMA() {
		ref.RMSNorm(y, x, w, eps, offset, rows)
		return
	}
	d := len(w)
	for i := range rows {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		ms := float32(sumSquaresF64(xr) / float64(d))
		inv := float32(1 / math.Sqrt(float64(ms+eps)))
		if offset {
			normScaleOffsetF32(yr, xr, w, inv)
		} else {
			normScaleF32(yr, xr, w, inv)
		}
	}
}
