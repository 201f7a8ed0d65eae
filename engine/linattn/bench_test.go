package linattn

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchPar splits heads over two goroutines.
func benchPar(n int, fn func(lo, hi int)) {
	if n < 2 {
		Serial(n, fn)
		return
	}
	done := make(chan struct{})
	go func() { fn(0, n/2); close(done) }()
	fn(n/2, n)
	<-done
}

// BenchmarkPrefill compares the chunk and recurrent forms on a 512-token
// prefill of 4 heads with DK = DV = 128.
func BenchmarkPrefill(b *testing.B) {
	for _, pc := range []bool{false, true} {
		for _, par := range []bool{false, true} {
			d := DeltaRule{Heads: 4, DK: 128, DV: 128, PerChannel: pc}
			if par {
				d.Parallel = benchPar
			}
			rng := rand.New(rand.NewPCG(3, 3))
			p := gen(rng, d, 512, -5)
			out := make([]float32, p.T*d.Heads*d.DV)
			state := make([]float32, len(p.s0))
			kind := map[bool]string{false: "GDN", true: "KDA"}[pc]
			for _, form := range []string{"chunked", "recurrent"} {
				b.Run(fmt.Sprintf("%s/%s/par=%v", kind, form, par), func(b *testing.B) {
					b.SetBytes(int64(p.T)) // "MB/s" reads as million tokens/s
					for b.Loop() {
						copy(state, p.s0)
						s := p.seq(0, p.T, state, out)
						if form == "chunked" {
							d.Chunked(s)
						} else {
							d.Recurrent(s)
						}
					}
				})
			}
		}
	}
}

// BenchmarkChunkSize measures the chunk form's speed against its chunk size
// (results are the same up to rounding; 64 is the default).
func BenchmarkChunkSize(b *testing.B) {
	for _, pc := range []bool{false, true} {
		for _, C := range []int{16, 32, 64, 128} {
			d := DeltaRule{Heads: 4, DK: 128, DV: 128, PerChannel: pc, Chunk: C}
			p := gen(rand.New(rand.NewPCG(3, 3)), d, 512, -5)
			out := make([]float32, p.T*d.Heads*d.DV)
			state := make([]float32, len(p.s0))
			kind := map[bool]string{false: "GDN", true: "KDA"}[pc]
			b.Run(fmt.Sprintf("%s/C=%d", kind, C), func(b *testing.B) {
				for b.Loop() {
					copy(state, p.s0)
					d.Chunked(p.seq(0, p.T, state, out))
				}
			})
		}
	}
}

// BenchmarkDecode is one decode token of a Qwen3-Next-sized GDN layer
// (32 heads, DK = DV = 128) and of a glm5_next KDA layer (64 heads).
func BenchmarkDecode(b *testing.B) {
	for _, pc := range []bool{false, true} {
		H := map[bool]int{false: 32, true: 64}[pc]
		d := DeltaRule{Heads: H, DK: 128, DV: 128, PerChannel: pc}
		p := gen(rand.New(rand.NewPCG(4, 4)), d, 1, -5)
		out := make([]float32, H*d.DV)
		state := append([]float32(nil), p.s0...)
		kind := map[bool]string{false: "GDN", true: "KDA"}[pc]
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				d.Recurrent(p.seq(0, 1, state, out))
			}
		})
	}
}
