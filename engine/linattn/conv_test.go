package linattn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func newConv(rng *rand.Rand, C, K int, bias bool) *Conv {
	c := &Conv{Channels: C, K: K, Weight: randn(rng, C*K, 0.5), Parallel: goPar}
	if bias {
		c.Bias = randn(rng, C, 0.1)
	}
	return c
}

// refConv computes the whole-sequence convolution in float64 with the
// given history (hist [K−1, C], oldest first) before x.
func refConv(c *Conv, x []float32, T int, hist []float32, act Activation) []float64 {
	C, K := c.Channels, c.K
	full := append(append([]float32(nil), hist...), x[:T*C]...) // [K−1+T, C]
	y := make([]float64, T*C)
	for t := 0; t < T; t++ {
		for ch := 0; ch < C; ch++ {
			var acc float64
			if c.Bias != nil {
				acc = float64(c.Bias[ch])
			}
			for j := 0; j < K; j++ {
				acc += float64(c.Weight[ch*K+j]) * float64(full[(t+j)*C+ch])
			}
			if act == ActSiLU {
				acc = acc / (1 + math.Exp(-acc))
			}
			y[t*C+ch] = acc
		}
	}
	return y
}

func TestConvWholeAndPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 21))
	for _, K := range []int{1, 2, 4, 9} {
		c := newConv(rng, 150, K, K == 4) // 150: blocks of 64, 64 and 22
		T := 23
		x := randn(rng, T*c.Channels, 1)
		hist := randn(rng, c.StateLen(), 1)
		want := refConv(c, x, T, hist, ActSiLU)

		// One call, out of place.
		state := slices.Clone(hist)
		y := make([]float32, len(x))
		c.Forward(y, x, T, state, ActSiLU)
		if e := relErr(y, want); e > 1e-6 {
			t.Errorf("K=%d whole: err %.3g", K, e)
		}
		wantState := append(slices.Clone(hist), x...)[T*c.Channels:]
		if !slices.Equal(state, wantState) {
			t.Errorf("K=%d whole: final state is not the last K−1 raw inputs", K)
		}

		// Pieces (prefill, decode steps, short prefills shorter than K−1),
		// in place.
		state = slices.Clone(hist)
		xy := slices.Clone(x)
		C := c.Channels
		for _, cut := range [][2]int{{0, 7}, {7, 8}, {8, 9}, {9, 11}, {11, 12}, {12, 23}} {
			seg := xy[cut[0]*C : cut[1]*C]
			if cut[1]-cut[0] == 1 {
				c.Step(seg, seg, state, ActSiLU)
			} else {
				c.Forward(seg, seg, cut[1]-cut[0], state, ActSiLU)
			}
		}
		if e := relErr(xy, want); e > 1e-6 {
			t.Errorf("K=%d pieces: err %.3g", K, e)
		}
		if !slices.Equal(state, wantState) {
			t.Errorf("K=%d pieces: final state differs", K)
		}
	}
}

func TestConvSeparateSiLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 22))
	c := newConv(rng, 70, 4, false)
	x := randn(rng, 5*70, 1)
	s1, s2 := make([]float32, c.StateLen()), make([]float32, c.StateLen())
	fused, sep := make([]float32, len(x)), make([]float32, len(x))
	c.Forward(fused, x, 5, s1, ActSiLU)
	c.Forward(sep, x, 5, s2, ActNone)
	if e := relErr(sep, refConv(c, x, 5, make([]float32, c.StateLen()), ActNone)); e > 1e-6 {
		t.Errorf("ActNone err %.3g", e)
	}
	SiLU(sep)
	for i := range fused {
		if d := math.Abs(float64(fused[i] - sep[i])); d > 1e-6*math.Max(1, math.Abs(float64(fused[i]))) {
			t.Fatalf("fused vs separate SiLU at %d: %g vs %g", i, fused[i], sep[i])
		}
	}
}

func TestConvSaveStates(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 23))
	c := newConv(rng, 33, 4, false)
	T := 5
	x := randn(rng, T*c.Channels, 1)
	hist := randn(rng, c.StateLen(), 1)
	dst := make([][]float32, T)
	for i := range dst {
		dst[i] = make([]float32, c.StateLen())
	}
	c.SaveStates(dst, x, T, hist)
	for i := 0; i < T; i++ {
		state := slices.Clone(hist)
		c.Forward(make([]float32, (i+1)*c.Channels), x, i+1, state, ActSiLU)
		if !slices.Equal(state, dst[i]) {
			t.Errorf("state after token %d differs", i)
		}
	}
}
