package runtime_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// costRun runs rounds of n concurrent greedy requests on f with cost-aware
// drafting, checks every output against plain decoding (on ref, f's twin
// without a cost), and returns the final stats.
func costRun(t *testing.T, f, ref *fakeMTP, rounds, n, maxTokens int) runtime.Stats {
	t.Helper()
	r := startCostAware(t, f, runtime.Options{KVBudget: budget(f, 64), MaxBatchTokens: 64, MaxSeqs: n, Draft: 3})
	rng := rand.New(rand.NewPCG(7, 11))
	for range rounds {
		reqs := make([]runtime.Request, n)
		streams := make([]*runtime.Stream, n)
		for i := range reqs {
			reqs[i] = runtime.Request{Prompt: randPrompt(rng, 6, f.vocab), MaxTokens: maxTokens, Sampling: greedy}
			streams[i] = generate(t, r, context.Background(), reqs[i])
		}
		for i, res := range collectAll(streams) {
			want, _ := reference(t, ref, reqs[i])
			if res.Err != nil || !slices.Equal(res.Tokens, want) {
				t.Fatalf("request %d: %v %v, want %v", i, res.Tokens, res.Err, want)
			}
		}
	}
	return waitIdle(t, r)
}

// A backend whose cost grows with the tokens of a step (compute-bound):
// verifying k+1 tokens costs k+1 plain steps, so after warming up drafting
// is suppressed but for probes, and the output stays that of plain decoding.
func TestDraftCostSuppresses(t *testing.T) {
	f := &fakeMTP{vocab: 24, noise: 1, scale: 4}
	f.cost = func(mtp bool, tokens int) time.Duration {
		if mtp {
			return time.Duration(tokens) * 500 * time.Microsecond
		}
		return time.Duration(tokens) * 2 * time.Millisecond
	}
	st := costRun(t, f, &fakeMTP{vocab: 24, noise: 1, scale: 4}, 2, 4, 60)
	t.Logf("draft %.3gms/token, plain %.3gms/token, suppressed %v; %d verify steps, %d of %d drafts accepted, %d tokens",
		1e3*st.DraftSecPerToken, 1e3*st.PlainSecPerToken, st.DraftSuppressed, st.VerifySteps, st.AcceptedTokens, st.DraftTokens, st.GeneratedTokens)
	if !st.DraftSuppressed || st.PlainSecPerToken <= 0 || st.DraftSecPerToken <= st.PlainSecPerToken {
		t.Errorf("drafting not suppressed: %+v", st)
	}
	if st.VerifySteps == 0 || st.VerifySteps > st.GeneratedTokens/4 {
		t.Errorf("%d sequence-steps verified drafts for %d tokens: want a warm-up and probes only", st.VerifySteps, st.GeneratedTokens)
	}
}

// A backend whose step costs the same whatever its tokens (bound by
// reading the weights) and a drafter that is always right: drafting pays
// and stays on, with a plain step now and then to measure.
func TestDraftCostKeepsDrafting(t *testing.T) {
	f := &fakeMTP{vocab: 24, scale: 4}
	f.cost = func(mtp bool, tokens int) time.Duration {
		if mtp {
			return 200 * time.Microsecond
		}
		return 4 * time.Millisecond
	}
	st := costRun(t, f, &fakeMTP{vocab: 24, scale: 4}, 2, 2, 80)
	t.Logf("draft %.3gms/token, plain %.3gms/token, suppressed %v; %d verify steps, %d of %d drafts accepted, %d tokens",
		1e3*st.DraftSecPerToken, 1e3*st.PlainSecPerToken, st.DraftSuppressed, st.VerifySteps, st.AcceptedTokens, st.DraftTokens, st.GeneratedTokens)
	if st.DraftSuppressed || st.PlainSecPerToken <= 0 || st.DraftSecPerToken <= 0 || st.DraftSecPerToken >= st.PlainSecPerToken {
		t.Errorf("drafting suppressed or costs misjudged: %+v", st)
	}
	if st.AcceptedTokens < st.GeneratedTokens/2 {
		t.Errorf("%d of %d tokens from accepted drafts: want most", st.AcceptedTokens, st.GeneratedTokens)
	}
}
