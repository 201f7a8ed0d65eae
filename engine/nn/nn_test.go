package nn

import (
	"math"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// rotate applies r to the heads (headDim each) of one token at pos, as the
// op set does (ref.RoPE over r's frequencies).
func rotate(r *RoPE, x []float32, heads, headDim, pos int) {
	ref.RoPE(x, heads, headDim, []int32{int32(pos)}, r.InvFreq(), r.Interleaved, r.Scale)
}

func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestRopeNeoXPartial checks the half-split rotation inside a partial slice
// against the textbook formula in float64.
func TestRopeNeoXPartial(t *testing.T) {
	r, err := NewRoPE(RopeConfig{HeadDim: 8, PartialRotaryFactor: 0.5, Theta: 100})
	if err != nil {
		t.Fatal(err)
	}
	if r.Dim != 4 {
		t.Fatalf("Dim %d", r.Dim)
	}
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8}
	orig := slices.Clone(x)
	const pos = 5
	rotate(r, x, 2, 8, pos)
	for h := range 2 {
		v := orig[h*8:]
		for i := range 2 {
			f := 1 / math.Pow(100, float64(2*i)/4)
			c, s := math.Cos(pos*f), math.Sin(pos*f)
			a, b := float64(v[i]), float64(v[i+2])
			near(t, "rotated", x[h*8+i:h*8+i+1], []float32{float32(a*c - b*s)}, 1e-6)
			near(t, "rotated", x[h*8+i+2:h*8+i+3], []float32{float32(b*c + a*s)}, 1e-6)
		}
		near(t, "pass-through", x[h*8+4:h*8+8], v[4:8], 0)
	}
}

func TestRopeInterleaved(t *testing.T) {
	r, _ := NewRoPE(RopeConfig{HeadDim: 4, Theta: 10000, Interleaved: true})
	x := []float32{1, 2, 3, 4}
	rotate(r, x, 1, 4, 0)
	near(t, "position 0 is identity", x, []float32{1, 2, 3, 4}, 0)
	x = []float32{1, 0, 1, 0}
	rotate(r, x, 1, 4, 3)
	f1 := 1 / math.Pow(10000, 0.5)
	near(t, "pairs", x, []float32{float32(math.Cos(3)), float32(math.Sin(3)), float32(math.Cos(3 * f1)), float32(math.Sin(3 * f1))}, 1e-6)
}

func TestRopeScaling(t *testing.T) {
	base, _ := NewRoPE(RopeConfig{HeadDim: 64, Theta: 500000})
	l3, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192})
	if err != nil {
		t.Fatal(err)
	}
	// Wavelengths under 8192/4 keep their frequency, over 8192 are divided by 8.
	for i, f := range base.invFreq {
		wave := 2 * math.Pi / float64(f)
		switch {
		case wave < 2048 && l3.invFreq[i] != f:
			t.Fatalf("llama3 high frequency %d changed", i)
		case wave > 8192 && math.Abs(float64(l3.invFreq[i]-f/8)) > 1e-6*float64(f):
			t.Fatalf("llama3 low frequency %d: %g, want %g", i, l3.invFreq[i], f/8)
		case wave >= 2048 && wave <= 8192 && !(l3.invFreq[i] <= f && l3.invFreq[i] >= f/8):
			t.Fatalf("llama3 medium frequency %d outside the blend", i)
		}
	}
	y, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000, Type: "yarn", Factor: 4, OriginalMaxPositions: 4096, MaxPositions: 16384})
	if err != nil {
		t.Fatal(err)
	}
	if want := float32(0.1*math.Log(4) + 1); math.Abs(float64(y.Scale-want)) > 1e-6 {
		t.Fatalf("yarn scale %g, want %g", y.Scale, want)
	}
	b2, _ := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000})
	if y.invFreq[0] != b2.invFreq[0] || math.Abs(float64(y.invFreq[31]-b2.invFreq[31]/4)) > 1e-6*float64(b2.invFreq[31]) {
		t.Fatalf("yarn: first %g (want %g), last %g (want %g)", y.invFreq[0], b2.invFreq[0], y.invFreq[31], b2.invFreq[31]/4)
	}
	if _, err := NewRoPE(RopeConfig{HeadDim: 64, Theta: 10000, Type: "dynamic", Factor: 2}); err == nil {
		t.Fatal("dynamic rope: want an unsupported error")
	}
	if _, err := NewRoPE(RopeConfig{HeadDim: 6, PartialRotaryFactor: 0.5, Theta: 10000}); err == nil {
		t.Fatal("odd rotary dim: want error")
	}
}

func TestGroupedMoEShape(t *testing.T) {
	ok := GroupedMoEShape{Experts: 8, TopK: 2, Inter: 16, Shared: 1, Groups: 4, TopKGroups: 2}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*GroupedMoEShape){
		func(s *GroupedMoEShape) { s.TopK = 9 },
		func(s *GroupedMoEShape) { s.Inter = 0 },
		func(s *GroupedMoEShape) { s.Shared = -1 },
		func(s *GroupedMoEShape) { s.Groups = 3 },     // does not divide 8
		func(s *GroupedMoEShape) { s.Groups = 8 },     // one expert a group
		func(s *GroupedMoEShape) { s.TopKGroups = 5 }, // more than the groups
	} {
		s := ok
		bad(&s)
		if err := s.Check(); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
}
