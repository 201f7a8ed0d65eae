package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// BenchmarkAttnDecodeCold is a decode step's attention over 28 layers'
// BF16 caches (Qwen3-0.6B heads, one row at context 640) on one worker
// with bfloat16 activations, thread CPU time: 73 MB of keys and values,
// which a step reads from memory, as here (SetBytes: the cache bytes of
// one call).
func BenchmarkAttnDecodeCold(b *testing.B) {
	const heads, kvHeads, hd, bs, ctx, layers = 16, 8, 128, 16, 640, 28
	be, ints, f32t := attnBackend()
	defer be.Close()
	kw := kvHeads * hd
	nb := (ctx + bs - 1) / bs
	all := onePaged(ints, ctx, bs)
	kv := f32t(ctx, kw)
	var kcs, vcs []kernels.Tensor
	for range layers {
		kc, _ := be.Alloc(kernels.BF16, nb*bs, kw)
		vc, _ := be.Alloc(kernels.BF16, nb*bs, kw)
		be.StoreKV(kc, vc, kv, kv, all)
		kcs, vcs = append(kcs, kc), append(vcs, vc)
	}
	q := f32t(1, heads*hd)
	out, _ := be.Alloc(kernels.F32, 1, heads*hd)
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.088}
	p := &kernels.Paged{Pos: all.Pos.Slice(ctx-1, ctx), Seq: all.Seq.Slice(ctx-1, ctx), Slot: all.Slot.Slice(ctx-1, ctx), Blocks: all.Blocks, BlockSize: bs}
	b.SetBytes(int64(2 * 2 * ctx * kw))
	l := 0
	cpuLoop(b, func() {
		be.Attention(out, q, kcs[l], vcs[l], p, shape)
		l = (l + 1) % layers
	})
}

// attnBackend returns the attention benchmarks' backend (one worker,
// bfloat16 activations) and makers of its tensors: an I32 tensor (r, cols)
// holding v, and an F32 one of normal random values.
func attnBackend() (be *Backend, ints func(v []int32, r, cols int) kernels.Tensor, f32t func(r, cols int) kernels.Tensor) {
	be = New(1)
	be.SetBF16Activations(true)
	rng := rand.New(rand.NewPCG(1, 2))
	ints = func(v []int32, r, cols int) kernels.Tensor {
		t, _ := be.Alloc(kernels.I32, r, cols)
		be.WriteI32(t, v)
		return t
	}
	f32t = func(r, cols int) kernels.Tensor {
		v := make([]float32, r*cols)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		t, _ := be.Alloc(kernels.F32, r, cols)
		be.WriteF32(t, v)
		return t
	}
	return be, ints, f32t
}

// onePaged is the paging of one sequence at positions [0, ctx) in cache
// slots [0, ctx), blocks of bs slots in order.
func onePaged(ints func(v []int32, r, cols int) kernels.Tensor, ctx, bs int) *kernels.Paged {
	nb := (ctx + bs - 1) / bs
	pos, seq, blocks := make([]int32, ctx), make([]int32, ctx), make([]int32, nb)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	for p := range ctx {
		pos[p] = int32(p)
	}
	return &kernels.Paged{Pos: ints(pos, ctx, 1), Seq: ints(seq, ctx, 1), Slot: ints(pos, ctx, 1), Blocks: ints(blocks, 1, nb), BlockSize: bs}
}
