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

// TestStepInputsSizedByLimits: the model's step inputs are sized by the
// runtime's limits when it opens (model.StepReserver), not grown by the
// steps a schedule happens to form, so steps within the limits allocate
// nothing. After a short warm-up request (the hybrids' state pool takes its
// rows for one sequence: it grows with the sequences alive, by design),
// the backend's tensors stay put through requests of every step shape:
// long prompt chunks and, for the dense model, several sequences at once.
func TestStepInputsSizedByLimits(t *testing.T) {
	for _, c := range []struct {
		name     string
		model    func(t *testing.T) model.Model
		draft    int
		parallel int // requests at once (the state pool grows with them)
	}{
		{"qwen3", func(t *testing.T) model.Model { return build(t, tinyQwen3) }, 0, 6},
		{"qwen3_next", func(t *testing.T) model.Model { return loadHybrid(t, "qwen3_next") }, 0, 1},
		{"qwen3_next+mtp", func(t *testing.T) model.Model { return loadHybrid(t, "qwen3_next") }, 2, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := c.model(t)
			dev := model.AsDevice(m).Device().(kernels.MemoryReporter)
			r, err := runtime.New(m, runtime.Options{KVBudget: budget(m, 64), BlockSize: blockSize, Draft: c.draft, MaxBatchTokens: 48, PrefixCache: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			prompt := func(n int) []int32 {
				p := make([]int32, n)
				for j := range p {
					p[j] = int32(1 + (n+j)%7)
				}
				return p
			}
			if res := generate(t, r, context.Background(), runtime.Request{Prompt: prompt(2), MaxTokens: 8}).Collect(); res.Err != nil {
				t.Fatal(res.Err)
			}
			warm := dev.MemoryUse().Tensors
			for i := 0; i < 6; i += c.parallel { // prompts of 7..68 tokens: 48-token chunks, mixed and decode steps
				var streams []*runtime.Stream
				for j := i; j < i+c.parallel; j++ {
					streams = append(streams, generate(t, r, context.Background(), runtime.Request{Prompt: prompt(7 + 12*j), MaxTokens: 5}))
				}
				for _, res := range collectAll(streams) {
					if res.Err != nil {
						t.Fatal(res.Err)
					}
				}
			}
			waitIdle(t, r)
			if got := dev.MemoryUse().Tensors; got != warm {
				t.Errorf("Tensors %d after the requests, %d after the warm-up: a step grew the model's inputs", got, warm)
			}
		})
	}
}
