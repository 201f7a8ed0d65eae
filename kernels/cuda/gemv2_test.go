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

// TestGEMV2 checks the version-2 GEMV (gemv2.go) in each variant against
// kernels.MatMulRef with a bias and the residual add, for 1, 3 and 6 rows
// of x (one and two passes over the weights; rows past a block's last,
// chunks past a row's end, the 12,288-wide down product), that every row
// of a several-row call has the bits of that row alone (kernels.RowExact),
// and that its SwiGLU form equals the plain form's gate and up sums put
// through ferrite_swiglu_cat, bit for bit.
func TestGEMV2(t *testing.T) {
	d := needGPU(t)
	defer d.SetGEMV2(gemv2Default())
	for _, s2 := range []int{1, 2, 4} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F32, kernels.F16} {
			for _, s := range []struct{ rows, cols int }{{1024, 4096}, {333, 2056}, {100, 1000}, {7, 64}, {3, 12288}, {5, 4104}} {
				t.Run(fmt.Sprintf("s=%d/%v/%dx%d", s2, dt, s.rows, s.cols), func(t *testing.T) {
					if err := d.SetGEMV2(s2); err != nil {
						t.Fatal(err)
					}
					gemv2Case(t, d, dt, s.rows, s.cols)
				})
			}
		}
	}
}

func gemv2Case(t *testing.T, d *Device, dt kernels.DType, rows, cols int) {
	rng := rand.New(rand.NewPCG(uint64(rows), uint64(cols)))
	m := kerneltest.NewMat(rng, dt, rows, cols, 0, 0)
	w := uploadMat(t, d, m)
	if _, _, ok := d.gemv2Kernel(w, false); !ok {
		t.Fatalf("no version-2 kernel for %v (%d, %d)", dt, rows, cols)
	}
	const n = 6
	x, bias, y0 := randF32(rng, n*cols), randF32(rng, rows), randF32(rng, n*rows)
	xb, bb := upload(t, d, x), upload(t, d, bias)
	var one []float32 // row j alone, for j < n
	for _, nr := range []int{1, 3, n} {
		var got []float32
		if nr == 1 {
			for j := range n {
				yb := upload(t, d, y0[j*rows:(j+1)*rows])
				if err := d.do(func() error {
					return d.linearL(yb.ptr, xb.ptr+uint64(j*cols*4), w, 1, bb.ptr, true)
				}); err != nil {
					t.Fatal(err)
				}
				got = append(got, download(t, yb, rows)...)
			}
			one = got
			nr = n
		} else {
			yb := upload(t, d, y0[:nr*rows])
			if err := d.do(func() error { return d.linearExactL(yb.ptr, xb.ptr, w, nr, bb.ptr, true) }); err != nil {
				t.Fatal(err)
			}
			got = download(t, yb, nr*rows)
			for i, v := range got {
				if math.Float32bits(v) != math.Float32bits(one[i]) {
					t.Fatalf("n=%d: element %d is %g, alone %g", nr, i, v, one[i])
				}
			}
		}
		want := make([]float32, nr*rows)
		kernels.MatMulRef(want, x[:nr*cols], m, nr)
		abs := kerneltest.AbsDot(x[:nr*cols], m, nr)
		for i := range want {
			want[i] += bias[i%rows] + y0[i]
			abs[i] += math.Abs(float64(bias[i%rows])) + math.Abs(float64(y0[i]))
		}
		compare(t, got, want, abs, kerneltest.Tol)
	}
	if rows%2 != 0 {
		return
	}
	// SwiGLU: m as the stacked [gate; up], inter = rows/2.
	inter := rows / 2
	for _, nr := range []int{1, 3} {
		for _, limit := range []float32{0, 0.5} {
			tb := poisoned(t, d, nr*rows)
			want, got := poisoned(t, d, nr*inter), poisoned(t, d, nr*inter)
			total := int64(nr) * int64(inter)
			if err := d.do(func() error {
				if err := d.linearExactL(tb.ptr, xb.ptr, w, nr, 0, false); err != nil {
					return err
				}
				if err := d.launchL("ferrite_swiglu_cat", d.elementwiseGrid(total), 256, 0, want.ptr, tb.ptr, uint64(total), i32(inter), f32(limit)); err != nil {
					return err
				}
				ok, err := d.swiglu2L(got.ptr, xb.ptr, w, nr, inter, limit)
				if !ok && err == nil {
					err = fmt.Errorf("no SwiGLU kernel")
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			g, wv := download(t, got, nr*inter), download(t, want, nr*inter)
			for i := range g {
				if math.Float32bits(g[i]) != math.Float32bits(wv[i]) {
					t.Fatalf("SwiGLU n=%d limit=%g: element %d is %g, want %g", nr, limit, i, g[i], wv[i])
				}
			}
		}
	}
}

// TestGEMV2Ops runs the op-set conformance suite (kerneltest.RunOps) with
// the version-2 GEMV (S = 2) taking the one-row and row-exact products.
func TestGEMV2Ops(t *testing.T) {
	b := openOps(t)
	if err := b.dev.SetGEMV2(2); err != nil {
		t.Fatal(err)
	}
	kerneltest.RunOps(t, b)
}
