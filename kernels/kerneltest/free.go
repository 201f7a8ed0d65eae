package kerneltest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// FreeTest checks Memory.Free on a backend that notices the misuse of a
// freed tensor (kernels/cpu, kernels/strict): the tensor's bytes leave
// MemoryUse (when m reports it), the tensor, a view of it and a second
// Free panic with an error wrapping kernels.ErrFreed, another tensor is
// untouched, and a Scratch tensor cannot be freed.
func FreeTest(t *testing.T, m kernels.Memory) {
	tensors := func() int64 {
		if r, ok := m.(kernels.MemoryReporter); ok {
			return r.MemoryUse().Tensors
		}
		return 0
	}
	_, reports := m.(kernels.MemoryReporter)
	base := tensors()
	x, err := m.Alloc(kernels.F32, 4, 8) // 128 B
	if err != nil {
		t.Fatal(err)
	}
	y, err := m.Alloc(kernels.F32, 2, 2) // 16 B
	if err != nil {
		t.Fatal(err)
	}
	m.WriteF32(x, make([]float32, 32))
	m.WriteF32(y, []float32{1, 2, 3, 4})
	view := x.Slice(1, 3)

	m.Free(x)
	if got := tensors() - base; reports && got != 16 {
		t.Errorf("after Free: Tensors %d bytes above the baseline, want 16 (the other tensor)", got)
	}
	for name, use := range map[string]func(){
		"ReadF32":       func() { m.ReadF32(make([]float32, 32), x) },
		"WriteF32":      func() { m.WriteF32(x, make([]float32, 32)) },
		"ReadF32(view)": func() { m.ReadF32(make([]float32, 16), view) },
		"Copy":          func() { m.Copy(view, x.Slice(0, 2)) },
		"Free again":    func() { m.Free(x) },
	} {
		if r := panicOf(use); !isFreed(r) {
			t.Errorf("%s of a freed tensor: panic %v, want one wrapping kernels.ErrFreed", name, r)
		}
	}
	got := make([]float32, 4)
	m.ReadF32(got, y)
	if fmt.Sprint(got) != "[1 2 3 4]" {
		t.Errorf("the tensor not freed reads %v, want [1 2 3 4]", got)
	}

	m.BeginStep()
	s := m.Scratch(kernels.F32, 2, 2)
	m.EndStep()
	if r := panicOf(func() { m.Free(s) }); r == nil {
		t.Error("Free of a Scratch tensor did not panic")
	}

	m.Free(y)
	if got := tensors(); got != base {
		t.Errorf("after freeing both: Tensors %d, want the baseline %d", got, base)
	}
}

// panicOf runs fn and returns what it panicked with (nil for none).
func panicOf(fn func()) (r any) {
	defer func() { r = recover() }()
	fn()
	return nil
}

// isFreed reports whether a panic value wraps kernels.ErrFreed.
func isFreed(r any) bool {
	err, ok := r.(error)
	return ok && errors.Is(err, kernels.ErrFreed)
}
