package glm5next

import (
	"encoding/binary"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// f32Mat wraps float32 values (rows, cols) as an F32 kernels.Mat.
func f32Mat(rows, cols int, v []float32) *kernels.Mat {
	data := make([]byte, 4*len(v)) // (rows, cols) little-endian float32
	for i, f := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
	}
	return &kernels.Mat{DType: kernels.F32, Rows: rows, Cols: cols, Data: data}
}
