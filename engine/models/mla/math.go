package mla

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

// scaleVec sets y *= alpha.
func scaleVec(y []float32, alpha float32) {
	for i := range y {
		y[i] *= alpha
	}
}

// LayerNorm is y = (x − mean(x)) / sqrt(var(x) + eps) ⊙ W + B, the biased
// variance computed in fp32 (float64 sums), as torch.nn.LayerNorm.
type LayerNorm struct {
	W   []float32 // (dim)
	B   []float32 // (dim)
	Eps float32
}

// Forward normalises n rows: y (n, dim) from x (n, dim); y may be x.
func (l *LayerNorm) Forward(y, x []float32, n int) {
	d := len(l.W)
	for i := range n {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		var s float64
		for _, v := range xr {
			s += float64(v)
		}
		mean := float32(s / float64(d))
		var ss float64
		for _, v := range xr {
			c := float64(v - mean)
			ss += c * c
		}
		inv := float32(1 / math.Sqrt(float64(float32(ss/float64(d))+l.Eps)))
		for j, v := range xr {
			yr[j] = (v-mean)*inv*l.W[j] + l.B[j]
		}
	}
}

// newMat returns an empty (rows, cols) matrix of dtype dt.
func newMat(dt kernels.DType, rows, cols int) *kernels.Mat {
	return &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, rows*cols*dt.Size())}
}

// copyElem copies element src[si] of a matrix of dtype dt to dst[di]; dt is
// F32, BF16 or F16 (exact byte copy).
func copyElem(dst []byte, di int, src []byte, si int, size int) {
	copy(dst[di*size:(di+1)*size], src[si*size:(si+1)*size])
}

// putF32 stores v as element i of an F32 matrix's data.
func putF32(data []byte, i int, v float32) {
	binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
}
