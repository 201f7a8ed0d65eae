//go:build linux && (amd64 || arm64)

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Weight is a weight matrix in device memory, the device twin of
// kernels.Mat: Buf holds (Rows, Cols) elements of DType, row-major; an
// F8E4M3 weight also has Scale, (ceil(Rows/BlockRows), ceil(Cols/BlockCols))
// float32 block scales.
type Weight struct {
	Buf                  *Buffer
	DType                kernels.DType
	Rows, Cols           int
	Scale                *Buffer
	BlockRows, BlockCols int

	// Block-quantized weights (quant.go): DOff is the byte offset in Buf of
	// the scale section of src/ops_quant.cu's layout; Segs, when set, are
	// the parts of a stack of several dtypes (one each, rows in order), and
	// Buf is nil.
	DOff int64
	Segs []*Weight
}

// UploadMat copies m to the device, or generates there the values of a
// Random m without Data (FillRandom). The caller frees the Weight with Free.
func (d *Device) UploadMat(m *kernels.Mat) (*Weight, error) {
	if m.DType.Quantized() {
		// No GPU kernels for GGML blocks yet: decode them exactly to
		// float32 once, on the host, and run the float32 GEMV.
		m = dequantize(m)
	}
	size := m.DType.Size()
	if size == 0 {
		return nil, fmt.Errorf("cuda: no kernels for %v weights", m.DType)
	}
	bytes := int64(m.Rows) * int64(m.Cols) * int64(size)
	w := &Weight{DType: m.DType, Rows: m.Rows, Cols: m.Cols, BlockRows: m.BlockRows, BlockCols: m.BlockCols}
	var err error
	if w.Buf, err = d.Alloc(max(bytes, 1)); err != nil {
		return nil, err
	}
	if m.Data == nil && m.Random != nil {
		err = d.FillRandom(w.Buf, 0, bytes, m.DType, *m.Random)
	} else {
		err = w.Buf.Upload(0, m.Data[:bytes])
	}
	if err == nil && m.DType == kernels.F8E4M3 {
		ns := ceilDiv(m.Rows, m.BlockRows) * ceilDiv(m.Cols, m.BlockCols)
		if w.Scale, err = d.Alloc(int64(max(ns, 1)) * 4); err == nil {
			err = w.Scale.UploadF32(0, m.Scale[:ns])
		}
	}
	if err != nil {
		w.Free()
		return nil, err
	}
	return w, nil
}

// UploadStack copies ms, weights of one width and dtype, to the device
// as one matrix of their rows stacked in order. Quantized weights are
// decoded to float32 (as UploadMat does), and so are F8E4M3 weights whose
// scale blocks would straddle two of them. The caller frees the Weight.
func (d *Device) UploadStack(ms []*kernels.Mat) (*Weight, error) {
	first := ms[0]
	decode := false
	rows := 0
	for i, m := range ms {
		// Quantized weights of several dtypes (a Q4_K_M file's q, k and v),
		// or beside float ones, stack as their float32 decoding.
		mixedQuant := m.DType.Quantized() || first.DType.Quantized()
		if m.Cols != first.Cols || (m.DType != first.DType && !mixedQuant) || m.BlockRows != first.BlockRows || m.BlockCols != first.BlockCols {
			return nil, fmt.Errorf("cuda: cannot stack %v (%d, %d) onto %v (%d, %d)", m.DType, m.Rows, m.Cols, first.DType, first.Rows, first.Cols)
		}
		decode = decode || m.DType.Quantized() || (m.DType == kernels.F8E4M3 && i < len(ms)-1 && m.Rows%m.BlockRows != 0)
		rows += m.Rows
	}
	dt := first.DType
	if decode {
		dt = kernels.F32
	}
	size := int64(dt.Size())
	w := &Weight{DType: dt, Rows: rows, Cols: first.Cols}
	var err error
	if w.Buf, err = d.Alloc(max(int64(rows)*int64(first.Cols)*size, 1)); err != nil {
		return nil, err
	}
	var scales []float32
	off := int64(0)
	for _, m := range ms {
		if decode {
			m = dequantize(m)
		}
		bytes := int64(m.Rows) * int64(m.Cols) * size
		if m.Data == nil && m.Random != nil {
			err = d.FillRandom(w.Buf, off, bytes, m.DType, *m.Random)
		} else {
			err = w.Buf.Upload(off, m.Data[:bytes])
		}
		if err != nil {
			break
		}
		off += bytes
		if dt == kernels.F8E4M3 {
			scales = append(scales, m.Scale[:ceilDiv(m.Rows, m.BlockRows)*ceilDiv(m.Cols, m.BlockCols)]...)
		}
	}
	if err == nil && dt == kernels.F8E4M3 {
		w.BlockRows, w.BlockCols = first.BlockRows, first.BlockCols
		if w.Scale, err = d.Alloc(int64(max(len(scales), 1)) * 4); err == nil {
			err = w.Scale.UploadF32(0, scales)
		}
	}
	if err != nil {
		w.Free()
		return nil, err
	}
	return w, nil
}

// Bytes is the device memory the weight takes.
func (w *Weight) Bytes() int64 {
	n := int64(0)
	for _, s := range w.Segs {
		n += s.Bytes()
	}
	if w.Buf != nil {
		n += w.Buf.Size()
	}
	if w.Scale != nil {
		n += w.Scale.Size()
	}
	return n
}

// Free releases the weight's device memory.
func (w *Weight) Free() error {
	err := w.Buf.Free()
	if e := w.Scale.Free(); err == nil {
		err = e
	}
	for _, s := range w.Segs {
		if e := s.Free(); err == nil {
			err = e
		}
	}
	return err
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// dequantize returns m's values as an F32 matrix (kernels.Mat.RowF32, the
// exact decoding).
func dequantize(m *kernels.Mat) *kernels.Mat {
	f := &kernels.Mat{DType: kernels.F32, Rows: m.Rows, Cols: m.Cols, Data: make([]byte, m.Rows*m.Cols*4)}
	row := make([]float32, m.Cols)
	for r := range m.Rows {
		m.RowF32(row, r)
		for i, v := range row {
			binary.LittleEndian.PutUint32(f.Data[(r*m.Cols+i)*4:], math.Float32bits(v))
		}
	}
	return f
}

// gemvBlock is the GEMV kernels' block size, 8 warps: one output row each,
// or gemvSplit warps per row in the n = 1 kernels (F8E4M3 excepted).
const (
	gemvBlock = 256
	gemvSplit = 4
)

// Linear queues y (n, w.Rows) = x (n, w.Cols) · wᵀ with float32 x and y and
// float32 accumulation (the decode GEMV; exact weight decoding, so the
// result differs from kernels.MatMulRef only in summation order).
// x and y are float32 buffers at element offset 0.
func (d *Device) Linear(y, x *Buffer, w *Weight, n int) error {
	if err := linearArgs(y, x, w, n); err != nil {
		return err
	}
	return d.do(func() error { return d.linearL(y.ptr, x.ptr, w, n, 0, false) })
}

func linearArgs(y, x *Buffer, w *Weight, n int) error {
	if n < 0 || w == nil {
		return fmt.Errorf("cuda: Linear with n=%d, weight %v", n, w)
	}
	if err := x.span(0, int64(n)*int64(w.Cols)*4); err != nil {
		return fmt.Errorf("Linear x: %w", err)
	}
	if err := y.span(0, int64(n)*int64(w.Rows)*4); err != nil {
		return fmt.Errorf("Linear y: %w", err)
	}
	return nil
}

// linearL launches the GEMV for device addresses y and x, adding the
// float32 bias at device address bias (0 for none) and, with acc, the old y.
func (d *Device) linearL(y, x uint64, w *Weight, n int, bias uint64, acc bool) error {
	if n == 0 || w.Rows == 0 {
		return nil
	}
	nb := 1 // kernels for n = 1 (decode) and for n in chunks of 8
	if n > 1 {
		nb = 0
	}
	grid := uint32(ceilDiv(w.Rows, gemvBlock/32))
	switch w.DType {
	case kernels.F32, kernels.BF16, kernels.F16:
		name := gemvKernels[w.DType][nb]
		switch {
		case n == 1 && d.gemvRows > 0: // gemvRows rows a block
			name, grid = gemvRowsKernels[w.DType][d.gemvRows/8], uint32(ceilDiv(w.Rows, d.gemvRows))
		case n == 1: // four warps a row
			grid = uint32(ceilDiv(w.Rows, gemvBlock/32/gemvSplit))
		}
		// The last argument, the weight prefetch, only the split kernels read (pdl.go).
		return d.launchL(name, grid, gemvBlock, 0, y, x, w.Buf.ptr, i32(n), i32(w.Rows), i32(w.Cols), bias, b32(acc), i32(d.prefetchBlocks()))
	case kernels.F8E4M3:
		if w.BlockRows <= 0 || w.BlockCols <= 0 || w.Scale == nil {
			return fmt.Errorf("cuda: F8E4M3 weight without block scales")
		}
		return d.launchL(gemvKernels[w.DType][nb], grid, gemvBlock, 0,
			y, x, w.Buf.ptr, w.Scale.ptr, i32(n), i32(w.Rows), i32(w.Cols), i32(w.BlockRows), i32(w.BlockCols), bias, b32(acc))
	}
	return fmt.Errorf("cuda: no GEMV for %v weights", w.DType)
}

// linearExactL queues y (n, w.Rows) = x·wᵀ (+ bias) (+ y when acc) with
// every row summed as the n = 1 GEMV (four warps a row) sums it alone
// (Backend.SetRowExact); F8E4M3 weights' GEMV already is.
func (d *Device) linearExactL(y, x uint64, w *Weight, n int, bias uint64, acc bool) error {
	name, ok := gemvExactKernels[w.DType]
	if !ok || n == 0 || w.Rows == 0 {
		return d.linearL(y, x, w, n, bias, acc)
	}
	grid := uint32(ceilDiv(w.Rows, gemvBlock/32/gemvSplit))
	return d.launchL(name, grid, gemvBlock, 0, y, x, w.Buf.ptr, i32(n), i32(w.Rows), i32(w.Cols), bias, b32(acc), i32(d.prefetchBlocks()))
}

// gemvExactKernels names the GEMVs of linearExactL per dtype.
var gemvExactKernels = map[kernels.DType]string{
	kernels.F32: "ferrite_gemv_f32_x", kernels.BF16: "ferrite_gemv_bf16_x", kernels.F16: "ferrite_gemv_f16_x",
}

// gemvKernels names each dtype's GEMV kernels: [0] for n rows of x in
// chunks of 8, [1] for n = 1.
var gemvKernels = map[kernels.DType][2]string{
	kernels.F32:    {"ferrite_gemv_f32_8", "ferrite_gemv_f32_1"},
	kernels.BF16:   {"ferrite_gemv_bf16_8", "ferrite_gemv_bf16_1"},
	kernels.F16:    {"ferrite_gemv_f16_8", "ferrite_gemv_f16_1"},
	kernels.F8E4M3: {"ferrite_gemv_f8e4m3_8", "ferrite_gemv_f8e4m3_1"},
}

// gemvRowsKernels names the n = 1 GEMVs of R rows a block (gemv_rows):
// [0] for R = 4, [1] for R = 8.
var gemvRowsKernels = map[kernels.DType][2]string{
	kernels.F32:  {"ferrite_gemv_f32_r4", "ferrite_gemv_f32_r8"},
	kernels.BF16: {"ferrite_gemv_bf16_r4", "ferrite_gemv_bf16_r8"},
	kernels.F16:  {"ferrite_gemv_f16_r4", "ferrite_gemv_f16_r8"},
}

// gemvRowsDefault is a new Device's GEMV variant at n = 1:
// FERRITE_CUDA_GEMV_ROWS=4 or 8 picks gemv_rows with that many rows a
// block; anything else the four-warps-a-row gemv_split.
func gemvRowsDefault() int {
	switch os.Getenv("FERRITE_CUDA_GEMV_ROWS") {
	case "4":
		return 4
	case "8":
		return 8
	}
	return 0
}

// SetGEMVRows picks the n = 1 GEMV for later launches: 4 or 8 rows a
// block (gemv_rows), 0 for four warps a row (gemv_split). A switch for
// benchmarks and tests.
func (d *Device) SetGEMVRows(r int) {
	if r != 0 && r != 4 && r != 8 {
		panic("cuda: SetGEMVRows wants 0, 4 or 8")
	}
	d.do(func() error { d.gemvRows = r; return nil })
}

// RMSNorm queues y = w ⊙ x·rsqrt(mean(x²) + eps) (or (1 + w) ⊙ … with
// offset) over rows rows of dim float32 values; w holds dim float32. y may
// be x.
func (d *Device) RMSNorm(y, x, w *Buffer, rows, dim int, eps float32, offset bool) error {
	if rows < 0 || dim <= 0 {
		return fmt.Errorf("cuda: RMSNorm of %d rows of %d", rows, dim)
	}
	for _, c := range []struct {
		b *Buffer
		n int
	}{{y, rows * dim}, {x, rows * dim}, {w, dim}} {
		if err := c.b.span(0, int64(c.n)*4); err != nil {
			return fmt.Errorf("RMSNorm: %w", err)
		}
	}
	off := 0
	if offset {
		off = 1
	}
	return d.do(func() error {
		return d.launchL("ferrite_rmsnorm_f32", uint32(rows), 256, 0, y.ptr, x.ptr, w.ptr, i32(rows), i32(dim), f32(eps), i32(off))
	})
}

// elementwiseGrid is the grid for n elements of a grid-stride kernel.
func (d *Device) elementwiseGrid(n int64) uint32 {
	return uint32(min(ceilDiv(int(n), 256), d.SMs*32))
}

// ToBF16 queues dst[i] = bf16(src[i]) (round to nearest even) for n
// elements: src float32, dst bfloat16.
func (d *Device) ToBF16(dst, src *Buffer, n int) error {
	if err := src.span(0, int64(n)*4); err != nil {
		return err
	}
	if err := dst.span(0, int64(n)*2); err != nil {
		return err
	}
	return d.do(func() error {
		return d.launchL("ferrite_f32_to_bf16", d.elementwiseGrid(int64(n)), 256, 0, dst.ptr, src.ptr, uint64(n))
	})
}

// FillRandom queues the first bytes bytes of the kernels.RandomFill f of
// dtype dt (F32, BF16 or F16) into dst from byte off on: the bytes f.Fill
// writes on the host, generated on the device (src/randfill.cu).
func (d *Device) FillRandom(dst *Buffer, off, bytes int64, dt kernels.DType, f kernels.RandomFill) error {
	if dt != kernels.F32 && dt != kernels.BF16 && dt != kernels.F16 {
		return fmt.Errorf("cuda: no random fill for %v", dt)
	}
	if err := dst.span(off, bytes); err != nil {
		return err
	}
	words := ceilDiv(int(bytes), 4)
	return d.do(func() error {
		return d.launchL("ferrite_random_fill", d.elementwiseGrid(int64(words)), 256, 0, dst.ptr+uint64(off), uint64(bytes), f.Seed,
			i32(int(dt)), i32(f.Top))
	})
}

// FillBF16 queues n bfloat16 values uniform in [-scale, scale), a hash of
// (seed, index), into dst: random weights generated where they are used.
func (d *Device) FillBF16(dst *Buffer, n int64, seed uint64, scale float32) error {
	if err := dst.span(0, n*2); err != nil {
		return err
	}
	return d.do(func() error {
		return d.launchL("ferrite_fill_bf16", d.elementwiseGrid(n), 256, 0, dst.ptr, uint64(n), seed, f32(scale))
	})
}
