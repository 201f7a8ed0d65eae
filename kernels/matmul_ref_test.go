package kernels_test

import (
	"math"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestMatMulRef checks the reference on a hand-worked example in every
// dtype (all values exact in each).
func TestMatMulRef(t *testing.T) {
	w := []float32{ // (3, 2)
		1, 2,
		-0.5, 4,
		0.25, -1,
	}
	x := []float32{ // (2, 2)
		1, 1,
		2, -1,
	}
	want := []float32{ // (2, 3)
		3, 3.5, -0.75,
		0, -5, 1.5,
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3} {
		m := encode(t, dt, 3, 2, w)
		y := make([]float32, 6)
		kernels.MatMulRef(y, x, m, 2)
		if !slices.Equal(y, want) {
			t.Errorf("%v: got %v, want %v", dt, y, want)
		}
	}
}

// encode stores w (rows, cols) in dtype dt; F8 gets one block with scale 0.5
// over doubled values.
func encode(t *testing.T, dt kernels.DType, rows, cols int, w []float32) *kernels.Mat {
	m := &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, len(w)*dt.Size())}
	for i, v := range w {
		switch dt {
		case kernels.F32:
			b := math.Float32bits(v)
			m.Data[4*i], m.Data[4*i+1], m.Data[4*i+2], m.Data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
		case kernels.BF16:
			b := kernels.F32ToBF16(v)
			m.Data[2*i], m.Data[2*i+1] = byte(b), byte(b>>8)
		case kernels.F16:
			b := f16(t, v)
			m.Data[2*i], m.Data[2*i+1] = byte(b), byte(b>>8)
		case kernels.F8E4M3:
			m.Data[i] = f8(t, 2*v)
		}
	}
	if dt == kernels.F8E4M3 {
		m.Scale, m.BlockRows, m.BlockCols = []float32{0.5}, 128, 128
	}
	return m
}

// f16 and f8 find the exact encoding of v by search (tests only).
func f16(t *testing.T, v float32) uint16 {
	for b := range 1 << 16 {
		if kernels.F16ToF32(uint16(b)) == v {
			return uint16(b)
		}
	}
	t.Fatalf("%g is not a float16", v)
	return 0
}

func f8(t *testing.T, v float32) uint8 {
	for b := range 256 {
		if kernels.F8E4M3ToF32(uint8(b)) == v {
			return uint8(b)
		}
	}
	t.Fatalf("%g is not an e4m3 value", v)
	return 0
}

func TestCheckMatMulPanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "kernels: MatMul short x" {
			t.Errorf("recovered %v", r)
		}
	}()
	kernels.CheckMatMul(make([]float32, 4), make([]float32, 3), &kernels.Mat{DType: kernels.F32, Rows: 2, Cols: 2, Data: make([]byte, 16)}, 2)
}
