package gqa_test

import (
	"errors"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// TestEnsureI32Frees: a step input that grows frees the tensor it
// replaces, so the backend holds only the current one.
func TestEnsureI32Frees(t *testing.T) {
	d := strict.New()
	var buf kernels.Tensor
	for _, c := range []struct{ n, rows int }{{10, 64}, {64, 64}, {65, 128}, {300, 300}, {12, 300}} {
		v, err := gqa.EnsureI32(d, &buf, c.n)
		if err != nil {
			t.Fatal(err)
		}
		if v.Rows != c.n || buf.Rows != c.rows {
			t.Fatalf("n %d: view of %d rows over %d, want %d over %d", c.n, v.Rows, buf.Rows, c.n, c.rows)
		}
		if got := d.MemoryUse().Tensors; got != int64(4*c.rows) {
			t.Errorf("n %d: Tensors = %d, want %d (the replaced tensors freed)", c.n, got, 4*c.rows)
		}
	}
	old := buf
	if _, err := gqa.EnsureI32(d, &buf, 1000); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, kernels.ErrFreed) {
			t.Errorf("the replaced tensor written: panic %v, want kernels.ErrFreed", err)
		}
	}()
	d.WriteI32(old, make([]int32, old.Rows))
}
