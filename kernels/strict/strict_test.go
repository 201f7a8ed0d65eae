package strict_test

import (
	"errors"
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
	tr := &kernels.Mat{DType: kernels.F32, Rows: 2, Cols: 4, Data: make([]byte, 32), Transient: true}
	mustPanic(t, "Transient", func() { d.LinearCat(x, x, []*kernels.Mat{tr}, kernels.Epilogue{}) })
	mustPanic(t, "Transient", func() { d.SwiGLULinear(d.Scratch(kernels.F32, 2, 2), x, tr, tr, 0) })
	d.RMSNorm(x, x, w, 1e-6, false) // zeros are written values
	d.EndStep()
	d.ReadF32(make([]float32, 8), x)
	if d.Steps() != 1 {
		t.Fatalf("Steps() = %d, want 1", d.Steps())
	}
}

// TestSelectionChecks: AttentionMLA rejects a DSA selection that is not
// ascending, reaches past the row's position or continues after a −1.
func TestSelectionChecks(t *testing.T) {
	d := strict.New()
	s := kernels.MLAShape{Heads: 1, Nope: 2, V: 2, KVLora: 2, Scale: 1}
	kvB := &kernels.Mat{DType: kernels.F32, Rows: 4, Cols: 2, Data: make([]byte, 32)}
	cache, _ := d.Alloc(kernels.F32, 4, 2)
	q, _ := d.Alloc(kernels.F32, 1, 2)
	out, _ := d.Alloc(kernels.F32, 1, 2)
	i32 := func(v ...int32) kernels.Tensor {
		x, _ := d.Alloc(kernels.I32, 1, len(v))
		d.WriteI32(x, v)
		return x
	}
	p := &kernels.Paged{Pos: i32(2), Seq: i32(0), Slot: i32(2), Blocks: i32(0), BlockSize: 4}
	d.WriteF32(q, []float32{1, 2})
	for sel, want := range map[kernels.Tensor]string{
		i32(1, 0, -1): "ascending",
		i32(0, 3, -1): "visible positions",
		i32(0, -1, 2): "after a −1",
	} {
		d.BeginStep()
		mustPanic(t, want, func() { d.AttentionMLA(out, q, cache, kvB, nil, p, s, sel) })
		d.EndStep()
	}
	good := i32(0, 2, -1)
	d.BeginStep()
	d.AttentionMLA(out, q, cache, kvB, nil, p, s, good)
	d.EndStep()
}

// TestMemoryUse checks strict's MemoryUse against the allocated sizes:
// Alloc's tensors add up, the arena is the last step's Scratch bytes.
func TestMemoryUse(t *testing.T) {
	d := strict.New()
	if _, err := d.Alloc(kernels.BF16, 4, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(kernels.I32, 3, 1); err != nil {
		t.Fatal(err)
	}
	d.BeginStep()
	d.Scratch(kernels.F32, 10, 10)
	d.EndStep()
	d.BeginStep()
	d.Scratch(kernels.F32, 2, 5)
	d.Scratch(kernels.I32, 1, 4)
	d.EndStep()
	want := kernels.MemoryUse{Tensors: 64 + 12, Arena: 40 + 16}
	if u := d.MemoryUse(); u != want {
		t.Errorf("MemoryUse = %+v, want %+v", u, want)
	}
}

func TestFree(t *testing.T) { kerneltest.FreeTest(t, strict.New()) }

// TestFreeChecks: Free inside a step panics, and a freed tensor panics at
// the op that uses it, naming the tensor.
func TestFreeChecks(t *testing.T) {
	d := strict.New()
	x, _ := d.Alloc(kernels.F32, 2, 4)
	w, _ := d.Alloc(kernels.F32, 1, 4)
	d.BeginStep()
	mustPanic(t, "Free inside a step", func() { d.Free(x) })
	d.EndStep()
	d.Free(w)
	d.BeginStep()
	defer d.EndStep()
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, kernels.ErrFreed) || !strings.Contains(err.Error(), "kernels: ") || !strings.Contains(err.Error(), "F32(1, 4)") {
			t.Errorf("RMSNorm with a freed weight: panic %v, want kernels.ErrFreed naming F32(1, 4)", err)
		}
	}()
	d.RMSNorm(x, x, w, 1e-6, false)
}
