package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// GGML's block-quantized formats, bit-compatible with llama.cpp (ggml-common.h).
// Every block starts or ends with float16 scales; all values little-endian.
//
//	Q8_0 (34 B / 32):   d f16 | qs[32] int8              x = d·q
//	Q4_0 (18 B / 32):   d f16 | qs[16] nibbles           x[j] = d·(lo(qs[j])−8), x[j+16] = d·(hi(qs[j])−8)
//	Q4_K (144 B / 256): d f16 | dmin f16 | scales[12] | qs[128]
//	    8 sub-blocks of 32 with 6-bit scale sc and min m (packed in scales[12]);
//	    sub-block 2c is the low nibbles of qs[32c:32c+32], 2c+1 the high ones;
//	    x = (d·sc)·q − dmin·m
//	Q5_K (176 B / 256): d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
//	    as Q4_K, plus bit s of qh[l] as bit 4 of element l of sub-block s
//	Q6_K (210 B / 256): ql[128] | qh[64] | scales[16] int8 | d f16
//	    16 sub-blocks of 16 with int8 scales; x = (d·sc)·(q−32), q 6-bit:
//	    in half h, element 32g+l (g < 4) takes the low (g even) or high (g odd)
//	    nibble of ql[64h + 32(g&1) + l] and bits 2g..2g+1 of qh[32h+l]
//
// The dequantizers follow gguf-py's numpy reference operation by operation in
// float32 (products rounded separately, no fused multiply-add), so that the
// fixtures in testdata/quant that it produced match bit for bit.

// F32ToF16 rounds a float32 to the nearest IEEE float16, ties to even;
// overflow gives ±Inf and NaN stays NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff:
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp > 142: // ≥ 2^16: beyond float16's range even before rounding
		return sign | 0x7c00
	case exp < 102: // < 2^-25: rounds to zero
		return sign
	}
	e := exp - 112 // float16 biased exponent
	m := man | 0x800000
	shift := uint(13)
	if e <= 0 { // subnormal result
		shift += uint(1 - e)
		e = 0
	}
	h := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && h&1 == 1 {
		h++
	}
	if e == 0 {
		return sign | uint16(h) // a carry into bit 10 makes it the smallest normal
	}
	// h holds the implicit bit, which adds 1 to e−1 (2 if rounding carried).
	return sign | (uint16(e-1)<<10 + uint16(h))
}

func f16At(b []byte) float32 { return F16ToF32(binary.LittleEndian.Uint16(b)) }

// blockCodecs are the block dequantizer and quantizer of each type.
var blockCodecs = map[DType]struct {
	dequant func(y []float32, b []byte)
	quant   func(b []byte, x []float32)
}{
	Q8_0: {dequantQ8_0, quantQ8_0},
	Q4_0: {dequantQ4_0, quantQ4_0},
	Q4K:  {dequantQ4K, func(b []byte, x []float32) { quantQ45K(b, x, 15) }},
	Q5K:  {dequantQ5K, func(b []byte, x []float32) { quantQ45K(b, x, 31) }},
	Q6K:  {dequantQ6K, quantQ6K},
}

// dequantRow decodes cols elements of dtype dt from src into dst.
func dequantRow(dt DType, dst []float32, src []byte) {
	be, bb, dq := dt.BlockElems(), dt.BlockBytes(), blockCodecs[dt].dequant
	for b := range len(dst) / be {
		dq(dst[b*be:(b+1)*be], src[b*bb:(b+1)*bb])
	}
}

func dequantQ8_0(y []float32, b []byte) {
	d := f16At(b)
	for i, q := range b[2:34] {
		y[i] = float32(int8(q)) * d
	}
}

func dequantQ4_0(y []float32, b []byte) {
	d := f16At(b)
	for j, q := range b[2:18] {
		y[j] = d * float32(int(q&0xf)-8)
		y[j+16] = d * float32(int(q>>4)-8)
	}
}

// ScaleMinK4 returns the 6-bit scale and min of sub-block j (< 8) packed in
// a Q4_K/Q5_K block's scales[12].
func ScaleMinK4(j int, s []byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

func dequantQ4K(y []float32, b []byte) { dequantK(y, b, false) }
func dequantQ5K(y []float32, b []byte) { dequantK(y, b, true) }

// dequantK decodes a Q4_K block, or a Q5_K one with five set (bit s of
// qh[l] is bit 4 of sub-block s's element l).
func dequantK(y []float32, b []byte, five bool) {
	d, dmin := f16At(b), f16At(b[2:])
	scales, qh, qs := b[4:16], b[16:48], b[16:144]
	if five {
		qs = b[48:176]
	}
	for s := range 8 {
		sc, m := ScaleMinK4(s, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		q := qs[32*(s/2) : 32*(s/2)+32]
		shift := 4 * uint(s&1)
		for l := range 32 {
			v := q[l] >> shift & 0xf
			if five {
				v |= (qh[l] >> uint(s) & 1) << 4
			}
			y[32*s+l] = float32(d1*float32(v)) - m1
		}
	}
}

func dequantQ6K(y []float32, b []byte) {
	ql, qh, scales := b[0:128], b[128:192], b[192:208]
	d := f16At(b[208:])
	for e := range 256 {
		h, g, l := e/128, e/32%4, e%32
		lo := ql[64*h+32*(g&1)+l] >> (4 * uint(g/2)) & 0xf
		hi := qh[32*h+l] >> (2 * uint(g)) & 3
		q := int(lo|hi<<4) - 32
		y[e] = (d * float32(int8(scales[e/16]))) * float32(q)
	}
}

// Quantize returns m (any dtype) converted to the block-quantized dtype dt,
// row by row. Q8_0 and Q4_0 follow GGML's reference quantizers exactly; the
// K-quants use a simpler choice of scales than llama.cpp's search (a
// sub-block's range mapped onto the levels, scales rounded to 6 or 8 bits),
// in the same block format. It fails if m.Cols is not a multiple of the block.
func Quantize(m *Mat, dt DType) (*Mat, error) {
	if !dt.Quantized() {
		return nil, fmt.Errorf("kernels: cannot quantize to %v: not a block-quantized type", dt)
	}
	if m.Cols%dt.BlockElems() != 0 {
		return nil, fmt.Errorf("kernels: cannot quantize a %d×%d matrix to %v: %d columns are not a multiple of %d",
			m.Rows, m.Cols, dt, m.Cols, dt.BlockElems())
	}
	q := &Mat{DType: dt, Rows: m.Rows, Cols: m.Cols, Data: make([]byte, m.Rows*dt.RowBytes(m.Cols))}
	row := make([]float32, m.Cols)
	rb := dt.RowBytes(m.Cols)
	for r := range m.Rows {
		m.RowF32(row, r)
		QuantizeRow(dt, q.Data[r*rb:(r+1)*rb], row)
	}
	return q, nil
}

// QuantizeRow writes src (a multiple of dt.BlockElems() elements) into dst
// (dt.RowBytes(len(src)) bytes) in block-quantized dtype dt.
func QuantizeRow(dt DType, dst []byte, src []float32) {
	be, bb := dt.BlockElems(), dt.BlockBytes()
	if !dt.Quantized() || len(src)%be != 0 || len(dst) < len(src)/be*bb {
		panic("kernels: QuantizeRow bad arguments")
	}
	q := blockCodecs[dt].quant
	for b := range len(src) / be {
		q(dst[b*bb:(b+1)*bb], src[b*be:(b+1)*be])
	}
}

// quantQ8_0 is GGML's quantize_row_q8_0_ref for one block.
func quantQ8_0(out []byte, x []float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(out, F32ToF16(d))
	for i, v := range x {
		out[2+i] = byte(int8(roundAway(v * id)))
	}
}

// quantQ4_0 is GGML's quantize_row_q4_0_ref for one block: the value of
// largest magnitude maps to −8.
func quantQ4_0(out []byte, x []float32) {
	var amax, vmax float32
	for _, v := range x {
		if abs32(v) > amax {
			amax, vmax = abs32(v), v
		}
	}
	d := vmax / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(out, F32ToF16(d))
	q := func(v float32) byte { return byte(min(15, int8(float32(v*id)+8.5))) }
	for j := range 16 {
		out[2+j] = q(x[j]) | q(x[16+j])<<4
	}
}

// quantQ45K writes one Q4_K (nmax 15) or Q5_K (nmax 31) block: each
// sub-block of 32 maps [min(0, lo), hi] onto 0..nmax; the 8 scales and 8
// mins are then rounded to 6 bits against the block's largest, and the
// elements quantized against the rounded values.
func quantQ45K(out []byte, x []float32, nmax int) {
	var scale, mins [8]float32
	var maxScale, maxMin float32
	for s := range 8 {
		var off float32
		scale[s], off = fitAffine(x[32*s:32*s+32], nmax)
		mins[s] = -off
		maxScale, maxMin = max(maxScale, scale[s]), max(maxMin, mins[s])
	}
	d, dmin := maxScale/63, maxMin/63
	binary.LittleEndian.PutUint16(out, F32ToF16(d))
	binary.LittleEndian.PutUint16(out[2:], F32ToF16(dmin))
	d, dmin = F16ToF32(F32ToF16(d)), F16ToF32(F32ToF16(dmin))
	var ls, lm [8]uint8
	for s := range 8 {
		ls[s] = level(scale[s], d, 63)
		lm[s] = level(mins[s], dmin, 63)
	}
	sc := out[4:16]
	clear(sc)
	for j := range 4 {
		sc[j] = ls[j] | (ls[j+4]>>4)<<6
		sc[j+4] = lm[j] | (lm[j+4]>>4)<<6
		sc[j+8] = ls[j+4]&0xf | (lm[j+4]&0xf)<<4
	}
	var qh, qs []byte
	if nmax == 31 {
		qh, qs = out[16:48], out[48:176]
		clear(qh)
	} else {
		qs = out[16:144]
	}
	clear(qs)
	for s := range 8 {
		dl, ml := d*float32(ls[s]), dmin*float32(lm[s])
		var idl float32
		if dl != 0 {
			idl = 1 / dl
		}
		for l, v := range x[32*s : 32*s+32] {
			q := min(nmax, max(0, int(roundAway((v+ml)*idl))))
			qs[32*(s/2)+l] |= byte(q&0xf) << (4 * uint(s&1))
			if qh != nil {
				qh[l] |= byte(q>>4) << uint(s)
			}
		}
	}
}

// fitAffine chooses scale ≥ 0 and off ≤ 0 so that x ≈ off + scale·L with
// integer L in [0, nmax]: first the range [min(0, min x), max x] mapped
// onto the levels, then a few rounds of assigning levels and refitting
// scale and off by least squares, keeping the best.
func fitAffine(x []float32, nmax int) (scale, off float32) {
	lo, hi := float32(0), float32(math.Inf(-1))
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi <= lo {
		return 0, lo
	}
	scale, off = (hi-lo)/float32(nmax), lo
	best := affineErr(x, scale, off, nmax)
	for range 2 {
		var sl, sll, sx, sxl float64
		is := 1 / scale
		for _, v := range x {
			l := float64(affineLevel(v, off, is, nmax))
			sl, sll, sx, sxl = sl+l, sll+l*l, sx+float64(v), sxl+float64(v)*l
		}
		n := float64(len(x))
		det := n*sll - sl*sl
		if det <= 0 {
			break
		}
		sc, o := (n*sxl-sl*sx)/det, (sx*sll-sl*sxl)/det
		if o > 0 { // the min must not be positive: refit with off = 0
			sc, o = sxl/sll, 0
		}
		if !(sc > 0) {
			break
		}
		if e := affineErr(x, float32(sc), float32(o), nmax); e < best {
			best, scale, off = e, float32(sc), float32(o)
		} else {
			break
		}
	}
	return scale, off
}

// affineErr is Σ (x − off − scale·L)² with L rounded and clamped to [0, nmax].
func affineErr(x []float32, scale, off float32, nmax int) float64 {
	is := 1 / scale
	var e float64
	for _, v := range x {
		d := float64(v - off - scale*float32(affineLevel(v, off, is, nmax)))
		e += d * d
	}
	return e
}

// affineLevel is (v − off)·is rounded to the nearest level in [0, nmax]
// (halves up; negative values truncate to 0 before the clamp).
func affineLevel(v, off, is float32, nmax int) int32 {
	return min(int32(nmax), max(0, int32((v-off)*is+0.5)))
}

// quantQ6K writes one Q6_K block: each sub-block of 16 maps its value of
// largest magnitude to −32; the 16 scales are rounded to int8 against the
// block's largest.
func quantQ6K(out []byte, x []float32) {
	var scale [16]float32
	var maxScale, amax float32
	for s := range 16 {
		var m, vm float32
		for _, v := range x[16*s : 16*s+16] {
			if abs32(v) > m {
				m, vm = abs32(v), v
			}
		}
		scale[s] = vm / -32
		if abs32(scale[s]) > amax {
			amax, maxScale = abs32(scale[s]), scale[s]
		}
	}
	ql, qh, scales := out[0:128], out[128:192], out[192:208]
	clear(out)
	if amax == 0 {
		return
	}
	iscale := -128 / maxScale
	d := F16ToF32(F32ToF16(1 / iscale))
	binary.LittleEndian.PutUint16(out[208:], F32ToF16(1/iscale))
	for s := range 16 {
		scales[s] = byte(int8(min(127, max(-128, roundAway(iscale*scale[s])))))
	}
	var idl float32
	for e, v := range x {
		if e%16 == 0 {
			idl = 0
			if dl := d * float32(int8(scales[e/16])); dl != 0 {
				idl = 1 / dl
			}
		}
		q := min(31, max(-32, int(roundAway(v*idl)))) + 32
		h, g, l := e/128, e/32%4, e%32
		ql[64*h+32*(g&1)+l] |= byte(q&0xf) << (4 * uint(g/2))
		qh[32*h+l] |= byte(q>>4) << (2 * uint(g))
	}
}

// level returns v/unit rounded to the nearest integer in [0, top].
func level(v, unit float32, top int) uint8 {
	if unit == 0 {
		return 0
	}
	return uint8(min(float32(top), max(0, roundAway(v/unit))))
}

// roundAway is C's roundf: halves round away from zero.
func roundAway(v float32) float32 { return float32(math.Round(float64(v))) }

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
