package cpu

import (
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Prefill on the bf16 path runs on AMX where the CPU has it: TDPBF16PS
// multiplies a 16×32 bf16 tile by a 32×16 one into 16×16 float32 sums,
// 8192 multiply-adds an instruction. The weights are the A tiles, loaded in
// place (16 rows of 32 columns, row stride 2·cols bytes); x, rounded to
// bfloat16 once per MatMul, is packed into the B tiles' pairs layout (per
// 16 x rows and 32 columns, a 16×16 dword transpose); each 32×32 block of
// results is transposed back into y. The kernel (amxBF16) takes one block
// of 32 weight rows against all 32-row blocks of a task's x rows.

const (
	// amxMinRows is the fewest x rows that take AMX for BF16 weights (a
	// batch-8 decode step is one: 1.1× the float tiles at n = 8, 2.6× at
	// 16 in BenchmarkMatMulBF16; at 4 they are even).
	amxMinRows = 8
	// amxMinRowsQuant is the same for quantized weights, which pay for
	// the dequantization once per call: the int8 tiles win up to about
	// 100 rows (Q4_K 3072×1024: 5.7 against 12.5 ms at n = 64, 21 against
	// 12 ms at 128).
	amxMinRowsQuant = 128
	// amxRows is the weight rows (and x rows) of one AMX block.
	amxRows = 32
)

// amxCfg is the tile configuration: palette 1, tiles 0-7 of 16 rows × 64
// bytes (C tiles 0-3, weight tiles 4-5, x tiles 6-7).
var amxCfg = func() (c [64]byte) {
	c[0] = 1
	for t := range 8 {
		c[16+2*t] = 64
		c[48+t] = 16
	}
	return c
}()

// amxKernels are the AMX path's two kernels: the block product and the
// 16×16 transpose (see amxBF16 and transpose16 in kernels/_generate).
type amxKernels struct {
	mul       func(c []float32, w []byte, ldw int, x []uint32, xg int, nb int, k int, cfg *[64]byte)
	transpose func(dst []uint32, ldd int, src []uint32, lds int, n int)
}

// genericAMX is the pure-Go twin of the AMX kernels.
var genericAMX = amxKernels{mul: amxBF16Go, transpose: transpose16Go}

// amxKernelsFor returns the AMX kernels, or nil where the CPU has no AMX
// (the Go twin when forced, as for the other bf16 tiles).
func amxKernelsFor() *amxKernels {
	if forceGenericBF16.Load() {
		return &genericAMX
	}
	return asmAMX()
}

// Block-quantized weights (Q8_0, Q4_K, ...) take AMX for prefill too, where
// bfloat16 activations are allowed: each task dequantizes a block of 32
// weight rows exactly (kernels' RowF32) and rounds it to bfloat16 once, for
// all x rows of the call (such a MatMul has a single batch chunk), and then
// multiplies it as a BF16 block. Rounding the weights to bfloat16 adds at
// most 2⁻⁹ of each weight; the int8 path it replaces rounds each x element
// to within half of max|x|/127 of its 32-column block instead.

// usesAMX reports whether MatMul with weight w over n rows, on the bf16
// path, runs on AMX: enough x rows, and whole 32-column chunks (the tiles
// read 64 bytes of a weight row at a time).
func usesAMX(w *kernels.Mat, n int) bool {
	minRows := amxMinRows
	if w.DType.Quantized() {
		minRows = amxMinRowsQuant
	}
	return n >= minRows && w.Cols > 0 && w.Cols%32 == 0 && w.Rows >= amxRows && amxKernelsFor() != nil
}

// amxX is x for the AMX path: rounded to bfloat16 row by row (rows padded
// with zeros to whole 16-row groups), then packed into the pairs layout.
type amxX struct {
	b  bf16Rows
	p  []uint32 // (groups, cols/32, 16, 16)
	xg int      // uint32s per group: cols·8
	n  int      // x rows
}

// resize makes a hold n rows of cols columns (cols a multiple of 32).
func (a *amxX) resize(n, cols int) {
	groups := 2 * ceilDiv(n, amxRows)
	a.b.resize(16*groups, cols)
	a.xg, a.n = cols*8, n
	if cap(a.p) < groups*a.xg {
		a.p = make([]uint32, groups*a.xg)
	}
	a.p = a.p[:groups*a.xg]
}

// groups is the number of 16-row groups the packing runs over.
func (a *amxX) groups() int { return len(a.p) / max(a.xg, 1) }

// packGroups rounds and packs the x rows of groups [lo, hi).
func (a *amxX) packGroups(k *amxKernels, x []float32, cols, lo, hi int) {
	ld := a.b.ld / 2 // uint32s per bf16 row
	src := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(a.b.x))), len(a.b.x)/2)
	for g := lo; g < hi; g++ {
		r0, r1 := 16*g, min(a.n, 16*g+16)
		if r0 < r1 {
			a.b.roundRows(x, cols, r0, r1)
		}
		clear(a.b.x[max(r0, r1)*a.b.ld : (16*g+16)*a.b.ld]) // the padding rows
		for q := range cols / 32 {
			k.transpose(a.p[g*a.xg+q*256:], 16, src[16*g*ld+16*q:], ld, 16)
		}
	}
}

// atask is task on AMX: output rows [r0, r1) for x rows [i0, i1) (r0 and
// i0 multiples of 32). Weight rows past the last whole block of 32 run
// the Go twin (real models' row counts are multiples of 32).
func (m *matmul) atask(r0, r1, i0, i1 int, scratch *[]float32) {
	cols, rows := m.w.Cols, m.w.Rows
	nb := ceilDiv(i1-i0, amxRows)
	// scratch: the results of nb blocks (nb·1024), and for a quantized w
	// one block of weight rows in float32 and in bfloat16 (cols + 16·cols).
	need := nb * 1024
	if m.w.DType.Quantized() {
		need += 17 * cols
	}
	if cap(*scratch) < need {
		*scratch = make([]float32, need)
	}
	c := (*scratch)[:nb*1024]
	a, k := m.xa, m.ak
	x := a.p[(i0/16)*a.xg:]
	for j := r0; j < r1; j += amxRows {
		wr := min(amxRows, rows-j)
		var w []byte
		if m.w.DType.Quantized() {
			w = m.dequantBlock((*scratch)[nb*1024:need], j, wr)
		} else {
			w = m.w.Data[2*j*cols:]
		}
		if wr == amxRows {
			k.mul(c, w, 2*cols, x, a.xg, nb, cols, &amxCfg)
			m.storeBlocks(k, c, j, amxRows, i0, i1)
			continue
		}
		amxBF16GoRows(c, w, 2*cols, wr, x, a.xg, nb, cols)
		m.storeBlocks(&genericAMX, c, j, wr, i0, i1)
	}
}

// dequantBlock decodes weight rows [j, j+wr) of a quantized w exactly and
// rounds them to bfloat16 in buf (cols float32s of row buffer, then the
// block), returning the block as bytes with a row stride of 2·cols.
func (m *matmul) dequantBlock(buf []float32, j, wr int) []byte {
	cols := m.w.Cols
	row, blk := buf[:cols], buf[cols:cols+16*cols]
	b16 := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(blk))), 32*cols)
	for r := range wr {
		m.w.RowF32(row, j+r)
		roundBF16(b16[r*cols:(r+1)*cols], row)
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(blk))), 64*cols)
}

// storeBlocks writes the results of amxBF16 in c (nb blocks of 32 x rows
// from i0, against weight rows [j, j+wr)) into y, transposed.
func (m *matmul) storeBlocks(k *amxKernels, c []float32, j, wr, i0, i1 int) {
	ldy := m.ldy
	y := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(m.y))), len(m.y))
	cu := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(c))), len(c))
	for b := 0; i0+32*b < i1; b++ {
		for h := range 2 {
			if 16*h >= wr {
				break
			}
			for g := range 2 {
				i := i0 + 32*b + 16*g
				if i >= i1 {
					break
				}
				tile := cu[b*1024+(2*h+g)*256:]
				dst := y[i*ldy+j+16*h:]
				if wr-16*h >= 16 {
					k.transpose(dst, ldy, tile, 16, min(16, i1-i))
					continue
				}
				for xr := range min(16, i1-i) { // a partial tile: the Go twin's rows only
					for wr2 := range wr - 16*h {
						dst[xr*ldy+wr2] = tile[wr2*16+xr]
					}
				}
			}
		}
	}
}

// amxBF16Go is the pure-Go twin of amxBF16 (see kernels/_generate/bf16.go).
func amxBF16Go(c []float32, w []byte, ldw int, x []uint32, xg int, nb int, k int, _ *[64]byte) {
	amxBF16GoRows(c, w, ldw, amxRows, x, xg, nb, k)
}

// amxBF16GoRows is amxBF16Go for the first wr ≤ 32 weight rows only.
func amxBF16GoRows(c []float32, w []byte, ldw, wr int, x []uint32, xg int, nb int, k int) {
	for b := range nb {
		for h := range 2 {
			for g := range 2 {
				grp := x[(2*b+g)*xg:]
				for r := range 16 {
					if 16*h+r >= wr {
						break
					}
					row := w[(16*h+r)*ldw:]
					for xr := range 16 {
						var sum float32
						for i := range k / 2 {
							v := grp[(i/16)*256+(i%16)*16+xr]
							sum += kernels.BF16ToF32(uint16(v))*bf16At(row, 2*i) +
								kernels.BF16ToF32(uint16(v>>16))*bf16At(row, 2*i+1)
						}
						c[b*1024+(2*h+g)*256+r*16+xr] = sum
					}
				}
			}
		}
	}
}

// transpose16Go is the pure-Go twin of transpose16: dst[r*ldd+c] =
// src[c*lds+r] for r < n, c < 16.
func transpose16Go(dst []uint32, ldd int, src []uint32, lds int, n int) {
	for r := range n {
		for c := range 16 {
			dst[r*ldd+c] = src[c*lds+r]
		}
	}
}
