package kernels

import "fmt"

// I32 is a tensor of int32 values: token ids, positions, block tables,
// cache slots, expert ids. Weights never have it.
const I32 DType = 32

// Buffer is a backend's memory behind a Tensor: host memory for the CPU
// backend, a device pointer for a GPU. It is opaque to model code; only the
// backend that allocated it knows its concrete type.
type Buffer interface {
	// Elems is the number of elements the buffer holds.
	Elems() int
}

// Tensor is a row-major 2-D view over backend memory. Model code passes
// tensors to ops and never reads or writes their elements: values cross
// between host and backend only through Memory's Write and Read, at step
// boundaries. A Tensor is a small value; views share the memory.
//
// Row r, column c lives at element Off + r·Stride + c of the buffer.
type Tensor struct {
	DType      DType
	Rows, Cols int
	Stride     int // elements between the starts of consecutive rows (≥ Cols)

	buf Buffer
	off int
}

// NewTensor is for backends: a (rows, cols) view of buf starting at element
// off with the given row stride. It panics when the view leaves the buffer.
func NewTensor(buf Buffer, dt DType, rows, cols, stride, off int) Tensor {
	if rows < 0 || cols < 0 || stride < cols || off < 0 || buf == nil {
		panic("kernels: bad tensor view")
	}
	if rows > 0 && off+(rows-1)*stride+cols > buf.Elems() {
		panic("kernels: tensor view outside its buffer")
	}
	return Tensor{DType: dt, Rows: rows, Cols: cols, Stride: stride, buf: buf, off: off}
}

// Buffer is for backends: the memory behind t and the element offset of
// row 0. A backend type-asserts the Buffer to its own type and must reject
// (panic on) buffers of another backend.
func (t Tensor) Buffer() (Buffer, int) { return t.buf, t.off }

// Valid reports whether t refers to memory (the zero Tensor does not; ops
// take it for an absent optional operand such as a bias).
func (t Tensor) Valid() bool { return t.buf != nil }

// Elems is Rows·Cols.
func (t Tensor) Elems() int { return t.Rows * t.Cols }

// Contiguous reports whether the rows follow each other without gaps.
func (t Tensor) Contiguous() bool { return t.Stride == t.Cols || t.Rows <= 1 }

// Slice is the view of rows [lo, hi).
func (t Tensor) Slice(lo, hi int) Tensor {
	if lo < 0 || hi < lo || hi > t.Rows {
		panic("kernels: tensor row slice out of range")
	}
	u := t
	u.Rows = hi - lo
	u.off += lo * t.Stride
	return u
}

// Reshape views a contiguous tensor as (rows, cols), rows·cols = Elems();
// for example (N, heads·headDim) as (N·heads, headDim) for a per-head norm.
func (t Tensor) Reshape(rows, cols int) Tensor {
	if !t.Contiguous() || rows*cols != t.Elems() || rows < 0 || cols < 0 {
		panic("kernels: reshape of a strided tensor or to another size")
	}
	u := t
	u.Rows, u.Cols, u.Stride = rows, cols, cols
	return u
}

// String describes t's dtype and shape, for error messages.
func (t Tensor) String() string { return fmt.Sprintf("%s(%d, %d)", t.DType, t.Rows, t.Cols) }
