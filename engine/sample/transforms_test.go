package sample

import (
	"math"
	"slices"
	"testing"
)

var inf = float32(math.Inf(1))

// toks builds tokens with ids 0, 1, 2, ... from values.
func toks(vs ...float32) []token {
	ts := make([]token, len(vs))
	for i, v := range vs {
		ts[i] = token{id: int32(i), v: v}
	}
	return ts
}

func ids(ts []token) []int32 {
	out := make([]int32, len(ts))
	for i, t := range ts {
		out[i] = t.id
	}
	return out
}

func vals(ts []token) []float32 {
	out := make([]float32, len(ts))
	for i, t := range ts {
		out[i] = t.v
	}
	return out
}

func near(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i])-float64(b[i])) > tol {
			return false
		}
	}
	return true
}

func TestPenalize(t *testing.T) {
	cases := []struct {
		name                        string
		logits                      []float32
		window                      []int32
		repeat, presence, frequency float32
		want                        []float32
	}{
		{"repeat", []float32{2, -2, 1, 0.5, 0}, []int32{0, 1, 0, 4}, 2, 0, 0, []float32{1, -4, 1, 0.5, 0}},
		{"presence+frequency", []float32{2, -2, 1, 0.5}, []int32{0, 1, 0}, 1, 0.5, 0.25, []float32{1, -2.75, 1, 0.5}},
		{"all three", []float32{2, -2, 1, 0.5}, []int32{0, 1, 0}, 2, 0.5, 0.25, []float32{0, -4.75, 1, 0.5}},
		{"out of range ids ignored", []float32{1, 1}, []int32{-1, 2, 7, 1}, 2, 0, 0, []float32{1, 0.5}},
		{"negative penalty rewards", []float32{1, 1}, []int32{1, 1}, 1, -0.5, -0.25, []float32{1, 2}},
		{"empty window", []float32{1, -1}, nil, 2, 1, 1, []float32{1, -1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := slices.Clone(c.logits)
			penalize(got, c.window, nil, c.repeat, c.presence, c.frequency)
			if !slices.Equal(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestTemperature(t *testing.T) {
	cases := []struct {
		vs   []float32
		t    float32
		want []float32
	}{
		{[]float32{1, -2, 0, 3}, 0.5, []float32{-4, -10, -6, 0}},
		{[]float32{1, -2, 0, 3}, 2, []float32{-1, -2.5, -1.5, 0}},
		{[]float32{1, 2}, 1e-45, []float32{-inf, 0}}, // no overflow to a +Inf tie
		{[]float32{1, inf, 2}, 0.5, []float32{1, inf, 2}},
	}
	for _, c := range cases {
		ts := toks(c.vs...)
		temperature(ts, c.t)
		if got := vals(ts); !slices.Equal(got, c.want) {
			t.Errorf("temperature(%v, %g) = %v, want %v", c.vs, c.t, got, c.want)
		}
	}
}

func TestTopK(t *testing.T) {
	cases := []struct {
		vs   []float32
		k    int
		want []int32
	}{
		{[]float32{1, 5, 3, 4, 2}, 2, []int32{1, 3}},
		{[]float32{1, 5, 3, 4, 2}, 4, []int32{1, 3, 2, 4}},
		{[]float32{2, 1, 2, 2, 3}, 3, []int32{4, 0, 2}}, // ties go to the lower id
		{[]float32{0, 0, 0, 0}, 1, []int32{0}},
		{[]float32{-inf, 1, -inf, inf}, 2, []int32{3, 1}},
	}
	for _, c := range cases {
		if got := ids(topK(toks(c.vs...), c.k)); !slices.Equal(got, c.want) {
			t.Errorf("topK(%v, %d) = %v, want %v", c.vs, c.k, got, c.want)
		}
	}
}

func TestSoftmax(t *testing.T) {
	cases := []struct {
		vs, want []float32
	}{
		{[]float32{0, float32(math.Log(3))}, []float32{0.25, 0.75}},
		{[]float32{1000, 1000}, []float32{0.5, 0.5}}, // max subtracted: no overflow
		{[]float32{5}, []float32{1}},
		{[]float32{1, 2, 3}, []float32{0.09003057, 0.24472847, 0.66524096}},
		{[]float32{inf, 1, inf}, []float32{0.5, 0, 0.5}},
		{[]float32{0, -inf}, []float32{1, 0}},
	}
	for _, c := range cases {
		ts := toks(c.vs...)
		softmax(ts)
		if got := vals(ts); !near(got, c.want, 1e-7) {
			t.Errorf("softmax(%v) = %v, want %v", c.vs, got, c.want)
		}
	}
}

func TestTopP(t *testing.T) {
	probs := []float32{0.15, 0.5, 0.05, 0.3}
	cases := []struct {
		p    float32
		want []int32
	}{
		{0.5, []int32{1}},           // the top token alone reaches 0.5
		{0.4, []int32{1}},           // at least one token
		{0.01, []int32{1}},          //
		{0.8, []int32{1, 3}},        // 0.5 + 0.3
		{0.81, []int32{1, 3, 0}},    // needs the 0.15
		{0.99, []int32{1, 3, 0, 2}}, // everything
	}
	for _, c := range cases {
		if got := ids(topP(toks(probs...), c.p)); !slices.Equal(got, c.want) {
			t.Errorf("topP(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	// Equal probabilities: ties go to the lower ids.
	if got := ids(topP(toks(0.25, 0.25, 0.25, 0.25), 0.5)); !slices.Equal(got, []int32{0, 1}) {
		t.Errorf("topP on a flat distribution = %v, want [0 1]", got)
	}
}

func TestMinP(t *testing.T) {
	probs := []float32{0.15, 0.5, 0.05, 0.3}
	cases := []struct {
		p    float32
		want []int32
	}{
		{0.3, []int32{0, 1, 3}}, // cut at 0.15, kept in place
		{0.31, []int32{1, 3}},
		{1, []int32{1}},
		{0.05, []int32{0, 1, 2, 3}},
	}
	for _, c := range cases {
		if got := ids(minP(toks(probs...), c.p)); !slices.Equal(got, c.want) {
			t.Errorf("minP(%v) = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestNormalize(t *testing.T) {
	ts := toks(1, 3, 4)
	normalize(ts)
	if got, want := vals(ts), []float32{0.125, 0.375, 0.5}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
