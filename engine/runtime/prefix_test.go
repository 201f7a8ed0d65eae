package runtime_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
)

// The tiny configs with room for a conversation.
var (
	chatLlama = strings.Replace(tinyLlama, `"max_position_embeddings": 96`, `"max_position_embeddings": 320`, 1)
	chatQwen3 = strings.Replace(tinyQwen3, `"max_position_embeddings": 96`, `"max_position_embeddings": 320`, 1)
)

// chatOpts is how a conversation is run.
type chatOpts struct {
	turns, user int             // turns, and new tokens per user message
	req         runtime.Request // MaxTokens, Sampling and Draft of every turn
	stopEvery   int             // every stopEvery-th turn ends with a stop id (0: never)
	// exact: Usage.CachedTokens must be all that the previous turn
	// computed; otherwise (speculation may leave the tokens of the last
	// step uncached, and start it at the last prompt token) at least the
	// previous prompt but one token. off: nothing may be reused.
	exact, off bool
}

// chat runs a conversation on r, one turn at a time: each prompt is the
// previous prompt, its reply (with the stop id that ended it, as a chat
// template's end-of-turn) and new user tokens. Every reply must be the
// one a cold run of the same request gives, and every turn but the first
// must reuse the conversation so far. It returns the prompt tokens reused.
func chat(t *testing.T, m model.Model, r *runtime.Runtime, rng *rand.Rand, o chatOpts) (cached int) {
	t.Helper()
	vocab := m.Info().Vocab
	var prompt []int32
	prevPrompt, prevComputed := 0, 0
	for turn := range o.turns {
		prompt = append(prompt, randPrompt(rng, o.user, vocab)...)
		req := o.req
		req.Prompt = slices.Clone(prompt)
		if o.stopEvery > 0 && turn%o.stopEvery == o.stopEvery-1 {
			full, _ := reference(t, m, req)
			req.Stop = []int32{full[len(full)/2]}
		}
		want, wantFinish := reference(t, m, req)
		got := generate(t, r, t.Context(), req).Collect()
		if got.Err != nil || !slices.Equal(got.Tokens, want) || got.Finish != wantFinish {
			t.Fatalf("turn %d (prompt %d, %+v):\n got %v %s %v\nwant %v %s", turn, len(prompt), req.Sampling, got.Tokens, got.Finish, got.Err, want, wantFinish)
		}
		u := got.Usage
		switch {
		case turn == 0 || o.off:
			if u.CachedTokens != 0 {
				t.Errorf("turn %d: %d cached tokens, want none", turn, u.CachedTokens)
			}
		case o.exact && u.CachedTokens != prevComputed,
			!o.exact && (u.CachedTokens < prevPrompt-1 || u.CachedTokens > prevComputed):
			t.Errorf("turn %d: %d cached tokens; the previous turn had a prompt of %d and computed %d", turn, u.CachedTokens, prevPrompt, prevComputed)
		}
		cached += u.CachedTokens
		// The last token sampled is computed only if a stop id followed.
		prevPrompt, prevComputed = len(prompt), len(prompt)+len(got.Tokens)
		prompt = append(prompt, got.Tokens...)
		if got.Finish == runtime.FinishStop {
			prompt = append(prompt, req.Stop[0])
		} else {
			prevComputed--
		}
	}
	return cached
}

// Multi-turn conversations reuse the whole conversation so far and give a
// cold run's replies, greedy and seeded, whether a turn ended with a stop
// id or at MaxTokens; with the prefix cache off nothing is reused.
func TestPrefixChat(t *testing.T) {
	for _, tc := range []struct{ name, cfg string }{{"llama", chatLlama}, {"qwen3", chatQwen3}} {
		t.Run(tc.name, func(t *testing.T) {
			m := build(t, tc.cfg)
			seeded := sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 5}
			for _, off := range []bool{false, true} {
				opts := runtime.Options{KVBudget: budget(m, 160), MaxBatchTokens: 16, MaxSeqs: 4}
				if off {
					opts.PrefixCache = -1
				}
				r := start(t, m, opts)
				rng := rand.New(rand.NewPCG(81, 82))
				cached := 0
				for _, p := range []sample.Params{greedy, seeded} {
					cached += chat(t, m, r, rng, chatOpts{turns: 6, user: 9, req: runtime.Request{MaxTokens: 7, Sampling: p}, stopEvery: 2, exact: true, off: off})
				}
				st := r.Stats()
				if off && (cached != 0 || st.PrefixEntries != 0 || st.PrefixHits != 0) ||
					!off && (cached == 0 || st.CachedTokens != uint64(cached) || st.PrefixHits != 10 || st.PrefixEntries == 0 || st.PrefixBlocks == 0) {
					t.Errorf("prefix cache off %v: %d tokens reused; stats %+v", off, cached, st)
				}
				if !off {
					t.Logf("%d prompt tokens reused; %d computed, %d entries of %d blocks", cached, st.PromptTokens, st.PrefixEntries, st.PrefixBlocks)
				}
				waitIdle(t, r)
			}
		})
	}
}

// Requests sharing a prefix run at once, each forking the same cached
// blocks (and copying the shared partial block before writing): every one
// gives a cold run's output and reports the prefix as cached; a repeated
// prompt reuses all of it but its last token.
func TestPrefixSharedConcurrent(t *testing.T) {
	m := build(t, chatQwen3)
	vocab := m.Info().Vocab
	r := start(t, m, runtime.Options{KVBudget: budget(m, 200), MaxBatchTokens: 64, MaxSeqs: 8})
	rng := rand.New(rand.NewPCG(83, 84))
	system := randPrompt(rng, 23, vocab) // not a whole number of blocks
	first := runtime.Request{Prompt: append(slices.Clone(system), 2, 3, 4), MaxTokens: 5, Sampling: greedy}
	checkAgainstReference(t, m, r, []runtime.Request{first})

	var reqs []runtime.Request
	for i := range 6 {
		p := append(slices.Clone(system), int32(5+i)) // differs from the first request at once
		p = append(p, randPrompt(rng, 1+rng.IntN(12), vocab)...)
		req := runtime.Request{Prompt: p, MaxTokens: 8, Sampling: greedy}
		if i%2 == 1 {
			req.Sampling = sample.Params{Temperature: 1, TopK: 10, Seed: uint64(i)}
		}
		reqs = append(reqs, req)
	}
	reqs = append(reqs, first, first) // a repeated prompt, twice at once
	res := checkAgainstReference(t, m, r, reqs)
	for i, g := range res {
		want := len(system)
		if i >= 6 {
			want = len(first.Prompt) - 1
		}
		if g.Usage.CachedTokens != want {
			t.Errorf("request %d: %d tokens cached, want %d", i, g.Usage.CachedTokens, want)
		}
	}
	st := waitIdle(t, r)
	if st.PrefixHits != uint64(len(reqs)) {
		t.Errorf("%d prefix hits, want %d", st.PrefixHits, len(reqs))
	}
}

// A tight cache: cached prefixes make way for running sequences, which
// are never preempted for them, and reuse goes on within what fits.
func TestPrefixEviction(t *testing.T) {
	m := build(t, chatLlama)
	// 24 blocks of 4 tokens; two conversations at once of up to 48 tokens.
	r := start(t, m, runtime.Options{KVBudget: budget(m, 24), MaxBatchTokens: 16, MaxSeqs: 2})
	var wg sync.WaitGroup
	cached := make([]int, 6)
	for i := range cached {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(85, uint64(i)))
			cached[i] = chat(t, m, r, rng, chatOpts{turns: 4, user: 7, req: runtime.Request{MaxTokens: 4, Sampling: greedy}})
		})
		if i%2 == 1 {
			wg.Wait() // two conversations at a time
		}
	}
	st := r.Stats()
	if st.Preemptions != 0 {
		t.Errorf("%d preemptions: running sequences were evicted for cached prefixes", st.Preemptions)
	}
	if st.PrefixBlocks > 24 || st.PrefixEntries == 0 || st.PrefixEntries >= 6*4 {
		t.Errorf("stats %+v: want prefixes evicted", st)
	}
	for i, c := range cached {
		if c == 0 {
			t.Errorf("conversation %d: nothing reused", i)
		}
	}
	waitIdle(t, r)
}

// fakeChats runs conversations at once on a fake model with speculation:
// the fake checks the recurrent state and the MTP cache rows against the
// cached tokens on every call.
func fakeChats(t *testing.T, m model.Model, opts runtime.Options, n int, req runtime.Request) {
	t.Helper()
	r := start(t, m, opts)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(87, uint64(i)))
			chat(t, m, r, rng, chatOpts{turns: 5, user: 5, req: req, stopEvery: 3})
		})
	}
	wg.Wait()
	if st := waitIdle(t, r); st.PrefixHits < uint64(n*4) || st.VerifySteps == 0 {
		t.Errorf("stats %+v: want every later turn to reuse, and speculation", st)
	}
}

// Speculating conversations on the fakes, attention and hybrid: forks get
// consistent MTP rows (recomputed from the kept hidden states where the
// MTP module lagged) and state checkpoints, also when the state pool holds
// a single slot (the checkpoint's slot is taken over).
func TestPrefixFakeSpec(t *testing.T) {
	f := &fakeMTP{vocab: 24, noise: 0.6, scale: 4}
	req := runtime.Request{MaxTokens: 9, Sampling: greedy}
	t.Run("attention", func(t *testing.T) {
		fakeChats(t, f, runtime.Options{KVBudget: budget(f, 200), MaxBatchTokens: 16, MaxSeqs: 4, Draft: 4, DraftMaxSeqs: -1}, 4, req)
	})
	t.Run("hybrid", func(t *testing.T) {
		// Room for the slots, the snapshots (one per draft token) and the
		// checkpoints of two turns.
		m := fakeHybrid{f}
		per := m.StateLayout()[0].Bytes()
		fakeChats(t, m, runtime.Options{KVBudget: budget(m, 200), MaxBatchTokens: 16, MaxSeqs: 4, Draft: 4, DraftMaxSeqs: -1, StateBudget: 28 * per}, 4, req)
	})
	t.Run("hybrid one slot", func(t *testing.T) {
		m := fakeHybrid{f}
		per := m.StateLayout()[0].Bytes()
		r := start(t, m, runtime.Options{KVBudget: budget(m, 200), MaxBatchTokens: 16, StateBudget: per, Draft: 4})
		rng := rand.New(rand.NewPCG(89, 90))
		if cached := chat(t, m, r, rng, chatOpts{turns: 5, user: 5, req: req, stopEvery: 2}); cached == 0 {
			t.Error("nothing reused")
		}
		waitIdle(t, r)
	})
}

// Conversations on checkpoints with linear-attention layers reuse only at
// state checkpoints (the end of a turn) and give a cold run's replies,
// greedy, seeded and speculating.
func TestPrefixHybrid(t *testing.T) {
	for _, name := range hybridFixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := loadHybrid(t, name)
			turns, user := 4, 10
			if raceOn {
				turns, user = 3, 6
			}
			r := start(t, m, runtime.Options{KVBudget: budget(m, 64), MaxBatchTokens: 16, MaxSeqs: 2})
			rng := rand.New(rand.NewPCG(91, 92))
			for _, req := range []runtime.Request{
				{MaxTokens: 5, Sampling: greedy},
				{MaxTokens: 5, Sampling: sample.Params{Temperature: 0.8, Seed: 9}},
				{MaxTokens: 5, Sampling: greedy, Draft: 2},
			} {
				_, mtp := m.(model.MTPModel)
				if req.Draft > 0 && !mtp {
					continue
				}
				chat(t, m, r, rng, chatOpts{turns: turns, user: user, req: req, exact: req.Draft == 0})
			}
			if st := waitIdle(t, r); st.PrefixHits == 0 {
				t.Errorf("stats %+v: nothing reused", st)
			}
		})
	}
}

// DeepSeek-V3.2 (MLA latent cache, DSA indexer keys, an MTP layer):
// conversations reuse the latent and index caches and the MTP rows. A
// seeded speculating conversation draws the same tokens as without the
// prefix cache, which holds only if the reused MTP rows are right.
func TestPrefixMLA(t *testing.T) {
	m := loadFixture(t, "deepseek_v32")
	turns, user := 4, 10
	if raceOn {
		turns, user = 3, 6
	}
	opts := runtime.Options{KVBudget: budget(m, 64), MaxBatchTokens: 16, MaxSeqs: 2}
	r := start(t, m, opts)
	rng := rand.New(rand.NewPCG(93, 94))
	chat(t, m, r, rng, chatOpts{turns: turns, user: user, req: runtime.Request{MaxTokens: 5, Sampling: greedy}, exact: true})
	chat(t, m, r, rng, chatOpts{turns: turns, user: user, req: runtime.Request{MaxTokens: 5, Sampling: greedy, Draft: 2}})

	// Seeded and speculating: the same requests with and without reuse.
	opts.Draft = 3
	var out [2][][]int32
	for i, pc := range []int{0, -1} {
		opts.PrefixCache = pc
		r := start(t, m, opts)
		rng := rand.New(rand.NewPCG(95, 96))
		var prompt []int32
		for range turns {
			prompt = append(prompt, randPrompt(rng, user, m.Info().Vocab)...)
			got := generate(t, r, t.Context(), runtime.Request{Prompt: slices.Clone(prompt), MaxTokens: 6, Sampling: sample.Params{Temperature: 1, Seed: 3}}).Collect()
			if got.Err != nil {
				t.Fatal(got.Err)
			}
			out[i] = append(out[i], got.Tokens)
			prompt = append(prompt, got.Tokens...)
		}
		if st := waitIdle(t, r); pc == 0 && (st.PrefixHits == 0 || st.VerifySteps == 0) {
			t.Errorf("stats %+v: want reuse and speculation", st)
		}
	}
	for i := range out[0] {
		if !slices.Equal(out[0][i], out[1][i]) {
			t.Errorf("turn %d: %v with the prefix cache, %v without", i, out[0][i], out[1][i])
		}
	}
}

// DropPrefixCache returns every block and checkpoint; after Close it
// returns at once.
func TestDropPrefixCache(t *testing.T) {
	m := fakeHybrid{&fakeMTP{vocab: 16, scale: 4}}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64)})
	checkAgainstReference(t, m, r, []runtime.Request{{Prompt: []int32{3, 4, 5, 6, 7}, MaxTokens: 4, Sampling: greedy}})
	st := r.Stats()
	for deadline := time.Now().Add(5 * time.Second); st.Running > 0 && time.Now().Before(deadline); st = r.Stats() {
		time.Sleep(time.Millisecond) // Stats is published after the step that ended the request
	}
	// The prompt and the whole sequence, each with its checkpoint.
	if st.PrefixEntries != 2 || st.PrefixStateBytes != 2*4 || st.RecurrentBytes != 2*4 || st.KVBlocksUsed == 0 {
		t.Errorf("after one request: %+v", st)
	}
	r.DropPrefixCache()
	if st := r.Stats(); st.PrefixEntries != 0 || st.KVBlocksUsed != 0 || st.RecurrentBytes != 0 || st.PrefixBlocks != 0 {
		t.Errorf("after DropPrefixCache: %+v", st)
	}
	r.Close()
	r.DropPrefixCache()
	if _, err := r.Generate(t.Context(), runtime.Request{Prompt: []int32{1}}); !errors.Is(err, runtime.ErrClosed) {
		t.Errorf("Generate after Close: %v", err)
	}
}
