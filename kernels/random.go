package kernels

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync"
)

// RandomFill describes a matrix of seeded pseudo-random values, the
// weights engine/randweights invents: F32, BF16 or F16 elements with a
// random sign, binary exponent Top−1 with probability ½, Top−2 with ¼,
// Top−3 and Top−4 with ⅛ each, and a random mantissa — roughly uniform in
// (−2^Top, 2^Top). The bytes are cut into RandomChunk-byte chunks, each
// with its own splitmix64 stream (state Seed ^ offset·0xbf58476d1ce4e5b9),
// so any byte range can be computed without the ones before it: one
// stream output makes four 16-bit values (8 bytes) or one F32 (4 bytes),
// and a chunk's tail shorter than that stays zero. The block-quantized
// dtypes get random blocks: random bytes whose float16 scales (d, and
// Q4_K's and Q5_K's dmin) are then set to one value a matrix that keeps
// |w| within 2^Top (quantScales) — for benchmarks at real size, made at
// memory speed instead of by quantizing random values.
type RandomFill struct {
	Seed uint64
	Top  int
}

// RandomChunk is the span of one splitmix64 stream of a RandomFill.
const RandomChunk = 4 << 20

// RandomGenerator is implemented by a backend that generates a Mat's
// Random values where it keeps its copy of the weight (kernels/cuda, on the
// device), so that a weight source may leave Data nil for it.
type RandomGenerator interface {
	// GeneratesRandom reports whether Mats with Random set and no Data
	// can be used.
	GeneratesRandom() bool
}

// DataBytes is the size of m's Data, also while a Random m has none.
func (m *Mat) DataBytes() int64 {
	if m.Data != nil || m.Random == nil {
		return int64(len(m.Data))
	}
	return int64(m.Rows) * int64(m.DType.RowBytes(m.Cols))
}

// Materialize fills a Random m's Data on the host if it has none yet (a
// nil m is left alone). It is not safe for concurrent use on one Mat.
func (m *Mat) Materialize() {
	if m == nil || m.Data != nil || m.Random == nil {
		return
	}
	data := make([]byte, m.DataBytes())
	m.Random.Fill(data, m.DType)
	m.Data = data
}

// Fill writes the values into data (F32, BF16, F16 or a block-quantized
// dtype; another is left untouched), RandomChunk bytes per goroutine, at
// most 8 at a time.
func (f RandomFill) Fill(data []byte, dt DType) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for off := 0; off < len(data); off += RandomChunk {
		chunk := data[off:min(off+RandomChunk, len(data))]
		r := SplitMix64{S: f.Seed ^ uint64(off)*0xbf58476d1ce4e5b9}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			fillChunk(chunk, dt, f.Top, &r)
		}()
	}
	wg.Wait()
	if dt.Quantized() {
		setQuantScales(data, dt, f.Top)
	}
}

// quantScales returns the values RandomFill gives a block-quantized
// dtype's float16 scales (DType.ScaleOffsets) so that |w| ≤ 2^top: the
// largest |q| times the largest sub-block scale times d is 2^top (Q4_K and
// Q5_K: dmin is 8 and 16 times d, their mins half the range).
func quantScales(dt DType, top int) []float32 {
	t := math.Ldexp(1, top)
	switch dt {
	case Q8_0:
		return []float32{float32(t / 128)}
	case Q4_0:
		return []float32{float32(t / 8)}
	case Q4K:
		d := t / (63 * 15)
		return []float32{float32(d), float32(8 * d)}
	case Q5K:
		d := t / (63 * 31)
		return []float32{float32(d), float32(16 * d)}
	case Q6K:
		return []float32{float32(t / (128 * 32))}
	}
	return nil
}

// setQuantScales sets the scales of every whole block of dt in data
// (quantScales).
func setQuantScales(data []byte, dt DType, top int) {
	offs, vals := dt.ScaleOffsets(), quantScales(dt, top)
	bb := dt.BlockBytes()
	var h [2]uint16
	for i, v := range vals {
		h[i] = F32ToF16(v)
	}
	blocks := len(data) / bb
	var wg sync.WaitGroup
	const per = 1 << 16 // blocks a goroutine
	sem := make(chan struct{}, 8)
	for b0 := 0; b0 < blocks; b0 += per {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for b := b0; b < min(b0+per, blocks); b++ {
				for i, o := range offs {
					binary.LittleEndian.PutUint16(data[b*bb+o:], h[i])
				}
			}
		}()
	}
	wg.Wait()
}

func fillChunk(data []byte, dt DType, top int, r *SplitMix64) {
	if dt.Quantized() { // random bytes; Fill sets the scales after
		for i := 0; i+8 <= len(data); i += 8 {
			binary.LittleEndian.PutUint64(data[i:], r.Next())
		}
		return
	}
	switch dt {
	case BF16, F16:
		tab := halfTable(dt, top)
		for i := 0; i+8 <= len(data); i += 8 {
			x := r.Next()
			for k := range 4 {
				h := tab[uint16(x>>(16*k))]
				data[i+2*k] = byte(h)
				data[i+2*k+1] = byte(h >> 8)
			}
		}
	case F32:
		for i := 0; i+4 <= len(data); i += 4 {
			x := r.Next()
			off := bits.TrailingZeros64(x>>40|8) + 1
			e := uint32(max(top-off+127, 1))
			f := uint32(x)&0x807fffff | e<<23
			data[i], data[i+1], data[i+2], data[i+3] = byte(f), byte(f>>8), byte(f>>16), byte(f>>24)
		}
	}
}

// halfTables caches, per dtype and top exponent, the map from 16 random
// bits to a half-precision bit pattern: bit 15 the sign, bits 13–14 and the
// lowest set bit of (bits 12–13 | 4) pick the exponent offset, the low bits
// the mantissa (their top bits are reused, which is fine for weights).
var halfTables sync.Map // [2]int{dtype, top} → *[1 << 16]uint16

func halfTable(dt DType, top int) *[1 << 16]uint16 {
	key := [2]int{int(dt), top}
	if t, ok := halfTables.Load(key); ok {
		return t.(*[1 << 16]uint16)
	}
	manBits, bias := 7, 127
	if dt == F16 {
		manBits, bias = 10, 15
	}
	t := new([1 << 16]uint16)
	for v := range 1 << 16 {
		sel := uint16(v>>12) & 7
		off := bits.TrailingZeros16(sel|8) + 1 // 1 (½), 2 (¼), 3 or 4 (⅛ each)
		e := max(top-off+bias, 1)
		t[v] = uint16(v)&0x8000 | uint16(e)<<manBits | uint16(v)&(1<<manBits-1)
	}
	halfTables.Store(key, t)
	return t
}

// SplitMix64 is the splitmix64 generator: tiny, fast, and good enough for
// weights. The n-th output (from 1) of state S is mix(S + n·0x9e3779b97f4a7c15).
type SplitMix64 struct{ S uint64 }

// Next returns the next output.
func (r *SplitMix64) Next() uint64 {
	r.S += 0x9e3779b97f4a7c15
	z := r.S
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
