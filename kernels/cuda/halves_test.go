//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestFuseHalves checks ferrite_halves_rmsnorm_bf16x2: a split product
// added into the stream (Linear with acc, with and without a bias) and the
// next NormLinearCat or NormSwiGLULinear of that stream give, fused, the
// bits they give as two kernels — the stream and the product after the
// norm — and the fusion does happen (the product's fix is filled). Rows on
// both sides of the norm's block-size switch (the SM count).
func TestFuseHalves(t *testing.T) {
	b := halvesBackend(t)
	const hidden, in, qkv, inter = 256, 192, 320, 200
	rng := rand.New(rand.NewPCG(13, 1))
	o := kerneltest.NewMat(rng, kernels.BF16, hidden, in, 0, 0)
	cat := kerneltest.NewMat(rng, kernels.BF16, qkv, hidden, 0, 0)
	gate, up := kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0), kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)
	nw := f32Tensor(t, b, 1, hidden, randF32(rng, hidden))
	hn := &kernels.HeadNorm{W: nw, Eps: 1e-6, Offset: true}
	bias := f32Tensor(t, b, 1, hidden, randF32(rng, hidden))
	for _, n := range []int{fewRowsMax + 1, 40, b.dev.SMs + 7} { // up to fewRowsMax rows run as GEMVs (fewRows)
		for _, swiglu := range []bool{false, true} {
			for _, withBias := range []bool{false, true} {
				t.Run(fmt.Sprintf("n=%d/swiglu=%v/bias=%v", n, swiglu, withBias), func(t *testing.T) {
					av, xv := randF32(rng, n*in), randF32(rng, n*hidden)
					var epi kernels.Epilogue
					epi.Accumulate = true
					if withBias {
						epi.Bias = bias
					}
					width := qkv
					if swiglu {
						width = inter
					}
					var xs, ys [2][]float32
					for i, fuse := range []bool{false, true} {
						b.SetFuseHalves(fuse)
						a := f32Tensor(t, b, n, in, av)
						x := f32Tensor(t, b, n, hidden, xv)
						y := f32Tensor(t, b, n, width, make([]float32, n*width))
						b.BeginStep()
						b.Linear(x, a, o, epi)
						fix := b.halves.fix
						if swiglu {
							b.NormSwiGLULinear(y, x, hn, gate, up, 0)
						} else {
							b.NormLinearCat(y, x, hn, []*kernels.Mat{cat}, kernels.Epilogue{})
						}
						if fuse && (fix == nil || fix.y2 == 0) {
							t.Fatal("the norm did not join the product's epilogue")
						}
						if !fuse && fix != nil {
							t.Fatal("a fix without the fusion")
						}
						b.EndStep()
						xs[i], ys[i] = make([]float32, n*hidden), make([]float32, n*width)
						b.ReadF32(xs[i], x)
						b.ReadF32(ys[i], y)
						if err := b.Err(); err != nil {
							t.Fatal(err)
						}
					}
					for k, v := range [2][2][]float32{xs, ys} {
						for j := range v[0] {
							if math.Float32bits(v[0][j]) != math.Float32bits(v[1][j]) {
								t.Fatalf("%s[%d] = %g fused, %g as two kernels", [2]string{"stream", "product"}[k], j, v[1][j], v[0][j])
							}
						}
					}
				})
			}
		}
	}
}

// TestFuseHalvesPrep checks ferrite_prepare_qkv_halves and the attention
// kernel's split output: the q/k/v product (NormLinearCat, with and
// without a bias), PrepareQKV (q/k norms, rotation, a float32 and a bf16
// cache), Attention and the o projection (Linear with acc, which takes the
// attention's split output) give, fused, the bits of the separate kernels
// — the q/k/v sums, the queries, both caches, the attention's output and
// the stream — and both fusions do happen.
func TestFuseHalvesPrep(t *testing.T) {
	b := halvesBackend(t)
	// The split-KV kernel's split output: decode batches on ferrite_dattn
	// (the default, decode.go) write none, and the o projection splits
	// its input itself.
	defer b.SetDecodeBatch(b.SetDecodeBatch(0, 0), 0)
	const hidden, heads, kvh, hd, bs = 256, 4, 2, 64, 16
	const width = (heads + 2*kvh) * hd
	rng := rand.New(rand.NewPCG(13, 2))
	cat := kerneltest.NewMat(rng, kernels.BF16, width, hidden, 0, 0)
	o := kerneltest.NewMat(rng, kernels.BF16, hidden, heads*hd, 0, 0)
	hn := &kernels.HeadNorm{W: f32Tensor(t, b, 1, hidden, randF32(rng, hidden)), Eps: 1e-6}
	qn := &kernels.HeadNorm{W: f32Tensor(t, b, 1, hd, randF32(rng, hd)), Eps: 1e-6}
	kn := &kernels.HeadNorm{W: f32Tensor(t, b, 1, hd, randF32(rng, hd)), Eps: 1e-6, Offset: true}
	inv := make([]float32, hd/4)
	for i := range inv {
		inv[i] = float32(math.Pow(10000, -float64(2*i)/float64(hd/2)))
	}
	rope := &kernels.Rotary{InvFreq: f32Tensor(t, b, 1, len(inv), inv), Dim: hd / 2, Scale: 1}
	bias := f32Tensor(t, b, 1, width, randF32(rng, width))
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: 0.125}
	for _, n := range []int{fewRowsMax + 1, 37} { // up to fewRowsMax rows run as GEMVs (fewRows)
		nb := 16 // blocks a sequence: 256 keys, two splits; 1 block (one split) for the fewer rows
		if n < 37 {
			nb = 1
		}
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, c := range []struct{ bias, merged bool }{{false, false}, {true, false}, {false, true}} {
				withBias := c.bias
				t.Run(fmt.Sprintf("n=%d/%v/bias=%v/merged=%v", n, dt, c.bias, c.merged), func(t *testing.T) {
					b.SetFuse(c.merged) // the attention kernel merges its splits, or ferrite_attn_combine does
					defer b.SetFuse(false)
					xv, yv := randF32(rng, n*hidden), randF32(rng, n*hidden)
					keys := nb * bs
					pos, slot, seq, table := make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n*nb)
					for i := range pos { // row i: sequence i, blocks i·nb …, at a position below keys
						pos[i], seq[i] = int32((37*i+5)%keys), int32(i)
						slot[i] = int32(i*keys) + pos[i]
						for j := range nb {
							table[i*nb+j] = int32(i*nb + j)
						}
					}
					slot[0] = int32(n*keys + 5) // outside the cache: skipped
					p := &kernels.Paged{Pos: i32Tensor(t, b, n, 1, pos), Slot: i32Tensor(t, b, n, 1, slot), Seq: i32Tensor(t, b, n, 1, seq),
						Blocks: i32Tensor(t, b, n, nb, table), BlockSize: bs}
					var epi kernels.Epilogue
					if withBias {
						epi.Bias = bias
					}
					var outs [2][6][]float32
					for i, fuse := range []bool{false, true} {
						b.SetFuseHalves(fuse)
						x, y := f32Tensor(t, b, n, hidden, xv), f32Tensor(t, b, n, hidden, yv)
						qkv := f32Tensor(t, b, n, width, make([]float32, n*width))
						q := f32Tensor(t, b, n, heads*hd, make([]float32, n*heads*hd))
						att := f32Tensor(t, b, n, heads*hd, make([]float32, n*heads*hd))
						kc, err := b.Alloc(dt, n*keys, kvh*hd)
						if err != nil {
							t.Fatal(err)
						}
						vc, err := b.Alloc(dt, n*keys, kvh*hd)
						if err != nil {
							t.Fatal(err)
						}
						for _, c := range []kernels.Tensor{kc, vc} { // the rows no slot writes stay 0 on both sides
							tb, _ := c.Buffer()
							if err := tb.(*tensorBuf).buf.Upload(0, make([]byte, c.Elems()*dt.Size())); err != nil {
								t.Fatal(err)
							}
						}
						b.BeginStep()
						b.NormLinearCat(qkv, x, hn, []*kernels.Mat{cat}, epi)
						fix := b.halves.fix
						b.PrepareQKV(q, kc, vc, qkv, qn, kn, rope, p, shape)
						if fuse != (fix != nil && fix.prep) {
							t.Fatalf("fusion %v, fix %+v", fuse, fix)
						}
						b.Attention(att, q, kc, vc, p, shape)
						if fuse != (b.presplit.x == dptr(att)) {
							t.Fatalf("fusion %v, the attention's split output %v", fuse, b.presplit.x == dptr(att))
						}
						b.Linear(y, att, o, kernels.Epilogue{Accumulate: true})
						b.EndStep()
						outs[i] = [6][]float32{make([]float32, n*width), make([]float32, n*heads*hd), cacheF32(t, b, kc), cacheF32(t, b, vc),
							make([]float32, n*heads*hd), make([]float32, n*hidden)}
						for k, tt := range map[int]kernels.Tensor{0: qkv, 1: q, 4: att, 5: y} {
							b.ReadF32(outs[i][k], tt)
						}
						if err := b.Err(); err != nil {
							t.Fatal(err)
						}
					}
					for k, name := range []string{"qkv", "q", "k cache", "v cache", "attention", "stream"} {
						for j, v := range outs[0][k] {
							if math.Float32bits(v) != math.Float32bits(outs[1][k][j]) {
								t.Fatalf("%s[%d] = %g fused, %g as two kernels", name, j, outs[1][k][j], v)
							}
						}
					}
				})
			}
		}
	}
}

// halvesBackend is the fusion tests' backend: cuBLASLt's split products,
// the fusion switched per case and restored at the end.
func halvesBackend(t *testing.T) *Backend {
	b := openOps(t)
	if !b.useGemm() {
		t.Skipf("no cuBLASLt: %v", b.gemmErr)
	}
	prev := b.SetFuseHalves(false)
	t.Cleanup(func() { b.SetFuseHalves(prev) })
	return b
}

// cacheF32 reads a float32 or bf16 cache tensor as float32.
func cacheF32(t *testing.T, b *Backend, c kernels.Tensor) []float32 {
	t.Helper()
	out := make([]float32, c.Elems())
	if c.DType == kernels.F32 {
		b.ReadF32(out, c)
		return out
	}
	raw := make([]byte, 2*c.Elems())
	tb, _ := c.Buffer()
	if err := tb.(*tensorBuf).buf.Download(raw, 0); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		out[i] = math.Float32frombits(uint32(raw[2*i])<<16 | uint32(raw[2*i+1])<<24)
	}
	return out
}
