package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkDeltaRule runs the delta-rule op for one sequence: a decode
// token of a Qwen3-Next-sized GDN layer (32 value heads over 16 key heads,
// DK = DV = 128) and of a glm5_next-sized KDA layer (64 heads), and a
// 512-token prefill chunk of 4 heads (the chunked form). "MB/s" reads as
// million tokens per second.
func BenchmarkDeltaRule(b *testing.B) {
	for _, c := range []struct {
		name   string
		n      kernels.DeltaNet
		tokens int
	}{
		{"decode/GDN", kernels.DeltaNet{Heads: 32, KeyHeads: 16, DK: 128, DV: 128}, 1},
		{"decode/KDA", kernels.DeltaNet{Heads: 64, KeyHeads: 64, DK: 128, DV: 128, PerChannel: true, LowerBound: -5}, 1},
		{"prefill/GDN", kernels.DeltaNet{Heads: 4, KeyHeads: 4, DK: 128, DV: 128}, 512},
		{"prefill/KDA", kernels.DeltaNet{Heads: 4, KeyHeads: 4, DK: 128, DV: 128, PerChannel: true, LowerBound: -5}, 512},
	} {
		b.Run(c.name, func(b *testing.B) {
			d := cpu.New(0)
			rng := rand.New(rand.NewPCG(3, 3))
			gw := c.n.Heads
			if c.n.PerChannel {
				gw *= c.n.DK
			}
			up := func(rows, cols int) kernels.Tensor {
				t, _ := d.Alloc(kernels.F32, rows, cols)
				v := kerneltest.RandN(rng, rows*cols)
				d.WriteF32(t, v)
				return t
			}
			ints := func(v ...int32) kernels.Tensor {
				t, _ := d.Alloc(kernels.I32, len(v), 1)
				d.WriteI32(t, v)
				return t
			}
			c.n.ALog, c.n.DtBias = up(1, c.n.Heads), up(1, gw)
			qkv, a, bt := up(c.tokens, c.n.QKVWidth()), up(c.tokens, gw), up(c.tokens, c.n.Heads)
			out, _ := d.Alloc(kernels.F32, c.tokens, c.n.Heads*c.n.DV)
			state, _ := d.Alloc(kernels.F32, 1, c.n.StateWidth())
			r := &kernels.Recurrent{Start: ints(0, int32(c.tokens)), Slot: ints(0)}
			b.SetBytes(int64(c.tokens))
			for b.Loop() {
				d.DeltaRule(out, qkv, a, bt, state, r, &c.n)
			}
		})
	}
}
