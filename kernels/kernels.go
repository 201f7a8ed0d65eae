// Package kernels holds ferrite's compute backends: the small Backend
// interface the engine calls for its heavy operations, the weight matrix type
// that keeps weights in their stored dtype, and the generic reference loops
// every fast path is checked against.
//
// The CPU backend (package kernels/cpu) is the golden reference; a CUDA
// backend is checked against it. Every backend runs the shared conformance
// suite in package kernels/kerneltest.
package kernels

// DType is the storage type of a weight matrix.
type DType uint8

const (
	F32    DType = iota // IEEE float32, little-endian
	BF16                // bfloat16, little-endian
	F16                 // IEEE float16, little-endian
	F8E4M3              // float8 e4m3fn with per-block float32 scales
)

// String returns the safetensors spelling of the dtype.
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case F8E4M3:
		return "F8_E4M3"
	}
	return "unknown"
}

// Size is the number of bytes one element takes.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case BF16, F16:
		return 2
	case F8E4M3:
		return 1
	}
	return 0
}

// Mat is a row-major 2-D weight matrix kept in its stored dtype, usually a
// view into a memory-mapped safetensors file. A linear layer's weight is
// stored (out, in), PyTorch's layout, so Rows is the output width.
type Mat struct {
	DType      DType
	Rows, Cols int
	Data       []byte // (Rows, Cols) elements of DType, little-endian

	// F8E4M3 only: Scale holds (ceil(Rows/BlockRows), ceil(Cols/BlockCols))
	// float32 multipliers (a checkpoint's weight_scale_inv).
	Scale                []float32
	BlockRows, BlockCols int
}
