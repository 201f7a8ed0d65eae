package cpu

import (
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestMemoryUse checks the CPU's MemoryUse against the sizes of what was
// allocated: Alloc's tensors in their dtype's bytes, the arena's buffers in
// float32 words, grown in place and not counted twice across steps.
func TestMemoryUse(t *testing.T) {
	b := New(1)
	defer b.Close()
	if u := b.MemoryUse(); u != (kernels.MemoryUse{}) {
		t.Fatalf("fresh backend: %+v, want zero", u)
	}
	if _, err := b.Alloc(kernels.BF16, 16, 64); err != nil { // a BF16 KV layer: 2 KiB
		t.Fatal(err)
	}
	if _, err := b.Alloc(kernels.F32, 3, 5); err != nil { // 60 B
		t.Fatal(err)
	}
	if _, err := b.Alloc(kernels.I32, 7, 1); err != nil { // 28 B
		t.Fatal(err)
	}
	for range 2 { // the second step reuses the first one's buffers
		b.BeginStep()
		b.Scratch(kernels.F32, 4, 100) // 1600 B
		b.Scratch(kernels.BF16, 1, 3)  // 6 B, one float32 word short: 8 B
		b.EndStep()
	}
	b.BeginStep()
	b.Scratch(kernels.F32, 8, 100) // the first buffer grows to 3200 B
	b.EndStep()
	want := kernels.MemoryUse{Tensors: 2048 + 60 + 28, Arena: 3200 + 8}
	if u := b.MemoryUse(); u != want {
		t.Errorf("MemoryUse = %+v, want %+v", u, want)
	}
	if u := b.MemoryUse(); u.OnDevice || u.Weights != 0 || u.Total != 0 {
		t.Errorf("the CPU reports device memory or weights: %+v", u)
	}
}
