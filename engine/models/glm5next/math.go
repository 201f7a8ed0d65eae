package glm5next

import (
	"encoding/binary"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// dot is Σ a[i]·b[i] over len(a) values, with four float32 accumulators.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy sets y += alpha·x over len(x) values.
func axpy(y []float32, alpha float32, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// sigmoid64 is 1/(1+e^-x) without overflow.
func sigmoid64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// layerNorm normalises n rows of len(w) values in place:
// x ← (x − mean)/sqrt(var + eps)·w + b, with the biased variance (torch's
// nn.LayerNorm), sums in float64.
func layerNorm(x, w, b []float32, eps float64, n int) {
	d := len(w)
	for i := range n {
		r := x[i*d : (i+1)*d]
		var s float64
		for _, v := range r {
			s += float64(v)
		}
		mean := s / float64(d)
		var ss float64
		for _, v := range r {
			dv := float64(v) - mean
			ss += dv * dv
		}
		inv := 1 / math.Sqrt(ss/float64(d)+eps)
		for j, v := range r {
			r[j] = float32((float64(v)-mean)*inv)*w[j] + b[j]
		}
	}
}

// f32Mat wraps float32 values (rows, cols) as an F32 kernels.Mat.
func f32Mat(rows, cols int, v []float32) *kernels.Mat {
	data := make([]byte, 4*len(v)) // (rows, cols) little-endian float32
	for i, f := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
	}
	return &kernels.Mat{DType: kernels.F32, Rows: rows, Cols: cols, Data: data}
}
