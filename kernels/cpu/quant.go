package cpu

import (
	"encoding/binary"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Block-quantized weights (GGML's Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) are
// multiplied the way llama.cpp does it: each x row is first quantized to
// int8 in blocks of qk = 32 columns with one float32 scale per block
// (|x − d·q| ≤ d/2, d = max|x|/127), and every weight block is then dotted
// with the matching x blocks in integer arithmetic, one float multiply-add per
// block (per 32 columns) applying the weight and x scales.

// qk is the activation block: every quantized dtype's (sub-)blocks tile it.
const qk = 32

// qrows is a batch of x rows quantized to int8 in blocks of qk columns.
// The scale d comes from the largest |x| of each group of group columns:
// qk, or 256 for the K-quants (Q4_K, Q5_K, Q6_K), as llama.cpp quantizes
// x to Q8_K for them, so that their sub-block scales can multiply integer
// sums (the qgemv kernels). Every block of a group then has the same d.
type qrows struct {
	q     []int8    // (n, cols): round(x / d)
	ds    []float32 // (n, cols/qk, 2): the block scale d = max|x|/127, and d·Σq (for the weights' mins)
	bs    []int16   // (n, cols/16): Σq over each 16 columns
	group int       // columns per scale d
}

// xGroup is the columns per x scale for weights of dtype dt (see qrows).
func xGroup(dt kernels.DType) int {
	if dt.BlockElems() == 256 {
		return 256
	}
	return qk
}

// quantize fills r with the n rows of x (n, cols), one scale per group
// columns (qk or 256, dividing cols), growing its buffers.
func (r *qrows) quantize(x []float32, n, cols, group int) {
	r.resize(n, cols, group)
	r.quantizeRows(x, cols, 0, n)
}

// resize makes r hold n rows of cols columns, growing its buffers.
func (r *qrows) resize(n, cols, group int) {
	nb := n * cols / qk
	if cap(r.q) < n*cols {
		r.q = make([]int8, n*cols)
	}
	if cap(r.ds) < 2*nb {
		r.ds = make([]float32, 2*nb)
	}
	if cap(r.bs) < 2*nb {
		r.bs = make([]int16, 2*nb)
	}
	r.q, r.ds, r.bs, r.group = r.q[:n*cols], r.ds[:2*nb], r.bs[:2*nb], group
}

// quantizeRows quantizes rows [lo, hi) of x (rows of cols) into r, which
// resize has sized.
func (r *qrows) quantizeRows(x []float32, cols, lo, hi int) {
	b0, b1 := lo*cols/qk, hi*cols/qk
	quantizeX(r.q[b0*qk:b1*qk], r.ds[2*b0:2*b1], r.bs[2*b0:2*b1], x[b0*qk:b1*qk], r.group)
}

// quantizeXGo quantizes x (len(x) a multiple of group, itself a multiple
// of qk) to q with one scale per group columns, its (d, d·Σq) pairs per
// block of qk to ds and Σq per 16 columns to bs.
func quantizeXGo(q []int8, ds []float32, bs []int16, x []float32, group int) {
	for gb := range len(x) / group {
		var amax float32
		for _, v := range x[gb*group : (gb+1)*group] {
			amax = max(amax, math.Float32frombits(math.Float32bits(v)&^(1<<31)))
		}
		for b := gb * group / qk; b < (gb+1)*group/qk; b++ {
			ds[2*b], ds[2*b+1] = quantBlock(q[b*qk:(b+1)*qk], bs[2*b:2*b+2], x[b*qk:(b+1)*qk], amax)
		}
	}
}

// quantBlock quantizes one block of qk values with scale amax/127 (amax ≥
// max|x|) to q, sets bs to the sums of its two halves' q, and returns the
// scale d and d·Σq.
func quantBlock(q []int8, bs []int16, x []float32, amax float32) (d, s float32) {
	if amax == 0 {
		clear(q[:qk])
		bs[0], bs[1] = 0, 0
		return 0, 0
	}
	d = amax / 127
	id := 127 / amax
	var sum [2]int
	for i, v := range x[:qk] {
		// Round half away from zero; |v·id| ≤ 127 (+ rounding), so the
		// clamp only catches an id that rounded up.
		t := v * id
		var qi int32
		if t >= 0 {
			qi = min(int32(t+0.5), 127)
		} else {
			qi = max(int32(t-0.5), -127)
		}
		q[i] = int8(qi)
		sum[i/16] += int(qi)
	}
	bs[0], bs[1] = int16(sum[0]), int16(sum[1])
	return d, d * float32(sum[0]+sum[1])
}

// A qtileFunc sets y[r·ldy] for r < R x rows against one weight row w (k
// columns, GGML blocks) from x rows quantized in blocks of qk: q holds x
// row r at r·ldq, its (d, s) pairs at ds[2·r·ldq/qk:].
//
//	for r := range R {
//		y[r*ldy] = Σ over blocks b of x row r:
//			wscale(b)·d[b]·Σᵢ wq(b, i)·q[i] − wmin(b)·s[b]
//	}
type qtileFunc func(y []float32, ldy int, q []int8, ds []float32, ldq int, w []byte, k int)

// A qgemvFunc sets y[r·ldy + j] for j < rows, r < R x rows to the dot
// product of weight row j (k > 0 columns; the rows one after the other in
// w) with x row r quantized in groups of 256 columns for the K-quants
// (q[r·ldq:]; ds, its (d, s) pairs; bs, its sums per 16 columns): a task's
// block of weight rows in one call, each weight block decoded once for
// the R x rows. f16 is f16Table().
type qgemvFunc func(y []float32, ldy int, q []int8, ds []float32, bs []int16, ldq int, w []byte, k, rows int, f16 *[1 << 16]float32)

// qtileSet holds the kernels of one quantized dtype: tiles of one x row and
// of four x rows sharing the decoded weight row, and gemv kernels of one
// and four x rows against a block of weight rows (nil where there is none).
type qtileSet struct {
	r1, r4      qtileFunc
	gemv, gemv4 qgemvFunc
}

// genericQTiles are the pure-Go tiles, indexed by kernels.DType.
var genericQTiles = [...]qtileSet{
	kernels.Q8_0: {r1: rowTile(dotQ8_0), gemv: rowsGemv(kernels.Q8_0, dotQ8_0)},
	kernels.Q4_0: {r1: rowTile(dotQ4_0), gemv: rowsGemv(kernels.Q4_0, dotQ4_0)},
	kernels.Q4K:  {r1: rowTile(dotQ4K), gemv: rowsGemv(kernels.Q4K, dotQ4K)},
	kernels.Q5K:  {r1: rowTile(dotQ5K)},
	kernels.Q6K:  {r1: rowTile(dotQ6K), gemv: rowsGemv(kernels.Q6K, dotQ6K)},
}

// A qdotFunc is the dot product of one weight row w (k columns) with one
// quantized x row (q, and its (d, s) pairs in ds).
type qdotFunc func(q []int8, ds []float32, w []byte, k int) float32

func rowTile(dot qdotFunc) qtileFunc {
	return func(y []float32, _ int, q []int8, ds []float32, _ int, w []byte, k int) {
		y[0] = dot(q, ds, w, k)
	}
}

// rowsGemv is the Go twin of the one-row qgemv kernels: dot over each of
// the rows of dtype dt (whose x scales it reads from ds, like every Go
// tile).
func rowsGemv(dt kernels.DType, dot qdotFunc) qgemvFunc {
	return func(y []float32, _ int, q []int8, ds []float32, _ []int16, _ int, w []byte, k, rows int, _ *[1 << 16]float32) {
		rb := dt.RowBytes(k)
		for j := range rows {
			y[j] = dot(q, ds, w[j*rb:(j+1)*rb], k)
		}
	}
}

func f16(b []byte) float32 { return f16Table()[binary.LittleEndian.Uint16(b)] }

func dotQ8_0(q []int8, ds []float32, w []byte, k int) float32 {
	var sum float32
	for b := range k / 32 {
		blk := w[b*34 : b*34+34]
		xq := q[b*32 : b*32+32]
		var acc int32
		for i, v := range blk[2:34] {
			acc += int32(int8(v)) * int32(xq[i])
		}
		sum += f16(blk) * ds[2*b] * float32(acc)
	}
	return sum
}

// Q4_0: x ≈ wd·(n − 8), so the block's dot is wd·(d·Σn·q − 8·s).
func dotQ4_0(q []int8, ds []float32, w []byte, k int) float32 {
	var sum float32
	for b := range k / 32 {
		blk := w[b*18 : b*18+18]
		xq := q[b*32 : b*32+32]
		var acc int32
		for j, v := range blk[2:18] {
			acc += int32(v&0xf)*int32(xq[j]) + int32(v>>4)*int32(xq[j+16])
		}
		sum += f16(blk) * (ds[2*b]*float32(acc) - 8*ds[2*b+1])
	}
	return sum
}

// Q4_K and Q5_K: sub-block j of a super-block is x block 8·sb + j, and its
// elements are (dw·sc)·n − dmin·m, so its dot is
// dw·sc·d·Σn·q − dmin·m·s.
func dotQ4K(q []int8, ds []float32, w []byte, k int) float32 { return dotK(q, ds, w, k, false) }
func dotQ5K(q []int8, ds []float32, w []byte, k int) float32 { return dotK(q, ds, w, k, true) }

// dotK is dotQ4K, or dotQ5K with five set: bit j of qh[i] is bit 4 of
// sub-block j's element i.
func dotK(q []int8, ds []float32, w []byte, k int, five bool) float32 {
	bb, qs0 := 144, 16
	if five {
		bb, qs0 = 176, 48
	}
	var sum float32
	for sb := range k / 256 {
		blk := w[sb*bb : (sb+1)*bb]
		dw, dmin := f16(blk), f16(blk[2:])
		scales, qh, qs := blk[4:16], blk[16:48], blk[qs0:qs0+128]
		for j := range 8 {
			b := 8*sb + j
			xq := q[b*32 : b*32+32]
			nib := qs[32*(j/2) : 32*(j/2)+32]
			shift := 4 * uint(j&1)
			var acc int32
			for i, v := range nib {
				n := v >> shift & 0xf
				if five {
					n |= (qh[i] >> uint(j) & 1) << 4
				}
				acc += int32(n) * int32(xq[i])
			}
			sc, m := kernels.ScaleMinK4(j, scales)
			sum += dw*float32(sc)*ds[2*b]*float32(acc) - dmin*float32(m)*ds[2*b+1]
		}
	}
	return sum
}

// Q6_K: x block b of a super-block holds two 16-element sub-blocks with
// int8 scales; elements are dw·sc·(n − 32), so the block's dot is
// dw·d·(sc₀·Σ₀(n−32)·q + sc₁·Σ₁(n−32)·q).
func dotQ6K(q []int8, ds []float32, w []byte, k int) float32 {
	var sum float32
	for sb := range k / 256 {
		blk := w[sb*210 : sb*210+210]
		ql, qh, scales := blk[0:128], blk[128:192], blk[192:208]
		dw := f16(blk[208:])
		for g8 := range 8 { // x blocks: half h = g8/4, group g = g8%4
			h, g := g8/4, g8%4
			b := 8*sb + g8
			xq := q[b*32 : b*32+32]
			lo := ql[64*h+32*(g&1) : 64*h+32*(g&1)+32]
			hi := qh[32*h : 32*h+32]
			ls, hs := 4*uint(g/2), 2*uint(g)
			var acc [2]int32
			for l := range 32 {
				n := int32(lo[l]>>ls&0xf|(hi[l]>>hs&3)<<4) - 32
				acc[l/16] += n * int32(xq[l])
			}
			isum := int32(int8(scales[2*g8]))*acc[0] + int32(int8(scales[2*g8+1]))*acc[1]
			sum += dw * ds[2*b] * float32(isum)
		}
	}
	return sum
}
