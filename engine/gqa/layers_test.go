package gqa

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// TestClampedFFN runs the MLP and the MoE with a SwiGLU clamp and checks
// them against the references with the clamp: down(silu(min(g, L))·
// clamp(u, −L, L)), routed and shared.
func TestClampedFFN(t *testing.T) {
	const n, hidden, inter, experts, limit = 5, 16, 12, 4, 0.3
	rng := rand.New(rand.NewPCG(1, 2))
	mat := func(r, c int) *kernels.Mat { return kerneltest.NewMat(rng, kernels.F32, r, c, 0, 0) }
	dev := strict.New()
	mlp := &MLP{Gate: Linear{W: mat(inter, hidden)}, Up: Linear{W: mat(inter, hidden)}, Down: Linear{W: mat(hidden, inter)}, Limit: limit}
	ex := make([]kernels.Expert, experts)
	for i := range ex {
		ex[i] = kernels.Expert{Gate: mat(inter, hidden), Up: mat(inter, hidden), Down: mat(hidden, inter)}
	}
	moe := &MoE{Gate: mat(experts, hidden), Router: kernels.Router{Scoring: kernels.SoftmaxScoring, TopK: 2, Scale: 1},
		Experts: ex, Limit: limit, Shared: mlp}

	xv := make([]float32, n*hidden)
	for i := range xv {
		xv[i] = float32(3 * rng.NormFloat64())
	}
	x, _ := dev.Alloc(kernels.F32, n, hidden)
	dev.WriteF32(x, xv)
	run := func(f FFN) []float32 {
		y, _ := dev.Alloc(kernels.F32, n, hidden)
		dev.BeginStep()
		f.Forward(&Ctx{Dev: dev, N: n}, y, x)
		dev.EndStep()
		out := make([]float32, n*hidden)
		dev.ReadF32(out, y)
		return out
	}

	// The reference MLP.
	wantMLP := make([]float32, n*hidden)
	g, u := make([]float32, n*inter), make([]float32, n*inter)
	ref.Linear(g, xv, mlp.Gate.W, nil, false, n)
	ref.Linear(u, xv, mlp.Up.W, nil, false, n)
	ref.SwiGLUClamp(g, g, u, limit)
	ref.Linear(wantMLP, g, mlp.Down.W, nil, false, n)
	check(t, "MLP", run(mlp), wantMLP)

	// The reference MoE: routed experts plus the shared MLP.
	logits := make([]float32, n*experts)
	ref.Linear(logits, xv, moe.Gate, nil, false, n)
	ids, w := make([]int32, n*2), make([]float32, n*2)
	for i := range n {
		ref.Route(ids[i*2:(i+1)*2], w[i*2:(i+1)*2], logits[i*experts:(i+1)*experts], &moe.Router, nil)
	}
	want := make([]float32, n*hidden)
	ref.ExpertsClamp(want, xv, ids, w, n, ex, limit)
	for i := range want {
		want[i] += wantMLP[i]
	}
	check(t, "MoE", run(moe), want)
	moe.Limit, mlp.Limit = 0, 0
	if got := run(moe); maxAbs(got, want) < 1e-3 {
		t.Error("the clamp does not change the MoE's output: the test inputs do not reach it")
	}
}

func maxAbs(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(float64(a[i]-b[i])))
	}
	return m
}

func check(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if d := maxAbs(got, want); d > 1e-5 {
		t.Errorf("%s: max error %g", what, d)
	}
}

// TestStackRows checks q/k/v stacking: rows concatenated in order, and
// F8E4M3 scale blocks that would straddle two matrices refused.
func TestStackRows(t *testing.T) {
	a := &kernels.Mat{DType: kernels.BF16, Rows: 1, Cols: 2, Data: []byte{1, 2, 3, 4}}
	b := &kernels.Mat{DType: kernels.BF16, Rows: 2, Cols: 2, Data: []byte{5, 6, 7, 8, 9, 10, 11, 12}}
	m, err := StackRows(a, b)
	if err != nil || m.Rows != 3 || m.Cols != 2 || !slices.Equal(m.Data, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
		t.Fatalf("stackRows = %+v, %v", m, err)
	}
	if _, err := StackRows(a, &kernels.Mat{DType: kernels.F32, Rows: 1, Cols: 2, Data: make([]byte, 8)}); err == nil {
		t.Error("stacked BF16 and F32")
	}
	f8 := &kernels.Mat{DType: kernels.F8E4M3, Rows: 3, Cols: 2, Data: make([]byte, 6), Scale: []float32{1}, BlockRows: 128, BlockCols: 128}
	if _, err := StackRows(f8, f8); err == nil {
		t.Error("stacked F8E4M3 rows that do not fill their scale blocks")
	}
}

// folding is a strict device that asks models to fold shared experts into
// the routed ones (kernels.SharedExperts).
type folding struct{ *strict.Device }

func (folding) FoldsSharedExperts() bool { return true }

// TestFoldedSharedExpert checks that on a kernels.SharedExperts device an
// ungated shared expert of the routed shape becomes the last expert (ids
// past the routed ones, weight 1) and the MoE's output stays the routed
// sum plus the shared MLP (the reference, and the unfolded MoE of a plain
// device), for softmax and sigmoid routing; a gated one or one of another
// width stays apart.
func TestFoldedSharedExpert(t *testing.T) {
	const n, hidden, inter, experts = 6, 16, 12, 5
	rng := rand.New(rand.NewPCG(3, 4))
	mat := func(r, c int) *kernels.Mat { return kerneltest.NewMat(rng, kernels.BF16, r, c, 0, 0) }
	lin := func(r, c int) *nn.Linear { return &nn.Linear{W: mat(r, c)} }
	ex := make([]kernels.Expert, experts)
	for i := range ex {
		ex[i] = kernels.Expert{Gate: mat(inter, hidden), Up: mat(inter, hidden), Down: mat(hidden, inter)}
	}
	xv := kerneltest.RandN(rng, n*hidden)
	for _, r := range []nn.Router{
		{W: mat(experts, hidden), Scoring: nn.SoftmaxScoring, TopK: 2, NormTopK: true, Scale: 1},
		{W: mat(experts, hidden), Scoring: nn.SigmoidScoring, TopK: 3, NormTopK: true, Scale: 1.8, Bias: []float32{0.1, -0.2, 0, 0.3, 0.05}},
	} {
		sh := &nn.MLP{Gate: lin(inter, hidden), Up: lin(inter, hidden), Down: lin(hidden, inter)}
		f := &nn.MoE{Router: r, Experts: ex, Shared: sh}
		run := func(dev kernels.Device) ([]float32, *MoE) {
			m := NewUploader(dev).FFN(f).(*MoE)
			x, _ := dev.Alloc(kernels.F32, n, hidden)
			y, _ := dev.Alloc(kernels.F32, n, hidden)
			dev.WriteF32(x, xv)
			dev.BeginStep()
			m.Forward(&Ctx{Dev: dev, N: n}, y, x)
			dev.EndStep()
			out := make([]float32, n*hidden)
			dev.ReadF32(out, y)
			return out, m
		}
		folded, fm := run(folding{strict.New()})
		plain, pm := run(strict.New())
		if fm.Router.Shared != 1 || len(fm.Experts) != experts+1 || fm.Shared != nil {
			t.Fatalf("%v: not folded: Router.Shared %d, %d experts", r.Scoring, fm.Router.Shared, len(fm.Experts))
		}
		for i, e := range fm.Experts {
			if e.Shared != (i == experts) {
				t.Fatalf("%v: expert %d of %d marked Shared %v", r.Scoring, i, experts+1, e.Shared)
			}
		}
		if pm.Router.Shared != 0 || len(pm.Experts) != experts || pm.Shared == nil {
			t.Fatalf("%v: folded on a device without kernels.SharedExperts", r.Scoring)
		}
		// The reference: routed experts, then the shared MLP added.
		logits := make([]float32, n*experts)
		ref.Linear(logits, xv, r.W, nil, false, n)
		kr := kernels.Router{Scoring: r.Scoring, TopK: r.TopK, NormTopK: r.NormTopK, Scale: r.Scale}
		ids, w := make([]int32, n*r.TopK), make([]float32, n*r.TopK)
		for i := range n {
			ref.Route(ids[i*r.TopK:(i+1)*r.TopK], w[i*r.TopK:(i+1)*r.TopK], logits[i*experts:(i+1)*experts], &kr, r.Bias)
		}
		want := make([]float32, n*hidden)
		ref.Experts(want, xv, ids, w, n, ex)
		g, u, s := make([]float32, n*inter), make([]float32, n*inter), make([]float32, n*hidden)
		ref.Linear(g, xv, sh.Gate.W, nil, false, n)
		ref.Linear(u, xv, sh.Up.W, nil, false, n)
		ref.SwiGLUClamp(g, g, u, 0)
		ref.Linear(s, g, sh.Down.W, nil, false, n)
		for i := range want {
			want[i] += s[i]
		}
		check(t, "folded MoE", folded, want)
		check(t, "unfolded MoE", plain, want)
	}
	// Gated, or wider than the routed experts: not folded.
	wide := &nn.MLP{Gate: lin(2*inter, hidden), Up: lin(2*inter, hidden), Down: lin(hidden, 2*inter)}
	gate := lin(1, hidden)
	r := nn.Router{W: mat(experts, hidden), Scoring: nn.SoftmaxScoring, TopK: 2, Scale: 1}
	for _, f := range []*nn.MoE{{Router: r, Experts: ex, Shared: wide}, {Router: r, Experts: ex, Shared: wide, SharedGate: gate},
		{Router: r, Experts: ex, Shared: &nn.MLP{Gate: lin(inter, hidden), Up: lin(inter, hidden), Down: lin(hidden, inter)}, SharedGate: gate}} {
		if m := NewUploader(folding{strict.New()}).FFN(f).(*MoE); m.Router.Shared != 0 || m.Shared == nil {
			t.Errorf("shared expert of %d rows (gated %v) folded", f.Shared.Gate.W.Rows, f.SharedGate != nil)
		}
	}
}
