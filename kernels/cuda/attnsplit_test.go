//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestAttnLenSplit checks FERRITE_CUDA_ATTN_LENSPLIT's attention against
// the default splits on a block table far wider than the rows (as the
// cache's is): rows of 1 to 300 keys of a 512-key table, a float32 and a
// bf16 cache, merged by ferrite_attn_combine and in the kernel; every
// output within 10⁻⁵ of the largest |value|, and not all bit-equal to the
// default (the splits do differ).
func TestAttnLenSplit(t *testing.T) {
	b := openOps(t)
	defer b.SetAttnLenSplit(b.SetAttnLenSplit(0))
	const heads, kvh, hd, bs, nb = 32, 8, 128, 16, 32
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: 0.088}
	rng := rand.New(rand.NewPCG(13, 3))
	for _, n := range []int{5, 32, 64} {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, merged := range []bool{false, true} {
				t.Run(fmt.Sprintf("n=%d/%v/merged=%v", n, dt, merged), func(t *testing.T) {
					b.SetFuse(merged)
					defer b.SetFuse(false)
					keys := nb * bs
					pos, seq, table := make([]int32, n), make([]int32, n), make([]int32, n*nb)
					for i := range pos {
						pos[i], seq[i] = int32(rng.IntN(300)), int32(i)
						for j := range nb {
							table[i*nb+j] = int32(i*nb + j)
						}
					}
					p := &kernels.Paged{Pos: i32Tensor(t, b, n, 1, pos), Seq: i32Tensor(t, b, n, 1, seq), Slot: i32Tensor(t, b, n, 1, pos),
						Blocks: i32Tensor(t, b, n, nb, table), BlockSize: bs}
					q := f32Tensor(t, b, n, heads*hd, randF32(rng, n*heads*hd))
					vmax := 0.0
					var caches [2]kernels.Tensor
					for c := range caches {
						vals := randF32(rng, n*keys*kvh*hd)
						for _, v := range vals {
							vmax = math.Max(vmax, math.Abs(float64(v)))
						}
						caches[c] = f32Tensor(t, b, n*keys, kvh*hd, vals)
						if dt == kernels.BF16 {
							bc, err := b.Alloc(kernels.BF16, n*keys, kvh*hd)
							if err != nil {
								t.Fatal(err)
							}
							raw := make([]byte, 2*len(vals))
							for i, v := range vals {
								h := kernels.F32ToBF16(v)
								raw[2*i], raw[2*i+1] = byte(h), byte(h>>8)
							}
							tb, _ := bc.Buffer()
							if err := tb.(*tensorBuf).buf.Upload(0, raw); err != nil {
								t.Fatal(err)
							}
							caches[c] = bc
						}
					}
					var outs [2][]float32
					for i, k := range []int{0, 4} {
						b.SetAttnLenSplit(k)
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
					same := true
					for j, v := range outs[0] {
						if d := math.Abs(float64(v - outs[1][j])); d > 1e-5*vmax || math.IsNaN(float64(outs[1][j])) {
							t.Fatalf("out[%d] = %g split by length, %g by the table (|Δ| %.3g, max |v| %.3g)", j, outs[1][j], v, d, vmax)
						}
						same = same && math.Float32bits(v) == math.Float32bits(outs[1][j])
					}
					if same && n > 5 {
						t.Errorf("every output bit-equal: the length split did not change the splits")
					}
				})
			}
		}
	}
}
