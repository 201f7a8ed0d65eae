package kernels

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"testing"
)

// TestRandomFillDirect: every output of RandomFill can be computed on its
// own, as kernels/cuda's ferrite_random_fill does (the n-th output of a
// chunk's stream is mix(state + n·golden), the 16-bit patterns computed
// rather than looked up, a short tail zero). This is that computation in
// Go, checked against Fill for each dtype, a tail shorter than one output,
// and several chunks.
func TestRandomFillDirect(t *testing.T) {
	mix := func(z uint64) uint64 {
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		return z ^ z>>31
	}
	half := func(v uint32, top, manBits, bias int) uint32 {
		off := bits.TrailingZeros32(v>>12&7|8) + 1
		e := uint32(uint16(max(top-off+bias, 1)))
		return (v&0x8000 | e<<manBits | v&(1<<manBits-1)) & 0xffff
	}
	for _, dt := range []DType{F32, BF16, F16} {
		for _, n := range []int{6, 30, 4096, 2*RandomChunk + 1000 + 6} {
			if dt == F32 {
				n &^= 3
			}
			f := RandomFill{Seed: 0x1234567 + uint64(n), Top: -4}
			want := make([]byte, n)
			f.Fill(want, dt)
			got := bytes.Repeat([]byte{0xa5}, n)
			word := 8
			if dt == F32 {
				word = 4
			}
			manBits, bias := 7, 127
			if dt == F16 {
				manBits, bias = 10, 15
			}
			for o := 0; o < n; o += word {
				chunk := o / RandomChunk * RandomChunk
				end := min(n, chunk+RandomChunk)
				if o+word > end {
					clear(got[o:end])
					continue
				}
				x := mix((f.Seed ^ uint64(chunk)*0xbf58476d1ce4e5b9) + uint64((o-chunk)/word+1)*0x9e3779b97f4a7c15)
				if dt == F32 {
					off := bits.TrailingZeros32(uint32(x>>40)|8) + 1
					e := uint32(max(f.Top-off+127, 1))
					binary.LittleEndian.PutUint32(got[o:], uint32(x)&0x807fffff|e<<23)
					continue
				}
				binary.LittleEndian.PutUint32(got[o:], half(uint32(x), f.Top, manBits, bias)|half(uint32(x>>16), f.Top, manBits, bias)<<16)
				binary.LittleEndian.PutUint32(got[o+4:], half(uint32(x>>32), f.Top, manBits, bias)|half(uint32(x>>48), f.Top, manBits, bias)<<16)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for got[i] == want[i] {
					i++
				}
				t.Fatalf("%v, %d bytes: byte %d computed directly %#x, Fill %#x", dt, n, i, got[i], want[i])
			}
		}
	}
}

// TestRandomFillQuant: a Random Mat of each block-quantized dtype
// materializes to the same blocks for the same seed (others for another),
// spanning several of Fill's chunks, and decodes to finite weights of
// both signs within 2^Top that are not all alike: usable weights for
// benchmarks at real size.
func TestRandomFillQuant(t *testing.T) {
	for _, dt := range []DType{Q8_0, Q4_0, Q4K, Q5K, Q6K} {
		const rows, cols, top = 4096, 2048, -5
		mat := func(seed uint64) *Mat {
			m := &Mat{DType: dt, Rows: rows, Cols: cols, Random: &RandomFill{Seed: seed, Top: top}}
			m.Materialize()
			return m
		}
		a, b, c := mat(9), mat(9), mat(10)
		if int64(len(a.Data)) <= RandomChunk || len(a.Data) != rows*dt.RowBytes(cols) {
			t.Fatalf("%v: %d bytes", dt, len(a.Data))
		}
		if !bytes.Equal(a.Data, b.Data) || bytes.Equal(a.Data, c.Data) {
			t.Fatalf("%v: the blocks do not follow the seed", dt)
		}
		limit := math.Ldexp(1, top) * 1.002 // the scales' rounding to float16
		row := make([]float32, cols)
		var neg, pos int
		seen := map[float32]bool{}
		for r := 0; r < rows; r += 97 {
			a.RowF32(row, r)
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.Abs(float64(v)) > limit {
					t.Fatalf("%v: row %d holds %g, want within %g", dt, r, v, limit)
				}
				if v < 0 {
					neg++
				} else if v > 0 {
					pos++
				}
				seen[v] = true
			}
		}
		if neg == 0 || pos == 0 || len(seen) < 16 { // Q4_0: one d a matrix, 16 levels
			t.Fatalf("%v: %d negative, %d positive, %d distinct weights", dt, neg, pos, len(seen))
		}
	}
}
