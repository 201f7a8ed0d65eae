package cpu

import (
	"runtime"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
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
	var kept []kernels.Tensor // alive to the end: the count follows the GC
	for _, a := range []struct {
		dt         kernels.DType
		rows, cols int
	}{
		{kernels.BF16, 16, 64}, // a BF16 KV layer: 2 KiB
		{kernels.F32, 3, 5},    // 60 B
		{kernels.I32, 7, 1},    // 28 B
	} {
		x, err := b.Alloc(a.dt, a.rows, a.cols)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, x)
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
	runtime.KeepAlive(kept)
}

// TestMemoryUseFollowsTheGC checks that a dropped tensor leaves the count
// once the garbage collector has freed it.
func TestMemoryUseFollowsTheGC(t *testing.T) {
	b := New(1)
	defer b.Close()
	keep, err := b.Alloc(kernels.F32, 1, 256) // 1 KiB
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(kernels.F32, 1024, 256); err != nil { // 1 MiB, dropped
		t.Fatal(err)
	}
	if got := b.MemoryUse().Tensors; got != 1<<10+1<<20 {
		t.Fatalf("Tensors = %d before the GC, want %d", got, 1<<10+1<<20)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.MemoryUse().Tensors != 1<<10 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if got := b.MemoryUse().Tensors; got != 1<<10 {
		t.Errorf("Tensors = %d after the GC, want %d (the kept tensor)", got, 1<<10)
	}
	runtime.KeepAlive(keep)
}

func TestFree(t *testing.T) {
	b := New(1)
	defer b.Close()
	kerneltest.FreeTest(t, b)
}
