package mla

import (
	"encoding/binary"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// scaleVec sets y *= alpha.
func scaleVec(y []float32, alpha float32) {
	for i := range y {
		y[i] *= alpha
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
