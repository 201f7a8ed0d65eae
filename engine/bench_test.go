package engine

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// benchModel builds the Qwen3-0.6B-shaped model from testdata with random
// bf16 weights and returns it with the bytes of weight matrices it holds.
func benchModel(b *testing.B, be kernels.Backend) (model.Model, int64) {
	b.Helper()
	cfg, err := config.Load(filepath.Join("testdata", "qwen3-0.6b"))
	if err != nil {
		b.Fatal(err)
	}
	src := randweights.New(1, kernels.BF16)
	m, err := model.New(cfg, src, be)
	if err != nil {
		b.Fatal(err)
	}
	return m, src.Bytes()
}

// BenchmarkDecode measures batched decode steps of a Qwen3-0.6B-shaped
// model (random bf16 weights, tied embeddings) after a 128-token prompt per
// sequence. It reports decode tokens/s and the weight bytes a step streams
// (every matrix once, the tied embedding as the LM head).
func BenchmarkDecode(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	m, weightBytes := benchModel(b, be)
	info := m.Info()
	buf := streamBuffer()
	const prompt = 128
	for _, batch := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			c, err := model.NewCache(m, kvcache.Options{Budget: int64(batch*(prompt+4096)) * info.KVBytesPerToken})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			seqs := make([]model.Seq, batch)
			for i := range seqs {
				s := c.NewSeq()
				toks := make([]int32, prompt)
				for j := range toks {
					toks[j] = int32(rng.IntN(info.Vocab))
				}
				if err := c.Reserve(s, prompt); err != nil {
					b.Fatal(err)
				}
				if _, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, KV: s}}}); err != nil {
					b.Fatal(err)
				}
				seqs[i] = model.Seq{Tokens: []int32{toks[prompt-1]}, KV: s, Logits: model.LastLogits}
			}
			bw := streamRead(buf, 3)
			b.ResetTimer()
			steps := 0
			for b.Loop() {
				for i := range seqs {
					s := &seqs[i]
					s.Pos = s.KV.Len()
					if err := c.Reserve(s.KV, s.Pos+1); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := m.Forward(&model.Batch{Cache: c, Seqs: seqs}); err != nil {
					b.Fatal(err)
				}
				steps++
			}
			sec := b.Elapsed().Seconds()
			b.StopTimer()
			bw = (bw + streamRead(buf, 3)) / 2 // bandwidth around the loop
			achieved := float64(weightBytes) * float64(steps) / sec
			b.ReportMetric(float64(steps*batch)/sec, "tok/s")
			b.ReportMetric(achieved/1e9, "weightGB/s")
			b.ReportMetric(bw/1e9, "streamGB/s")
			b.ReportMetric(100*achieved/bw, "%roofline")
			b.ReportMetric(float64(weightBytes)/1e6, "MB/step")
		})
	}
}

// BenchmarkPrefill measures a 512-token prompt in one chunk.
func BenchmarkPrefill(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	m, _ := benchModel(b, be)
	const n = 512
	c, err := model.NewCache(m, kvcache.Options{Budget: int64(n) * m.Info().KVBytesPerToken})
	if err != nil {
		b.Fatal(err)
	}
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(i * 7919 % m.Info().Vocab)
	}
	b.ResetTimer()
	for b.Loop() {
		s := c.NewSeq()
		c.Reserve(s, n)
		if _, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, KV: s, Logits: model.LastLogits}}}); err != nil {
			b.Fatal(err)
		}
		c.Free(s)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
}

// streamBuffer returns a 512 MiB buffer for streamRead, far larger than
// any cache.
func streamBuffer() []uint64 {
	buf := make([]uint64, 1<<26)
	for i := range buf {
		buf[i] = uint64(i)
	}
	return buf
}

// streamRead returns the best read bandwidth, in bytes/s, of reps passes of
// all cores summing buf: the memory bandwidth a decode step is bound by.
func streamRead(buf []uint64, reps int) float64 {
	t := runtime.GOMAXPROCS(0)
	best := 0.0
	sums := make([]uint64, t)
	for range reps {
		start := time.Now()
		var wg sync.WaitGroup
		for k := range t {
			part := buf[k*len(buf)/t : (k+1)*len(buf)/t]
			wg.Go(func() {
				var s0, s1, s2, s3 uint64
				for i := 0; i+4 <= len(part); i += 4 {
					s0 += part[i]
					s1 += part[i+1]
					s2 += part[i+2]
					s3 += part[i+3]
				}
				sums[k] = s0 + s1 + s2 + s3
			})
		}
		wg.Wait()
		best = max(best, float64(len(buf)*8)/time.Since(start).Seconds())
	}
	return best
}

// BenchmarkStreamRead measures the memory read bandwidth on its own.
func BenchmarkStreamRead(b *testing.B) {
	buf := streamBuffer()
	bw := 0.0
	for b.Loop() {
		bw = max(bw, streamRead(buf, 1))
	}
	b.ReportMetric(bw/1e9, "GB/s")
}
