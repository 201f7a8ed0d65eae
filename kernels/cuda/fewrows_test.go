//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestFewRows checks fewRows' path: a product of 2 to 4 rows with an f32,
// f16 or small bf16 weight runs the one-row GEMV's sums for every row
// outside the row-exact mode too, so each row's bits equal those of the
// row alone (and the ops' conformance tolerances hold a fortiori); and
// the row-exact GEMV over 5 and 9 rows (gemv_split_rows' groups of four
// rows and a rest) does the same.
func TestFewRows(t *testing.T) {
	if !fewRowsOn {
		t.Skip("FERRITE_CUDA_FEWROWS=0")
	}
	b := openOps(t)
	rng := rand.New(rand.NewPCG(31, 32))
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		w := kerneltest.NewMat(rng, dt, 96, 320, 0, 0)
		for _, n := range []int{2, 3, 4, 5, 9} { // 5 and 9 in the row-exact mode: groups of 4 rows and a rest
			kernels.SetRowExact(b, n > fewRowsMax)
			xv := randF32(rng, n*320)
			x := f32Tensor(t, b, n, 320, xv)
			y := f32Tensor(t, b, n, 96, make([]float32, n*96))
			b.BeginStep()
			b.Linear(y, x, w, kernels.Epilogue{})
			b.EndStep()
			kernels.SetRowExact(b, false)
			got := make([]float32, n*96)
			b.ReadF32(got, y)
			for r := range n {
				x1 := f32Tensor(t, b, 1, 320, xv[r*320:(r+1)*320])
				y1 := f32Tensor(t, b, 1, 96, make([]float32, 96))
				b.BeginStep()
				b.Linear(y1, x1, w, kernels.Epilogue{})
				b.EndStep()
				want := make([]float32, 96)
				b.ReadF32(want, y1)
				for j := range want {
					if math.Float32bits(got[r*96+j]) != math.Float32bits(want[j]) {
						t.Fatalf("%v weight, %d rows: row %d [%d] = %g, alone %g", dt, n, r, j, got[r*96+j], want[j])
					}
				}
				b.Free(x1)
				b.Free(y1)
			}
			b.Free(x)
			b.Free(y)
		}
	}
}
