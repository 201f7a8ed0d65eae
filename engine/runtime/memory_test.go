package runtime_test

import (
	"context"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/kernels"
)

// TestCloseReleasesMemory: a runtime opened, run and closed again and again
// on the strict backend leaves the backend's tensors at the baseline (the
// model's own): Close releases the KV cache and the state pool exactly
// once (strict panics on a double free or a later use), for a dense
// model, a hybrid with recurrent state, and the hybrid drafting with MTP
// (state snapshots, the MTP layer's hidden rows).
func TestCloseReleasesMemory(t *testing.T) {
	for _, c := range []struct {
		name  string
		model func(t *testing.T) model.Model
		draft int
	}{
		{"qwen3", func(t *testing.T) model.Model { return build(t, tinyQwen3) }, 0},
		{"qwen3_next", func(t *testing.T) model.Model { return loadHybrid(t, "qwen3_next") }, 0},
		{"qwen3_next+mtp", func(t *testing.T) model.Model { return loadHybrid(t, "qwen3_next") }, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := c.model(t)
			if _, ok := m.(model.MTPModel); c.draft > 0 && !ok {
				t.Fatalf("%T has no MTP module", m)
			}
			dev := model.AsDevice(m).Device().(kernels.MemoryReporter)
			opts := runtime.Options{KVBudget: budget(m, 16), BlockSize: blockSize, Draft: c.draft}
			req := runtime.Request{Prompt: []int32{1, 2, 3, 4, 5, 6}, MaxTokens: 6}
			run := func() int64 { // the tensors while the runtime is open
				r, err := runtime.New(m, opts)
				if err != nil {
					t.Fatal(err)
				}
				open := dev.MemoryUse().Tensors // no step has run: the loop is idle
				if res := generate(t, r, context.Background(), req).Collect(); res.Err != nil {
					t.Fatal(res.Err)
				}
				r.Close()
				r.Close() // idempotent: nothing freed twice
				return open
			}
			run() // the model's step inputs grow to this request's size and stay
			base := dev.MemoryUse().Tensors
			for i := range 3 {
				open := run()
				if open <= base {
					t.Fatalf("run %d: Tensors %d with the runtime open, want more than the baseline %d (its cache)", i, open, base)
				}
				if got := dev.MemoryUse().Tensors; got != base {
					t.Fatalf("run %d: Tensors %d after Close, want the baseline %d", i, got, base)
				}
			}
		})
	}
}
