package gqa_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkAttention times one layer's attention over the paged cache at
// the Qwen3-0.6B shape (16 query heads, 8 KV heads, head_dim 128): the op
// set's Attention over F32 and BF16 caches. decode: one row at position
// ctx-1; prefill: ctx rows of one sequence.
//
//	go test -run - -bench Attention ./engine/gqa
func BenchmarkAttention(b *testing.B) {
	const heads, kvHeads, hd, bs = 16, 8, 128, 16
	be := cpu.New(0)
	defer be.Close()
	for _, ctx := range []int{512} {
		for _, rows := range []int{1, ctx} {
			name := "decode"
			if rows > 1 {
				name = "prefill"
			}
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
				b.Run(fmt.Sprintf("%s/ctx=%d/op-%v", name, ctx, dt), func(b *testing.B) {
					benchOp(b, be, dt, heads, kvHeads, hd, bs, ctx, rows)
				})
			}
		}
	}
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := kerneltest.RandN(rng, n)
	return v
}

// benchOp times the op set's Attention for the same case.
func benchOp(b *testing.B, be *cpu.Backend, dt kernels.DType, heads, kvHeads, hd, bs, ctx, rows int) {
	rng := rand.New(rand.NewPCG(1, 2))
	kw := kvHeads * hd
	nb := (ctx + bs - 1) / bs
	kc, _ := be.Alloc(dt, nb*bs, kw)
	vc, _ := be.Alloc(dt, nb*bs, kw)
	pos, seq, slot, blocks := make([]int32, ctx), make([]int32, ctx), make([]int32, ctx), make([]int32, nb)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	for p := range ctx {
		pos[p], slot[p] = int32(p), int32(p)
	}
	ints := func(v []int32, r, cols int) kernels.Tensor {
		t, _ := be.Alloc(kernels.I32, r, cols)
		be.WriteI32(t, v)
		return t
	}
	f32 := func(v []float32, r, cols int) kernels.Tensor {
		t, _ := be.Alloc(kernels.F32, r, cols)
		be.WriteF32(t, v)
		return t
	}
	all := &kernels.Paged{Pos: ints(pos, ctx, 1), Seq: ints(seq, ctx, 1), Slot: ints(slot, ctx, 1), Blocks: ints(blocks, 1, nb), BlockSize: bs}
	k, v := f32(randVec(rng, ctx*kw), ctx, kw), f32(randVec(rng, ctx*kw), ctx, kw)
	be.StoreKV(kc, vc, k, v, all)
	p := &kernels.Paged{Pos: all.Pos.Slice(ctx-rows, ctx), Seq: all.Seq.Slice(ctx-rows, ctx), Slot: all.Slot.Slice(ctx-rows, ctx), Blocks: all.Blocks, BlockSize: bs}
	q := f32(randVec(rng, rows*heads*hd), rows, heads*hd)
	out, _ := be.Alloc(kernels.F32, rows, heads*hd)
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.088}
	for b.Loop() {
		be.Attention(out, q, kc, vc, p, shape)
	}
}
