// Package strict is a test backend that proves a model runs on the op set
// alone. It computes every op with the golden references (kernels/ref) and
// is strict about everything else:
//
//   - tensor data lives in buffers only this package can read; a tensor of
//     another backend, a wrong dtype or shape, or a strided operand where an
//     op wants a contiguous one panics;
//   - Scratch tensors start poisoned (a NaN with a private payload, or an
//     out-of-range I32), and an op that reads a poisoned element panics, so
//     a model that reads scratch it never wrote fails at the op at fault;
//   - Write and Read, the only host ↔ backend copies, panic between
//     BeginStep and EndStep: no host access to activations inside a step;
//   - it is a kernels.RandomGenerator: random weights come without their
//     bytes, which only the op that reads them materializes, so host code
//     that reads a weight (rather than passing it to an op) fails;
//   - Free marks a tensor's storage freed: any later use of it or of a view
//     of it, and a second Free, panic with kernels.ErrFreed, and Free of a
//     Scratch tensor or inside a step panics too.
//
// MatMul is kernels.MatMulRef (float64 sums) and Parallel runs serially, so
// the host-slice Backend methods work too, for the load-time work that
// uses them (quantizing weights).
package strict

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Poison values of fresh Scratch elements.
var (
	poisonF32  = math.Float32frombits(0x7fa0dead)
	poisonBF16 = uint16(0x7fad)
)

const poisonI32 = math.MinInt32 + 0x5a5a

// buffer is strict's tensor memory.
type buffer struct {
	dev   *Device
	f32   []float32
	i32   []int32
	bf16  []uint16
	alloc bool // from Alloc, not Scratch
	freed bool // released by Free
}

func (b *buffer) Elems() int { return max(len(b.f32), len(b.i32), len(b.bf16)) }

// Device is the strict backend. It is not safe for concurrent use, except
// Alloc and MemoryUse (tests build caches on one model's device from
// several goroutines).
type Device struct {
	inStep bool
	steps  int // completed steps

	allocated atomic.Int64 // bytes of the tensors Alloc returned and Free did not release
	scratch   atomic.Int64 // bytes of the Scratch tensors of the current (or last) step (MemoryUse may read it from another goroutine)
}

var _ kernels.Device = (*Device)(nil)

// New returns a strict device.
func New() *Device { return &Device{} }

// Name returns "strict".
func (d *Device) Name() string { return "strict" }

// Steps is the number of BeginStep/EndStep pairs completed, so a test can
// tell that a model went through the op set.
func (d *Device) Steps() int { return d.steps }

var _ kernels.RandomGenerator = (*Device)(nil)

// GeneratesRandom implements kernels.RandomGenerator, as a GPU does: random
// weights reach the backend without Data (randweights' Deferred) and get
// it at the op that reads them, so a model that reads a weight's bytes on
// the host, outside the backend, fails there.
func (d *Device) GeneratesRandom() bool { return true }

// MatMul implements kernels.Backend with the float64 reference.
func (d *Device) MatMul(y, x []float32, w *kernels.Mat, n int) {
	w.Materialize()
	kernels.CheckMatMul(y, x, w, n)
	kernels.MatMulRef(y, x, w, n)
}

// Parallel implements kernels.Backend serially.
func (d *Device) Parallel(n int, fn func(lo, hi int)) {
	if n > 0 {
		fn(0, n)
	}
}

func (d *Device) alloc(dt kernels.DType, rows, cols int) (kernels.Tensor, *buffer) {
	if rows < 0 || cols < 0 {
		panic("strict: negative tensor shape")
	}
	n := rows * cols
	b := &buffer{dev: d}
	switch dt {
	case kernels.F32:
		b.f32 = make([]float32, n)
	case kernels.I32:
		b.i32 = make([]int32, n)
	case kernels.BF16:
		b.bf16 = make([]uint16, n)
	default:
		panic("strict: unsupported tensor dtype " + dt.String())
	}
	return kernels.NewTensor(b, dt, rows, cols, cols, 0), b
}

// Alloc implements kernels.Memory.
func (d *Device) Alloc(dt kernels.DType, rows, cols int) (kernels.Tensor, error) {
	t, b := d.alloc(dt, rows, cols)
	b.alloc = true
	d.allocated.Add(int64(rows * cols * dt.Size()))
	return t, nil
}

// Free implements kernels.Memory.
func (d *Device) Free(t kernels.Tensor) {
	if d.inStep {
		panic("strict: Free inside a step")
	}
	b := d.buffer(t)
	if !b.alloc {
		panic(fmt.Sprintf("strict: Free of %v, a Scratch tensor", t))
	}
	d.allocated.Add(-int64(b.Elems() * t.DType.Size()))
	b.f32, b.i32, b.bf16, b.freed = nil, nil, nil, true
}

// MemoryUse implements kernels.MemoryReporter: host bytes of the tensors
// Alloc returned and Free did not release (dropped ones included), and as
// the arena the Scratch bytes of the current or last step (strict
// allocates every Scratch tensor afresh).
func (d *Device) MemoryUse() kernels.MemoryUse {
	return kernels.MemoryUse{Tensors: d.allocated.Load(), Arena: d.scratch.Load()}
}

// Scratch implements kernels.Memory: a fresh, poisoned tensor.
func (d *Device) Scratch(dt kernels.DType, rows, cols int) kernels.Tensor {
	if !d.inStep {
		panic("strict: Scratch outside a step")
	}
	t, b := d.alloc(dt, rows, cols)
	d.scratch.Add(int64(rows * cols * dt.Size()))
	for i := range b.f32 {
		b.f32[i] = poisonF32
	}
	for i := range b.i32 {
		b.i32[i] = poisonI32
	}
	for i := range b.bf16 {
		b.bf16[i] = poisonBF16
	}
	return t
}

// BeginStep implements kernels.Memory.
func (d *Device) BeginStep() {
	if d.inStep {
		panic("strict: BeginStep inside a step")
	}
	d.inStep = true
	d.scratch.Store(0)
}

// EndStep implements kernels.Memory.
func (d *Device) EndStep() {
	if !d.inStep {
		panic("strict: EndStep outside a step")
	}
	d.inStep = false
	d.steps++
}

// host panics inside a step: host copies happen only at step boundaries.
func (d *Device) host(op string) {
	if d.inStep {
		panic("strict: " + op + " inside a step (host access to backend data)")
	}
}

// WriteF32 implements kernels.Memory.
func (d *Device) WriteF32(t kernels.Tensor, src []float32) {
	d.host("WriteF32")
	if len(src) != t.Elems() {
		panic("strict: WriteF32 length does not match the tensor")
	}
	copyRows(d.view(t, kernels.F32).f32, t.Stride, src, t.Cols, t.Rows, t.Cols)
}

// WriteI32 implements kernels.Memory.
func (d *Device) WriteI32(t kernels.Tensor, src []int32) {
	d.host("WriteI32")
	if len(src) != t.Elems() {
		panic("strict: WriteI32 length does not match the tensor")
	}
	copyRows(d.view(t, kernels.I32).i32, t.Stride, src, t.Cols, t.Rows, t.Cols)
}

// ReadF32 implements kernels.Memory; reading a poisoned element panics.
func (d *Device) ReadF32(dst []float32, t kernels.Tensor) {
	d.host("ReadF32")
	if len(dst) != t.Elems() {
		panic("strict: ReadF32 length does not match the tensor")
	}
	copy(dst, d.in("ReadF32", t, kernels.F32))
}

// Copy implements kernels.Memory.
func (d *Device) Copy(dst, src kernels.Tensor) {
	if dst.DType != src.DType || dst.Rows != src.Rows || dst.Cols != src.Cols {
		panic("strict: Copy between tensors of different dtype or shape")
	}
	s, t := d.view(src, src.DType), d.view(dst, dst.DType)
	switch src.DType {
	case kernels.F32:
		copyRows(t.f32, dst.Stride, s.f32, src.Stride, src.Rows, src.Cols)
	case kernels.I32:
		copyRows(t.i32, dst.Stride, s.i32, src.Stride, src.Rows, src.Cols)
	case kernels.BF16:
		copyRows(t.bf16, dst.Stride, s.bf16, src.Stride, src.Rows, src.Cols)
	}
}

// copyRows copies rows rows of cols elements from src, whose rows start
// sstride elements apart, to dst, whose rows start dstride apart.
func copyRows[T any](dst []T, dstride int, src []T, sstride, rows, cols int) {
	for r := range rows {
		copy(dst[r*dstride:r*dstride+cols], src[r*sstride:r*sstride+cols])
	}
}

// view is t's memory from its first element, checked to be strict's and of
// dtype dt; the slices are cut to t's span.
func (d *Device) view(t kernels.Tensor, dt kernels.DType) *buffer {
	b := d.buffer(t)
	_, off := t.Buffer()
	if t.DType != dt {
		panic(fmt.Sprintf("strict: tensor %v, want dtype %v", t, dt))
	}
	n := 0
	if t.Rows > 0 {
		n = (t.Rows-1)*t.Stride + t.Cols
	}
	v := &buffer{dev: d}
	switch dt {
	case kernels.F32:
		v.f32 = b.f32[off : off+n]
	case kernels.I32:
		v.i32 = b.i32[off : off+n]
	case kernels.BF16:
		v.bf16 = b.bf16[off : off+n]
	}
	return v
}

// buffer is t's memory, checked to be strict's and not freed.
func (d *Device) buffer(t kernels.Tensor) *buffer {
	raw, _ := t.Buffer()
	b, ok := raw.(*buffer)
	if !ok || b.dev != d {
		panic(fmt.Sprintf("strict: tensor %v not allocated by this device", t))
	}
	if b.freed {
		panic(fmt.Errorf("%w (%v)", kernels.ErrFreed, t))
	}
	return b
}

// in returns a copy of input t (dtype F32) packed row after row, panicking
// when an element is poisoned.
func (d *Device) in(op string, t kernels.Tensor, dt kernels.DType) []float32 {
	v := d.view(t, dt)
	out := make([]float32, 0, t.Elems())
	for r := range t.Rows {
		for _, x := range v.f32[r*t.Stride : r*t.Stride+t.Cols] {
			if math.Float32bits(x) == math.Float32bits(poisonF32) {
				panic(fmt.Sprintf("strict: %s reads an element of %v never written", op, t))
			}
			out = append(out, x)
		}
	}
	return out
}

// ints returns a copy of I32 input t, panicking on poison.
func (d *Device) ints(op string, t kernels.Tensor) []int32 {
	v := d.view(t, kernels.I32)
	out := make([]int32, 0, t.Elems())
	for r := range t.Rows {
		for _, x := range v.i32[r*t.Stride : r*t.Stride+t.Cols] {
			if x == poisonI32 {
				panic(fmt.Sprintf("strict: %s reads an element of %v never written", op, t))
			}
			out = append(out, x)
		}
	}
	return out
}

// out writes packed values into F32 output t.
func (d *Device) out(t kernels.Tensor, vals []float32) {
	v := d.view(t, kernels.F32)
	for r := range t.Rows {
		copy(v.f32[r*t.Stride:r*t.Stride+t.Cols], vals[r*t.Cols:(r+1)*t.Cols])
	}
}

// shape panics unless t is (rows, cols); a negative value matches any.
func shape(op string, t kernels.Tensor, rows, cols int) {
	if (rows >= 0 && t.Rows != rows) || (cols >= 0 && t.Cols != cols) {
		panic(fmt.Sprintf("strict: %s: operand %v, want (%d, %d)", op, t, rows, cols))
	}
}

// contiguous panics unless t's rows are packed.
func contiguous(op string, ts ...kernels.Tensor) {
	for _, t := range ts {
		if !t.Contiguous() {
			panic(fmt.Sprintf("strict: %s: operand %v is strided", op, t))
		}
	}
}

// weight panics on an empty or malformed weight. A random weight without
// Data gets it here, at the op that reads it (GeneratesRandom).
func weight(op string, w *kernels.Mat) {
	w.Materialize()
	if w == nil || w.Rows <= 0 || w.Cols <= 0 || len(w.Data) < w.DType.RowBytes(w.Cols)*w.Rows {
		panic("strict: " + op + ": missing or short weight")
	}
}
