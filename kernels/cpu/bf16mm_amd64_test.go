//go:build !noasm

package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkBF16GEMM is one worker's MatMul over BF16 weights at the shapes
// of a Qwen3-0.6B layer (q, k/v, o, gate/up, down; LM head for decode), x
// in float32 (the float tiles) and rounded to bfloat16 (the VDPBF16PS
// path), thread CPU time: the per-core rate prefill and batched decode get,
// less sensitive to a shared machine than BenchmarkMatMulBF16's wall time.
func BenchmarkBF16GEMM(b *testing.B) {
	for _, s := range []benchShape{
		{512, 2048, 1024}, {512, 1024, 1024}, {512, 1024, 2048}, {512, 3072, 1024}, {512, 1024, 3072},
		{8, 3072, 1024}, {8, 1024, 3072},
	} {
		for _, path := range []string{"f32", "vdp4x4", "gemm", "gemmKC4096", "gemmKC1024"} {
			b.Run(fmt.Sprintf("%s/n=%d/%dx%d", path, s.n, s.rows, s.cols), func(b *testing.B) {
				be := New(1)
				defer be.Close()
				be.SetBF16Activations(path != "f32")
				gemmTilesOff.Store(path == "vdp4x4")
				switch path {
				case "gemmKC4096":
					gemmKC = 4096
				case "gemmKC1024":
					gemmKC = 1024
				}
				defer func(kc int) { gemmKC = kc }(gemmKC)
				defer gemmTilesOff.Store(false)
				rng := rand.New(rand.NewPCG(1, 2))
				w0 := kerneltest.NewMat(rng, kernels.BF16, s.rows, s.cols, 128, 128)
				// Copies filling 128 MiB, cycled through: each call's weights
				// come from memory, as in a model's forward pass.
				ws := make([]*kernels.Mat, max(1, 128<<20/len(w0.Data)))
				for i := range ws {
					c := *w0
					c.Data = append([]byte(nil), w0.Data...)
					ws[i] = &c
				}
				wi := 0
				x := make([]float32, s.n*s.cols)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				y := make([]float32, s.n*s.rows)
				t0 := threadCPU()
				cpuLoop(b, func() {
					be.MatMul(y, x, ws[wi], s.n)
					wi = (wi + 1) % len(ws)
				})
				b.ReportMetric(float64(s.n*s.rows*s.cols)*float64(b.N)/float64(threadCPU()-t0), "GMAC/cpu-s")
			})
		}
	}
}

type benchShape struct{ n, rows, cols int }

// BenchmarkAttnPrefill is one layer's prefill attention (512 rows of one
// sequence, Qwen3-0.6B heads) over a BF16 cache with bfloat16 activations,
// one worker, thread CPU time: scores on the float tiles over widened keys
// against the gemm tiles over the cached keys.
func BenchmarkAttnPrefill(b *testing.B) { benchAttn(b, 512) }

// BenchmarkAttnDecode is BenchmarkAttnPrefill for one row at position 511
// (decode at context 512): scores on the float tiles against the gemm tiles.
func BenchmarkAttnDecode(b *testing.B) { benchAttn(b, 1) }

func benchAttn(b *testing.B, rows int) {
	const heads, kvHeads, hd, bs, ctx = 16, 8, 128, 16, 512
	for _, v := range []string{"f32keys", "gemm"} {
		b.Run(v, func(b *testing.B) {
			attnGemmOff.Store(v == "f32keys")
			defer attnGemmOff.Store(false)
			be, ints, f32t := attnBackend(1)
			defer be.Close()
			kw := kvHeads * hd
			nb := (ctx + bs - 1) / bs
			kc, _ := be.Alloc(kernels.BF16, nb*bs, kw)
			vc, _ := be.Alloc(kernels.BF16, nb*bs, kw)
			p := onePaged(ints, ctx, bs)
			be.StoreKV(kc, vc, f32t(ctx, kw), f32t(ctx, kw), p)
			q := f32t(rows, heads*hd)
			out, _ := be.Alloc(kernels.F32, rows, heads*hd)
			shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.088}
			p = &kernels.Paged{Pos: p.Pos.Slice(ctx-rows, ctx), Seq: p.Seq.Slice(ctx-rows, ctx), Slot: p.Slot.Slice(ctx-rows, ctx), Blocks: p.Blocks, BlockSize: bs}
			cpuLoop(b, func() { be.Attention(out, q, kc, vc, p, shape) })
		})
	}
}
