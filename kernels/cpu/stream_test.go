package cpu

import (
	"fmt"
	"sync"
	"testing"
)

var (
	streamOnce sync.Once
	streamBuf  []float32 // 1 GiB, far larger than the caches
)

// BenchmarkStreamRead sums a 1 GiB []float32 with 1 and with all threads:
// the read bandwidth that a bandwidth-bound kernel (decode MatMul) can hope
// for. The sum is AVX2 assembly where available; scalar Go adds are too slow
// to saturate memory.
func BenchmarkStreamRead(b *testing.B) {
	streamOnce.Do(func() {
		streamBuf = make([]float32, 1<<30/4)
		for i := range streamBuf {
			streamBuf[i] = float32(i & 1023)
		}
	})
	for _, threads := range []int{1, 0} {
		be := New(threads)
		b.Run(fmt.Sprintf("threads=%d", be.Threads()), func(b *testing.B) {
			b.SetBytes(int64(4 * len(streamBuf)))
			const chunk = 1 << 20
			sums := make([]float32, len(streamBuf)/chunk)
			for b.Loop() {
				be.Parallel(len(sums), func(lo, hi int) {
					sums[lo] = streamSum(streamBuf[lo*chunk : hi*chunk])
				})
			}
		})
		be.Close()
	}
}

func TestStreamSum(t *testing.T) {
	for _, n := range []int{0, 1, 7, 63, 64, 65, 1000} {
		x := make([]float32, n)
		var want float32
		for i := range x {
			x[i] = float32(i%7) - 3
			want += x[i]
		}
		if got := streamSum(x); got != want {
			t.Errorf("n=%d: sum %g, want %g", n, got, want)
		}
	}
}

// sumGo is streamSum without assembly.
func sumGo(x []float32) float32 {
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		v := x[:4:4]
		s0, s1, s2, s3 = s0+v[0], s1+v[1], s2+v[2], s3+v[3]
		x = x[4:]
	}
	for _, v := range x {
		s0 += v
	}
	return (s0 + s1) + (s2 + s3)
}
