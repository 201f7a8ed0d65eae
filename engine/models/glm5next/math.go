package glm5next

import (
	"encoding/binary"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// sigmoid64 is 1/(1+e^-x) without overflow.
func sigmoid64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// f32Mat wraps float32 values (rows, cols) as an F32 kernels.Mat.
func f32Mat(rows, cols int, v []float32) *kernels.Mat {
	data := make([]byte, 4*len(v)) // (rows, cols) little-endian float32
	for i, f := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
	}
	return &kernels.Mat{DType: kernels.F32, Rows: rows, Cols: cols, Data: data}
}
