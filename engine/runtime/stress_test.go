package runtime_test

import (
	"context"
	"errors"
	"math/rand/v2"
	goruntime "runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
)

// stressJob is one request of the stress test and what it should do.
type stressJob struct {
	kind   int // see TestStress
	req    runtime.Request
	want   []int32 // reference output (normal jobs)
	finish runtime.FinishReason
	delay  time.Duration // cancellation delay (timeout jobs)
}

const (
	jobNormal     = iota
	jobImpossible // prompt over the context: refused at once
	jobPanic      // poisoned prompt: the model panics
	jobCancel     // Stream.Cancel right after Generate
	jobTimeout    // the context expires after a short random delay
	jobSlow       // the consumer reads only after the request ended
)

func TestStress(t *testing.T) {
	base := goruntime.NumGoroutine()
	hm := poisonModel(build(t, tinyLlama))
	vocab := hm.Info().Vocab

	const total = 300
	jobs := make([]stressJob, total)
	rng := rand.New(rand.NewPCG(23, 24))
	stems := [][]int32{randPrompt(rng, 20, vocab), randPrompt(rng, 20, vocab), randPrompt(rng, 20, vocab)}
	for i := range jobs {
		j := &jobs[i]
		switch k := rng.IntN(20); {
		case k == 0:
			j.kind = jobImpossible
		case k == 1:
			j.kind = jobPanic
		case k <= 3:
			j.kind = jobCancel
		case k <= 6:
			j.kind = jobTimeout
			j.delay = time.Duration(rng.IntN(4000)) * time.Microsecond
		case k == 7:
			j.kind = jobSlow
		}
		j.req = runtime.Request{Prompt: randPrompt(rng, 1+rng.IntN(30), vocab), MaxTokens: 1 + rng.IntN(10), Sampling: greedy}
		if rng.IntN(2) == 0 { // shares a prefix with others: reuse
			stem := stems[rng.IntN(len(stems))]
			j.req.Prompt = append(slices.Clone(stem[:1+rng.IntN(len(stem))]), j.req.Prompt[:rng.IntN(len(j.req.Prompt))]...)
		}
		if rng.IntN(3) == 0 {
			j.req.Sampling = sample.Params{Temperature: 1, Seed: rng.Uint64()}
		}
		if rng.IntN(4) == 0 {
			j.req.Stop = []int32{int32(2 + rng.IntN(vocab-2))}
		}
		switch j.kind {
		case jobImpossible:
			j.req.Prompt = randPrompt(rng, 97+rng.IntN(30), vocab)
		case jobPanic:
			j.req.Prompt[0] = panicToken
		default:
			j.want, j.finish = reference(t, hm.Model, j.req)
		}
	}

	// 24 blocks of 4 tokens for up to 8 sequences of up to 40 tokens:
	// preemption is routine.
	r, err := runtime.New(hm, runtime.Options{
		KVBudget: budget(hm, 24), BlockSize: blockSize, MaxBatchTokens: 24, MaxSeqs: 8,
		NewDecoder: func() runtime.TextDecoder { return &byteDecoder{} },
	})
	if err != nil {
		t.Fatal(err)
	}

	var counts [jobSlow + 1]atomic.Int32
	var cancelled, collateral atomic.Int32
	runJobs(24, total, func(i int) {
		j := &jobs[i]
		counts[j.kind].Add(1)
		ctx, cancel := context.WithCancel(t.Context())
		if j.kind == jobTimeout {
			ctx, cancel = context.WithTimeout(t.Context(), j.delay)
		}
		s, err := r.Generate(ctx, j.req)
		if j.kind == jobImpossible {
			if !errors.Is(err, runtime.ErrPromptTooLong) || s != nil {
				t.Errorf("job %d: impossible prompt of %d: %v", i, len(j.req.Prompt), err)
			}
			cancel()
			return
		}
		if err != nil {
			t.Errorf("job %d: %v", i, err)
			cancel()
			return
		}
		switch j.kind {
		case jobCancel:
			s.Cancel()
		case jobSlow:
			<-s.Done()
		}
		got := s.Collect()
		cancel()
		if (got.Err == nil) == (got.Finish == "") {
			t.Errorf("job %d: final event has finish %q and error %v", i, got.Finish, got.Err)
		}
		var pe *runtime.PanicError
		switch {
		case j.kind == jobPanic:
			if !errors.As(got.Err, &pe) {
				t.Errorf("job %d: poisoned prompt: %s %v", i, got.Finish, got.Err)
			}
		case errors.As(got.Err, &pe):
			collateral.Add(1) // shared a step with a poisoned prompt
			if !slices.Equal(got.Tokens, j.want[:min(len(j.want), len(got.Tokens))]) {
				t.Errorf("job %d: failed with %v after %v, want a prefix of %v", i, got.Err, got.Tokens, j.want)
			}
		case got.Err != nil:
			t.Errorf("job %d: %v", i, got.Err)
		case got.Finish == runtime.FinishCancelled:
			if j.kind != jobCancel && j.kind != jobTimeout {
				t.Errorf("job %d (kind %d): cancelled", i, j.kind)
			}
			cancelled.Add(1)
			if len(got.Tokens) > len(j.want) || !slices.Equal(got.Tokens, j.want[:len(got.Tokens)]) {
				t.Errorf("job %d: cancelled after %v, want a prefix of %v", i, got.Tokens, j.want)
			}
		case !slices.Equal(got.Tokens, j.want) || got.Finish != j.finish:
			t.Errorf("job %d (kind %d):\n got %v %s\nwant %v %s", i, j.kind, got.Tokens, got.Finish, j.want, j.finish)
		}
	})
	st := waitIdle(t, r)
	var byKind []int32
	for i := range counts {
		byKind = append(byKind, counts[i].Load())
	}
	t.Logf("jobs by kind %v; %d cancelled, %d collateral failures; %d steps, %d preemptions, %d failed; %d prefix hits, %d tokens reused",
		byKind, cancelled.Load(), collateral.Load(), st.Steps, st.Preemptions, st.Failed, st.PrefixHits, st.CachedTokens)
	if st.Preemptions == 0 || st.PrefixHits == 0 {
		t.Error("no preemption or no prefix reuse: the stress test does not exercise them")
	}
	if st.KVBlocksUsed != 0 || st.KVBytesUsed != 0 {
		t.Errorf("blocks not returned: %+v", st)
	}
	r.Close()
	checkGoroutines(t, base)
}
