package ref

import (
	"math"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestRMSNorm checks RMSNorm against hand-computed rows, plain and
// zero-centred.
func TestRMSNorm(t *testing.T) {
	x := []float32{1, -2, 3, 4, 0, 0, 0, 1e-3}
	w := []float32{1, 2, 0.5, -1}
	y := make([]float32, 8)
	RMSNorm(y, x, w, 1e-6, false, 2)
	r := float32(1 / math.Sqrt((1+4+9+16)/4.0+1e-6))
	near(t, "plain", y[:4], []float32{r, -4 * r, 1.5 * r, -4 * r}, 1e-6)
	r2 := float32(1 / math.Sqrt(1e-6/4+1e-6))
	near(t, "small row", y[4:], []float32{0, 0, 0, -1e-3 * r2}, 1e-6)
	RMSNorm(y, x, w, 1e-6, true, 1)
	near(t, "zero-centred", y[:4], []float32{2 * r, -6 * r, 4.5 * r, 0}, 1e-6)
}

// TestRouteSoftmax picks the top two of a softmax, raw and renormalised.
func TestRouteSoftmax(t *testing.T) {
	logits := []float32{1, 3, 2, 0.5}
	r := &kernels.Router{Scoring: kernels.SoftmaxScoring, TopK: 2, Scale: 1}
	idx, wt := make([]int32, 2), make([]float32, 2)
	Route(idx, wt, slices.Clone(logits), r, nil)
	p := slices.Clone(logits)
	Softmax(p)
	if !slices.Equal(idx, []int32{1, 2}) {
		t.Fatalf("experts %v, want [1 2]", idx)
	}
	near(t, "softmax weights", wt, []float32{p[1], p[2]}, 1e-6)
	r.NormTopK = true
	Route(idx, wt, slices.Clone(logits), r, nil)
	near(t, "renormalised", wt, []float32{p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])}, 1e-6)
}

// TestRouteSigmoidGrouped is DeepSeek-V3's noaux_tc routing: biased
// selection among the best groups, unbiased weights.
func TestRouteSigmoidGrouped(t *testing.T) {
	// 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts.
	logits := []float32{2.0, -1, 0.5, 0.4, 1.9, -3, 0.0, 0.0}
	bias := []float32{0, 0, 0, 0, 0, 0, 0.8, 0.8}
	r := &kernels.Router{Scoring: kernels.SigmoidScoring, TopK: 2, NormTopK: true, Scale: 2.5, Groups: 4, TopKGroups: 2}
	idx, wt := make([]int32, 2), make([]float32, 2)
	Route(idx, wt, slices.Clone(logits), r, bias)
	// Biased scores: s = sigmoid(l) + b. Group sums of top-2:
	// g0 = s(2)+s(-1), g1 = s(.5)+s(.4), g2 = s(1.9)+s(-3), g3 = 2(s(0)+.8) = 2.6.
	// g3 and g1 (≈1.22) win over g0 (≈1.15) and g2 (≈0.92), so expert 0
	// (the best unbiased score) and expert 4 are masked out.
	s := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	slices.Sort(idx)
	if !slices.Equal(idx, []int32{6, 7}) {
		t.Fatalf("experts %v, want [6 7]", idx)
	}
	want := float32(s(0) / (2*s(0) + 1e-20) * 2.5)
	near(t, "weights use unbiased scores", wt, []float32{want, want}, 1e-6)

	r.Groups = 1
	Route(idx, wt, slices.Clone(logits), r, nil)
	if !slices.Equal(idx, []int32{0, 4}) {
		t.Fatalf("ungrouped experts %v, want [0 4]", idx)
	}
	sum := s(2) + s(1.9)
	near(t, "ungrouped weights", wt, []float32{float32(s(2) / sum * 2.5), float32(s(1.9) / sum * 2.5)}, 1e-6)
}

func TestLayerNorm(t *testing.T) {
	x := []float32{1, 2, 3, 4, -1, 0.5, 0.25, 8}
	w, b := []float32{1, 2, 0.5, -1}, []float32{0.1, 0, -0.2, 0.3}
	y := make([]float32, len(x))
	LayerNorm(y, x, w, b, 1e-6, 2)
	for r := range 2 {
		row := x[r*4 : (r+1)*4]
		var mean, v float64
		for _, e := range row {
			mean += float64(e) / 4
		}
		for _, e := range row {
			v += (float64(e) - mean) * (float64(e) - mean) / 4
		}
		for j, e := range row {
			want := (float64(e)-mean)/math.Sqrt(v+1e-6)*float64(w[j]) + float64(b[j])
			if d := math.Abs(float64(y[r*4+j]) - want); d > 1e-6 {
				t.Errorf("row %d col %d: %g, want %g", r, j, y[r*4+j], want)
			}
		}
	}
}

// TestTopK checks the one top-k both selections share: largest first, ties
// to the lower index; SelectTopK ascending, never a −∞ score, −1 padding.
func TestTopK(t *testing.T) {
	inf := float32(math.Inf(-1))
	v := []float32{1, 3, inf, 3, 2, inf, 0}
	out := make([]int32, 4)
	TopK(out, v)
	if want := []int32{1, 3, 4, 0}; !slices.Equal(out, want) {
		t.Errorf("TopK %v, want %v", out, want)
	}
	sel := make([]int32, 3)
	SelectTopK(sel, v)
	if want := []int32{1, 3, 4}; !slices.Equal(sel, want) {
		t.Errorf("SelectTopK %v, want %v", sel, want)
	}
	sel = make([]int32, 4)
	SelectTopK(sel, []float32{inf, 5, inf, 5})
	if want := []int32{1, 3, -1, -1}; !slices.Equal(sel, want) {
		t.Errorf("SelectTopK past the finite scores %v, want %v", sel, want)
	}
}
