//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestKSplit checks the K-split products (FERRITE_CUDA_GEMM_KSPLIT) against
// kernels/ref: Linear with a bias and the residual add, at 5 to 64 rows in
// 2, 3 and 4 parts,
// within the conformance tolerance of float32 x (LinearTol·Σ|x·w|), and
// that the split did run (its sums are grouped otherwise: not every value
// is bit-equal to the one product's).
func TestKSplit(t *testing.T) {
	b := openOps(t)
	if !b.useGemm() {
		t.Skipf("no cuBLASLt: %v", b.gemmErr)
	}
	if lt.layoutSetAttr == 0 {
		t.Skip("cuBLASLt without cublasLtMatrixLayoutSetAttribute")
	}
	b.SetSkinnyRows(0)
	defer b.SetKSplit(b.SetKSplit(0))
	const rows, cols = 384, 1536
	for _, c := range []struct{ n, parts int }{{fewRowsMax + 1, 2}, {32, 2}, {64, 2}, {32, 3}, {64, 4}} {
		n := c.n
		rng := rand.New(rand.NewPCG(uint64(n), uint64(c.parts)))
		w := kerneltest.NewMat(rng, kernels.BF16, rows, cols, 0, 0)
		xv, y0, bv := randF32(rng, n*cols), randF32(rng, n*rows), randF32(rng, rows)
		var outs [2][]float32
		for i, parts := range []int{0, c.parts} {
			b.SetKSplit(parts)
			x, y, bias := f32Tensor(t, b, n, cols, xv), f32Tensor(t, b, n, rows, y0), f32Tensor(t, b, 1, rows, bv)
			dw, err := b.weight(w)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.kSplits(dw, n); got != parts {
				t.Fatalf("n=%d: %d K parts, want %d", n, got, parts)
			}
			b.BeginStep()
			b.Linear(y, x, w, kernels.Epilogue{Bias: bias, Accumulate: true})
			b.EndStep()
			outs[i] = make([]float32, n*rows)
			b.ReadF32(outs[i], y)
			if err := b.Err(); err != nil {
				t.Fatal(err)
			}
		}
		want := append([]float32(nil), y0...)
		ref.Linear(want, xv, w, bv, true, n)
		compare(t, outs[1], want, linearAbs(w, xv, bv, y0, n), kerneltest.LinearTol)
		same := true
		for i, v := range outs[0] {
			same = same && math.Float32bits(v) == math.Float32bits(outs[1][i])
		}
		if same {
			t.Errorf("n=%d, %d parts: every value bit-equal to the one product's: the K split did not run", n, c.parts)
		}
	}
}

// linearAbs is Linear's Σ|terms| of each output (n, w.Rows) of x (n,
// w.Cols) with bias and the accumulated y0: the scale of its tolerance.
func linearAbs(w *kernels.Mat, x, bias, y0 []float32, n int) []float64 {
	rows, cols := w.Rows, w.Cols
	abs := make([]float64, n*rows)
	row := make([]float32, cols)
	for j := range rows {
		w.RowF32(row, j)
		for i := range n {
			s := math.Abs(float64(bias[j])) + math.Abs(float64(y0[i*rows+j]))
			for k, v := range row {
				s += math.Abs(float64(v * x[i*cols+k]))
			}
			abs[i*rows+j] = s
		}
	}
	return abs
}

// TestKSplitEnv checks FERRITE_CUDA_GEMM_KSPLIT's parts: 1 and 2 are two,
// 3 and 4 as given, anything else off.
func TestKSplitEnv(t *testing.T) {
	for v, want := range map[string]int{"": 0, "0": 0, "1": 2, "2": 2, "3": 3, "4": 4, "5": 0, "x": 0} {
		t.Setenv("FERRITE_CUDA_GEMM_KSPLIT", v)
		if got := kSplitDefault(); got != want {
			t.Errorf("%q: %d parts, want %d", v, got, want)
		}
	}
}
