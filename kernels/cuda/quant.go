//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math/bits"
	"os"
	"strconv"

	"github.com/ferrite-llm/ferrite/kernels"
)

// GGML block-quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: the GGUF
// files of ollama, LM Studio and llama.cpp) stay in their blocks on the
// device for the linear ops (Linear, LinearCat, SwiGLULinear and their
// norm forms), a quarter to a seventh of their float32 decoding's bytes.
// Decode steps (up to quantGemvRows rows, and a verification's rows under
// SetRowExact) run src/ops_quant.cu's GEMV over the blocks, on x
// quantized to int8 as the CPU backend quantizes it (ferrite_qx8, then
// dp4a: quantGemvL; FERRITE_CUDA_QX8=0 keeps float32 x); wider decode
// batches, up to quantMMQRows rows, multiply the blocks with that int8 x on
// the tensor cores (ferrite_qmmq_*: mma.sync s8, quantMMQL); wider products
// still (prefill) decode the weight exactly into bfloat16 scratch
// (ferrite_qbf16_*) and run the bf16 product (linearQuant): two terms
// below gemmRoundRows rows, one (a relative 2⁻⁹ a weight, as x's own
// rounding there) from then on.
// The MoE experts keep their blocks too (expertTable): src/ops_moe.cu's _q
// kernels read them through src/ops_common_quant.cu, 9 to moeMMQTokens
// tokens of experts of one dtype a role run the grouped tensor-core
// product on int8 x (expertsMMQ, ferrite_moe_mmq_*), and a prefill of
// gemmRoundRows tokens and more decodes the chosen experts into bf16 for
// the tensor cores (ferrite_moe_qdecode; where the decode buffer cannot
// hold them, expertsMMQ takes them if it can). Embed reads its table's blocks
// too (ferrite_embed_q: a row decoded as it is gathered; a tied head
// shares the upload). MLA's kv_b_proj from a GGUF keeps its halves'
// blocks (kvbWeights, ferrite_mla_proj_q); a whole quantized kv_b_proj
// keeps the float32 decoding (Backend.weight). FERRITE_CUDA_QUANT=0 decodes every
// quantized weight to float32, as before.

// quantOn is whether quantized weights keep their blocks on the device.
var quantOn = os.Getenv("FERRITE_CUDA_QUANT") != "0"

// quantGemvRows is the most rows of x the quantized GEMV takes outside the
// row-exact mode (it reads the weight once per 8 rows of x):
// FERRITE_CUDA_QGEMV_ROWS, default 8.
var quantGemvRows = func() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_QGEMV_ROWS")); err == nil && n >= 1 {
		return n
	}
	return 8
}()

// quantMMQRows is the most rows of x the tensor-core product over the
// blocks takes (from quantGemvRows + 1; 0: none, the bf16 decoding's
// product takes them): FERRITE_CUDA_MMQ_ROWS, default gemmRoundRows − 1.
var quantMMQRows = func() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_MMQ_ROWS")); err == nil && n >= 0 {
		return n
	}
	return gemmRoundRows - 1
}()

// The tensor-core product's tiles (src/ops_quant.cu's kMmqRows and
// kMmqChunk): a block's weight rows and the columns it stages at a time.
const (
	mmqRows  = 128
	mmqChunk = 128
)

// mmqInt picks the tensor-core product's integer-combining forms
// (ferrite_qmmq_*i: a K quant's runs summed in integers over a chunk of
// columns, fewer instructions a run and more registers):
// FERRITE_CUDA_MMQ_INT=1, until measured.
var mmqInt = os.Getenv("FERRITE_CUDA_MMQ_INT") == "1"

// mmqMaxSplits is the most column splits of a tensor-core product (tests
// set it to 1 for the single-split form).
var mmqMaxSplits = 16

// quantKernelNames are a type's GEMVs for one row of x (2, 4 or 8 weight
// rows a block: one1[0], [1], [2]) and for up to 8 rows of x (2 weight rows
// a block), its decoding into bfloat16, its GEMVs over int8 rows of x
// (x8one: one row, 4 weight rows a block; x8b8: up to 8, 2) and its
// tensor-core products over int8 rows of x (mmq[f][0]: 16 rows of x a
// block, mmq[f][1]: 32; f = 1 the integer-combining forms, mmqInt).
type quantKernelNames struct {
	one1        [3]string
	b8          string
	bf16        string
	x8one, x8b8 string
	mmq         [2][2]string
}

var quantKernels = map[kernels.DType]quantKernelNames{
	kernels.Q8_0: {[3]string{"ferrite_qgemv_q8_0_r2", "ferrite_qgemv_q8_0_r4", "ferrite_qgemv_q8_0_r8"}, "ferrite_qgemv_q8_0_b8", "ferrite_qbf16_q8_0", "ferrite_qgemv8_q8_0_r4", "ferrite_qgemv8_q8_0_b8",
		[2][2]string{{"ferrite_qmmq_q8_0_x16", "ferrite_qmmq_q8_0_x32"}, {"ferrite_qmmq_q8_0_x16i", "ferrite_qmmq_q8_0_x32i"}}},
	kernels.Q4_0: {[3]string{"ferrite_qgemv_q4_0_r2", "ferrite_qgemv_q4_0_r4", "ferrite_qgemv_q4_0_r8"}, "ferrite_qgemv_q4_0_b8", "ferrite_qbf16_q4_0", "ferrite_qgemv8_q4_0_r4", "ferrite_qgemv8_q4_0_b8",
		[2][2]string{{"ferrite_qmmq_q4_0_x16", "ferrite_qmmq_q4_0_x32"}, {"ferrite_qmmq_q4_0_x16i", "ferrite_qmmq_q4_0_x32i"}}},
	kernels.Q4K: {[3]string{"ferrite_qgemv_q4_k_r2", "ferrite_qgemv_q4_k_r4", "ferrite_qgemv_q4_k_r8"}, "ferrite_qgemv_q4_k_b8", "ferrite_qbf16_q4_k", "ferrite_qgemv8_q4_k_r4", "ferrite_qgemv8_q4_k_b8",
		[2][2]string{{"ferrite_qmmq_q4_k_x16", "ferrite_qmmq_q4_k_x32"}, {"ferrite_qmmq_q4_k_x16i", "ferrite_qmmq_q4_k_x32i"}}},
	kernels.Q5K: {[3]string{"ferrite_qgemv_q5_k_r2", "ferrite_qgemv_q5_k_r4", "ferrite_qgemv_q5_k_r8"}, "ferrite_qgemv_q5_k_b8", "ferrite_qbf16_q5_k", "ferrite_qgemv8_q5_k_r4", "ferrite_qgemv8_q5_k_b8",
		[2][2]string{{"ferrite_qmmq_q5_k_x16", "ferrite_qmmq_q5_k_x32"}, {"ferrite_qmmq_q5_k_x16i", "ferrite_qmmq_q5_k_x32i"}}},
	kernels.Q6K: {[3]string{"ferrite_qgemv_q6_k_r2", "ferrite_qgemv_q6_k_r4", "ferrite_qgemv_q6_k_r8"}, "ferrite_qgemv_q6_k_b8", "ferrite_qbf16_q6_k", "ferrite_qgemv8_q6_k_r4", "ferrite_qgemv8_q6_k_b8",
		[2][2]string{{"ferrite_qmmq_q6_k_x16", "ferrite_qmmq_q6_k_x32"}, {"ferrite_qmmq_q6_k_x16i", "ferrite_qmmq_q6_k_x32i"}}},
}

func init() {
	for _, k := range quantKernels {
		for _, name := range []string{k.one1[0], k.one1[1], k.one1[2], k.b8, k.bf16, k.x8one, k.x8b8, k.mmq[0][0], k.mmq[0][1], k.mmq[1][0],
			k.mmq[1][1]} {
			kernelNames = append(kernelNames, name)
			pdlKernels[name] = true
		}
	}
	for _, name := range []string{"ferrite_qx8", "ferrite_qmmq_sum", "ferrite_embed_q"} {
		kernelNames = append(kernelNames, name)
		pdlKernels[name] = true
	}
}

// quantRowsPerBlock is the one-row quantized GEMV's weight rows a block
// of 4 warps (2, 4 or 8; FERRITE_CUDA_QGEMV_R), all of them loaded before
// any is multiplied.
var quantRowsPerBlock = func() int {
	switch os.Getenv("FERRITE_CUDA_QGEMV_R") {
	case "2":
		return 2
	case "8":
		return 8
	}
	return 4
}()

// quantSplit is how dt's device layout splits a block: the keep bytes
// from qAt on stay in the first section, the float16 scale d at dAt moves
// to a section of its own (so that every load is 16-byte aligned), where
// split; Q4_K and Q5_K blocks stay whole.
type quantSplit struct {
	split          bool
	keep, qAt, dAt int
}

func quantSplitOf(dt kernels.DType) quantSplit {
	switch dt {
	case kernels.Q8_0:
		return quantSplit{true, 32, 2, 0}
	case kernels.Q4_0:
		return quantSplit{true, 16, 2, 0}
	case kernels.Q6K:
		return quantSplit{true, 208, 0, 208}
	}
	return quantSplit{keep: dt.BlockBytes()}
}

// quantLayout returns the rows of ms (one block-quantized dtype, one
// width) one after another in src/ops_quant.cu's device layout, and the
// byte offset of its scale section (0 where the blocks keep their scales):
// Q4_K and Q5_K blocks as they are; Q8_0, Q4_0 and Q6_K blocks without
// their float16 scale d, which moves, block by block, to the section after
// the rows (16-byte aligned). The layout loses nothing (quantUnlayout).
// One Q4_K or Q5_K matrix is returned as its own Data, not copied.
func quantLayout(ms []*kernels.Mat) (data []byte, dsec int64) {
	dt, cols := ms[0].DType, ms[0].Cols
	be, bb := dt.BlockElems(), dt.BlockBytes()
	sp := quantSplitOf(dt)
	rows := 0
	for _, m := range ms {
		rows += m.Rows
	}
	blocks := rows * (cols / be)
	if !sp.split && len(ms) == 1 { // the blocks as they are: no copy of (often memory-mapped) bytes
		return ms[0].Data[:blocks*bb], 0
	}
	if !sp.split {
		data = make([]byte, 0, blocks*bb)
		for _, m := range ms {
			data = append(data, m.Data[:m.Rows*dt.RowBytes(cols)]...)
		}
		return data, 0
	}
	dsec = int64(blocks*sp.keep+15) &^ 15
	data = make([]byte, dsec+int64(2*blocks))
	i := 0
	for _, m := range ms {
		for b := range m.Rows * (cols / be) {
			blk := m.Data[b*bb : (b+1)*bb]
			copy(data[i*sp.keep:(i+1)*sp.keep], blk[sp.qAt:sp.qAt+sp.keep])
			copy(data[dsec+int64(2*i):], blk[sp.dAt:sp.dAt+2])
			i++
		}
	}
	return data, dsec
}

// quantUnlayout is quantLayout's inverse: the GGML blocks of rows rows
// of cols elements of dt from their device layout (for tests).
func quantUnlayout(dt kernels.DType, rows, cols int, data []byte, dsec int64) []byte {
	sp := quantSplitOf(dt)
	if !sp.split {
		return data[:rows*dt.RowBytes(cols)]
	}
	bb := dt.BlockBytes()
	blocks := rows * (cols / dt.BlockElems())
	out := make([]byte, blocks*bb)
	for i := range blocks {
		blk := out[i*bb : (i+1)*bb]
		copy(blk[sp.qAt:sp.qAt+sp.keep], data[i*sp.keep:(i+1)*sp.keep])
		copy(blk[sp.dAt:sp.dAt+2], data[dsec+int64(2*i):dsec+int64(2*i)+2])
	}
	return out
}

// quantWidthOK reports whether rows of cols elements of dt can keep their
// blocks on the device: whole blocks, and rows whose device bytes are a
// multiple of 16 (the GEMV's aligned loads).
func quantWidthOK(dt kernels.DType, cols int) bool {
	if !dt.Quantized() || cols <= 0 || cols%dt.BlockElems() != 0 || cols%32 != 0 {
		return false
	}
	return cols/dt.BlockElems()*quantSplitOf(dt).keep%16 == 0
}

// UploadQuant copies ms (block-quantized, one width; dtypes may differ) to
// the device in their blocks, stacked by rows: one Weight of ms's dtype,
// or, for several dtypes (a Q4_K_M file's q, k and v), a Weight whose
// Segs are one per run of equal dtypes. The caller frees it with Free.
func (d *Device) UploadQuant(ms []*kernels.Mat) (*Weight, error) {
	var segs [][]*kernels.Mat
	for i, m := range ms {
		if !quantWidthOK(m.DType, m.Cols) || m.Cols != ms[0].Cols {
			return nil, fmt.Errorf("cuda: no quantized GEMV for %v rows of %d", m.DType, m.Cols)
		}
		if m.Data == nil {
			return nil, fmt.Errorf("cuda: quantized %v weight without data", m.DType)
		}
		if i == 0 || m.DType != ms[i-1].DType {
			segs = append(segs, nil)
		}
		segs[len(segs)-1] = append(segs[len(segs)-1], m)
	}
	upload := func(ms []*kernels.Mat) (*Weight, error) {
		data, dsec := quantLayout(ms)
		w := &Weight{DType: ms[0].DType, Cols: ms[0].Cols, DOff: dsec}
		for _, m := range ms {
			w.Rows += m.Rows
		}
		var err error
		if w.Buf, err = d.Alloc(int64(len(data))); err != nil {
			return nil, err
		}
		if err = w.Buf.Upload(0, data); err != nil {
			w.Free()
			return nil, err
		}
		return w, nil
	}
	if len(segs) == 1 {
		return upload(segs[0])
	}
	w := &Weight{DType: ms[0].DType, Cols: ms[0].Cols}
	for _, s := range segs {
		sw, err := upload(s)
		if err != nil {
			w.Free()
			return nil, err
		}
		w.Segs = append(w.Segs, sw)
		w.Rows += sw.Rows
	}
	return w, nil
}

// quantable reports whether ms keep their blocks on the device.
func quantable(ms ...*kernels.Mat) bool {
	if !quantOn {
		return false
	}
	for _, m := range ms {
		if !quantWidthOK(m.DType, m.Cols) || m.Data == nil || m.Transient {
			return false
		}
	}
	return true
}

// segs is w's parts of one dtype each: w itself unless it is a stack of
// several.
func (w *Weight) segs() []*Weight {
	if w.Segs != nil {
		return w.Segs
	}
	return []*Weight{w}
}

// quantX8Bytes is the device bytes of n rows of x of cols values
// quantized to int8 (ferrite_qx8): the values, then a (d, Σq) pair per 16
// columns.
func quantX8Bytes(n, cols int) int64 {
	return alignUp(int64(n)*int64(cols), 16) + int64(n)*int64(cols/16)*8
}

// quantXGroup is the columns that share one scale when x is quantized to
// int8 for weights of dt: a K quant's super-block, else a block of 32 (the
// CPU backend's xGroup).
func quantXGroup(dt kernels.DType) int {
	if dt.BlockElems() == 256 {
		return 256
	}
	return 32
}

// quantGemvL queues y (n, w.Rows) = x · wᵀ (+ bias) (+ y) for a quantized
// w, a GEMV launch per segment into its columns of y. Where xq is not 0
// (quantX8Bytes(n, w.Cols) bytes), x is first quantized to int8 there
// (quantXL) and the GEMVs multiply it with dp4a, as the CPU backend
// does; else they multiply x's float32 values.
func (d *Device) quantGemvL(y, x, bias uint64, w *Weight, n int, acc bool, xq uint64) error {
	q := quantX{xq: xq, xe: xq + uint64(alignUp(int64(n)*int64(w.Cols), 16))}
	return eachSeg(w, func(s *Weight, k quantKernelNames, c0 int) error {
		sb := uint64(0)
		if bias != 0 {
			sb = bias + uint64(4*c0)
		}
		if xq != 0 {
			if err := q.quantize(d, x, s, n); err != nil {
				return err
			}
			name, r := k.x8b8, 2 // up to 8 rows of x at once
			if n == 1 {
				name, r = k.x8one, 4
			}
			return d.launchL(name, uint32(ceilDiv(s.Rows, r)), 128, 0, y+uint64(4*c0), q.xq, q.xe, s.Buf.ptr, s.Buf.ptr+uint64(s.DOff),
				i32(n), i32(s.Rows), i32(s.Cols), i32(w.Rows), sb, b32(acc))
		}
		name, r := k.b8, 2 // up to 8 rows of x at once
		if n == 1 {
			name, r = k.one1[bits.Len(uint(quantRowsPerBlock))-2], quantRowsPerBlock
		}
		return d.launchL(name, uint32(ceilDiv(s.Rows, r)), 128, 0, y+uint64(4*c0), x, s.Buf.ptr, s.Buf.ptr+uint64(s.DOff),
			i32(n), i32(s.Rows), i32(s.Cols), i32(w.Rows), sb, b32(acc))
	})
}

// eachSeg calls f for each of the quantized w's segments (segs) with its
// dtype's kernels and its first column in w's rows of output, in order,
// until f fails.
func eachSeg(w *Weight, f func(s *Weight, k quantKernelNames, c0 int) error) error {
	c0 := 0
	for _, s := range w.segs() {
		k, ok := quantKernels[s.DType]
		if !ok {
			return fmt.Errorf("cuda: no quantized kernels for %v", s.DType)
		}
		if err := f(s, k, c0); err != nil {
			return err
		}
		c0 += s.Rows
	}
	return nil
}

// quantX is where x goes quantized to int8 (quantX8Bytes: the values at
// xq, the (d, Σq) pairs at xe) and the scale group it was last quantized
// for (0: not yet).
type quantX struct {
	xq, xe uint64
	group  int
}

// quantize queues ferrite_qx8 of x's n rows for the segment s, unless x
// is already there for s's scale group.
func (q *quantX) quantize(d *Device, x uint64, s *Weight, n int) error {
	g := quantXGroup(s.DType)
	if g == q.group {
		return nil
	}
	q.group = g
	return d.launch3L("ferrite_qx8", [3]uint32{uint32(ceilDiv(s.Cols, 256)), uint32(n), 1}, 256, 0,
		q.xq, q.xe, x, i32(s.Cols), i32(s.Cols), i32(g))
}

// mmqSplits is how many column splits the tensor-core product of a rows ×
// cols weight takes: enough blocks for two a multiprocessor, at most one
// chunk of columns a split and mmqMaxSplits. It depends on the weight's
// shape only, so a row of x gets the same bits in any batch.
func (d *Device) mmqSplits(rows, cols int) int {
	return max(1, min(ceilDiv(2*d.SMs, ceilDiv(rows, mmqRows)), cols/mmqChunk, mmqMaxSplits))
}

// quantMMQL queues y (n, w.Rows) = x · wᵀ (+ bias) (+ y) for a quantized
// w on the tensor cores: x quantized to int8 at xq (quantX8Bytes(n,
// w.Cols) bytes), then a ferrite_qmmq launch per segment; with more than
// one split (mmqSplits), each writes its sums to ws (splits·n, w.Rows) and
// ferrite_qmmq_sum adds them into y.
func (d *Device) quantMMQL(y, x, bias uint64, w *Weight, n int, acc bool, xq, ws uint64, splits int) error {
	q := quantX{xq: xq, xe: xq + uint64(alignUp(int64(n)*int64(w.Cols), 16))}
	err := eachSeg(w, func(s *Weight, k quantKernelNames, c0 int) error {
		if err := q.quantize(d, x, s, n); err != nil {
			return err
		}
		f := 0
		if mmqInt {
			f = 1
		}
		name, xr := k.mmq[f][1], 32
		if n <= 16 {
			name, xr = k.mmq[f][0], 16
		}
		sb := uint64(0)
		if bias != 0 && splits == 1 {
			sb = bias + uint64(4*c0)
		}
		wsp := uint64(0)
		if ws != 0 {
			wsp = ws + uint64(4*c0)
		}
		grid := [3]uint32{uint32(ceilDiv(s.Rows, mmqRows)), uint32(ceilDiv(n, xr)), uint32(splits)}
		return d.launch3L(name, grid, 128, 0, y+uint64(4*c0), wsp, q.xq, q.xe, s.Buf.ptr, s.Buf.ptr+uint64(s.DOff),
			i32(n), i32(s.Rows), i32(s.Cols), i32(w.Rows), sb, b32(acc && splits == 1))
	})
	if err != nil {
		return err
	}
	if splits == 1 {
		return nil
	}
	out := int64(n) * int64(w.Rows)
	return d.launchL("ferrite_qmmq_sum", uint32(ceilDiv(int(out), 256)), 256, 0, y, ws, bias, i32(n), i32(w.Rows), i32(w.Rows),
		i32(splits), b32(acc))
}

// quantX8 returns the buffer for n int8 rows of x of cols values
// (quantGemvL's, the experts' _q8 kernels'), or 0 where they multiply
// float32 x (FERRITE_CUDA_QX8=0, or no room).
func (b *Backend) quantX8(n, cols int) uint64 {
	if b.noQX8 {
		return 0
	}
	xq, err := b.qxBuf(quantX8Bytes(n, cols))
	if err != nil {
		return 0
	}
	return xq
}

// quantBF16L queues the exact decoding of w, rounded to bfloat16, into
// hi (w.Rows, w.Cols) and, when lo is not 0, the rest rounded to bfloat16
// into lo.
func (d *Device) quantBF16L(hi, lo uint64, w *Weight) error {
	return eachSeg(w, func(s *Weight, k quantKernelNames, r0 int) error {
		off, lp := uint64(2*r0*s.Cols), uint64(0)
		if lo != 0 {
			lp = lo + off
		}
		parts := int64(s.Rows) * int64(s.Cols/32)
		return d.launchL(k.bf16, d.elementwiseGrid(parts), 256, 0, hi+off, lp, s.Buf.ptr, s.Buf.ptr+uint64(s.DOff), i32(s.Rows), i32(s.Cols))
	})
}

// linearQuant is linearW for a quantized w: the GEMV over its blocks for
// up to quantGemvRows rows of x (any rows under SetRowExact), the
// tensor-core product over its blocks up to quantMMQRows (mmqFits); else w
// decoded into the shared decode buffer (decodeBuf) for linearW's bf16
// product: in two terms, hi and lo (about float32 accuracy, as linearW's
// split x) below gemmRoundRows rows, in one from there on, where x is
// rounded to bf16 too.
func (b *Backend) linearQuant(y, x, bias uint64, w *Weight, n int, acc bool) {
	if b.rowExact || n <= quantGemvRows {
		xq := b.quantX8(n, w.Cols)
		b.queue(func(d *Device) error { return d.quantGemvL(y, x, bias, w, n, acc, xq) })
		return
	}
	if b.mmqFits(n, w.Cols) {
		if xq := b.quantX8(n, w.Cols); xq != 0 {
			splits, ws := b.dev.mmqSplits(w.Rows, w.Cols), uint64(0)
			if splits > 1 {
				ws = dptr(b.Scratch(kernels.F32, splits*n, w.Rows)) // (splits·n, rows) each split's sums
			}
			b.queue(func(d *Device) error { return d.quantMMQL(y, x, bias, w, n, acc, xq, ws, splits) })
			return
		}
	}
	view := func(p uint64) *Weight {
		return &Weight{Buf: &Buffer{dev: b.dev, ptr: p, size: int64(w.Rows) * int64(w.Cols) * 2}, DType: kernels.BF16, Rows: w.Rows, Cols: w.Cols}
	}
	// hi, lo (rows, cols): w decoded, bf16 terms, in the shared decode buffer
	terms, half := int64(1), alignUp(int64(w.Rows)*int64(w.Cols)*2, arenaAlign)
	if n < gemmRoundRows {
		terms = 2
	}
	hi, err := b.decodeBuf(terms * half)
	if err != nil { // no room for the decoding: the GEMV takes any rows, slower
		xq := b.quantX8(n, w.Cols)
		b.queue(func(d *Device) error { return d.quantGemvL(y, x, bias, w, n, acc, xq) })
		return
	}
	lo := uint64(0)
	if terms == 2 {
		lo = hi + uint64(half)
	}
	b.queue(func(d *Device) error { return d.quantBF16L(hi, lo, w) })
	b.linearW(y, x, bias, view(hi), n, acc)
	if lo != 0 {
		b.linearW(y, x, 0, view(lo), n, true)
	}
}

// mmqFits reports whether n rows of x of cols values take the
// tensor-core product over a quantized weight's blocks outside the
// row-exact mode: int8 x on, more rows than the GEMV's and at most
// quantMMQRows, whole column chunks.
func (b *Backend) mmqFits(n, cols int) bool {
	return !b.noQX8 && n > quantGemvRows && n <= quantMMQRows && cols%mmqChunk == 0
}

// x8Rows reports whether a product of n rows of x (cols values) over a
// quantized weight multiplies x quantized to int8 (the GEMV's and the
// tensor-core product's rows), outside the row-exact mode.
func (b *Backend) x8Rows(n, cols int) bool {
	return !b.noQX8 && (n <= quantGemvRows || b.mmqFits(n, cols))
}

// linWeight is weight for the linear ops: a quantized m's blocks
// (UploadQuant) where quantable, else weight's copy.
func (b *Backend) linWeight(m *kernels.Mat) (*Weight, error) {
	if !quantable(m) {
		return b.weight(m)
	}
	return cachedWeight(b, &b.qweights, m, func() (*Weight, error) { return b.dev.UploadQuant([]*kernels.Mat{m}) })
}
