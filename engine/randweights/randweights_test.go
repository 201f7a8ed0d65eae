package randweights

import (
	"math"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

func TestDeterministicAndBounded(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		a, b := New(7, dt), New(7, dt)
		// Request order must not matter.
		b.Mat("other", 3, 5)
		m1, err := a.Mat("w", 300, 1024)
		if err != nil {
			t.Fatal(err)
		}
		m2, _ := b.Mat("w", 300, 1024)
		if !slices.Equal(m1.Data, m2.Data) {
			t.Fatalf("%v: same seed and name gave different data", dt)
		}
		if again, _ := a.Mat("w", 300, 1024); again != m1 {
			t.Fatalf("%v: repeated request not shared", dt)
		}
		row := make([]float32, 1024)
		var sum, sq float64
		for r := range m1.Rows {
			m1.RowF32(row, r)
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.Abs(float64(v)) >= 1.0/16 {
					t.Fatalf("%v: value %g out of range", dt, v)
				}
				sum += float64(v)
				sq += float64(v) * float64(v)
			}
		}
		n := float64(m1.Rows * m1.Cols)
		if mean, rms := sum/n, math.Sqrt(sq/n); math.Abs(mean) > 1e-3 || rms < 0.02 || rms > 0.05 {
			t.Fatalf("%v: mean %g rms %g", dt, mean, rms)
		}
		e0, _ := a.Expert("experts.down_proj", 0, 4, 8)
		e1, _ := a.Expert("experts.down_proj", 1, 4, 8)
		if slices.Equal(e0.Data, e1.Data) {
			t.Fatalf("%v: experts identical", dt)
		}
	}
}

func TestFloat32Roles(t *testing.T) {
	s := New(1, kernels.BF16)
	n, _ := s.Float32("model.norm.weight", 64)
	for _, v := range n {
		if v < 0.9 || v > 1.1 {
			t.Fatalf("norm weight %g", v)
		}
	}
	s.Missing = func(name string) bool { return name == "lm_head.weight" }
	if s.Has("lm_head.weight") || !s.Has("x") {
		t.Fatal("Missing not honoured by Has")
	}
	if _, err := s.Mat("lm_head.weight", 2, 2); err == nil {
		t.Fatal("missing tensor loaded")
	}
}
