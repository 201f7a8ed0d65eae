package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkAttnDecodeCold is a decode step's attention over 28 layers'
// BF16 caches (Qwen3-0.6B heads, one row at context 640) with bfloat16
// activations, thread CPU time of the calling worker: 73 MB of keys and
// values, which a step reads from memory, as here (SetBytes: the cache
// bytes of one call). The backend has as many workers as -cpu.
func BenchmarkAttnDecodeCold(b *testing.B) { benchAttnDecode(b, 640, 28) }

// BenchmarkAttnDecodeContexts is BenchmarkAttnDecodeCold at contexts from
// 16 to 4,096 (28 layers, or as many as make 300 MB).
func BenchmarkAttnDecodeContexts(b *testing.B) {
	for _, ctx := range []int{16, 128, 512, 1024, 2048, 4096} {
		b.Run(fmt.Sprintf("ctx%d", ctx), func(b *testing.B) { benchAttnDecode(b, ctx, min(28, 300<<20/(4*ctx*1024))) })
	}
}

// BenchmarkAttnDecodeWarm is BenchmarkAttnDecodeCold over one layer's
// cache, read again every call (2.6 MB: from the last-level cache).
func BenchmarkAttnDecodeWarm(b *testing.B) { benchAttnDecode(b, 640, 1) }

// benchAttnDecode is the decode benchmarks at context ctx over layers
// layers' caches.
func benchAttnDecode(b *testing.B, ctx, layers int) {
	const heads, kvHeads, hd, bs = 16, 8, 128, 16
	be, ints, f32t := attnBackend(runtime.GOMAXPROCS(0))
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

// attnBackend returns the attention benchmarks' backend (threads workers,
// bfloat16 activations) and makers of its tensors: an I32 tensor (r, cols)
// holding v, and an F32 one of normal random values.
func attnBackend(threads int) (be *Backend, ints func(v []int32, r, cols int) kernels.Tensor, f32t func(r, cols int) kernels.Tensor) {
	be = New(threads)
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

// TestAttentionSplits runs the conformance suite's attention cases on
// backends of 1, 3 and 8 workers: a decode row splits its blocks into as
// many ranges as there are workers per row (rows), so these cover no
// merge, an odd split and splits longer than a short row's blocks.
func TestAttentionSplits(t *testing.T) {
	for _, threads := range []int{1, 3, 8} {
		for _, bf16 := range []bool{false, true} {
			t.Run(fmt.Sprintf("threads=%d/bf16=%v", threads, bf16), func(t *testing.T) {
				b := New(threads)
				defer b.Close()
				b.SetBF16Activations(bf16)
				kerneltest.RunAttentionOps(t, b)
			})
		}
	}
}
