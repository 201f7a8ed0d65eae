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
	b := openOps(t)
	if !b.useGemm() {
		t.Skipf("no cuBLASLt: %v", b.gemmErr)
	}
	b.SetSkinnyRows(0)
	defer b.SetFuseHalves(b.SetFuseHalves(false))
	const hidden, in, qkv, inter = 256, 192, 320, 200
	rng := rand.New(rand.NewPCG(13, 1))
	o := kerneltest.NewMat(rng, kernels.BF16, hidden, in, 0, 0)
	cat := kerneltest.NewMat(rng, kernels.BF16, qkv, hidden, 0, 0)
	gate, up := kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0), kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)
	nw := f32Tensor(t, b, 1, hidden, randF32(rng, hidden))
	hn := &kernels.HeadNorm{W: nw, Eps: 1e-6, Offset: true}
	bias := f32Tensor(t, b, 1, hidden, randF32(rng, hidden))
	for _, n := range []int{3, 40, b.dev.SMs + 7} {
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
