package sample

import (
	"math/rand/v2"
	"testing"
)

// benchLogits returns a 150k vocabulary of logits shaped like a language
// model's: most mass on a few dozen tokens.
func benchLogits() []float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	l := make([]float32, 150_000)
	for i := range l {
		l[i] = float32(rng.NormFloat64() * 2)
	}
	for i := range 30 {
		l[rng.IntN(len(l))] = 12 + float32(i)/10
	}
	return l
}

func BenchmarkSample(b *testing.B) {
	logits := benchLogits()
	hist := make([]int32, 64)
	for i := range hist {
		hist[i] = int32(i * 997)
	}
	for _, c := range []struct {
		name string
		p    Params
	}{
		{"greedy", Params{}},
		{"greedy+penalties", Params{RepeatPenalty: 1.1, PresencePenalty: 0.2}},
		{"temperature", Params{Temperature: 0.8}},
		{"topk40", Params{Temperature: 0.8, TopK: 40}},
		{"topp0.9", Params{Temperature: 0.8, TopP: 0.9}},
		{"minp0.05", Params{Temperature: 0.8, MinP: 0.05}},
		{"all", Params{Temperature: 0.8, TopK: 40, TopP: 0.9, MinP: 0.05, RepeatPenalty: 1.1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := New(c.p)
			b.ReportAllocs()
			for b.Loop() {
				s.Sample(logits, hist)
			}
		})
	}
	b.Run("probs+samplefrom", func(b *testing.B) {
		s := New(Params{Temperature: 0.8, TopP: 0.9})
		b.ReportAllocs()
		for b.Loop() {
			s.SampleFrom(s.Probs(logits, hist))
		}
	})
}
