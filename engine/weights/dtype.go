package weights

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// OtherDType is the kernels.DType a Tensor carries when its safetensors dtype
// (Tensor.Dtype) is valid but has no kernels.DType, such as I64, U8, BOOL or
// F64. It is deliberately not a kernels constant: its Size is 0 and its
// String is "unknown", so it cannot be mistaken for F32.
const OtherDType kernels.DType = 0xff

// dtypeInfo describes one safetensors dtype.
type dtypeInfo struct {
	bits   int           // bits per element (4 and 6 for the packed micro-float types)
	kd     kernels.DType // OtherDType when the kernels cannot use it
	float  bool          // Float32 can convert it
	kernel bool          // Mat can view it
}

// dtypes lists every dtype the safetensors format defines.
var dtypes = map[string]dtypeInfo{
	"BOOL":    {bits: 8, kd: OtherDType},
	"U8":      {bits: 8, kd: OtherDType},
	"I8":      {bits: 8, kd: OtherDType},
	"U16":     {bits: 16, kd: OtherDType},
	"I16":     {bits: 16, kd: OtherDType},
	"U32":     {bits: 32, kd: OtherDType},
	"I32":     {bits: 32, kd: OtherDType},
	"U64":     {bits: 64, kd: OtherDType},
	"I64":     {bits: 64, kd: OtherDType},
	"C64":     {bits: 64, kd: OtherDType},
	"F4":      {bits: 4, kd: OtherDType},
	"F6_E2M3": {bits: 6, kd: OtherDType},
	"F6_E3M2": {bits: 6, kd: OtherDType},
	"F8_E8M0": {bits: 8, kd: OtherDType, float: true},
	"F8_E5M2": {bits: 8, kd: OtherDType, float: true},
	"F64":     {bits: 64, kd: OtherDType, float: true},
	"F8_E4M3": {bits: 8, kd: kernels.F8E4M3, float: true, kernel: true},
	"F16":     {bits: 16, kd: kernels.F16, float: true, kernel: true},
	"BF16":    {bits: 16, kd: kernels.BF16, float: true, kernel: true},
	"F32":     {bits: 32, kd: kernels.F32, float: true, kernel: true},
}

// kernelDtypes is the list named in "want ..." errors.
const kernelDtypes = "F32, BF16, F16 or F8_E4M3"

// dtypeName returns the safetensors spelling for d, or "" if d is not one of
// the kernels' dtypes.
func dtypeName(d kernels.DType) string {
	switch d {
	case kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3:
		return d.String()
	}
	return ""
}

// byteSize returns the number of bytes numel elements of info take, or an
// error when the count overflows or does not fill whole bytes.
func byteSize(info dtypeInfo, numel uint64) (uint64, error) {
	if numel != 0 && numel > math.MaxUint64/uint64(info.bits) {
		return 0, fmt.Errorf("%d elements overflow", numel)
	}
	bits := numel * uint64(info.bits)
	if bits%8 != 0 {
		return 0, fmt.Errorf("%d elements of %d bits do not fill whole bytes", numel, info.bits)
	}
	return bits / 8, nil
}

// numelOf multiplies the dims of shape, reporting overflow past MaxInt.
func numelOf(shape []int) (uint64, error) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension %d", d)
		}
		if d != 0 && n > math.MaxInt/uint64(d) {
			return 0, fmt.Errorf("element count overflows")
		}
		n *= uint64(d)
	}
	return n, nil
}

// decodeFloats converts len(dst) elements of the float dtype dt from src
// (little-endian) into dst. F8_E4M3 is converted without any block scale.
func decodeFloats(dt string, dst []float32, src []byte) {
	switch dt {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = kernels.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = kernels.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case "F8_E4M3":
		for i := range dst {
			dst[i] = kernels.F8E4M3ToF32(src[i])
		}
	case "F8_E5M2": // the top byte of an IEEE half
		for i := range dst {
			dst[i] = kernels.F16ToF32(uint16(src[i]) << 8)
		}
	case "F8_E8M0": // 2^(b-127); 0xff is NaN
		for i := range dst {
			switch b := src[i]; b {
			case 0xff:
				dst[i] = float32(math.NaN())
			case 0:
				dst[i] = math.Float32frombits(0x00400000) // 2^-127, subnormal
			default:
				dst[i] = math.Float32frombits(uint32(b) << 23)
			}
		}
	case "F64":
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	default:
		panic("weights: decodeFloats of " + dt)
	}
}

// F32ToF16 rounds a float32 to the nearest IEEE half, ties to even;
// overflow becomes ±Inf and NaN stays NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased half exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 { // half subnormal (or zero): value / 2^-24, rounded
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || rem == half && r&1 == 1 {
			r++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++ // may carry into the exponent, up to Inf, which is right
	}
	return sign | uint16(r)
}

// f8Values holds the non-negative finite float8 e4m3fn values, by code.
var f8Values = func() [127]float32 {
	var v [127]float32
	for i := range v {
		v[i] = kernels.F8E4M3ToF32(uint8(i))
	}
	return v
}()

// F8E4M3Max is the largest finite float8 e4m3fn value.
const F8E4M3Max = 448

// F32ToF8E4M3 rounds a float32 to the nearest float8 e4m3fn, ties to even.
// Values beyond ±448 saturate to ±448 (the format has no infinities); NaN
// becomes NaN (0x7f).
func F32ToF8E4M3(f float32) uint8 {
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 0x80
		f = -f
	}
	switch {
	case f != f:
		return 0x7f
	case f >= F8E4M3Max:
		return sign | 0x7e
	}
	lo, hi := 0, len(f8Values)-1 // find the first code with value >= f
	for lo < hi {
		mid := (lo + hi) / 2
		if f8Values[mid] >= f {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	i := lo
	if f8Values[i] != f && i > 0 {
		below, above := f-f8Values[i-1], f8Values[i]-f
		if below < above || below == above && (i-1)&1 == 0 {
			i--
		}
	}
	return sign | uint8(i)
}

// validDtypeList names the defined dtypes for an "unknown dtype" error.
func validDtypeList() string {
	return "BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F4, F6_E2M3, F6_E3M2, F8_E4M3, F8_E5M2, F8_E8M0, F16, BF16, F32, F64, C64"
}

// lookupDtype finds a dtype by its safetensors name.
func lookupDtype(name string) (dtypeInfo, bool) {
	info, ok := dtypes[name]
	return info, ok
}
