//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestDecodeBatchPrefill checks the decode batch's attention without the
// prefill kernel (decodeBatch) against the launch with it
// (FERRITE_CUDA_DECODE_PREFILL=1): 64 and 96 rows, one a sequence, at
// positions up to 300, a bf16 cache; the outputs must be bit-equal (the
// prefill kernel owns no tile of such a batch), and a batch with a
// sequence of several rows must still take the prefill kernel.
func TestDecodeBatchPrefill(t *testing.T) {
	b := openOps(t)
	defer func() { decodePrefill = false }()
	defer b.SetDecodeBatch(b.SetDecodeBatch(0, 0), 0) // the split-KV kernel's decode batches (ferrite_dattn's: TestDecodeBatch)
	const heads, kvh, hd, bs, nb = 32, 8, 128, 16, 32
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: 0.088}
	rng := rand.New(rand.NewPCG(13, 4))
	for _, n := range []int{64, 96} {
		decodePrefill = false // the previous n's last launch set it
		if !b.usePrefill(shape, n) {
			t.Skipf("no prefill kernel at %d rows", n)
		}
		pos, seq, table := make([]int32, n), make([]int32, n), make([]int32, n*nb)
		for i := range pos {
			pos[i], seq[i] = int32(rng.IntN(300)), int32(i)
			for j := range nb {
				table[i*nb+j] = int32(i*nb + j)
			}
		}
		p := &kernels.Paged{Pos: i32Tensor(t, b, n, 1, pos), Seq: i32Tensor(t, b, n, 1, seq), Slot: i32Tensor(t, b, n, 1, pos),
			Blocks: i32Tensor(t, b, n, nb, table), BlockSize: bs}
		if !decodeBatch(n, p) {
			t.Fatalf("n=%d: one row a sequence is not a decode batch", n)
		}
		if many := (&kernels.Paged{Blocks: i32Tensor(t, b, n/2, nb, table[:n/2*nb])}); decodeBatch(n, many) {
			t.Fatalf("n=%d: %d sequences taken for a decode batch", n, n/2)
		}
		q := f32Tensor(t, b, n, heads*hd, randF32(rng, n*heads*hd))
		kcs, vcs := randCaches(t, b, 1, n*nb*bs, kvh*hd)
		caches := [2]kernels.Tensor{kcs[0], vcs[0]}
		var outs [2][]float32
		for i, pre := range []bool{false, true} {
			decodePrefill = pre
			out := f32Tensor(t, b, n, heads*hd, make([]float32, n*heads*hd))
			b.BeginStep()
			b.Attention(out, q, caches[0], caches[1], p, shape)
			b.EndStep()
			outs[i] = make([]float32, n*heads*hd)
			b.ReadF32(outs[i], out)
			if err := b.Err(); err != nil {
				t.Fatal(err)
			}
		}
		for j, v := range outs[0] {
			if math.Float32bits(v) != math.Float32bits(outs[1][j]) || math.IsNaN(float64(v)) {
				t.Fatalf("n=%d: out[%d] = %g without the prefill kernel, %g with it", n, j, v, outs[1][j])
			}
		}
	}
}
