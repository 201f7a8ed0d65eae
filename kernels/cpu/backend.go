package cpu

import (
	"runtime"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Backend is the CPU implementation of kernels.Backend: a persistent worker
// pool plus AVX-512 or AVX2/FMA matmul tiles (pure Go without them). Like every
// backend it is meant for one engine goroutine at a time; a Parallel or
// MatMul issued while another is in flight (for example from inside a
// Parallel callback) runs single-threaded on its caller instead of
// deadlocking.
type Backend struct {
	pool  *pool
	arena arena     // per-step scratch tensors
	tmp   []float32 // scratch inside one op (Linear's accumulate)
	moe   moeScratch
	hyper hyperScratch
	lin   linScratch           // the delta rule's normalised q/k and gates
	rope  map[ropeKey]*ropeTab // cos/sin tables per Rotary
	mla   mlaSplits            // kv_b_proj split per head, per weight (absorbed MLA)
	heads sideBySide           // the absorbed MLA's per-head products (headMatMuls)
	x8    x8Cache              // Q4_0 and Q8_0 weights repacked for the x8 kernels, per weight
	res   residentCache        // BF16 weights copied into huge pages, per weight
	// experts is set while Experts runs: its MatMuls are routed experts'
	// (x8Persistent keeps no Q8_0 expert packed).
	experts bool

	mlaTile int // keys the naive MLA form expands at a time; 0 picks one (tests set it)

	allocated atomic.Int64 // bytes of the live tensors Alloc returned (MemoryUse)
	bf16x     bool         // BF16 weights may take x rounded to bfloat16
	rowExact  bool         // SetRowExact: MatMul runs row by row

	// bf16xSet is SetBF16Activations' value, which PrepareWeights reads on
	// its own goroutine (an op may switch bf16x off for a while).
	bf16xSet atomic.Bool
}

// SetRowExact implements kernels.RowExact: while on, MatMul (under every
// op that multiplies by a matrix: the linear ops, experts, MLA, mHC,
// attention) runs one row of x at a time, so a row gets the bits a
// one-row call gives it (the tiled kernels of several rows sum in
// another order). Call it outside a step.
func (b *Backend) SetRowExact(on bool) { b.rowExact = on }

var _ kernels.Device = (*Backend)(nil)

// New returns a CPU backend running on threads workers, the calling
// goroutine included; threads ≤ 0 means runtime.NumCPU(). The helper
// goroutines live until Close, or until the Backend is garbage collected.
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	b := &Backend{pool: newPool(threads)}
	runtime.AddCleanup(b, func(p *pool) { p.close() }, b.pool)
	return b
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Threads returns the number of workers, the caller included.
func (b *Backend) Threads() int { return b.pool.workers }

// Close stops the helper goroutines and lets go of the forms MatMul keeps
// per weight (the resident copies and x8 packings, MLA's per-head splits:
// as much memory again as the model's weights, which would otherwise stay
// for as long as anything holds the backend). The backend keeps working
// after Close, single-threaded, making such forms again where it needs
// them. Close waits for an in-flight call and is idempotent; call it after
// PrepareWeights has returned.
func (b *Backend) Close() {
	b.pool.close()
	b.x8.drop()
	b.res.drop()
	b.mla.drop()
}

// Parallel calls fn on min(n, Threads()) contiguous, non-empty sub-ranges
// that together cover [0, n) exactly once, concurrently, and returns when
// all calls have returned. The first sub-range runs on the calling
// goroutine. A panic in fn is re-raised on the calling goroutine after the
// other calls have returned.
func (b *Backend) Parallel(n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	nw := min(n, b.pool.workers)
	if nw == 1 || !b.pool.acquire() {
		fn(0, n)
		return
	}
	defer b.pool.release()
	j := &b.pool.job
	j.fn, j.n, j.nw, j.mm = fn, n, nw, nil
	b.pool.run(nw)
}

// minConvertSplit is the fewest x elements whose conversion (int8 or
// bfloat16) is spread over the workers (a wake-up costs about as much as
// quantizing 16k elements).
const minConvertSplit = 1 << 16

// convertX converts the x rows of m for its tiles (a quantized weight, or
// the bf16 path) over the pool's workers when there are enough of them.
// The caller holds the pool.
func (b *Backend) convertX(m *matmul) {
	p := b.pool
	units := m.convertUnits()
	nw := min(units, p.workers)
	if nw == 1 || m.n*m.w.Cols < minConvertSplit {
		m.convertX(0, units)
		return
	}
	j := &p.job
	j.fn, j.n, j.nw, j.mm = p.convertFn, units, nw, nil
	p.run(nw)
}

// matMulInline is MatMul on the calling goroutine alone, with the caller's
// buffers for the converted x and the tasks' scratch: what a MatMul issued
// inside a Parallel callback runs.
func (b *Backend) matMulInline(y, x []float32, w *kernels.Mat, n int, xs *xbufs, scratch *[]float32) {
	b.matMulInlineTo(y, w.Rows, x, w, n, xs, scratch)
}

// matMulInlineTo is matMulInline with y's rows ldy apart.
func (b *Backend) matMulInlineTo(y []float32, ldy int, x []float32, w *kernels.Mat, n int, xs *xbufs, scratch *[]float32) {
	var m matmul
	m.init(y, x, w, n, 1, xs, b.bf16x, b.x8Packed(w))
	m.ldy = ldy
	m.useResident(b.resident(w, n))
	m.convertX(0, m.convertUnits())
	for t := range m.tasks {
		m.task(t, scratch)
	}
}

// resident returns the resident copy of w (residentCache) for a MatMul of
// n rows, made on first use over the workers (call it without holding the
// pool), or nil.
func (b *Backend) resident(w *kernels.Mat, n int) []byte {
	return b.res.data(w, bf16Path(w, n, b.bf16x), b.experts, b.Parallel)
}

// useResident points m's tasks at d, the resident copy of its weight, if
// not nil.
func (m *matmul) useResident(d []byte) {
	if d == nil || m.bt == nil {
		return
	}
	m.wd = d
	if m.bt.gemvHuge != nil {
		m.gemv = m.bt.gemvHuge
	}
}

// x8Packed returns w kept packed for the x8 kernels (x8Cache.packed),
// packing it over the workers on first use, or nil.
func (b *Backend) x8Packed(w *kernels.Mat) []byte {
	return b.x8.packed(w, b.Parallel, b.experts)
}

// SetBF16Activations lets MatMul round x to bfloat16 (off by default), where
// the CPU has the units that make it faster: BF16 weights then run one to
// three x rows on VDPBF16PS tiles and eight or more on AMX (every row count
// on VDPBF16PS where there is no AMX), quantized weights 128 or more x rows
// on AMX (dequantized to bfloat16). Results then
// differ from the float32 product by up to 2⁻⁸·Σ|x·w| (see bf16.go): the
// precision of a model that keeps its KV cache in bfloat16 anyway. Call it
// between MatMuls only.
func (b *Backend) SetBF16Activations(on bool) {
	b.bf16x = on
	b.bf16xSet.Store(on)
}

// RoundsXToBF16 reports whether MatMul(y, x, w, n) multiplies x rounded to
// bfloat16 instead of x (the VDPBF16PS and AMX paths; see bf16.go, amx.go):
// kerneltest takes its reference from the rounded x then.
func (b *Backend) RoundsXToBF16(w *kernels.Mat, n int) bool {
	return bf16Path(w, n, b.bf16x) != pathF32
}

// MatMul sets y (n, w.Rows) = x (n, w.Cols) · wᵀ, converting w from its
// stored dtype inside the kernel. It panics (see kernels.CheckMatMul) on
// malformed arguments. The work is split into tasks of output rows and, when
// n > 64, of x rows; the workers take tasks off a shared counter.
func (b *Backend) MatMul(y, x []float32, w *kernels.Mat, n int) {
	kernels.CheckMatMul(y, x, w, n)
	b.matMulTo(y, w.Rows, x, w, n)
}

// matMulTo is MatMul (its arguments checked) with y's rows ldy ≥ w.Rows
// apart: y (n, ldy) gets x·wᵀ in its first w.Rows columns, the others
// untouched (LinearCat writes each weight's columns of its output so).
func (b *Backend) matMulTo(y []float32, ldy int, x []float32, w *kernels.Mat, n int) {
	if n == 0 || w.Rows == 0 {
		return
	}
	y = y[:(n-1)*ldy+w.Rows]
	if b.rowExact && n > 1 {
		for i := range n {
			b.matMulTo(y[i*ldy:i*ldy+w.Rows], w.Rows, x[i*w.Cols:(i+1)*w.Cols], w, 1)
		}
		return
	}
	pk, res := b.x8Packed(w), b.resident(w, n)
	p := b.pool
	if !p.acquire() {
		var scratch []float32
		b.matMulInlineTo(y, ldy, x, w, n, new(xbufs), &scratch)
		return
	}
	defer p.release()
	m := &p.mm[0]
	m.init(y, x, w, n, p.workers, &p.xs, b.bf16x, pk)
	m.ldy = ldy
	defer func() { m.y, m.x, m.w, m.wd = nil, nil, nil, nil }()
	m.useResident(res)
	if m.convertUnits() > 0 {
		b.convertX(m)
	}
	nw := min(m.tasks, p.workers)
	if nw == 1 {
		for t := range m.tasks {
			m.task(t, &p.scratch[0])
		}
		return
	}
	j := &p.job
	j.fn, j.mm = nil, p.mm[:1]
	j.next.Store(0)
	p.run(nw)
}

// maxFused is the most weights matMulsTo runs as one parallel call.
const maxFused = 3

// mmOut is where one weight's product goes: y (n, ldy), its first w.Rows
// columns.
type mmOut struct {
	y   []float32
	ldy int
}

// matMulsTo is matMulTo for each weight of ws over the same x (n rows),
// into outs[i]. BF16 weights of one width on the VDPBF16PS path run as one
// parallel call (x rounded once, the tasks of every weight taken off one
// counter: a decode step's q, k and v, or gate and up, with one hand-off
// to the helpers instead of three or two); a task's results are those of
// the same rows in a call of their own. Other weights go one by one.
func (b *Backend) matMulsTo(outs []mmOut, x []float32, ws []*kernels.Mat, n int) {
	if !b.fusable(ws, n) {
		for i, w := range ws {
			b.matMulTo(outs[i].y, outs[i].ldy, x, w, n)
		}
		return
	}
	var res [maxFused][]byte
	for i, w := range ws {
		res[i] = b.resident(w, n)
	}
	p := b.pool
	if !p.acquire() {
		for i, w := range ws {
			b.matMulTo(outs[i].y, outs[i].ldy, x, w, n) // inline
		}
		return
	}
	defer p.release()
	tasks := 0
	for i, w := range ws {
		m := &p.mm[i]
		m.init(outs[i].y[:(n-1)*outs[i].ldy+w.Rows], x, w, n, p.workers, &p.xs, b.bf16x, nil)
		m.ldy = outs[i].ldy
		m.useResident(res[i])
		tasks += m.tasks
	}
	defer func() {
		for i := range ws {
			m := &p.mm[i]
			m.y, m.x, m.w, m.wd = nil, nil, nil, nil
		}
	}()
	b.convertX(&p.mm[0]) // one x for all: the same rows and width
	j := &p.job
	j.fn, j.mm = nil, p.mm[:len(ws)]
	j.next.Store(0)
	if nw := min(tasks, p.workers); nw > 1 {
		p.run(nw)
		return
	}
	j.do(0, &p.scratch[0])
	j.mm = nil
}

// fusable reports whether matMulsTo runs ws as one call: two to maxFused
// BF16 weights of one width, all on the VDPBF16PS path for n rows.
func (b *Backend) fusable(ws []*kernels.Mat, n int) bool {
	if len(ws) < 2 || len(ws) > maxFused || n == 0 || b.rowExact && n > 1 {
		return false
	}
	for _, w := range ws {
		if w.DType != kernels.BF16 || w.Cols != ws[0].Cols || w.Rows == 0 || bf16Path(w, n, b.bf16x) != pathBF16 {
			return false
		}
	}
	return true
}
