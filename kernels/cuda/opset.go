//go:build linux && (amd64 || arm64)

package cuda

import (
	"encoding/binary"
	"math"
	"os"
	"strconv"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The op set (kernels/ops.go) on the GPU, the kernels of src/ops.cu and
// src/gemv.cu. Every op checks its shapes on the host (a mismatch is a
// programmer error and panics, as on the CPU), then queues a closure of its
// launches (queue); nothing waits for the GPU until EndStep or a read. A
// device failure is kept for Err and turns the later ops into no-ops.

var _ kernels.Device = (*Backend)(nil)

// Linear on a bf16 weight runs cuBLASLt from 2 rows (the GEMV reads the
// weight once per 8 rows, and its float32 x costs more cache traffic than
// the weight as the rows grow). Below gemmRoundRows rows, where the GEMM
// reads the weight once whatever its height, x is split into two bf16
// terms (hi + lo, 16 bits of mantissa) stacked as 2·rows inputs: about
// float32 accuracy at no extra weight traffic. From gemmRoundRows rows
// (prefill, compute-bound) x is rounded to bf16 once.
const gemmRoundRows = 256

// flushAt is how many launches queued outside a step go to the device
// thread at a time: one hand-over to the locked thread per batch rather
// than per op.
const flushAt = 32

// queue adds f, which queues work on the stream, to the launches waiting
// for the device thread. Inside a step they wait for EndStep, which runs
// the step as a whole (graph.go); outside one they go in batches. Anything
// that reads, writes or waits (exec) issues the waiting launches first.
func (b *Backend) queue(f func(d *Device) error) {
	b.presplit = presplit{} // whatever was split may change now (linearSplitSwiGLU)
	b.halves = halvesPend{} // a norm joins only the product just before it (normSplit)
	b.dec.pend = decPend{}  // a norm joins only the op just before it (decFuseNorm)
	b.qmu.Lock()
	b.pending = append(b.pending, f)
	full := !b.inStep && len(b.pending) >= flushAt
	timed := b.inStep && b.stepTime != nil && b.stepTime.ops != nil
	b.qmu.Unlock()
	if timed {
		b.stepTime.queued()
	}
	if full {
		b.exec(nil)
	}
}

// exec runs the queued launches and then f (when not nil) on the device
// thread, unless the backend already failed, and keeps the first error for
// Err. It reports whether everything ran and succeeded.
func (b *Backend) exec(f func(d *Device) error) bool {
	b.qmu.Lock()
	pending := b.pending
	if len(b.pre) > 0 { // inside a step (not expected): what came before it goes first
		pending = append(b.pre, pending...)
		b.pre = nil
	}
	b.pending = nil
	b.qmu.Unlock()
	if b.Err() != nil {
		return false
	}
	if len(pending) == 0 && f == nil {
		return true
	}
	err := b.dev.do(func() error {
		if err := runOps(b.dev, pending); err != nil || f == nil {
			return err
		}
		return f(b.dev)
	})
	if err != nil {
		b.fail(err)
		return false
	}
	return true
}

// fillNaN sets every value of v to NaN (a read after a device failure).
func fillNaN(v []float32) {
	nan := float32(math.NaN())
	for i := range v {
		v[i] = nan
	}
}

// f32Contig panics unless every tensor is F32 and contiguous.
func f32Contig(op string, ts ...kernels.Tensor) {
	for _, t := range ts {
		if t.DType != kernels.F32 || !t.Contiguous() {
			panic("cuda: " + op + " wants contiguous F32 tensors, got " + t.String())
		}
	}
}

// index panics unless t is an I32 column (rows, 1) or, with cols > 1, a
// contiguous (rows, cols) I32 tensor.
func index(op string, t kernels.Tensor, rows, cols int) {
	if t.DType != kernels.I32 || t.Rows != rows || t.Cols != cols || (cols > 1 && !t.Contiguous()) {
		panic("cuda: " + op + " index tensor " + t.String() + " does not match")
	}
}

// biasPtr is the device address of an optional (1, width) F32 bias, 0 for
// the zero Tensor; it panics on a malformed one.
func biasPtr(op string, bias kernels.Tensor, width int) uint64 {
	if !bias.Valid() {
		return 0
	}
	f32Contig(op+" bias", bias)
	if bias.Elems() != width {
		panic("cuda: " + op + " bias width")
	}
	return dptr(bias)
}

// useGemm reports whether cuBLASLt is available, trying it once.
func (b *Backend) useGemm() bool {
	b.gemmOnce.Do(func() { b.gemmErr = b.dev.HasGemm() })
	return b.gemmErr == nil
}

// Linear implements kernels.LinearOps.
func (b *Backend) Linear(dst, x kernels.Tensor, w *kernels.Mat, e kernels.Epilogue) {
	f32Contig("Linear", dst, x)
	if x.Cols != w.Cols || dst.Cols != w.Rows || dst.Rows != x.Rows || w.Cols == 0 {
		panic("cuda: Linear shapes do not match the weight")
	}
	bias := biasPtr("Linear", e.Bias, w.Rows)
	n := x.Rows
	if n == 0 || w.Rows == 0 {
		return
	}
	dw, err := b.linWeight(w)
	if err != nil {
		b.fail(err)
		return
	}
	if b.decLinear(dptr(dst), dptr(x), dw, n, bias, e.Accumulate) { // the next op may norm dst in it (decode.go)
		return
	}
	b.linearW(dptr(dst), dptr(x), bias, dw, n, e.Accumulate)
}

// SetRowExact implements kernels.RowExact: while on, Linear, LinearCat and
// SwiGLULinear sum every row as the n = 1 GEMV sums it alone (gemv.cu's _x
// kernels: the weight read once per step from memory, at GEMV speed, not
// cuBLASLt's for many rows). Call it outside a step.
func (b *Backend) SetRowExact(on bool) { b.rowExact = on }

// fewRowsMax is the most rows fewRows hands to the one-row GEMV's sums
// (linearExactL), and fewRowsBF16 the largest bf16 weight it does: for
// 2 to 4 rows (an MTP draft pass after an accepted draft, a few decoding
// sequences) the four-warps-a-row GEMV, run once per row with the
// weight rows still in L1, took 6 µs where the 8-rows-a-block GEMV of
// f32 weights took 20-47 µs and cuBLASLt's split product 15-30 µs on
// ferrite-tiny's small weights (GPU run 2's profile). A large bf16 weight
// keeps cuBLASLt. FERRITE_CUDA_FEWROWS=0 turns it off.
const (
	fewRowsMax  = 4
	fewRowsBF16 = 4 << 20
)

var fewRowsOn = os.Getenv("FERRITE_CUDA_FEWROWS") != "0"

// fewRows reports whether a product of n rows with w runs as n one-row
// GEMVs (linearExactL) although the row-exact mode is off.
func fewRows(w *Weight, n int) bool {
	if !fewRowsOn || n < 2 || n > fewRowsMax {
		return false
	}
	if _, ok := gemvExactKernels[w.DType]; !ok {
		return false
	}
	return w.DType != kernels.BF16 || w.Bytes() <= fewRowsBF16
}

// linearW queues y (n, w.Rows) = x·wᵀ (+ bias) (+ y when acc): the GEMV
// for one row (and for weights cuBLASLt does not take), cuBLASLt above;
// with SetRowExact, the one-row GEMV's sums for every row.
func (b *Backend) linearW(y, x, bias uint64, w *Weight, n int, acc bool) {
	if w.DType.Quantized() {
		b.linearQuant(y, x, bias, w, n, acc)
		return
	}
	switch {
	case b.rowExact && n > 1, fewRows(w, n):
		b.queue(func(d *Device) error { return d.linearExactL(y, x, w, n, bias, acc) })
	case n == 1 || w.DType != kernels.BF16 || !b.useGemm():
		b.queue(func(d *Device) error { return d.linearL(y, x, w, n, bias, acc) })
	case n < gemmRoundRows:
		b.linearSplit(y, x, bias, w, n, acc)
	default:
		b.linearRounded(y, x, bias, w, n, acc)
	}
}

// LinearCat implements kernels.LinearOps: the weights are stacked once on
// the device (stacked) and run as one product.
func (b *Backend) LinearCat(dst, x kernels.Tensor, ws []*kernels.Mat, e kernels.Epilogue) {
	if dw, bias, ok := b.catArgs("LinearCat", dst, x, ws, e); ok {
		b.linearW(dptr(dst), dptr(x), bias, dw, x.Rows, e.Accumulate)
	}
}

// catArgs checks the operands of op (LinearCat or a Norm form of it) and
// returns the stacked weights and the bias address; ok is false when there
// is nothing to run (no rows or no outputs) or the upload failed (kept for
// Err).
func (b *Backend) catArgs(op string, dst, x kernels.Tensor, ws []*kernels.Mat, e kernels.Epilogue) (dw *Weight, bias uint64, ok bool) {
	f32Contig(op, dst, x)
	total := 0
	for _, w := range ws {
		if w.Cols != x.Cols || w.Cols == 0 {
			panic("cuda: " + op + " weights of another width")
		}
		total += w.Rows
	}
	if dst.Cols != total || dst.Rows != x.Rows {
		panic("cuda: " + op + " shapes do not match the weights")
	}
	bias = biasPtr(op, e.Bias, total)
	if x.Rows == 0 || total == 0 {
		return nil, 0, false
	}
	dw, err := b.stacked(ws...)
	if err != nil {
		b.fail(err)
		return nil, 0, false
	}
	return dw, bias, true
}

// SwiGLULinear implements kernels.LinearOps: gate and up stacked once on
// the device; one row runs the GEMV with the SwiGLU in its epilogue (a
// block computes gate row r and up row r), more rows the stacked product
// into scratch and then ferrite_swiglu_cat.
func (b *Backend) SwiGLULinear(dst, x kernels.Tensor, gate, up *kernels.Mat, limit float32) {
	f32Contig("SwiGLULinear", dst, x)
	if gate.Rows != up.Rows || gate.Cols != x.Cols || up.Cols != x.Cols || dst.Cols != gate.Rows || dst.Rows != x.Rows || x.Cols == 0 {
		panic("cuda: SwiGLULinear shapes do not match the weights")
	}
	n, inter := x.Rows, gate.Rows
	if n == 0 || inter == 0 {
		return
	}
	dw, err := b.stacked(gate, up)
	if err != nil {
		b.fail(err)
		return
	}
	y, xp := dptr(dst), dptr(x)
	if k, ok := gemvSwiGLU[dw.DType]; ok && n == 1 { // with SetRowExact, n > 1 gives each row these bits too
		b.queue(func(d *Device) error {
			name, grid := k[0], uint32(inter)
			if d.gemvRows > 0 { // gemvRows weight rows, half of them outputs, a block
				name, grid = k[d.gemvRows/4], uint32(ceilDiv(inter, d.gemvRows/2))
			}
			return d.launchL(name, grid, gemvBlock, 0, y, xp, dw.Buf.ptr, i32(inter), i32(dw.Cols), f32(limit), i32(d.prefetchBlocks()))
		})
		return
	}
	switch {
	case b.rowExact: // below
	case dw.DType == kernels.BF16 && n < gemmRoundRows && b.useGemm(): // linearW's split product
		b.linearSplitSwiGLU(y, xp, dw, n, limit)
		return
	}
	t := b.Scratch(kernels.F32, n, 2*inter) // (n, 2·inter) [x·gateᵀ | x·upᵀ]
	tp := dptr(t)
	b.linearW(tp, xp, 0, dw, n, false)
	total := int64(n) * int64(inter)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_swiglu_cat", d.elementwiseGrid(total), 256, 0, y, tp, uint64(total), i32(inter), f32(limit))
	})
}

// NormLinearCat implements kernels.LinearOps. With the norm fusion on
// (SetFuseNorm), one row (or any rows with SetRowExact) runs gemv.cu's
// GEMV with the norm fused (each block sums x² as it reads x and scales
// its sums once); otherwise RMSNorm into scratch and LinearCat.
func (b *Backend) NormLinearCat(dst, x kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	normArgs("NormLinearCat", x, n)
	dw, bias, ok := b.catArgs("NormLinearCat", dst, x, ws, e)
	if !ok {
		return
	}
	rows := x.Rows
	if k, ok := gemvNormKernels[dw.DType]; ok && b.fusesNorm(x, n) {
		y, xp, nw := dptr(dst), dptr(x), dptr(n.W)
		b.queue(func(d *Device) error {
			return d.launchL(k[0], uint32(ceilDiv(dw.Rows, gemvBlock/32/gemvSplit)), gemvBlock, 0, y, xp, dw.Buf.ptr, i32(rows),
				i32(dw.Rows), i32(dw.Cols), nw, f32(n.Eps), b32(n.Offset), bias, b32(e.Accumulate), i32(d.prefetchBlocks()))
		})
		return
	}
	if b.splitsNormed(dw, rows) { // the norm writes cuBLASLt's split input
		xb, split := b.normSplit(x, n)
		y, epi := dptr(dst), addHalves(dptr(dst), bias, dw, rows, e.Accumulate)
		var fix *halvesFix
		if !e.Accumulate && b.fuseHalves && b.inStep { // PrepareQKV may add the halves (halves.go)
			fix = &halvesFix{}
			epi = halvesOrPrep(fix, epi)
		}
		t := b.splitGemmXB(xb, split, dw, rows, epi)
		if fix != nil {
			b.halves = halvesPend{y: y, n: rows, dim: dw.Rows, fix: fix, t: t, bias: bias}
		}
		return
	}
	h := b.normed(x, n)
	b.linearW(dptr(dst), dptr(h), bias, dw, rows, e.Accumulate)
}

// AddNormLinearCat implements kernels.LinearOps as NormLinearCat does:
// the fused GEMV reads x + delta (and its blocks write that sum), or,
// unfused, the AddRMSNorm kernel writing the sum to sum, and the product.
func (b *Backend) AddNormLinearCat(dst, sum, x, delta kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	f32Contig("AddNormLinearCat", sum, delta)
	normArgs("AddNormLinearCat", x, n)
	if sum.Rows != x.Rows || sum.Cols != x.Cols || delta.Rows != x.Rows || delta.Cols != x.Cols {
		panic("cuda: AddNormLinearCat shapes differ")
	}
	dw, bias, ok := b.catArgs("AddNormLinearCat", dst, x, ws, e)
	if !ok {
		return
	}
	rows := x.Rows
	if k, ok := gemvAddNormKernels[dw.DType]; ok && b.fusesNorm(x, n) && dptr(delta)%16 == 0 {
		y, xp, nw, dp, sp := dptr(dst), dptr(x), dptr(n.W), dptr(delta), dptr(sum)
		b.queue(func(d *Device) error {
			return d.launchL(k, uint32(ceilDiv(dw.Rows, gemvBlock/32/gemvSplit)), gemvBlock, 0, y, xp, dw.Buf.ptr, i32(rows),
				i32(dw.Rows), i32(dw.Cols), nw, f32(n.Eps), b32(n.Offset), bias, b32(e.Accumulate), i32(d.prefetchBlocks()), dp, sp)
		})
		return
	}
	h := b.Scratch(kernels.F32, rows, x.Cols) // (N, in) the normed rows
	b.norm(dptr(h), dptr(x), dptr(delta), dptr(n.W), rows, x.Cols, n.Eps, n.Offset, dptr(sum))
	b.linearW(dptr(dst), dptr(h), bias, dw, rows, e.Accumulate)
}

// gemvAddNormKernels names AddNormLinearCat's fused GEMV per dtype
// (gemv.cu's gemv_norm_split with the add).
var gemvAddNormKernels = map[kernels.DType]string{
	kernels.F32: "ferrite_gemv_addnorm_f32", kernels.BF16: "ferrite_gemv_addnorm_bf16", kernels.F16: "ferrite_gemv_addnorm_f16",
}

// NormSwiGLULinear implements kernels.LinearOps as NormLinearCat does:
// the fused GEMV with the SwiGLU epilogue (ops.cu's gemv_norm_swiglu), or
// RMSNorm and SwiGLULinear.
func (b *Backend) NormSwiGLULinear(dst, x kernels.Tensor, n *kernels.HeadNorm, gate, up *kernels.Mat, limit float32) {
	f32Contig("NormSwiGLULinear", dst, x)
	normArgs("NormSwiGLULinear", x, n)
	if gate.Rows != up.Rows || gate.Cols != x.Cols || up.Cols != x.Cols || dst.Cols != gate.Rows || dst.Rows != x.Rows || x.Cols == 0 {
		panic("cuda: NormSwiGLULinear shapes do not match the weights")
	}
	rows, inter := x.Rows, gate.Rows
	if rows == 0 || inter == 0 {
		return
	}
	dw, err := b.stacked(gate, up)
	if err != nil {
		b.fail(err)
		return
	}
	if k, ok := gemvNormKernels[dw.DType]; ok && b.fusesNorm(x, n) {
		y, xp, nw := dptr(dst), dptr(x), dptr(n.W)
		b.queue(func(d *Device) error {
			return d.launchL(k[1], uint32(inter), gemvBlock, 0, y, xp, dw.Buf.ptr, i32(rows), i32(inter), i32(dw.Cols),
				nw, f32(n.Eps), b32(n.Offset), f32(limit), i32(d.prefetchBlocks()))
		})
		return
	}
	if b.splitsNormed(dw, rows) {
		xb, split := b.normSplit(x, n)
		b.splitSwiGLU(dptr(dst), xb, split, dw, rows, limit)
		return
	}
	b.SwiGLULinear(dst, b.normed(x, n), gate, up, limit)
}

// splitsNormed reports whether NormLinearCat or NormSwiGLULinear of rows
// rows on w takes linearSplit's cuBLASLt product, so that the norm can
// write its split input (ferrite_rmsnorm_bf16x2) in place of the normed
// rows and their split.
func (b *Backend) splitsNormed(w *Weight, rows int) bool {
	return !b.rowExact && w.DType == kernels.BF16 && rows > 1 && rows < gemmRoundRows && b.useGemm()
}

// splitNorm is splitGemmXB's split of RMSNorm(x) with hn, the norm and the
// split in one kernel (the bits of ferrite_add_rmsnorm and then
// ferrite_f32_to_bf16x2).
func (b *Backend) splitNorm(x kernels.Tensor, hn *kernels.HeadNorm) func(d *Device, xb uint64) error {
	xp, nw, rows, dim := dptr(x), dptr(hn.W), x.Rows, x.Cols
	block := b.normBlock(rows)
	return func(d *Device, xb uint64) error {
		return d.launchL("ferrite_rmsnorm_bf16x2", uint32(rows), block, 0, xb, xp, nw, i32(rows), i32(dim), f32(hn.Eps), b32(hn.Offset))
	}
}

// normArgs panics unless n is a norm over x's rows: weight (1, x.Cols)
// F32, contiguous.
func normArgs(op string, x kernels.Tensor, n *kernels.HeadNorm) {
	if n == nil {
		panic("cuda: " + op + " without a norm")
	}
	f32Contig(op+" norm", n.W)
	if n.W.Elems() != x.Cols {
		panic("cuda: " + op + " norm width")
	}
}

// fusesNorm reports whether the norm-fused GEMVs run for x: the fusion
// on, one row (or row-exact rows: the kernel sums every row as it sums one
// alone) and x and the norm weight at 16-byte addresses (the kernels'
// vector loads; rows of a width the loads do not fit take the scalar
// path).
func (b *Backend) fusesNorm(x kernels.Tensor, n *kernels.HeadNorm) bool {
	return b.fuseNorm && (x.Rows == 1 || b.rowExact) && (dptr(x)|dptr(n.W))%16 == 0
}

// normed returns RMSNorm(x, n) in a scratch tensor (the unfused path).
func (b *Backend) normed(x kernels.Tensor, n *kernels.HeadNorm) kernels.Tensor {
	h := b.Scratch(kernels.F32, x.Rows, x.Cols) // (N, in) the normed rows
	b.norm(dptr(h), dptr(x), 0, dptr(n.W), x.Rows, x.Cols, n.Eps, n.Offset, 0)
	return h
}

// SetFuse turns the fused attention — QKVAttention's one kernel and
// the split merge in the attention kernel — on or off for the steps that
// follow: a switch for benchmarks and tests. It is off by default
// (FERRITE_CUDA_FUSE=1 starts a Backend with it on): GPU run 3 measured
// the fused kernel slower at one row (27 µs a layer at context 150)
// than PrepareQKV, the split-KV kernel and the merge kernel together.
func (b *Backend) SetFuse(on bool) { b.noFuse = !on }

// SetFuseNorm turns the norm-fused GEMVs of NormLinearCat,
// AddNormLinearCat and NormSwiGLULinear on or off for the steps that
// follow. They are off by default (FERRITE_CUDA_FUSE_NORM=1 starts a
// Backend with them on): GPU run 2 measured them slower than the RMSNorm
// kernel and the plain GEMV together (BENCHMARKS.md, 9).
func (b *Backend) SetFuseNorm(on bool) { b.fuseNorm = on }

// gemvNormKernels names the norm-fused GEMVs per dtype: [0] the plain one
// (gemv.cu's gemv_norm_split), [1] with the SwiGLU epilogue over the
// stacked [gate; up] (ops.cu's gemv_norm_swiglu).
var gemvNormKernels = map[kernels.DType][2]string{
	kernels.F32:  {"ferrite_gemv_norm_f32", "ferrite_gemv_norm_swiglu_f32"},
	kernels.BF16: {"ferrite_gemv_norm_bf16", "ferrite_gemv_norm_swiglu_bf16"},
	kernels.F16:  {"ferrite_gemv_norm_f16", "ferrite_gemv_norm_swiglu_f16"},
}

// gemvSwiGLU names the n = 1 GEMVs with the SwiGLU epilogue per dtype:
// [0] four warps a weight row (gemv_swiglu), [1] and [2] 4 and 8 weight
// rows a block (gemv_swiglu_rows, Device.gemvRows).
var gemvSwiGLU = map[kernels.DType][3]string{
	kernels.F32:  {"ferrite_gemv_swiglu_f32", "ferrite_gemv_swiglu_f32_r4", "ferrite_gemv_swiglu_f32_r8"},
	kernels.BF16: {"ferrite_gemv_swiglu_bf16", "ferrite_gemv_swiglu_bf16_r4", "ferrite_gemv_swiglu_bf16_r8"},
	kernels.F16:  {"ferrite_gemv_swiglu_f16", "ferrite_gemv_swiglu_f16_r4", "ferrite_gemv_swiglu_f16_r8"},
}

// stackKey identifies a stack of up to four weights.
type stackKey [4]*kernels.Mat

// stacked returns the device copy of ms stacked by rows, uploading it on
// first use (cached per stack, like weight).
func (b *Backend) stacked(ms ...*kernels.Mat) (*Weight, error) {
	if len(ms) > len(stackKey{}) {
		panic("cuda: LinearCat of more than four weights")
	}
	var key stackKey
	copy(key[:], ms)
	for _, m := range ms {
		if m.Transient {
			panic("cuda: LinearCat or SwiGLULinear of a Transient matrix")
		}
	}
	upload := b.dev.UploadStack
	if quantable(ms...) {
		upload = b.dev.UploadQuant
	}
	return cachedWeight(b, &b.stacks, key, func() (*Weight, error) { return upload(ms) })
}

// linearSplit is Linear through cuBLASLt with x split into bf16 hi and lo
// rows, their products summed in the epilogue kernel. When x is the output
// of the op just queued and that op also wrote it split (presplit), the
// split is not done again.
func (b *Backend) linearSplit(y, x, bias uint64, w *Weight, n int, acc bool) {
	epi, fix := addHalves(y, bias, w, n, acc), (*halvesFix)(nil)
	if acc && b.fuseHalves && b.inStep {
		fix = &halvesFix{}
		epi = halvesOrNorm(y, bias, w, n, fix, epi)
	}
	var t uint64
	if p := b.presplit; p.x == x && p.n == n && p.cols == w.Cols && x != 0 {
		t = b.splitGemmXB(p.xb, nil, w, n, epi)
	} else {
		t = b.splitGemmXB(dptr(b.Scratch(kernels.BF16, 2*n, w.Cols)), splitX(x, n, w.Cols), w, n, epi) // (2n, cols) x split
	}
	if fix != nil {
		b.halves = halvesPend{y: y, n: n, dim: w.Rows, fix: fix, t: t, bias: bias, acc: true}
	}
}

// presplit is the float32 rows x (n, cols) that the op queued last also
// wrote split into bf16 hi and lo rows at xb (2n, cols), for the product
// that follows (a SwiGLU MLP's down projection); queue clears it.
type presplit struct {
	x, xb   uint64
	n, cols int
}

// linearSplitSwiGLU is SwiGLULinear of n rows on linearSplit's product of
// the stacked [gate; up] w: y (n, w.Rows/2), written split as well for the
// down projection that usually follows (presplit).
func (b *Backend) linearSplitSwiGLU(y, x uint64, w *Weight, n int, limit float32) {
	b.splitSwiGLU(y, dptr(b.Scratch(kernels.BF16, 2*n, w.Cols)), splitX(x, n, w.Cols), w, n, limit) // (2n, cols) x split
}

// splitSwiGLU is splitGemmXB of the stacked [gate; up] w with the SwiGLU
// epilogue into y (n, w.Rows/2), which it also leaves split (presplit).
func (b *Backend) splitSwiGLU(y, xb uint64, split func(d *Device, xb uint64) error, w *Weight, n int, limit float32) {
	inter := w.Rows / 2
	y2 := dptr(b.Scratch(kernels.BF16, 2*n, inter)) // (2n, inter) y as bf16 hi, then lo
	b.splitGemmXB(xb, split, w, n, swigluHalves(y, y2, w, n, limit))
	b.presplit = presplit{x: y, xb: y2, n: n, cols: inter}
}

// splitGemmXB queues split, which writes the bf16 hi and lo rows of the n
// input rows into xb (2n, w.Cols) (with split nil, xb already holds
// them), their cuBLASLt product with w into scratch t (2n, w.Rows), then
// epi(t); it returns t.
func (b *Backend) splitGemmXB(xb uint64, split func(d *Device, xb uint64) error, w *Weight, n int, epi func(d *Device, t uint64) error) uint64 {
	b.splitRows = max(b.splitRows, n)
	t := dptr(b.Scratch(kernels.F32, 2*n, w.Rows)) // (2n, rows) the two products
	b.queue(func(d *Device) error {
		if split != nil {
			if err := split(d, xb); err != nil {
				return err
			}
		}
		if err := d.gemmL(t, xb, w, 2*n, false); err != nil {
			return err
		}
		return epi(d, t)
	})
	return t
}

// splitX is splitGemmXB's split of float32 rows x (n, cols).
func splitX(x uint64, n, cols int) func(d *Device, xb uint64) error {
	return func(d *Device, xb uint64) error {
		cnt := int64(n) * int64(cols)
		return d.launchL("ferrite_f32_to_bf16x2", d.elementwiseGrid(cnt), 256, 0, xb, x, uint64(cnt))
	}
}

// addHalves is linearSplit's epilogue: y (n, w.Rows) = the sum of the two
// products (+ bias) (+ y when acc).
func addHalves(y, bias uint64, w *Weight, n int, acc bool) func(d *Device, t uint64) error {
	return func(d *Device, t uint64) error {
		out := int64(n) * int64(w.Rows)
		return d.launchL("ferrite_add_halves", d.elementwiseGrid(out), 256, 0, y, t, bias, uint64(out), i32(w.Rows), b32(acc))
	}
}

// swigluHalves is the split product's epilogue for the stacked [gate; up]
// w: y (n, w.Rows/2) = the SwiGLU of the two products' sums
// (ferrite_add_halves_swiglu: one pass for ferrite_add_halves and
// ferrite_swiglu_cat, the same sums), clamped at limit > 0, and, at y2
// when not 0, y split into bf16 hi and lo rows (2n, w.Rows/2).
func swigluHalves(y, y2 uint64, w *Weight, n int, limit float32) func(d *Device, t uint64) error {
	inter := w.Rows / 2
	return func(d *Device, t uint64) error {
		out := int64(n) * int64(inter)
		return d.launchL("ferrite_add_halves_swiglu", d.elementwiseGrid(out), 256, 0, y, t, uint64(out), i32(inter), f32(limit), y2)
	}
}

// linearRounded is Linear through cuBLASLt with x rounded to bf16.
func (b *Backend) linearRounded(y, x, bias uint64, w *Weight, n int, acc bool) {
	xb := dptr(b.Scratch(kernels.BF16, n, w.Cols)) // (n, cols) x in bf16
	b.queue(func(d *Device) error {
		cnt := int64(n) * int64(w.Cols)
		if err := d.launchL("ferrite_f32_to_bf16", d.elementwiseGrid(cnt), 256, 0, xb, x, uint64(cnt)); err != nil {
			return err
		}
		if err := d.gemmL(y, xb, w, n, acc); err != nil {
			return err
		}
		if bias == 0 {
			return nil
		}
		out := int64(n) * int64(w.Rows)
		return d.launchL("ferrite_add_bias", d.elementwiseGrid(out), 256, 0, y, bias, uint64(out), i32(w.Rows))
	})
}

// SwiGLU implements kernels.LinearOps.
func (b *Backend) SwiGLU(dst, gate, up kernels.Tensor) {
	f32Contig("SwiGLU", dst, gate, up)
	if gate.Elems() != dst.Elems() || up.Elems() != dst.Elems() {
		panic("cuda: SwiGLU shapes differ")
	}
	y, g, u, n := dptr(dst), dptr(gate), dptr(up), int64(dst.Elems())
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_swiglu", d.elementwiseGrid(n), 256, 0, y, g, u, uint64(n))
	})
}

// Embed implements kernels.LinearOps.
func (b *Backend) Embed(dst kernels.Tensor, w *kernels.Mat, ids kernels.Tensor) {
	if dst.DType != kernels.F32 || dst.Cols != w.Cols {
		panic("cuda: Embed shapes do not match")
	}
	index("Embed", ids, dst.Rows, 1)
	if dst.Rows == 0 {
		return
	}
	if quantable(w) { // the table in its blocks (the linear ops' upload, shared with a tied head)
		dw, err := b.linWeight(w)
		if err != nil {
			b.fail(err)
			return
		}
		y, id := dptr(dst), dptr(ids)
		b.queue(func(d *Device) error {
			return d.launchL("ferrite_embed_q", uint32(dst.Rows), 256, 0, y, i32(dst.Stride), dw.Buf.ptr, dw.Buf.ptr+uint64(dw.DOff), id,
				i32(ids.Stride), i32(dst.Rows), i32(dw.Rows), i32(dw.Cols), i32(int(dw.DType)))
		})
		return
	}
	dw, err := b.weight(w)
	if err != nil {
		b.fail(err)
		return
	}
	var scale uint64
	if dw.Scale != nil {
		scale = dw.Scale.ptr
	}
	y, id := dptr(dst), dptr(ids)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_embed", uint32(dst.Rows), 256, 0, y, i32(dst.Stride), dw.Buf.ptr, scale, id,
			i32(ids.Stride), i32(dst.Rows), i32(dw.Rows), i32(dw.Cols), i32(int(dw.DType)), i32(dw.BlockRows), i32(dw.BlockCols))
	})
}

// GatherRows implements kernels.LinearOps.
func (b *Backend) GatherRows(dst, src, rows kernels.Tensor) {
	if dst.DType != kernels.F32 || src.DType != kernels.F32 || dst.Cols != src.Cols {
		panic("cuda: GatherRows shapes do not match")
	}
	index("GatherRows", rows, dst.Rows, 1)
	y, x, r := dptr(dst), dptr(src), dptr(rows)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_gather_rows", uint32(dst.Rows), 256, 0, y, i32(dst.Stride), x, i32(src.Stride), r,
			i32(rows.Stride), i32(dst.Rows), i32(dst.Cols), i32(src.Rows))
	})
}

// RMSNorm implements kernels.NormOps.
func (b *Backend) RMSNorm(dst, x, w kernels.Tensor, eps float32, offset bool) {
	f32Contig("RMSNorm", dst, x, w)
	if dst.Rows != x.Rows || dst.Cols != x.Cols || w.Elems() != x.Cols {
		panic("cuda: RMSNorm shapes do not match")
	}
	b.norm(dptr(dst), dptr(x), 0, dptr(w), x.Rows, x.Cols, eps, offset, 0)
}

// AddRMSNorm implements kernels.NormOps.
func (b *Backend) AddRMSNorm(dst, res, delta, w kernels.Tensor, eps float32, offset bool) {
	f32Contig("AddRMSNorm", dst, res, delta, w)
	for _, t := range []kernels.Tensor{dst, delta} {
		if t.Rows != res.Rows || t.Cols != res.Cols {
			panic("cuda: AddRMSNorm shapes differ")
		}
	}
	if w.Elems() != res.Cols {
		panic("cuda: AddRMSNorm weight width")
	}
	b.norm(dptr(dst), dptr(res), dptr(delta), dptr(w), res.Rows, res.Cols, eps, offset, 0)
}

// norm queues ferrite_add_rmsnorm: y = RMSNorm(res + delta) (delta 0:
// none), res + delta written to sum, or to res when sum is 0.
func (b *Backend) norm(y, res, delta, w uint64, rows, dim int, eps float32, offset bool, sum uint64) {
	if rows == 0 || dim == 0 || b.decFuseNorm(y, res, delta, w, rows, dim, eps, offset, sum) ||
		b.decNorm(y, res, delta, w, rows, dim, eps, offset, sum) {
		return
	}
	block := uint32(256) // threads a row; 1024 when the rows do not fill the GPU
	if rows < b.dev.SMs {
		block = 1024
	}
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_add_rmsnorm", uint32(rows), block, 0, y, res, delta, w, i32(rows), i32(dim), f32(eps), b32(offset), sum)
	})
}

// PrepareQKV implements kernels.AttentionOps: a warp per (row, head) of
// [q | k | v] norms, rotates and writes its head (ferrite_prepare_qkv,
// four heads a block).
func (b *Backend) PrepareQKV(q, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	f32Contig("PrepareQKV", q)
	pa := prepArgs("PrepareQKV", kc, vc, qkv, qn, kn, r, p, s)
	n := qkv.Rows
	if q.Rows != n || q.Cols != s.Heads*s.HeadDim {
		panic("cuda: PrepareQKV shapes do not match")
	}
	if n == 0 {
		return
	}
	qp, kcp, vcp, src, pos, slot := dptr(q), dptr(kc), dptr(vc), dptr(qkv), dptr(p.Pos), dptr(p.Slot)
	heads := s.Heads + 2*s.KVHeads
	if h := b.halves; h.fix != nil && !h.fix.ran && !h.acc && h.y == src && h.n == n && h.dim == qkv.Cols && b.inStep {
		h.fix.prep = true // the product's epilogue is this launch (halves.go)
		b.queue(func(d *Device) error {
			return d.launch3L("ferrite_prepare_qkv_halves", [3]uint32{uint32(n), uint32(ceilDiv(heads, prepHeads)), 1}, 128, 0,
				qp, kcp, vcp, h.t, pos, i32(p.Pos.Stride), slot, i32(p.Slot.Stride), i32(kc.Rows), b32(kc.DType == kernels.BF16),
				i32(s.Heads), i32(s.KVHeads), i32(s.HeadDim), pa[0], pa[1], pa[2], pa[3], pa[4], pa[5], pa[6], pa[7], h.bias, src)
		})
		return
	}
	b.queue(func(d *Device) error {
		return d.launch3L("ferrite_prepare_qkv", [3]uint32{uint32(n), uint32(ceilDiv(heads, prepHeads)), 1}, 128, 0,
			qp, kcp, vcp, src, pos, i32(p.Pos.Stride), slot, i32(p.Slot.Stride), i32(kc.Rows), b32(kc.DType == kernels.BF16),
			i32(s.Heads), i32(s.KVHeads), i32(s.HeadDim), pa[0], pa[1], pa[2], pa[3], pa[4], pa[5], pa[6], pa[7])
	})
}

// prepHeads is the heads a ferrite_prepare_qkv block takes, a warp each.
const prepHeads = 4

// prepArgs checks PrepareQKV's operands but q (for op) and returns
// src/ops.cu's PrepArgs as kernel arguments: q norm weight, its eps, k
// norm weight, its eps, inverse frequencies, rotated pairs, cos/sin scale
// and the flags (bit 0: q norm offset, 1: k norm offset, 2: interleaved).
func prepArgs(op string, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) [8]uint64 {
	f32Contig(op, qkv)
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := qkv.Rows
	switch {
	case s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 || qkv.Cols != qw+2*kw || s.HeadDim <= 0 || s.HeadDim > attnMaxHD:
		panic("cuda: " + op + " shapes do not match")
	case kc.DType != vc.DType || (kc.DType != kernels.F32 && kc.DType != kernels.BF16):
		panic("cuda: KV cache dtype must be F32 or BF16")
	case !kc.Contiguous() || !vc.Contiguous() || kc.Cols != kw || vc.Cols != kw || kc.Rows != vc.Rows:
		panic("cuda: " + op + " shapes do not match the cache")
	}
	index(op, p.Slot, n, 1)
	index(op, p.Pos, n, 1)
	var a [8]uint64
	flags := 0
	for i, hn := range []*kernels.HeadNorm{qn, kn} {
		if hn != nil {
			f32Contig(op+" norm", hn.W)
			if hn.W.Elems() != s.HeadDim {
				panic("cuda: " + op + " norm width")
			}
			a[2*i], a[2*i+1] = dptr(hn.W), f32(hn.Eps)
			if hn.Offset {
				flags |= 1 << i
			}
		}
	}
	if r != nil {
		f32Contig(op+" rotary", r.InvFreq)
		if r.InvFreq.Elems() != r.Dim/2 || r.Dim > s.HeadDim || r.Dim%2 != 0 {
			panic("cuda: " + op + " rotary does not fit the heads")
		}
		a[4], a[5], a[6] = dptr(r.InvFreq), i32(r.Dim/2), f32(r.Scale)
		if r.Interleaved {
			flags |= 4
		}
	}
	a[7] = i32(flags)
	return a
}

// QKVAttention implements kernels.AttentionOps. One row (a decode step)
// without the fusion switched off (SetFuse, FERRITE_CUDA_FUSE_QKV=0 for
// this one alone) runs the attention kernel's QKV form,
// which prepares its query heads in the block and, in the split that
// holds the row's position, stores the row's key and value before reading
// them (no PrepareQKV kernel); otherwise PrepareQKV into scratch, then
// Attention. Both give the same bits.
func (b *Backend) QKVAttention(out, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	n := qkv.Rows
	if out.Rows != n {
		panic("cuda: QKVAttention shapes do not match")
	}
	if b.dec.attn == decAttnQKV && n == 1 && dptr(qkv)%16 == 0 && b.decAttnFits(out, kernels.Tensor{}, kc, vc, p, s) { // one row (decode.go)
		pa := prepArgs("QKVAttention", kc, vc, qkv, qn, kn, r, p, s)
		f32Contig("QKVAttention", out)
		index("QKVAttention", p.Seq, n, 1)
		if out.Cols != s.Heads*s.HeadDim || !p.Blocks.Contiguous() || p.Blocks.DType != kernels.I32 {
			panic("cuda: QKVAttention shapes do not match")
		}
		b.decAttention(out, kernels.Tensor{}, kc, vc, p, s, &qkvForm{qkv: dptr(qkv), slot: dptr(p.Slot), slots: kc.Rows, prep: pa})
		return
	}
	if b.noFuse || b.noFuseQKV || n != 1 || !b.attnG4(s, n) || b.usePrefill(s, n) {
		q := b.Scratch(kernels.F32, n, s.Heads*s.HeadDim) // (N, heads·headDim) normed and rotated
		b.PrepareQKV(q, kc, vc, qkv, qn, kn, r, p, s)
		b.Attention(out, q, kc, vc, p, s)
		return
	}
	pa := prepArgs("QKVAttention", kc, vc, qkv, qn, kn, r, p, s)
	b.attention(out, kernels.Tensor{}, kc, vc, p, s, &qkvForm{qkv: dptr(qkv), slot: dptr(p.Slot), slots: kc.Rows, prep: pa})
}

// qkvForm is the attention kernel's QKV form's extra arguments.
type qkvForm struct {
	qkv, slot uint64
	slots     int
	prep      [8]uint64
}

// RoPE implements kernels.RopeOps.// RoPE implements kernels.RopeOps.
func (b *Backend) RoPE(x kernels.Tensor, heads, headDim int, pos kernels.Tensor, r *kernels.Rotary) {
	f32Contig("RoPE", x, r.InvFreq)
	half := r.Dim / 2
	if x.Cols != heads*headDim || r.InvFreq.Elems() != half || r.Dim > headDim || r.Dim%2 != 0 {
		panic("cuda: RoPE shapes do not match")
	}
	index("RoPE", pos, x.Rows, 1)
	total := int64(x.Rows) * int64(heads) * int64(half)
	if total == 0 {
		return
	}
	xp, pp, inv := dptr(x), dptr(pos), dptr(r.InvFreq)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_rope", d.elementwiseGrid(total), 256, 0, xp, pp, i32(pos.Stride), inv,
			i32(x.Rows), i32(heads), i32(headDim), i32(half), b32(r.Interleaved), f32(r.Scale))
	})
}

// StoreKV implements kernels.AttentionOps.
func (b *Backend) StoreKV(kc, vc, k, v kernels.Tensor, p *kernels.Paged) {
	if k.DType != kernels.F32 || v.DType != kernels.F32 || k.Rows != v.Rows {
		panic("cuda: StoreKV wants F32 keys and values of one row count")
	}
	if kc.DType != vc.DType || (kc.DType != kernels.F32 && kc.DType != kernels.BF16) {
		panic("cuda: KV cache dtype must be F32 or BF16")
	}
	if !kc.Contiguous() || !vc.Contiguous() || kc.Cols != k.Cols || vc.Cols != v.Cols || k.Cols != v.Cols || kc.Rows != vc.Rows {
		panic("cuda: StoreKV shapes do not match the cache")
	}
	index("StoreKV", p.Slot, k.Rows, 1)
	total := int64(k.Rows) * int64(k.Cols)
	if total == 0 {
		return
	}
	kcp, vcp, kp, vp, sp := dptr(kc), dptr(vc), dptr(k), dptr(v), dptr(p.Slot)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_store_kv", d.elementwiseGrid(total), 256, 0, kcp, vcp, kp, i32(k.Stride), vp, i32(v.Stride),
			sp, i32(p.Slot.Stride), i32(k.Rows), i32(k.Cols), i32(kc.Rows), b32(kc.DType == kernels.BF16))
	})
}

// Attention tiling (src/ops.cu): splits of at least attnSplit keys,
// attnGroup (or 4: attnG4) query heads per block, head dims up to
// attnMaxHD.
const (
	attnSplit  = 128
	attnGroup  = 8
	attnMaxHD  = 256
	attnThread = 128
)

// attnKernels[g4][bf16][i] handles head dims up to 32·2^i, attnGroup
// query heads a block or, with g4, 4.
var attnKernels = [2][2][4]string{
	{{"ferrite_attn_f32_1", "ferrite_attn_f32_2", "ferrite_attn_f32_4", "ferrite_attn_f32_8"},
		{"ferrite_attn_bf16_1", "ferrite_attn_bf16_2", "ferrite_attn_bf16_4", "ferrite_attn_bf16_8"}},
	{{"ferrite_attn_f32_1_g4", "ferrite_attn_f32_2_g4", "ferrite_attn_f32_4_g4", "ferrite_attn_f32_8_g4"},
		{"ferrite_attn_bf16_1_g4", "ferrite_attn_bf16_2_g4", "ferrite_attn_bf16_4_g4", "ferrite_attn_bf16_8_g4"}},
}

// attnQKVKernels[bf16][i] are the QKV forms (QKVAttention) of the kernels
// of 4 query heads a block.
var attnQKVKernels = [2][4]string{
	{"ferrite_attn_qkv_f32_1", "ferrite_attn_qkv_f32_2", "ferrite_attn_qkv_f32_4", "ferrite_attn_qkv_f32_8"},
	{"ferrite_attn_qkv_bf16_1", "ferrite_attn_qkv_bf16_2", "ferrite_attn_qkv_bf16_4", "ferrite_attn_qkv_bf16_8"},
}

// attnG4 reports whether Attention runs the kernels of 4 query heads a
// block for n rows: always for groups of up to 4 heads (the wider kernel
// would compute empty heads), and for wider groups while the blocks (twice
// as many, each reading the keys) still number at most one a
// multiprocessor: decode is latency-bound there.
func (b *Backend) attnG4(s kernels.AttnShape, n int) bool {
	grp := s.Heads / s.KVHeads
	return !b.attnWide && (grp <= 4 || n*s.KVHeads*ceilDiv(grp, 4) <= b.dev.SMs)
}

// prefillRows is the prefill kernel's default row tile (src/prefill.cu: 64
// or 128 rows, a warp per 16); Backend.prefillRows overrides it.
// prefillKernels[bf16][hd == 128][rows == 128] are its instances, for head
// dims 64 and 128.
const prefillRows = 64

var prefillKernels = [2][2][2]string{
	{{"ferrite_prefill_attn_f32_64_64", "ferrite_prefill_attn_f32_64_128"},
		{"ferrite_prefill_attn_f32_128_64", "ferrite_prefill_attn_f32_128_128"}},
	{{"ferrite_prefill_attn_bf16_64_64", "ferrite_prefill_attn_bf16_64_128"},
		{"ferrite_prefill_attn_bf16_128_64", "ferrite_prefill_attn_bf16_128_128"}},
}

// prefillTile is the prefill kernel's row tile: 64 or 128.
func (b *Backend) prefillTile() int {
	if b.prefillRows == 128 {
		return 128
	}
	return prefillRows
}

// usePrefill reports whether Attention runs the prefill kernel for a batch
// of n rows: a head dim it has an instance for and at least one full row
// tile. The kernel then takes every row tile whose rows are all of one
// sequence (decided on the device) and the split-KV kernel the rest.
func (b *Backend) usePrefill(s kernels.AttnShape, n int) bool {
	return !b.splitKVOnly && n >= b.prefillTile() && (s.HeadDim == 64 || s.HeadDim == 128)
}

// AttentionRoundsToBF16 reports whether Attention over a batch of n rows
// rounds queries, probabilities and an F32 cache's keys and values to
// bfloat16 for its tensor-core products (the prefill kernel; its sums stay
// float32). kerneltest then holds it to AttentionBF16Tol.
func (b *Backend) AttentionRoundsToBF16(s kernels.AttnShape, n int) bool { return b.usePrefill(s, n) }

// batchTokens is the step token budget the runtime gets from
// PreferredBatchTokens on a GPU of batchMemory or more: whole 4,096-token
// prompt chunks, where cuBLASLt's Linear layers and the prefill kernel
// reach their throughput. A step's scratch arena grows with its tokens
// (Qwen3-8B: 9.2 MB a token, 37.7 GB at 4,096 on the H200), so a smaller
// GPU gets half the budget per halving of its memory, down to 512.
const (
	batchTokens = 4096
	batchMemory = 64 << 30
)

// PreferredBatchTokens implements kernels.BatchSizer.
func (b *Backend) PreferredBatchTokens() int {
	t := batchTokens
	for mem := b.dev.TotalMem; t > 512 && mem < batchMemory; mem *= 2 {
		t /= 2
	}
	return t
}

// attnCounters is how many (row, KV head, chunk) blocks of a split
// attention launch splitCounters covers: the split-KV kernel splits only
// when the blocks number fewer than 2·SMs; ferrite_dattn takes decode
// batches of up to decBatchRowsDef rows (decode.go) of up to 16 block
// columns.
const attnCounters = 4096

// splitCounters returns the device address of the attention kernel's
// split counters (attnCounters zeroed int32, allocated on first use; each
// launch leaves them zeroed).
func (b *Backend) splitCounters() (uint64, error) {
	if !b.attnCnt.Valid() {
		t, err := b.Alloc(kernels.I32, 1, attnCounters)
		if err != nil {
			return 0, err
		}
		b.attnCnt = t
	}
	return dptr(b.attnCnt), nil
}

// Attention implements kernels.AttentionOps. Batches usePrefill accepts
// first run the prefill kernel (src/prefill.cu: flash attention on tensor
// cores over row tiles of one sequence). The split-KV
// kernel then does every other row over its own keys, the splits merged by
// ferrite_attn_combine. The split count comes from host values only (the
// block table's width and the batch), never from the positions on the
// device: enough splits of attnSplit keys to give the GPU about two blocks
// per multiprocessor, each split then widened so that together they cover
// the block table's keys. The last block of a row's splits to finish
// merges them in the attention kernel (split counters), unless the fusion
// is off (SetFuse).
func (b *Backend) Attention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape) {
	f32Contig("Attention", q)
	b.attention(out, q, kc, vc, p, s, nil)
}

// attention is Attention, or with qf the attention kernel's QKV form
// (QKVAttention: one row, q the zero Tensor).
func (b *Backend) attention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape, qf *qkvForm) {
	f32Contig("Attention", out)
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	rows := out.Rows
	if qf == nil && (q.Cols != qw || q.Rows != rows) {
		panic("cuda: Attention shapes do not match")
	}
	switch {
	case s.KVHeads <= 0 || s.Heads%s.KVHeads != 0:
		panic("cuda: Attention head counts")
	case out.Cols != qw || kc.Cols != kw || vc.Cols != kw || kc.DType != vc.DType:
		panic("cuda: Attention shapes do not match")
	case kc.DType != kernels.F32 && kc.DType != kernels.BF16:
		panic("cuda: KV cache dtype must be F32 or BF16")
	case s.HeadDim <= 0 || s.HeadDim > attnMaxHD:
		panic("cuda: Attention head dim above 256")
	case !p.Blocks.Contiguous() || p.Blocks.DType != kernels.I32 || p.BlockSize <= 0:
		panic("cuda: Attention block table")
	}
	n := rows
	index("Attention", p.Pos, n, 1)
	index("Attention", p.Seq, n, 1)
	if n == 0 {
		return
	}
	if p.Pos.Stride != 1 && n > 1 || p.Seq.Stride != 1 && n > 1 {
		panic("cuda: Attention wants contiguous positions and sequences")
	}
	if qf == nil && b.decAttnFits(out, q, kc, vc, p, s) { // one row, a row-exact step or a decode batch (decode.go)
		b.decAttention(out, q, kc, vc, p, s, nil)
		return
	}
	dpl := 0
	for 32<<dpl < s.HeadDim {
		dpl++
	}
	bf := 0
	if kc.DType == kernels.BF16 {
		bf = 1
	}
	// The splits are counted for attnGroup heads a block, whatever the
	// kernel's group: a row's bits then depend on the batch as before.
	blocks := n * s.KVHeads * ceilDiv(s.Heads/s.KVHeads, attnGroup)
	g4, group := 0, attnGroup
	if b.attnG4(s, n) {
		g4, group = 1, 4
	}
	chunks := ceilDiv(s.Heads/s.KVHeads, group)
	maxKeys := p.Blocks.Cols * p.BlockSize
	ptile := 0 // the prefill kernel's row tile, 0 when it does not run (attnsplit.go)
	if b.usePrefill(s, n) && !decodeBatch(n, p) {
		ptile = b.prefillTile()
	}
	splits := min(ceilDiv(maxKeys, attnSplit), max(1, ceilDiv(2*b.dev.SMs, blocks)))
	split := ceilDiv(ceilDiv(maxKeys, splits), 32) * 32 // keys per split, whole warp tiles
	var part, cnt uint64
	if splits > 1 {
		part = dptr(b.Scratch(kernels.F32, n*s.Heads*splits, s.HeadDim+2)) // (n, heads, splits, max, sum, hd acc)
		if !b.noFuse && n*s.KVHeads*chunks <= attnCounters {               // the last split to finish merges
			var err error
			if cnt, err = b.splitCounters(); err != nil {
				b.fail(err)
				return
			}
		}
	}
	var qp uint64 // 0 for the QKV form
	if qf == nil {
		qp = dptr(q)
	}
	o, kcp, vcp := dptr(out), dptr(kc), dptr(vc)
	pos, seq, bt := dptr(p.Pos), dptr(p.Seq), dptr(p.Blocks)
	name := attnKernels[g4][bf][dpl]
	pf := n == 1 && !b.noAttnPrefetch // a decode row: its few blocks are latency-bound
	var extra []uint64
	var out2 uint64 // the output also split for the o projection (halves.go); 0: not
	if qf != nil {
		if g4 == 0 || ptile > 0 || n != 1 {
			panic("cuda: the QKV form of attention wants one row and 4 query heads a block")
		}
		name = attnQKVKernels[bf][dpl]
		extra = append([]uint64{qf.qkv, qf.slot, i32(qf.slots)}, qf.prep[:]...)
	} else {
		if b.fuseHalves && b.inStep && ptile == 0 && n > 1 {
			out2 = dptr(b.Scratch(kernels.BF16, 2*n, qw)) // (2n, heads·hd) out as bf16 hi, then lo
		}
		extra = []uint64{out2}
	}
	b.queue(func(d *Device) error {
		if ptile > 0 {
			err := d.launch3L(prefillKernels[bf][s.HeadDim/128][ptile/128], [3]uint32{uint32(s.Heads), uint32(ceilDiv(n, ptile)), 1},
				uint32(ptile/16*32), 0, o, qp, kcp, vcp, pos, seq, bt, i32(p.Blocks.Cols), i32(p.BlockSize), i32(n), i32(s.Heads),
				i32(s.KVHeads), f32(s.Scale))
			if err != nil {
				return err
			}
		}
		args := append([]uint64{o, qp, kcp, vcp, pos, seq, bt, part, i32(p.Blocks.Cols), i32(p.BlockSize), i32(n), i32(s.Heads),
			i32(s.KVHeads), i32(s.HeadDim), i32(chunks), i32(split), f32(s.Scale), i32(ptile), cnt, b32(pf)}, extra...)
		err := d.launch3L(name, [3]uint32{uint32(n), uint32(s.KVHeads * chunks), uint32(splits)}, attnThread, 0, args...)
		if err != nil || splits == 1 || cnt != 0 {
			return err
		}
		return d.launch3L("ferrite_attn_combine", [3]uint32{uint32(n), uint32(s.Heads), 1}, attnThread, 0,
			o, part, i32(s.Heads), i32(s.HeadDim), i32(splits), seq, i32(n), i32(ptile), out2)
	})
	if out2 != 0 {
		b.presplit = presplit{x: o, xb: out2, n: n, cols: qw}
	}
}

// Route implements kernels.MoEOps.
func (b *Backend) Route(ids, w, logits kernels.Tensor, r *kernels.Router) {
	f32Contig("Route", logits, w)
	n, e := logits.Rows, logits.Cols
	index("Route", ids, n, r.Width())
	if w.Rows != n || w.Cols != r.Width() || r.TopK <= 0 || r.TopK > 64 || r.TopK > e || r.Groups > 64 || r.Shared < 0 {
		panic("cuda: Route shapes do not match")
	}
	groups, keep := r.Groups, r.TopKGroups
	if groups > 1 && (e%groups != 0 || keep <= 0 || keep > groups) {
		panic("cuda: Route groups do not divide the experts")
	}
	bias := biasPtr("Route", r.Bias, e)
	if n == 0 {
		return
	}
	smem := uint32((2*e + 128) * 4)
	if smem > 48<<10 {
		panic("cuda: Route over more experts than shared memory holds")
	}
	ip, wp, lp := dptr(ids), dptr(w), dptr(logits)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_route", uint32(n), 32, smem, ip, i32(ids.Stride), wp, i32(w.Stride), lp, i32(logits.Stride), bias,
			i32(n), i32(e), i32(r.TopK), b32(r.Scoring == kernels.SigmoidScoring), b32(r.NormTopK), f32(r.Scale), i32(groups), i32(keep),
			i32(r.Shared))
	})
}

// expertDescBytes is the size of src/ops.cu's MatDesc: two pointers and six
// int32 (dtype, rows, cols, block rows, block cols, first row).
const expertDescBytes = 40

// expertKinds is what an expert list's weights are on the device.
type expertKinds struct {
	quant bool // some matrix kept in GGML blocks: the _q kernels
	qbf16 bool // quant, and every other matrix bf16: a prefill may decode the blocks for the tensor cores (ferrite_moe_qdecode)
	// guGroup and dGroup are the columns an int8 scale of x (gates and
	// ups) and of h (downs) spans (quantXGroup) where every such matrix is
	// block-quantized with one group, else −1: the _q8 kernels need both.
	guGroup, dGroup int
	// oneDT: every gate and up is of one dtype, every down of one: the
	// grouped tensor-core product (ferrite_moe_mmq_*) needs it, with x8.
	oneDT bool
}

// moeDownRows is the hidden rows a block of the slot-a-pass down kernels
// takes but in their _q1 form (src/ops_moe.cu's kMoeDownRows).
const moeDownRows = 4

// x8 reports whether the experts take int8 activations (the _q8 kernels).
func (k expertKinds) x8() bool { return k.guGroup > 0 && k.dGroup > 0 }

// mmq reports whether the experts take the grouped tensor-core product
// on int8 activations (ferrite_moe_mmq_*).
func (k expertKinds) mmq() bool { return k.x8() && k.oneDT }

// moeMMQTokens is the most tokens of experts that can take it
// (expertKinds.mmq) the grouped tensor-core product takes, from
// moeFewTokens + 1: FERRITE_CUDA_MOE_MMQ, default gemmRoundRows − 1 (from
// there a prefill decodes the chosen experts into bf16 for the tensor
// cores); 0 keeps the register tiles and the CUDA-core tiles on float32 x.
var moeMMQTokens = func() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_MOE_MMQ")); err == nil && n >= 0 {
		return n
	}
	return gemmRoundRows - 1
}()

// foldXGroup folds matrix dtype dt into a role's scale group g (0: none
// seen yet; −1: not one group of block-quantized matrices).
func foldXGroup(g int, dt kernels.DType) int {
	switch {
	case g < 0 || !dt.Quantized():
		return -1
	case g == 0 || g == quantXGroup(dt):
		return quantXGroup(dt)
	}
	return -1
}

// moeDecodeMost is the most bytes of bf16 ferrite_moe_qdecode decodes a
// call's block-quantized experts into (one layer's experts: 1.2 GB for
// Qwen3-30B-A3B's 128 of 768, in the decode buffer every layer shares);
// larger expert sets keep to the CUDA-core tiles.
const moeDecodeMost = 4 << 30

// expertsFewX8 is Experts' slot-a-pass kernels for up to moeFewTokens
// tokens (any count in the row-exact mode) on int8 activations, as the
// linear ops' quantized GEMV: x quantized (ferrite_qx8), the gate/up kernel on it into h (n·k, inter),
// h quantized in turn into the same buffer (the gate/up kernel has read
// x's by then: a stream's launches run in order), the down kernel on it.
// It reports false, queuing nothing, where there is no room for them.
func (b *Backend) expertsFewX8(y uint64, yStride int, xp uint64, xStride int, ip, wp, h uint64, table *Buffer, kinds expertKinds,
	ne, n, k, hidden, inter int, limit float32) bool {
	// x (n, hidden), then h (n·k, inter); no room: the float32 forms
	q := b.quantX8(n*k, max(hidden, inter))
	if q == 0 {
		return false
	}
	xe := q + uint64(alignUp(int64(n)*int64(hidden), 16))
	he := q + uint64(alignUp(int64(n*k)*int64(inter), 16))
	b.queue(func(d *Device) error {
		err := d.launch3L("ferrite_qx8", [3]uint32{uint32(ceilDiv(hidden, 256)), uint32(n), 1}, 256, 0,
			q, xe, xp, i32(xStride), i32(hidden), i32(kinds.guGroup))
		if err == nil {
			err = d.launch3L("ferrite_moe_few_gate_up_1_q8", [3]uint32{uint32(ceilDiv(inter, 8)), uint32(n * k), 1}, 256, 0,
				h, q, xe, i32(hidden), ip, table.ptr, i32(ne), i32(k), i32(n*k), i32(inter), f32(limit))
		}
		if err == nil {
			err = d.launch3L("ferrite_qx8", [3]uint32{uint32(ceilDiv(inter, 256)), uint32(n * k), 1}, 256, 0,
				q, he, h, i32(inter), i32(inter), i32(kinds.dGroup))
		}
		if err != nil {
			return err
		}
		return d.launchL("ferrite_moe_few_down_1_q8", uint32(ceilDiv(hidden, moeDownRows)), 256, 0, y, i32(yStride), q, he, ip, wp,
			table.ptr, i32(ne), i32(n), i32(k), i32(inter), i32(hidden))
	})
	return true
}

// expertsMMQ runs n tokens (moeFewTokens < n ≤ most) of experts
// whose gates and ups are of one block-quantized dtype and downs of one
// (kinds.mmq) as grouped products on the tensor cores: ferrite_moe_sort
// sorts the slots by expert, ferrite_qx8 quantizes x, then
// ferrite_moe_mmq_gate_up writes each slot's SwiGLU into h, ferrite_qx8
// quantizes h (into the same buffer: x's int8 copy is read by then),
// ferrite_moe_mmq_down writes each slot's output, and ferrite_moe_combine
// adds a token's. It returns false where they do not apply; the caller
// keeps the row-exact mode off it (a token's bits are not its bits alone).
func (b *Backend) expertsMMQ(y uint64, yStride int, xp uint64, xStride int, ip, wp, h uint64, kinds expertKinds, table *Buffer,
	ne, n, k, hidden, inter, most int, limit float32) bool {
	if b.noQX8 || !kinds.mmq() || moeMMQTokens == 0 || n <= moeFewTokens || n > most || hidden%mmqChunk != 0 || inter%mmqChunk != 0 {
		return false
	}
	q := b.quantX8(n*k, max(hidden, inter)) // x (n, hidden), then h (n·k, inter)
	if q == 0 {
		return false
	}
	xe := q + uint64(alignUp(int64(n)*int64(hidden), 16))
	he := q + uint64(alignUp(int64(n*k)*int64(inter), 16))
	ye := dptr(b.Scratch(kernels.F32, n*k, hidden)) // (n·k, hidden) each slot's expert output
	off := dptr(b.Scratch(kernels.I32, 1, ne+1))    // (experts + 1) where each expert's slots start in perm
	tiles := dptr(b.Scratch(kernels.I32, 1, ne+1))  // (experts + 1) 64-slot tiles before each expert
	perm := dptr(b.Scratch(kernels.I32, 1, n*k))    // (n·k) the slots sorted by expert
	gy := uint32(ceilDiv(n*k, moeTileM) + ne)
	parts := b.combineParts(n, hidden)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_moe_sort", 1, 1024, 0, off, tiles, perm, ye, ip, i32(n*k), i32(ne), i32(hidden))
		if err == nil {
			err = d.launch3L("ferrite_qx8", [3]uint32{uint32(ceilDiv(hidden, 256)), uint32(n), 1}, 256, 0,
				q, xe, xp, i32(xStride), i32(hidden), i32(kinds.guGroup))
		}
		if err == nil {
			err = d.launch3L("ferrite_moe_mmq_gate_up", [3]uint32{uint32(ceilDiv(inter, 64)), gy, 1}, 128, 0,
				h, i32(inter), q, xe, i32(hidden), off, tiles, perm, table.ptr, i32(ne), i32(k), f32(limit))
		}
		if err == nil {
			err = d.launch3L("ferrite_qx8", [3]uint32{uint32(ceilDiv(inter, 256)), uint32(n * k), 1}, 256, 0,
				q, he, h, i32(inter), i32(inter), i32(kinds.dGroup))
		}
		if err == nil {
			err = d.launch3L("ferrite_moe_mmq_down", [3]uint32{uint32(ceilDiv(hidden, mmqRows)), gy, 1}, 128, 0,
				ye, i32(hidden), q, he, i32(inter), off, tiles, perm, table.ptr, i32(ne), i32(k))
		}
		if err != nil {
			return err
		}
		return d.moeCombine(y, yStride, ye, ip, wp, n, k, hidden, parts)
	})
	return true
}

// expertTable returns the device table of experts' weight descriptors,
// three per expert (gate, up, down), uploading the weights and the table
// on first use; it is cached per expert list. Block-quantized experts stay
// in their blocks where quantable (the grouped GEMVs and the tiled GEMMs
// read them, src/ops_common_quant.cu), else they are decoded to float32.
func (b *Backend) expertTable(experts []kernels.Expert) (*Buffer, error) {
	key := &experts[0]
	b.mu.Lock()
	t := b.experts[key]
	b.mu.Unlock()
	if t != nil {
		return t, nil
	}
	raw := make([]byte, 3*len(experts)*expertDescBytes)
	kinds := expertKinds{qbf16: true, oneDT: true}
	var roleDT [2]*kernels.DType // the dtype of the gates and ups, of the downs
	put := func(i int, m *kernels.Mat, row0 int) error {
		// A block-quantized expert keeps its blocks (linWeight), its
		// scale the address of their scale section.
		w, err := b.linWeight(m)
		if err != nil {
			return err
		}
		var scale uint64
		if w.Scale != nil {
			scale = w.Scale.ptr
		}
		if w.DType.Quantized() {
			scale, kinds.quant = w.Buf.ptr+uint64(w.DOff), true
		} else if w.DType != kernels.BF16 {
			kinds.qbf16 = false
		}
		if i%3 == 2 {
			kinds.dGroup = foldXGroup(kinds.dGroup, w.DType)
		} else {
			kinds.guGroup = foldXGroup(kinds.guGroup, w.DType)
		}
		if dt := &roleDT[i%3/2]; *dt == nil {
			*dt = &w.DType
		} else if **dt != w.DType {
			kinds.oneDT = false
		}
		d := raw[i*expertDescBytes:]
		binary.LittleEndian.PutUint64(d[0:], w.Buf.ptr)
		binary.LittleEndian.PutUint64(d[8:], scale)
		for j, v := range []int{int(w.DType), w.Rows, w.Cols, max(w.BlockRows, 1), max(w.BlockCols, 1), row0} {
			binary.LittleEndian.PutUint32(d[16+4*j:], uint32(int32(v)))
		}
		return nil
	}
	for i, ex := range experts {
		var err error
		if ex.GateUp != nil {
			inter := ex.GateUp.Rows / 2
			if err = put(3*i, ex.GateUp, 0); err == nil {
				err = put(3*i+1, ex.GateUp, inter)
			}
		} else if err = put(3*i, ex.Gate, 0); err == nil {
			err = put(3*i+1, ex.Up, 0)
		}
		if err == nil {
			err = put(3*i+2, ex.Down, 0)
		}
		if err != nil {
			return nil, err
		}
	}
	t, err := b.dev.Alloc(int64(len(raw)))
	if err == nil {
		err = t.Upload(0, raw)
	}
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.experts == nil {
		b.experts, b.qexperts = map[*kernels.Expert]*Buffer{}, map[*kernels.Expert]expertKinds{}
	}
	kinds.qbf16 = kinds.qbf16 && kinds.quant
	b.experts[key], b.qexperts[key] = t, kinds
	return t, nil
}

// moeFewTokens is the most tokens Experts may run through the grouped GEMV
// kernels of a slot a pass (src/ops_moe.cu's ferrite_moe_few_*: each chosen
// expert read once, two launches); from moe.go's moeGTFrom to moeGTTokens
// its register-tile form runs instead; more are sorted by expert and run
// as tiled grouped GEMMs of moeTileM slots (and weight rows) a block, for
// at most moeMaxExperts experts.
const (
	moeFewTokens  = 8
	moeTileM      = 64
	moeMaxExperts = 1024
)

// Experts implements kernels.MoEOps. A few tokens: the grouped gate/up
// (SwiGLU fused) and down (routing weights and the sum in increasing expert
// id fused) GEMV kernels; up to moeGTTokens their register-tile form
// (moe.go), each chosen expert's rows read once for all the tokens that
// chose it. Bf16 experts from moeConfig.tcFrom tokens to moeConfig.tc, with no
// shared expert folded in, run on the tensor cores outside the row-exact
// mode (moe_tc.go). More: the slots sorted by expert on
// the device, the gate/up (SwiGLU fused) and down tiled grouped GEMMs (on
// tensor cores, x split into three bf16 terms, when every weight is bf16),
// and a last kernel that adds each token's slots in increasing expert id.
func (b *Backend) Experts(dst, x, ids, w kernels.Tensor, experts []kernels.Expert) {
	b.runExperts(dst, x, ids, w, experts, 0)
}

// runExperts is Experts with the SwiGLU clamped at limit > 0 (ExpertsClamp).
func (b *Backend) runExperts(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, limit float32) {
	f32Contig("Experts", dst, x, w)
	if len(experts) == 0 || len(experts) > moeMaxExperts {
		panic("cuda: Experts wants 1 to 1024 experts")
	}
	n, k := x.Rows, ids.Cols
	hidden, inter := experts[0].Down.Rows, experts[0].Down.Cols
	index("Experts", ids, n, k)
	if !ids.Contiguous() {
		panic("cuda: Experts wants contiguous expert ids")
	}
	if dst.Rows != n || dst.Cols != hidden || x.Cols != hidden || w.Rows != n || w.Cols != k || k > 64 {
		panic("cuda: Experts shapes do not match")
	}
	// The tensor-core kernels take bf16 weights and widths of 32s.
	shapeMMA := !b.noMMA && hidden%32 == 0 && inter%32 == 0 && x.Stride%4 == 0
	mma := shapeMMA
	for _, ex := range experts {
		gateRows := 0
		if ex.GateUp != nil {
			gateRows = ex.GateUp.Rows / 2
			mma = mma && ex.GateUp.DType == kernels.BF16
		} else if ex.Gate != nil && ex.Up != nil && ex.Up.Rows == ex.Gate.Rows {
			gateRows = ex.Gate.Rows
			mma = mma && ex.Gate.DType == kernels.BF16 && ex.Up.DType == kernels.BF16
		}
		if ex.Down == nil || ex.Down.Rows != hidden || ex.Down.Cols != inter || gateRows != inter {
			panic("cuda: Experts of different shapes")
		}
		mma = mma && ex.Down.DType == kernels.BF16
	}
	if n == 0 {
		return
	}
	table, err := b.expertTable(experts)
	if err != nil {
		b.fail(err)
		return
	}
	b.mu.Lock()
	kinds := b.qexperts[&experts[0]]
	b.mu.Unlock()
	quant := kinds.quant
	// q names a kernel's form that also reads experts in GGML blocks.
	q := func(name string) string {
		if quant {
			return name + "_q"
		}
		return name
	}
	h := dptr(b.Scratch(kernels.F32, n*k, inter)) // (n·k, inter) SwiGLU of each slot
	if b.expertsB1(dst, x, ids, w, experts, table, h, limit) {
		return
	}
	y, xp, ip, wp := dptr(dst), dptr(x), dptr(ids), dptr(w)
	if mma && b.expertsTC(y, dst.Stride, x, ip, wp, table, experts, n, k, hidden, inter, limit) {
		return
	}
	if b.usePipe(n, k) && pipeFits(experts, hidden, inter, x.Stride) {
		b.expertsPipe(dst, x, ip, wp, h, table, len(experts), n, k, hidden, inter, limit)
		return
	}
	// The row-exact mode (a speculative verification) gives each token the
	// bits it gets alone: experts on int8 x keep to their slot-a-pass
	// kernels past moeFewTokens too (the register tiles read float32 x).
	if b.rowExact && n > moeFewTokens && quant && kinds.x8() && !b.noQX8 && !b.moe.q1 &&
		b.expertsFewX8(y, dst.Stride, xp, x.Stride, ip, wp, h, table, kinds, len(experts), n, k, hidden, inter, limit) {
		return
	}
	if quant && !b.rowExact && b.expertsMMQ(y, dst.Stride, xp, x.Stride, ip, wp, h, kinds, table, len(experts), n, k, hidden, inter, moeMMQTokens, limit) {
		return
	}
	// Block-quantized experts decode every row they read; up to
	// moeFewTokens tokens their slot-a-pass kernels, many more warps in
	// flight, beat the register tiles (323 against 426 µs a layer at 8
	// tokens, BENCHMARKS.md, 9).
	if b.moe.useGT(n, k) && (!quant || n > moeFewTokens || b.moe.tiles > 0) {
		slots, sms := n*k, b.dev.SMs
		ye := dptr(b.Scratch(kernels.F32, slots, hidden)) // (n·k, hidden) each slot's expert output
		gateUp, guRows, down, downRows := b.moe.gtLaunch()
		if quant { // one row size in the _q form
			gateUp, guRows, down, downRows = moeConfig{}.gtLaunch()
			gateUp, down = q(gateUp), q(down)
		}
		sbu := b.moe.blockSlots(slots, inter, guRows, sms)
		sbd := b.moe.blockSlots(slots, hidden, downRows, sms)
		parts := b.combineParts(n, hidden)
		b.queue(func(d *Device) error {
			err := d.launch3L(gateUp, [3]uint32{uint32(ceilDiv(inter, guRows)), uint32(ceilDiv(slots, sbu)), 1}, 256, 0,
				h, i32(inter), xp, i32(x.Stride), ip, table.ptr, i32(len(experts)), i32(k), i32(slots), i32(sbu), f32(limit))
			if err == nil {
				err = d.launch3L(down, [3]uint32{uint32(ceilDiv(hidden, downRows)), uint32(ceilDiv(slots, sbd)), 1}, 256, 0,
					ye, i32(hidden), h, i32(inter), ip, table.ptr, i32(len(experts)), i32(k), i32(slots), i32(sbd))
			}
			if err != nil {
				return err
			}
			return d.moeCombine(y, dst.Stride, ye, ip, wp, n, k, hidden, parts)
		})
		return
	}
	if n <= moeFewTokens {
		// A slot a pass (the one-token kernels; an expert two tokens share
		// is read twice, the second time from cache) measured 1.6–1.7× the
		// speed of 8 slots a pass at 4 and 8 tokens (BENCHMARKS.md, 9).
		if quant && kinds.x8() && !b.noQX8 && !b.moe.q1 &&
			b.expertsFewX8(y, dst.Stride, xp, x.Stride, ip, wp, h, table, kinds, len(experts), n, k, hidden, inter, limit) {
			return
		}
		gateUp, down, downRows := q("ferrite_moe_few_gate_up_1"), q("ferrite_moe_few_down_1"), moeDownRows
		if quant && b.moe.q1 {
			down, downRows = down+"1", 1
		}
		if n > 1 && b.moe.slots8 && !quant { // (no _8 form of the _q kernels)
			gateUp, down = q("ferrite_moe_few_gate_up_8"), q("ferrite_moe_few_down_8")
		}
		b.queue(func(d *Device) error {
			err := d.launch3L(gateUp, [3]uint32{uint32(ceilDiv(inter, 8)), uint32(n * k), 1}, 256, 0,
				h, xp, i32(x.Stride), ip, table.ptr, i32(len(experts)), i32(k), i32(n*k), i32(inter), f32(limit))
			if err != nil {
				return err
			}
			return d.launchL(down, uint32(ceilDiv(hidden, downRows)), 256, 0, y, i32(dst.Stride), h, ip, wp,
				table.ptr, i32(len(experts)), i32(n), i32(k), i32(inter), i32(hidden))
		})
		return
	}
	ne := len(experts)
	// A prefill of block-quantized experts, from as many rows as the linear
	// ops round x to bf16 for (gemmRoundRows), decodes the chosen ones
	// into bf16 (rounded: a relative 2⁻⁹ a weight) for the tensor cores.
	qdecode := kinds.qbf16 && shapeMMA && n >= gemmRoundRows && 3*ne*inter*hidden*2 <= moeDecodeMost
	// They go to the shared decode buffer (decodeBuf); where it cannot
	// grow to hold them (or they are too many), the grouped tensor-core
	// product takes them where it can (expertsMMQ, with no decoding), else
	// the CUDA-core tiles.
	tab, wbf := table.ptr, uint64(0)
	if qdecode {
		views := alignUp(int64(3*ne)*int64(inter*hidden)*2, arenaAlign)
		p, err := b.decodeBuf(views + int64(3*ne*expertDescBytes))
		if err == nil {
			wbf, tab = p, p+uint64(views) // (3·experts, inter·hidden) the chosen experts' views in bf16, then their descriptors
		}
		qdecode = err == nil
	}
	if quant && !qdecode && n >= gemmRoundRows &&
		b.expertsMMQ(y, dst.Stride, xp, x.Stride, ip, wp, h, kinds, table, ne, n, k, hidden, inter, n, limit) {
		return
	}
	ye := dptr(b.Scratch(kernels.F32, n*k, hidden)) // (n·k, hidden) each slot's expert output
	off := dptr(b.Scratch(kernels.I32, 1, ne+1))    // (experts + 1) where each expert's slots start in perm
	tiles := dptr(b.Scratch(kernels.I32, 1, ne+1))  // (experts + 1) 64-slot tiles before each expert
	perm := dptr(b.Scratch(kernels.I32, 1, n*k))    // (n·k) the slots sorted by expert
	gy := uint32(ceilDiv(n*k, moeTileM) + ne)
	gateUp, down, threads := q("ferrite_moe_tile_gate_up"), q("ferrite_moe_tile_down"), uint32(256)
	if mma || qdecode {
		gateUp, down, threads = "ferrite_moe_mma_gate_up", "ferrite_moe_mma_down", 128
	}
	parts := b.combineParts(n, hidden)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_moe_sort", 1, 1024, 0, off, tiles, perm, ye, ip, i32(n*k), i32(ne), i32(hidden))
		if err != nil {
			return err
		}
		if qdecode {
			err = d.launchL("ferrite_moe_qdecode", d.elementwiseGrid(int64(3*ne)*int64(inter*hidden/16)), 256, 0, wbf, tab, table.ptr,
				off, i32(ne), i32(inter), i32(hidden))
			if err != nil {
				return err
			}
		}
		err = d.launch3L(gateUp, [3]uint32{uint32(ceilDiv(inter, moeTileM)), gy, 1}, threads, 0,
			h, i32(inter), xp, i32(x.Stride), off, tiles, perm, tab, i32(ne), i32(k), i32(hidden), f32(limit))
		if err != nil {
			return err
		}
		err = d.launch3L(down, [3]uint32{uint32(ceilDiv(hidden, moeTileM)), gy, 1}, threads, 0,
			ye, i32(hidden), h, off, tiles, perm, tab, i32(ne), i32(k), i32(inter))
		if err != nil {
			return err
		}
		return d.moeCombine(y, dst.Stride, ye, ip, wp, n, k, hidden, parts)
	})
}
