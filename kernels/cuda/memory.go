//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// kernels.Memory on the GPU: tensors are device memory; the host reaches
// them only through WriteF32/WriteI32/ReadF32, which go through the pinned
// staging buffers.

// tensorBuf is the GPU's kernels.Buffer: elems elements at device address
// ptr. A tensor from Alloc owns its Buffer (buf) until Free; a Scratch
// tensor views the step arena (buf nil).
type tensorBuf struct {
	ptr   uint64
	elems int
	buf   *Buffer
	freed bool
}

func (t *tensorBuf) Elems() int { return t.elems }

// dptr is the device address of t's element (0, 0). It panics for a
// tensor of another backend.
func dptr(t kernels.Tensor) uint64 {
	_, off := t.Buffer()
	return tensorBufOf(t).ptr + uint64(off*t.DType.Size())
}

// tensorBufOf is t's buffer. It panics for a tensor of another backend and
// with kernels.ErrFreed for a freed one.
func tensorBufOf(t kernels.Tensor) *tensorBuf {
	b, _ := t.Buffer()
	tb, ok := b.(*tensorBuf)
	if !ok {
		panic("cuda: tensor not allocated by the CUDA backend")
	}
	if tb.freed {
		panic(kernels.ErrFreed)
	}
	return tb
}

// arenaAlign is the alignment of every Scratch tensor, enough for 16-byte
// vector loads and cuBLASLt's operands.
const arenaAlign = 256

// minChunk is the smallest arena chunk allocated.
const minChunk = 16 << 20

// arena is the per-step scratch: a bump allocator over device chunks. A
// step that outgrows the current chunk gets another one; the next
// BeginStep replaces them by one chunk as large as the largest step seen,
// so steps of a steady shape stop allocating.
type arena struct {
	mu     sync.Mutex
	chunks []*Buffer
	off    int64 // next free byte of the last chunk
	used   int64 // bytes handed out in this step
	peak   int64 // the most bytes any step used
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// get returns the device address of size fresh bytes; it allocates on the
// device thread only when the last chunk is full.
func (a *arena) get(d *Device, size int64) (uint64, error) {
	size = alignUp(max(size, 1), arenaAlign)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.used += size
	if n := len(a.chunks); n > 0 && a.off+size <= a.chunks[n-1].size {
		p := a.chunks[n-1].ptr + uint64(a.off)
		a.off += size
		return p, nil
	}
	grow := int64(minChunk)
	if n := len(a.chunks); n > 0 {
		grow = 2 * a.chunks[n-1].size
	}
	var c *Buffer
	err := d.do(func() error {
		var err error
		c, err = d.allocL(alignUp(max(size, grow), 1<<20))
		return err
	})
	if err != nil {
		return 0, err
	}
	a.chunks = append(a.chunks, c)
	a.off = size
	return c.ptr, nil
}

// consolidates reports whether reset will replace the chunks (the last
// step needed more than one).
func (a *arena) consolidates() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.chunks) > 1
}

// reset starts a step. When the last step needed more than one chunk it
// waits for the device, frees them and allocates one chunk of the peak.
func (a *arena) reset(d *Device) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.peak = max(a.peak, a.used)
	a.off, a.used = 0, 0
	if len(a.chunks) <= 1 {
		return nil
	}
	return d.do(func() error {
		if err := d.syncL(); err != nil {
			return err
		}
		for _, c := range a.chunks {
			if err := c.free(); err != nil {
				return err
			}
		}
		a.chunks = a.chunks[:0]
		c, err := d.allocL(alignUp(a.peak, 1<<20))
		if err != nil {
			return err
		}
		a.chunks = append(a.chunks, c)
		return nil
	})
}

// Alloc implements kernels.Memory: zeroed device memory that lives until
// Free or until the Backend is closed.
func (b *Backend) Alloc(dt kernels.DType, rows, cols int) (kernels.Tensor, error) {
	size := dt.Size()
	if size == 0 || rows < 0 || cols < 0 {
		panic("cuda: Alloc of an unsupported dtype or a negative shape")
	}
	n := rows * cols
	bytes := alignUp(int64(max(n*size, 4)), 4)
	var buf *Buffer
	err := b.dev.do(func() error {
		var err error
		if buf, err = b.dev.allocL(bytes); err != nil {
			return err
		}
		return b.dev.profiledL(profKey{kind: profMemset, size: int64(bytes)}, func() error {
			return check("cuMemsetD32Async", call(driver.cuMemsetD32Async, uintptr(buf.ptr), 0, uintptr(bytes/4), b.dev.stream))
		})
	})
	if err != nil {
		return kernels.Tensor{}, err
	}
	b.mem.tensors.Add(bytes)
	return kernels.NewTensor(&tensorBuf{ptr: buf.ptr, elems: n, buf: buf}, dt, rows, cols, cols, 0), nil
}

// Free implements kernels.Memory: once the launches queued so far have
// run, the device thread waits for the stream and frees t's Buffer
// (cuMemFree). After a device failure the Buffer stays until Close, which
// frees every Buffer still allocated; the counters drop at once either way.
func (b *Backend) Free(t kernels.Tensor) {
	b.qmu.Lock()
	inStep := b.inStep
	b.qmu.Unlock()
	if inStep {
		panic("cuda: Free inside a step (the step's launches may still use the tensor)")
	}
	buf := b.mem.release(tensorBufOf(t))
	b.exec(func(d *Device) error {
		if err := d.syncL(); err != nil {
			return err
		}
		return buf.free()
	})
}

// Scratch implements kernels.Memory. When the device cannot provide the
// memory, the failure is kept for Err and the ops of the step do nothing.
func (b *Backend) Scratch(dt kernels.DType, rows, cols int) kernels.Tensor {
	size := dt.Size()
	if size == 0 || rows < 0 || cols < 0 {
		panic("cuda: Scratch of an unsupported dtype or a negative shape")
	}
	n := rows * cols
	p, err := b.arena.get(b.dev, int64(n*size))
	if err != nil {
		b.fail(err)
	}
	return kernels.NewTensor(&tensorBuf{ptr: p, elems: n}, dt, rows, cols, cols, 0)
}

// BeginStep implements kernels.Memory: it releases every Scratch tensor.
// The step's launches then wait for EndStep. What was queued before (the
// step's input uploads, copies) goes first in EndStep's hand-over to the
// device thread, unless the arena is about to free chunks those launches
// may use: then it is launched now.
func (b *Backend) BeginStep() {
	b.splitRows = 0
	if b.stepTime != nil {
		b.stepTime.beginStep()
	}
	b.presplit = presplit{} // a split is used within its step only
	b.dec.pend = decPend{}  // so is a Linear a norm may join (decode.go)
	if b.arena.consolidates() || !lazyWrites {
		b.exec(nil)
	}
	if err := b.arena.reset(b.dev); err != nil {
		b.fail(err)
	}
	b.qmu.Lock()
	b.pre, b.pending = append(b.pre, b.pending...), nil
	b.inStep = true
	b.qmu.Unlock()
}

// stepSpin is how long EndStep's caller polls before it parks: long for a
// decode batch (device.go's stepSpinOn).
func (b *Backend) stepSpin() time.Duration {
	if stepSpinOn && b.splitRows >= stepSpinRows {
		return stepSpinLong
	}
	return spinWait
}

// EndStep implements kernels.Memory: it launches what was queued before
// the step, then the step, through a CUDA graph when the step repeats
// (graph.go), and waits for it.
func (b *Backend) EndStep() {
	b.qmu.Lock()
	ops, pre := b.pending, b.pre
	b.pending, b.pre, b.inStep = nil, nil, false
	b.qmu.Unlock()
	if b.Err() != nil {
		return
	}
	st := b.stepTime
	var n0 kernels.StepGraphs
	if st != nil {
		st.enter, n0 = time.Now(), b.graphs.n
		if st.ops != nil {
			st.charge("(after the last op)", st.enter.Sub(st.lastOp))
		}
	}
	err := b.dev.doSpin(func() error {
		if st != nil {
			st.start = time.Now()
		}
		if err := runOps(b.dev, pre); err != nil {
			return err
		}
		if st != nil {
			st.uploaded = time.Now()
		}
		if err := b.runStepL(ops); err != nil {
			return err
		}
		if st != nil {
			st.launched = time.Now()
		}
		err := b.dev.syncL()
		if st != nil {
			st.synced = time.Now()
			st.harvestL()
		}
		return err
	}, b.stepSpin())
	if err != nil {
		b.fail(err)
	}
	if st != nil {
		kind := stepEager
		switch n := b.graphs.n; {
		case n.Captures > n0.Captures:
			kind = stepCaptured
		case n.Replays > n0.Replays:
			kind = stepReplayed
		}
		st.endStep(kind)
	}
}

// WriteF32 implements kernels.Memory.
func (b *Backend) WriteF32(t kernels.Tensor, src []float32) {
	if t.DType != kernels.F32 || len(src) != t.Elems() {
		panic("cuda: WriteF32 wants an F32 tensor of len(src) elements")
	}
	b.write(t, f32Bytes(src))
}

// WriteI32 implements kernels.Memory.
func (b *Backend) WriteI32(t kernels.Tensor, src []int32) {
	if t.DType != kernels.I32 || len(src) != t.Elems() {
		panic("cuda: WriteI32 wants an I32 tensor of len(src) elements")
	}
	var raw []byte
	if len(src) > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src))
	}
	b.write(t, raw)
}

// lazyWrites queues small writes with the launches (FERRITE_CUDA_LAZY_WRITES=0
// makes every write copy at once, as before, for comparison).
var lazyWrites = os.Getenv("FERRITE_CUDA_LAZY_WRITES") != "0"

// lazyWriteMax is the largest write queued rather than copied at once: a
// step's inputs (ids, positions, slots, block tables, hidden rows).
const lazyWriteMax = 1 << 20

// write copies src, t's rows one after another, into t. Outside a step, a
// small write to a contiguous tensor is queued with the launches (a copy of
// src, put on the stream without waiting when the queue runs), so a step's
// input uploads and its launches reach the device thread in one hand-over;
// anything that reads or waits runs the queue first.
func (b *Backend) write(t kernels.Tensor, src []byte) {
	p, esz := dptr(t), int64(t.DType.Size())
	b.qmu.Lock()
	lazy := lazyWrites && !b.inStep && len(src) <= lazyWriteMax && t.Contiguous()
	b.qmu.Unlock()
	if lazy {
		buf := slices.Clone(src)
		b.queue(func(d *Device) error { return d.uploadAsyncL(p, buf) })
		return
	}
	b.exec(func(d *Device) error {
		if t.Contiguous() {
			return d.uploadL(p, src)
		}
		row := int64(t.Cols) * esz
		for r := range int64(t.Rows) {
			if err := d.uploadL(p+uint64(r*int64(t.Stride)*esz), src[r*row:(r+1)*row]); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReadF32 implements kernels.Memory: it waits for queued work, then copies.
// After a device failure dst is filled with NaN.
func (b *Backend) ReadF32(dst []float32, t kernels.Tensor) {
	if t.DType != kernels.F32 || len(dst) != t.Elems() {
		panic("cuda: ReadF32 wants an F32 tensor of len(dst) elements")
	}
	if !b.read(f32Bytes(dst), t) {
		fillNaN(dst)
	}
}

// read copies t's rows, one after another, into raw once the queued work
// has run, and reports whether it could.
func (b *Backend) read(raw []byte, t kernels.Tensor) bool {
	p, esz := dptr(t), int64(t.DType.Size())
	return b.exec(func(d *Device) error {
		if t.Contiguous() {
			return d.downloadL(raw, p)
		}
		row := int64(t.Cols) * esz
		for r := range int64(t.Rows) {
			if err := d.downloadL(raw[r*row:(r+1)*row], p+uint64(r*int64(t.Stride)*esz)); err != nil {
				return err
			}
		}
		return nil
	})
}

var _ kernels.BatchReader = (*Backend)(nil)

// ReadF32s implements kernels.BatchReader: the copies wait for queued work
// once, in one hand-over to the device thread. After a device failure
// every dst is filled with NaN.
func (b *Backend) ReadF32s(dst [][]float32, ts []kernels.Tensor) {
	if len(dst) != len(ts) {
		panic("cuda: ReadF32s wants one destination per tensor")
	}
	if len(ts) == 0 {
		return
	}
	raw, src := make([][]byte, len(ts)), make([]uint64, len(ts))
	for i, t := range ts {
		if t.DType != kernels.F32 || len(dst[i]) != t.Elems() {
			panic("cuda: ReadF32s wants F32 tensors of len(dst[i]) elements")
		}
		if !t.Contiguous() {
			for i, t := range ts {
				b.ReadF32(dst[i], t)
			}
			return
		}
		raw[i], src[i] = f32Bytes(dst[i]), dptr(t)
	}
	if !b.exec(func(d *Device) error { return d.downloadsL(raw, src) }) {
		for _, v := range dst {
			fillNaN(v)
		}
	}
}

// Copy implements kernels.Memory.
func (b *Backend) Copy(dst, src kernels.Tensor) {
	if dst.DType != src.DType || dst.Rows != src.Rows || dst.Cols != src.Cols {
		panic("cuda: Copy between tensors of different dtype or shape")
	}
	esz := int64(dst.DType.Size())
	dp, sp := dptr(dst), dptr(src)
	if dp == sp || dst.Rows == 0 || dst.Cols == 0 {
		return
	}
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_copy_rows", d.elementwiseGrid(max(int64(dst.Rows)*int64(dst.Cols)*esz/16, 1)), 256, 0,
			dp, uint64(int64(dst.Stride)*esz), sp, uint64(int64(src.Stride)*esz), i32(dst.Rows), i32(int(int64(dst.Cols)*esz)))
	})
}
