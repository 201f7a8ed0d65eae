package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// RowVariance is one row-wise op that gives a row other bits in a call of
// several rows than in a call of that row alone.
type RowVariance struct {
	Op      string
	Rows    int     // rows in the call
	Differ  int     // outputs whose bits differ from the one-row calls'
	Of      int     // outputs compared
	MaxDiff float64 // largest |difference| relative to max(1, |one-row value|)
}

func (v RowVariance) String() string {
	return fmt.Sprintf("%s n=%d: %d of %d outputs differ (max %.2g)", v.Op, v.Rows, v.Differ, v.Of, v.MaxDiff)
}

// RowVariances runs the row-wise ops of a decode step (Linear on F32, BF16
// and Q8_0 weights, LinearCat, SwiGLULinear, their Norm twins, RMSNorm,
// AddRMSNorm) on d over
// n = 2..kernels.RecordMaxRows rows and over each row alone, and returns where a row's bits
// depend on the other rows of the call. Speculative verification runs the
// drafts as extra rows: greedy output equals plain decoding's bit for bit
// only on ops that return none here (engine TestMTPOnDevice reports them).
func RowVariances(t *testing.T, d kernels.Device) []RowVariance {
	t.Helper()
	rng := rand.New(rand.NewPCG(61, 62))
	const in, out = 320, 896
	var found []RowVariance
	check := func(op string, n, width int, run func(x []float32, rows int) []float32) {
		x := randn(rng, n*in)
		all := run(x, n)
		v := RowVariance{Op: op, Rows: n, Of: n * width}
		for i := range n {
			one := run(x[i*in:(i+1)*in], 1)
			for j, w := range one {
				g := all[i*width+j]
				if math.Float32bits(g) != math.Float32bits(w) {
					v.Differ++
					v.MaxDiff = max(v.MaxDiff, math.Abs(float64(g)-float64(w))/max(1, math.Abs(float64(w))))
				}
			}
		}
		if v.Differ > 0 {
			found = append(found, v)
		}
	}
	linear := func(w *kernels.Mat) func(x []float32, rows int) []float32 {
		return func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, w.Rows, nil)
			step(d, func() { d.Linear(y.t, xb.t, w, kernels.Epilogue{}) })
			return y.read(t, "y")
		}
	}
	mats := map[kernels.DType]*kernels.Mat{}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0} {
		mats[dt] = NewMat(rng, dt, out, in, 0, 0)
	}
	gate, up := NewMat(rng, kernels.BF16, out, in, 0, 0), NewMat(rng, kernels.BF16, out, in, 0, 0)
	wn := newBuf(t, d, 1, in, randn(rng, in))
	for n := 2; n <= kernels.RecordMaxRows; n++ {
		for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0} {
			check("Linear "+dt.String(), n, out, linear(mats[dt]))
		}
		check("LinearCat BF16", n, 2*out, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, 2*out, nil)
			step(d, func() { d.LinearCat(y.t, xb.t, []*kernels.Mat{gate, up}, kernels.Epilogue{}) })
			return y.read(t, "y")
		})
		check("SwiGLULinear BF16", n, out, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, out, nil)
			step(d, func() { d.SwiGLULinear(y.t, xb.t, gate, up, 0) })
			return y.read(t, "y")
		})
		check("NormLinearCat BF16", n, 2*out, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, 2*out, nil)
			hn := &kernels.HeadNorm{W: wn.t, Eps: 1e-6}
			step(d, func() { d.NormLinearCat(y.t, xb.t, hn, []*kernels.Mat{gate, up}, kernels.Epilogue{}) })
			return y.read(t, "y")
		})
		check("AddNormLinearCat BF16", n, 2*out, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, 2*out, nil)
			delta, sum := newBuf(t, d, rows, in, x), newBuf(t, d, rows, in, nil)
			hn := &kernels.HeadNorm{W: wn.t, Eps: 1e-6}
			step(d, func() {
				d.AddNormLinearCat(y.t, sum.t, xb.t, delta.t, hn, []*kernels.Mat{gate, up}, kernels.Epilogue{})
			})
			return y.read(t, "y")
		})
		check("NormSwiGLULinear BF16", n, out, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, out, nil)
			hn := &kernels.HeadNorm{W: wn.t, Eps: 1e-6, Offset: true}
			step(d, func() { d.NormSwiGLULinear(y.t, xb.t, hn, gate, up, 0) })
			return y.read(t, "y")
		})
		check("RMSNorm", n, in, func(x []float32, rows int) []float32 {
			xb, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, in, nil)
			step(d, func() { d.RMSNorm(y.t, xb.t, wn.t, 1e-6, false) })
			return y.read(t, "y")
		})
		check("AddRMSNorm", n, in, func(x []float32, rows int) []float32 {
			res, y := newBuf(t, d, rows, in, x), newBuf(t, d, rows, in, nil)
			delta := newBuf(t, d, rows, in, x)
			step(d, func() { d.AddRMSNorm(y.t, res.t, delta.t, wn.t, 1e-6, false) })
			return y.read(t, "y")
		})
	}
	return found
}

// rowExactTest checks a kernels.RowExact backend with the mode on: the
// linear ops' cases hold against the references, and no row-wise op of
// RowVariances gives a row other bits in a call of several rows.
func rowExactTest(t *testing.T, d kernels.Device) {
	kernels.SetRowExact(d, true)
	defer kernels.SetRowExact(d, false)
	t.Run("Linear", func(t *testing.T) { linearTest(t, d) })
	t.Run("LinearCat", func(t *testing.T) { linearCatTest(t, d) })
	t.Run("SwiGLULinear", func(t *testing.T) { swigluLinearTest(t, d) })
	t.Run("NormLinearCat", func(t *testing.T) { normLinearCatTest(t, d) })
	t.Run("NormSwiGLULinear", func(t *testing.T) { normSwigluLinearTest(t, d) })
	t.Run("AddNormLinearCat", func(t *testing.T) { addNormLinearCatTest(t, d) })
	for _, v := range RowVariances(t, d) {
		t.Errorf("row-exact mode: %v", v)
	}
}
