package runtime_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// TestGenerateAllStartsTogether: the requests of one GenerateAll start in
// the same step even while the runtime is busy stepping another request
// (so a seeded request's choices run the same steps whenever it comes),
// each gives what it gives alone, and a request that fails validation
// queues none of them.
func TestGenerateAllStartsTogether(t *testing.T) {
	hm := &hookModel{Model: build(t, tinyLlama)}
	var mu sync.Mutex
	var starts [][]int32 // per step: the first token of every prompt that starts in it
	hm.setBefore(func(b *model.Batch) error {
		var s []int32
		for _, q := range b.Seqs {
			if q.Pos == 0 && len(q.Tokens) > 0 {
				s = append(s, q.Tokens[0])
			}
		}
		mu.Lock()
		starts = append(starts, s)
		mu.Unlock()
		time.Sleep(200 * time.Microsecond) // slow steps: the loop is mid-step when the requests come
		return nil
	})
	r := start(t, hm, runtime.Options{KVBudget: budget(hm, 64)})
	ctx := context.Background()
	busy := generate(t, r, ctx, runtime.Request{Prompt: []int32{1, 2, 3}, MaxTokens: 40, Sampling: greedy})
	time.Sleep(2 * time.Millisecond)

	var reqs []runtime.Request
	for i := range 3 {
		reqs = append(reqs, runtime.Request{Prompt: []int32{int32(10 + i), 5, 6, 7}, MaxTokens: 6, Sampling: greedy})
	}
	if _, err := r.GenerateAll(ctx, append(slices.Clone(reqs), runtime.Request{MaxTokens: 4})); err == nil {
		t.Fatal("GenerateAll with an empty prompt among the requests: no error")
	}
	streams, err := r.GenerateAll(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	res := collectAll(streams)
	busy.Collect()
	for i, req := range reqs {
		want, _ := reference(t, hm.Model, req)
		if !slices.Equal(res[i].Tokens, want) {
			t.Errorf("request %d: %v, alone %v", i, res[i].Tokens, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	together, total := false, 0
	for _, s := range starts {
		n := 0
		for _, first := range s {
			if first >= 10 && first < 13 {
				n++
			}
		}
		if n > 0 && n < 3 {
			t.Fatalf("a step started %d of the 3 requests (first tokens %v)", n, s)
		}
		together = together || n == 3
		total += n
	}
	if total != 3 {
		t.Errorf("%d prompt starts of the 3 requests, want 3 (the failed GenerateAll must queue none)", total)
	}
	if !together {
		t.Fatalf("no step started the 3 requests: %v", starts)
	}
	waitIdle(t, r)
}
