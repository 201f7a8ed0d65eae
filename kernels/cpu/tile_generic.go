package cpu

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// A tileFunc sets an (R, C) tile of y = x·wᵀ over k columns, R rows of x
// against C rows of w stored in one dtype:
//
//	for r := range R {
//		for c := range C {
//			var sum float32
//			for i := range k {
//				sum += x[r*ldx+i] * decode(w, c*ldw+i)
//			}
//			y[r*ldy+c] = sum
//		}
//	}
//
// ldx, ldy and ldw are row strides in elements. F8 tiles decode without the
// block scale (the driver folds the scale into x). The assembly tiles do not
// check bounds; the driver guarantees them.
type tileFunc func(y []float32, ldy int, x []float32, ldx int, w []byte, ldw int, k int)

// tileSet holds the tile shapes of one dtype, R rows of x times C rows of w.
// A single x row always walks w one row at a time (see kernels/_generate).
// r4c4 is nil where there are not enough registers for it (AVX2, Go);
// AVX2 has r4c3 instead (12 accumulators, three weight vectors and one of
// x fill its 16 registers; not for F8, whose constants need two more), so
// each decoded weight vector feeds four FMAs and each x load three, and
// r4c1 for the weight rows left over, which sums every element in the
// order r4c3 does: a row's result does not depend on how the rows were
// grouped (a fused gate/up weight gives the bits of the two separate).
type tileSet struct {
	r1c1, r2c1, r2c4, r4c4 tileFunc
	r4c3, r4c1             tileFunc
}

// genericTiles are the pure-Go tiles, indexed by kernels.DType. They are the
// fallback on CPUs without AVX2/FMA and under -tags noasm: correct, and
// 10-50× slower than the assembly.
var genericTiles = [...]tileSet{
	kernels.F32:    makeGenericSet(4, dotF32x1, dotF32x4),
	kernels.BF16:   makeGenericSet(2, dotBF16x1, dotBF16x4),
	kernels.F16:    makeGenericSet(2, dotF16x1, dotF16x4),
	kernels.F8E4M3: makeGenericSet(1, dotF8x1, dotF8x4),
}

type (
	dot1Func func(x []float32, w []byte) float32
	dot4Func func(x []float32, w0, w1, w2, w3 []byte) (s0, s1, s2, s3 float32)
)

// makeGenericSet builds the tile shapes of a dtype of esz bytes from a 1-row
// and a 4-row dot product. The 2-row tiles run the x rows one after the
// other; the w rows are in L1 the second time.
func makeGenericSet(esz int, dot1 dot1Func, dot4 dot4Func) tileSet {
	r1c1 := func(y []float32, _ int, x []float32, _ int, w []byte, _ int, k int) {
		y[0] = dot1(x[:k], w)
	}
	r1c4 := func(y []float32, _ int, x []float32, _ int, w []byte, ldw int, k int) {
		o := ldw * esz
		y[0], y[1], y[2], y[3] = dot4(x[:k], w, w[o:], w[2*o:], w[3*o:])
	}
	return tileSet{
		r1c1: r1c1,
		r2c1: func(y []float32, ldy int, x []float32, ldx int, w []byte, ldw int, k int) {
			r1c1(y, ldy, x, ldx, w, ldw, k)
			r1c1(y[ldy:], ldy, x[ldx:], ldx, w, ldw, k)
		},
		r2c4: func(y []float32, ldy int, x []float32, ldx int, w []byte, ldw int, k int) {
			r1c4(y, ldy, x, ldx, w, ldw, k)
			r1c4(y[ldy:], ldy, x[ldx:], ldx, w, ldw, k)
		},
	}
}

// The dot products below keep four independent sums and take four columns
// a step; the tail columns go into the first sum.

func f32At(w []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:])) }

func bf16At(w []byte, i int) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(w[2*i:])) << 16)
}

// f16Table maps every float16 bit pattern to its float32 value (256 KiB,
// built on first use): a load is much cheaper than F16ToF32's branches.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = kernels.F16ToF32(uint16(i))
	}
	return t
})

func f16At(t *[1 << 16]float32, w []byte, i int) float32 {
	return t[binary.LittleEndian.Uint16(w[2*i:])]
}

// f8Table maps an e4m3fn byte to its unscaled float32 value.
var f8Table = func() (t [256]float32) {
	for i := range t {
		t[i] = kernels.F8E4M3ToF32(uint8(i))
	}
	return t
}()

func f8At(w []byte, i int) float32 { return f8Table[w[i]] }

func dotF32x1(x []float32, w []byte) float32 {
	w = w[:4*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * f32At(w, i)
		s1 += x[i+1] * f32At(w, i+1)
		s2 += x[i+2] * f32At(w, i+2)
		s3 += x[i+3] * f32At(w, i+3)
	}
	for ; i < len(x); i++ {
		s0 += x[i] * f32At(w, i)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF32x4(x []float32, w0, w1, w2, w3 []byte) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:4*n], w1[:4*n], w2[:4*n], w3[:4*n]
	for i, v := range x {
		s0 += v * f32At(w0, i)
		s1 += v * f32At(w1, i)
		s2 += v * f32At(w2, i)
		s3 += v * f32At(w3, i)
	}
	return
}

func dotBF16x1(x []float32, w []byte) float32 {
	w = w[:2*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * bf16At(w, i)
		s1 += x[i+1] * bf16At(w, i+1)
		s2 += x[i+2] * bf16At(w, i+2)
		s3 += x[i+3] * bf16At(w, i+3)
	}
	for ; i < len(x); i++ {
		s0 += x[i] * bf16At(w, i)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotBF16x4(x []float32, w0, w1, w2, w3 []byte) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:2*n], w1[:2*n], w2[:2*n], w3[:2*n]
	for i, v := range x {
		s0 += v * bf16At(w0, i)
		s1 += v * bf16At(w1, i)
		s2 += v * bf16At(w2, i)
		s3 += v * bf16At(w3, i)
	}
	return
}

func dotF16x1(x []float32, w []byte) float32 {
	t := f16Table()
	w = w[:2*len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * f16At(t, w, i)
		s1 += x[i+1] * f16At(t, w, i+1)
		s2 += x[i+2] * f16At(t, w, i+2)
		s3 += x[i+3] * f16At(t, w, i+3)
	}
	for ; i < len(x); i++ {
		s0 += x[i] * f16At(t, w, i)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF16x4(x []float32, w0, w1, w2, w3 []byte) (s0, s1, s2, s3 float32) {
	t := f16Table()
	n := len(x)
	w0, w1, w2, w3 = w0[:2*n], w1[:2*n], w2[:2*n], w3[:2*n]
	for i, v := range x {
		s0 += v * f16At(t, w0, i)
		s1 += v * f16At(t, w1, i)
		s2 += v * f16At(t, w2, i)
		s3 += v * f16At(t, w3, i)
	}
	return
}

func dotF8x1(x []float32, w []byte) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * f8At(w, i)
		s1 += x[i+1] * f8At(w, i+1)
		s2 += x[i+2] * f8At(w, i+2)
		s3 += x[i+3] * f8At(w, i+3)
	}
	for ; i < len(x); i++ {
		s0 += x[i] * f8At(w, i)
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF8x4(x []float32, w0, w1, w2, w3 []byte) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	for i, v := range x {
		s0 += v * f8At(w0, i)
		s1 += v * f8At(w1, i)
		s2 += v * f8At(w2, i)
		s3 += v * f8At(w3, i)
	}
	return
}

// scaleGo sets dst[i] = src[i] * s for i < len(src).
func scaleGo(dst, src []float32, s float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = v * s
	}
}

// axpyGo sets y[i] += a·w[i] for i < len(y), w an F32 or BF16 row: the
// pure-Go twin of axpyF32 and axpyBF16.
func axpyGo(dt kernels.DType, y []float32, a float32, w []byte) {
	if dt == kernels.BF16 {
		w = w[:2*len(y)]
		for i := range y {
			y[i] += a * bf16At(w, i)
		}
		return
	}
	w = w[:4*len(y)]
	for i := range y {
		y[i] += a * f32At(w, i)
	}
}
