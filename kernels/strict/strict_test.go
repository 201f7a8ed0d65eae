package strict_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

func TestConformance(t *testing.T) { kerneltest.Run(t, strict.New()) }

func TestOps(t *testing.T) { kerneltest.RunOps(t, strict.New()) }

// mustPanic fails t unless fn panics with a message containing want.
func mustPanic(t *testing.T, want string, fn func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Errorf("panic %v, want one containing %q", r, want)
		}
	}()
	fn()
}

func TestStrictness(t *testing.T) {
	d := strict.New()
	x, _ := d.Alloc(kernels.F32, 2, 4)
	w, _ := d.Alloc(kernels.F32, 1, 4)
	d.WriteF32(w, []float32{1, 1, 1, 1})

	d.BeginStep()
	s := d.Scratch(kernels.F32, 2, 4)
	mustPanic(t, "never written", func() { d.RMSNorm(x, s, w, 1e-6, false) })
	mustPanic(t, "inside a step", func() { d.ReadF32(make([]float32, 8), x) })
	mustPanic(t, "inside a step", func() { d.WriteF32(x, make([]float32, 8)) })
	mustPanic(t, "want (2, 4)", func() { d.RMSNorm(d.Scratch(kernels.F32, 3, 4), x, w, 1e-6, false) })
	mustPanic(t, "want dtype", func() { d.RMSNorm(x, x, d.Scratch(kernels.I32, 1, 4), 1e-6, false) })
	other, _ := strict.New().Alloc(kernels.F32, 2, 4)
	mustPanic(t, "not allocated by this device", func() { d.RMSNorm(x, other, w, 1e-6, false) })
	d.RMSNorm(x, x, w, 1e-6, false) // zeros are written values
	d.EndStep()
	d.ReadF32(make([]float32, 8), x)
	if d.Steps() != 1 {
		t.Fatalf("Steps() = %d, want 1", d.Steps())
	}
}
