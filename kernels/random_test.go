package kernels

import (
	"bytes"
	"encoding/binary"
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
