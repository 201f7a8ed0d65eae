package kernels

import (
	"encoding/binary"
	"math"
)

// BF16ToF32 widens a bfloat16 bit pattern to float32 (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds a float32 to the nearest bfloat16, ties to even (NaN stays NaN).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32 widens an IEEE half-precision bit pattern to float32 (exact).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = man · 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// F8E4M3ToF32 widens a float8 e4m3fn value (bias 7, no infinities, 0x7f/0xff
// are NaN) to float32 (exact).
func F8E4M3ToF32(b uint8) float32 {
	sign := uint32(b>>7) << 31
	exp := uint32(b>>3) & 0xf
	man := uint32(b) & 0x7
	switch {
	case exp == 0xf && man == 0x7:
		return float32(math.NaN())
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = man · 2^-9
		f := float32(man) * (1.0 / (1 << 9))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+120)<<23 | man<<20)
}

// RowF32 decodes row r of m into dst (len m.Cols) as float32, applying the
// block scale for F8E4M3 and the block scales of the quantized types. It is the generic reference every backend's
// conversion must equal; it is also how the engine gathers embedding rows.
func (m *Mat) RowF32(dst []float32, r int) {
	if r < 0 || r >= m.Rows || len(dst) < m.Cols {
		panic("kernels: RowF32 out of range")
	}
	n := m.Cols
	switch m.DType {
	case F32:
		src := m.Data[r*n*4 : (r+1)*n*4]
		for i := range n {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		src := m.Data[r*n*2 : (r+1)*n*2]
		for i := range n {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		src := m.Data[r*n*2 : (r+1)*n*2]
		for i := range n {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F8E4M3:
		src := m.Data[r*n : (r+1)*n]
		sCols := (m.Cols + m.BlockCols - 1) / m.BlockCols
		srow := m.Scale[(r/m.BlockRows)*sCols : (r/m.BlockRows+1)*sCols]
		for i := range n {
			dst[i] = F8E4M3ToF32(src[i]) * srow[i/m.BlockCols]
		}
	case Q8_0, Q4_0, Q4K, Q5K, Q6K:
		if n%m.DType.BlockElems() != 0 {
			panic("kernels: RowF32 quantized row not a whole number of blocks")
		}
		rb := m.DType.RowBytes(n)
		dequantRow(m.DType, dst[:n], m.Data[r*rb:(r+1)*rb])
	default:
		panic("kernels: RowF32 unknown dtype")
	}
}
