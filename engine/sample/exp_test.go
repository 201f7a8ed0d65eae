package sample

import (
	"math"
	"testing"
)

func TestExp32(t *testing.T) {
	ulp := func(f float32) float64 {
		return float64(math.Nextafter32(f, float32(math.Inf(1))) - f)
	}
	worst := 0.0
	for x := float32(-103.9); x < 88.7; x += 0.0137 {
		want := float32(math.Exp(float64(x)))
		got := exp32(x)
		if want < 0x1p-126 { // subnormal: absolute error of a few ulp of the smallest normal
			if math.Abs(float64(got-want)) > 0x1p-148 {
				t.Fatalf("exp32(%g) = %g, want %g", x, got, want)
			}
			continue
		}
		e := math.Abs(float64(got)-float64(want)) / ulp(want)
		worst = max(worst, e)
		if e > 2 {
			t.Fatalf("exp32(%g) = %g, want %g (%.1f ulp)", x, got, want, e)
		}
	}
	t.Logf("worst error %.2f ulp", worst)
	for _, c := range []struct{ x, want float32 }{
		{0, 1}, {-200, 0}, {100, float32(math.Inf(1))}, {float32(math.Inf(-1)), 0}, {float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := exp32(c.x); got != c.want {
			t.Errorf("exp32(%g) = %g, want %g", c.x, got, c.want)
		}
	}
	if got := exp32(float32(math.NaN())); got == got {
		t.Errorf("exp32(NaN) = %g", got)
	}
}

func BenchmarkExp32(b *testing.B) {
	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = -float32(i) / 64
	}
	var s float32
	for b.Loop() {
		for _, x := range xs {
			s += exp32(x)
		}
	}
	_ = s
}

func BenchmarkMathExp(b *testing.B) {
	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = -float32(i) / 64
	}
	var s float32
	for b.Loop() {
		for _, x := range xs {
			s += float32(math.Exp(float64(x)))
		}
	}
	_ = s
}
