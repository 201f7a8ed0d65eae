package cpu

import (
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// buffer is the CPU's tensor memory: one host allocation, 64-byte aligned
// by the Go allocator for large sizes, viewed as the dtype's elements.
type buffer struct {
	b     []byte // the bytes; nil once Free released them
	elems int

	// A buffer from Alloc has the cleanup that takes its bytes out of
	// Backend.allocated when it is dropped without Free; Scratch views have
	// none.
	alloc   bool
	freed   bool
	cleanup runtime.Cleanup
}

func (b *buffer) Elems() int { return b.elems }

// hugeTensor is the size from which a tensor's memory asks for huge pages
// (hugeBytes): the KV cache's layers, which prefill writes (a fault per 2
// MiB instead of per 4 KiB) and decode attention streams, and the large
// scratch tensors of a prefill. Qwen3-0.6B BF16 on the Zen 5, 512-token
// prompt, 2 threads, interleaved: 589-629 prompt tok/s against 464-548
// with 4 KiB pages (FERRITE_CPU_HUGEPAGES=0).
const hugeTensor = 1 << 20

// hugeTensorsOn turns the huge pages of large tensors on
// (FERRITE_CPU_HUGETENSORS=1); they are off by default. On the Zen 5 the
// Qwen3-30B-A3B (8 layers, Q8_0) batch-1 decode ran 24.6–52.3 tok/s with
// them against 56.9–58.3 without, in three interleaved pairs (2026-12-04
// 00:42): fresh huge pages fault slowly on that VM, and a MoE step's large
// tensors come and go. The resident weight copies (residentCache) keep
// their huge pages: they are made once.
var hugeTensorsOn = os.Getenv("FERRITE_CPU_HUGETENSORS") == "1"

// newBuffer allocates n zeroed elements of dt (backed by float32 words so
// every element type is naturally aligned; from hugeTensor bytes on in
// huge pages when hugeTensorsOn).
func newBuffer(dt kernels.DType, n int) *buffer {
	size := dt.Size()
	if size == 0 {
		panic("cpu: tensors of dtype " + dt.String() + " are not supported")
	}
	if hugeTensorsOn && n*size >= hugeTensor {
		b := hugeBytes((n*size + 3) &^ 3) // 2 MiB-aligned
		return &buffer{b: b[:n*size], elems: n}
	}
	words := make([]float32, (n*size+3)/4)
	return &buffer{b: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*4)[:n*size], elems: n}
}

// prefaulted returns n zeroed bytes of Go memory whose pages are mapped
// already (prefault, on Linux), for memory that is written whole right
// away (the x8 packings): where it comes fresh from the system, one call
// maps it rather than a fault per 4 KiB page as it is written, each a trap
// into the kernel, which on this VM cost more than the packing (Qwen3-0.6B
// Q8_0, two threads: the preparation's system time a median 1.1 s before,
// 0.3 s after; BENCHMARKS.md, session 17).
func prefaulted(n int) []byte {
	b := make([]byte, n)
	prefault(b)
	return b
}

// mem returns t's buffer, panicking when t belongs to another backend.
func mem(t kernels.Tensor) (*buffer, int) {
	b, off := t.Buffer()
	cb, ok := b.(*buffer)
	if !ok {
		panic("cpu: tensor not allocated by the CPU backend")
	}
	if cb.freed {
		panic(kernels.ErrFreed)
	}
	return cb, off
}

// f32 is the float32 view of t's rows; a strided t includes the gaps.
func f32(t kernels.Tensor) []float32 {
	if t.DType != kernels.F32 {
		panic("cpu: op wants an F32 tensor, got " + t.String())
	}
	b, off := mem(t)
	n := span(t)
	all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b.b))), b.elems)
	return all[off : off+n : off+n]
}

// i32 is the int32 view of t's rows.
func i32(t kernels.Tensor) []int32 {
	if t.DType != kernels.I32 {
		panic("cpu: op wants an I32 tensor, got " + t.String())
	}
	b, off := mem(t)
	n := span(t)
	all := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b.b))), b.elems)
	return all[off : off+n : off+n]
}

// raw is the byte view of t's rows, any dtype.
func raw(t kernels.Tensor) []byte {
	b, off := mem(t)
	sz := t.DType.Size()
	return b.b[off*sz : (off+span(t))*sz]
}

// span is the number of elements from t's first to its last element.
func span(t kernels.Tensor) int {
	if t.Rows == 0 {
		return 0
	}
	return (t.Rows-1)*t.Stride + t.Cols
}

// contiguous panics unless t's rows follow each other.
func contiguous(t kernels.Tensor) {
	if !t.Contiguous() {
		panic("cpu: op wants a contiguous tensor")
	}
}

// arena is the per-step scratch: the k-th Scratch call of a step reuses
// the k-th buffer when it is large enough, so a steady stream of steps of
// one shape stops allocating.
type arena struct {
	bufs  []*buffer
	next  int
	bytes atomic.Int64 // the bufs' bytes, for MemoryUse from any goroutine
}

func (a *arena) get(dt kernels.DType, rows, cols int) kernels.Tensor {
	n := rows * cols
	need := (n*dt.Size() + 3) / 4 // float32 words
	if a.next == len(a.bufs) {
		a.bufs = append(a.bufs, nil)
	}
	b := a.bufs[a.next]
	if b == nil || len(b.b)/4 < need {
		if b != nil {
			a.bytes.Add(-int64(len(b.b)))
		}
		b = newBuffer(kernels.F32, max(need, 1))
		a.bufs[a.next] = b
		a.bytes.Add(int64(len(b.b)))
	}
	a.next++
	view := &buffer{b: b.b[:n*dt.Size()], elems: n}
	return kernels.NewTensor(view, dt, rows, cols, cols, 0)
}

// Alloc implements kernels.Memory.
func (b *Backend) Alloc(dt kernels.DType, rows, cols int) (kernels.Tensor, error) {
	buf := newBuffer(dt, rows*cols)
	buf.alloc = true
	b.allocated.Add(int64(len(buf.b)))
	buf.cleanup = runtime.AddCleanup(buf, func(n int64) { b.allocated.Add(-n) }, int64(len(buf.b)))
	return kernels.NewTensor(buf, dt, rows, cols, cols, 0), nil
}

// Free implements kernels.Memory: t's bytes leave the accounting at once
// and go to the garbage collector (with every view of t). It panics for a
// Scratch tensor and with kernels.ErrFreed for a freed one.
func (b *Backend) Free(t kernels.Tensor) {
	cb, _ := mem(t)
	if !cb.alloc {
		panic("cpu: Free of a tensor not from Alloc (Scratch tensors go at BeginStep)")
	}
	cb.cleanup.Stop()
	b.allocated.Add(-int64(len(cb.b)))
	cb.b, cb.freed = nil, true
}

// MemoryUse implements kernels.MemoryReporter: host RAM the backend
// allocated, Alloc's tensors not yet freed (Free, or the garbage collector
// for a tensor dropped without it) and the Scratch arena. Weights are only
// the copies MatMul keeps (x8Cache's repacked weights, residentCache's
// BF16 weights in huge pages) and AttentionMLA's per-head splits of
// kv_b_proj (mlaSplits): otherwise the CPU runs the model's weights
// where they lie, mapped from the file or converted at load.
func (b *Backend) MemoryUse() kernels.MemoryUse {
	return kernels.MemoryUse{Weights: b.x8.bytes.Load() + b.res.bytes.Load() + b.mla.bytes.Load(), Tensors: b.allocated.Load(), Arena: b.arena.bytes.Load()}
}

// Scratch implements kernels.Memory.
func (b *Backend) Scratch(dt kernels.DType, rows, cols int) kernels.Tensor {
	return b.arena.get(dt, rows, cols)
}

// BeginStep implements kernels.Memory: it releases the scratch tensors.
func (b *Backend) BeginStep() { b.arena.next = 0 }

// EndStep implements kernels.Memory (the CPU runs ops synchronously).
func (b *Backend) EndStep() {}

// WriteF32 implements kernels.Memory.
func (b *Backend) WriteF32(t kernels.Tensor, src []float32) {
	if len(src) != t.Elems() {
		panic("cpu: WriteF32 length does not match the tensor")
	}
	d := f32(t)
	for r := range t.Rows {
		copy(d[r*t.Stride:r*t.Stride+t.Cols], src[r*t.Cols:])
	}
}

// WriteI32 implements kernels.Memory.
func (b *Backend) WriteI32(t kernels.Tensor, src []int32) {
	if len(src) != t.Elems() {
		panic("cpu: WriteI32 length does not match the tensor")
	}
	d := i32(t)
	for r := range t.Rows {
		copy(d[r*t.Stride:r*t.Stride+t.Cols], src[r*t.Cols:])
	}
}

// ReadF32 implements kernels.Memory.
func (b *Backend) ReadF32(dst []float32, t kernels.Tensor) {
	if len(dst) != t.Elems() {
		panic("cpu: ReadF32 length does not match the tensor")
	}
	s := f32(t)
	for r := range t.Rows {
		copy(dst[r*t.Cols:(r+1)*t.Cols], s[r*t.Stride:])
	}
}

// ReadI32 implements kernels.SparseOps.
func (b *Backend) ReadI32(dst []int32, t kernels.Tensor) {
	if len(dst) != t.Elems() {
		panic("cpu: ReadI32 length does not match the tensor")
	}
	s := i32(t)
	for r := range t.Rows {
		copy(dst[r*t.Cols:(r+1)*t.Cols], s[r*t.Stride:])
	}
}

// Copy implements kernels.Memory.
func (b *Backend) Copy(dst, src kernels.Tensor) {
	if dst.DType != src.DType || dst.Rows != src.Rows || dst.Cols != src.Cols {
		panic("cpu: Copy between tensors of different dtype or shape")
	}
	d, s := raw(dst), raw(src)
	sz := dst.DType.Size()
	for r := range dst.Rows {
		copy(d[r*dst.Stride*sz:(r*dst.Stride+dst.Cols)*sz], s[r*src.Stride*sz:])
	}
}
