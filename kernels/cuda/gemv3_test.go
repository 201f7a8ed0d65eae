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

// TestGEMV3 checks the version-3 GEMV (gemv3.go) at 1, 2 and 3 blocks a
// multiprocessor against kernels.MatMulRef with a bias and the residual
// add, for 1, 3 and 6 rows of x (one and two launches), that every row of
// a several-row call has the bits of that row alone (kernels.RowExact),
// and that its SwiGLU form equals the plain form's gate and up sums put
// through ferrite_swiglu_cat, bit for bit: blocks of several rows and of
// one, rows of one slice and of several tiles, the last tile part full.
func TestGEMV3(t *testing.T) {
	d := needGPU(t)
	defer d.SetGEMV3(gemv3Default())
	for _, bps := range []int{1, 2, 3} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F32, kernels.F16} {
			for _, s := range []struct{ rows, cols int }{{1024, 4096}, {334, 2048}, {7, 1024}, {3, 12288}, {5000, 4096}, {2, 7168}} {
				t.Run(fmt.Sprintf("bps=%d/%v/%dx%d", bps, dt, s.rows, s.cols), func(t *testing.T) {
					d.SetGEMV3(bps)
					w := func(w *Weight) bool { _, _, ok := d.gemv3Takes(w, 0, 0); return ok }
					gemvCase(t, d, dt, s.rows, s.cols, w, d.swiglu3L)
				})
			}
		}
	}
}

// gemvCase is TestGEMV3's check of one weight: takes
// reports whether the variant runs it (it must), swiglu launches its
// SwiGLU form.
func gemvCase(t *testing.T, d *Device, dt kernels.DType, rows, cols int, takes func(*Weight) bool,
	swiglu func(y, x uint64, dw *Weight, n, inter int, limit float32) (bool, error)) {
	rng := rand.New(rand.NewPCG(uint64(rows), uint64(cols)))
	m := kerneltest.NewMat(rng, dt, rows, cols, 0, 0)
	w := uploadMat(t, d, m)
	if !takes(w) {
		t.Fatalf("the variant does not take %v (%d, %d)", dt, rows, cols)
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
				ok, err := swiglu(got.ptr, xb.ptr, w, nr, inter, limit)
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

// TestGEMV3Ops runs the op-set conformance suite (kerneltest.RunOps) with
// the version-3 GEMV taking the one-row and row-exact products and the
// norm-fused one the norm ops.
func TestGEMV3Ops(t *testing.T) {
	b := openOps(t)
	b.dev.SetGEMV3(2)
	b.SetGEMV3Norm(true)
	kerneltest.RunOps(t, b)
}
