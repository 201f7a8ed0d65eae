package runtime_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	goruntime "runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/all"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// loadFixture builds fixture name's checkpoint on the strict backend, skipping t
// when the fixture is absent or its architecture is not registered.
func loadFixture(t testing.TB, name string) model.Model {
	t.Helper()
	dir := fixtures.Dir(name)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("fixture %s not present", name)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(model.Supported(), cfg.ModelType) {
		t.Skipf("%s: model_type %q not registered", name, cfg.ModelType)
	}
	w, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(cfg, w, strict.New())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mtpFixtures lists the fixtures whose registered model has an MTP module.
func mtpFixtures(t *testing.T) []string {
	names, err := fixtures.List()
	if err != nil || len(names) == 0 {
		t.Skipf("no fixtures: %v", err)
	}
	var out []string
	for _, n := range names {
		cfg, err := config.Load(fixtures.Dir(n))
		if err != nil || !slices.Contains(model.Supported(), cfg.ModelType) {
			continue
		}
		w, err := weights.Open(fixtures.Dir(n))
		if err != nil {
			t.Fatal(err)
		}
		m, err := model.New(cfg, w, strict.New())
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if _, ok := m.(model.MTPModel); !ok {
			continue
		}
		if (raceOn || testing.Short()) && m.Info().Hidden > 128 {
			// Larger than the tiny reference fixtures (hidden 64), like
			// the built-in model: a minute under the race detector (half a
			// minute without) for nothing the tiny ones do not cover.
			t.Logf("%s: hidden size %d, skipped under the race detector and in -short mode", n, m.Info().Hidden)
			continue
		}
		out = append(out, n)
	}
	if testing.Short() && len(out) > 1 {
		t.Logf("-short: %s only (of %v)", out[0], out)
		out = out[:1]
	}
	return out
}

// specReqs are n greedy requests with prompts of 1 to maxPrompt tokens; one
// in four overrides the draft length, one in eight turns speculation off.
func specReqs(rng *rand.Rand, n, maxPrompt, maxTokens, vocab int) []runtime.Request {
	reqs := make([]runtime.Request, n)
	for i := range reqs {
		reqs[i] = runtime.Request{
			Prompt:    randPrompt(rng, 1+rng.IntN(maxPrompt), vocab),
			MaxTokens: maxTokens/2 + rng.IntN(maxTokens/2+1),
			Sampling:  greedy,
		}
		switch i % 8 {
		case 3:
			reqs[i].Draft = 5
		case 5:
			reqs[i].Draft = 1
		case 7:
			reqs[i].Draft = -1
		}
	}
	return reqs
}

// Speculative greedy decoding emits exactly plain greedy decoding's tokens
// on every registered architecture with an MTP module, for concurrent
// requests, with preemption and with speculation switching off and on
// with the load.
func TestSpecGreedyEqualsPlain(t *testing.T) {
	for _, name := range mtpFixtures(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := loadFixture(t, name)
			// 14 blocks of 4 tokens for 6 sequences of up to 36: preemption
			// is routine.
			n, blocks, prompt := 14, 14, 24
			if raceOn {
				n, blocks, prompt = 7, 9, 16
			}
			r := start(t, m, runtime.Options{
				KVBudget: budget(m, blocks), MaxBatchTokens: 16, MaxSeqs: 6, Draft: 3, DraftMaxSeqs: 4,
			})
			reqs := specReqs(rand.New(rand.NewPCG(31, uint64(len(name)))), n, prompt, 12, m.Info().Vocab)
			res := checkAgainstReference(t, m, r, reqs)
			st := waitIdle(t, r)
			for i, g := range res {
				u := g.Usage
				if reqs[i].Draft < 0 && u.VerifySteps != 0 || u.AcceptedTokens > u.DraftTokens ||
					u.VerifySteps > 0 && (len(u.AcceptRate) == 0 || u.AcceptedPerStep < 0) {
					t.Errorf("request %d (draft %d): usage %+v", i, reqs[i].Draft, u)
				}
			}
			if st.VerifySteps == 0 || st.DraftTokens == 0 || st.Preemptions == 0 {
				t.Errorf("stats %+v: want verification steps and preemptions", st)
			}
			t.Logf("%d steps, %d preemptions; %d verify steps, %d drafts, %d accepted (%.3f; by position %.2f)",
				st.Steps, st.Preemptions, st.VerifySteps, st.DraftTokens, st.AcceptedTokens, st.AcceptRate, st.AcceptRateByPos)
		})
	}
}

// On the fake model, whose drafts are mostly right, speculation emits
// several tokens per step, and the output is still plain decoding's:
// rejected drafts are rolled back from the cache and, for the hybrid
// variant, from the recurrent state (the fake checks the state against the
// cache on every call).
func TestSpecFakeGreedy(t *testing.T) {
	for _, hybrid := range []bool{false, true} {
		name := map[bool]string{false: "attention", true: "hybrid"}[hybrid]
		t.Run(name, func(t *testing.T) {
			f := &fakeMTP{vocab: 24, noise: 0.6, scale: 4}
			var m model.Model = f
			if hybrid {
				m = fakeHybrid{f}
			}
			r := start(t, m, runtime.Options{
				KVBudget: budget(m, 40), MaxBatchTokens: 32, MaxSeqs: 8, Draft: 6, DraftMaxSeqs: -1,
			})
			reqs := specReqs(rand.New(rand.NewPCG(41, 42)), 24, 20, 40, m.Info().Vocab)
			res := checkAgainstReference(t, m, r, reqs)
			st := waitIdle(t, r)
			_, _, mtpRows, maxVerify := f.counts()
			if hybrid && maxVerify > 8 {
				t.Errorf("a hybrid verified %d tokens at once, want ≤ 8", maxVerify)
			}
			if st.AcceptRate < 0.3 || st.AcceptedPerStep < 1 || st.Preemptions == 0 {
				t.Errorf("stats %+v: want most drafts accepted, and preemptions", st)
			}
			gen := 0
			for _, g := range res {
				gen += len(g.Tokens)
			}
			t.Logf("%d tokens in %d steps (%d preemptions); %d MTP rows; %d verify steps, acceptance %.3f, %.2f accepted per step, by position %.2f",
				gen, st.Steps, st.Preemptions, mtpRows, st.VerifySteps, st.AcceptRate, st.AcceptedPerStep, st.AcceptRateByPos)
		})
	}
}

// chi2Crit approximates the chi-square quantile of df degrees of freedom
// at z standard deviations (Wilson–Hilferty).
func chi2Crit(df int, z float64) float64 {
	d := float64(df)
	c := 1 - 2/(9*d) + z*math.Sqrt(2/(9*d))
	return d * c * c * c
}

// Speculative sampling draws every token from exactly the distribution
// plain sampling does. The fake model's distributions are known, so the
// exact law of tokens 2 to 4 (all drawn in one verification of two drafts)
// is computed and compared, by a chi-square test, with the tokens the
// runtime emits with speculation and without.
func TestSpecSamplingDistribution(t *testing.T) {
	const (
		vocab = 5
		n     = 3000 // requests per run
	)
	prompt := []int32{1, 3, 2}
	for _, tc := range []struct {
		name   string
		params sample.Params
		hybrid bool
	}{
		{"temperature", sample.Params{Temperature: 1}, false},
		{"top-k+penalty hybrid", sample.Params{Temperature: 0.8, TopK: 3, RepeatPenalty: 1.5}, true},
		{"top-p", sample.Params{Temperature: 1.3, TopP: 0.8}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeMTP{vocab: vocab, noise: 2, scale: 3}
			var m model.Model = f
			if tc.hybrid {
				m = fakeHybrid{f}
			}
			// The exact joint law of tokens 2..4.
			want := map[[3]int32]float64{}
			smp := sample.New(tc.params)
			probs := func(hist []int32) []float32 {
				row := make([]float32, vocab)
				f.fakeLogits(row, fakeHash(hist))
				return smp.Probs(row, hist)
			}
			p1 := probs(prompt)
			for t1 := range int32(vocab) {
				h1 := append(slices.Clone(prompt), t1)
				p2 := probs(h1)
				for t2 := range int32(vocab) {
					h2 := append(slices.Clone(h1), t2)
					p3 := probs(h2)
					for t3 := range int32(vocab) {
						p4 := probs(append(slices.Clone(h2), t3))
						for t4 := range int32(vocab) {
							if pr := float64(p1[t1]) * float64(p2[t2]) * float64(p3[t3]) * float64(p4[t4]); pr > 0 {
								want[[3]int32{t2, t3, t4}] += pr
							}
						}
					}
				}
			}
			run := func(draft int, seed uint64) map[[3]int32]int {
				r := start(t, m, runtime.Options{KVBudget: budget(m, 256), MaxBatchTokens: 256, MaxSeqs: 64, Draft: draft, DraftMaxSeqs: -1})
				streams := make([]*runtime.Stream, n)
				for i := range streams {
					p := tc.params
					p.Seed = seed + uint64(i)
					streams[i] = generate(t, r, t.Context(), runtime.Request{Prompt: prompt, MaxTokens: 4, Sampling: p})
				}
				got := map[[3]int32]int{}
				for i, res := range collectAll(streams) {
					if res.Err != nil || len(res.Tokens) != 4 {
						t.Fatalf("request %d: %v %v", i, res.Tokens, res.Err)
					}
					got[[3]int32(res.Tokens[1:])]++
				}
				st := waitIdle(t, r)
				if draft > 0 && (st.VerifySteps < n || st.AcceptedTokens == 0 || st.AcceptedTokens == st.DraftTokens) {
					t.Errorf("stats %+v: want every request to verify drafts, some accepted and some rejected", st)
				}
				if draft > 0 {
					t.Logf("acceptance %.3f (by position %.2f)", st.AcceptRate, st.AcceptRateByPos)
				}
				return got
			}
			plain, spec := run(0, 1000), run(2, 1_000_000)
			// Goodness of fit of each against the exact law, cells with
			// fewer than 5 expected pooled.
			for _, c := range []struct {
				name string
				got  map[[3]int32]int
			}{{"plain", plain}, {"speculative", spec}} {
				var chi2, poolE float64
				poolO, cells := 0, 0
				for k, got := range c.got {
					if want[k] == 0 {
						t.Errorf("%s: %d draws of %v, which has probability 0", c.name, got, k)
					}
				}
				for k, p := range want {
					e, o := p*n, float64(c.got[k])
					if e < 5 {
						poolE += e
						poolO += c.got[k]
						continue
					}
					chi2 += (o - e) * (o - e) / e
					cells++
				}
				if poolE > 0 {
					chi2 += (float64(poolO) - poolE) * (float64(poolO) - poolE) / poolE
					cells++
				}
				crit := chi2Crit(cells-1, 3.09) // p = 0.001
				t.Logf("%s: chi² %.1f over %d cells (critical %.1f)", c.name, chi2, cells, crit)
				if chi2 > crit {
					t.Errorf("%s: chi² %.1f > %.1f: the tokens do not follow the model's distribution", c.name, chi2, crit)
				}
			}
			// And the two samples against each other (homogeneity).
			var chi2 float64
			cells := 0
			for k := range want {
				a, b := float64(plain[k]), float64(spec[k])
				if a+b < 10 {
					continue
				}
				e := (a + b) / 2
				chi2 += (a-e)*(a-e)/e + (b-e)*(b-e)/e
				cells++
			}
			if crit := chi2Crit(cells-1, 3.09); chi2 > crit {
				t.Errorf("plain vs speculative: chi² %.1f > %.1f over %d cells", chi2, crit, cells)
			}
		})
	}
}

// A randomized stress with speculation on, on the hybrid fake: greedy and
// sampled requests, draft overrides, stop ids, cancellations and timeouts,
// a tight cache and a state pool that cannot hold every snapshot. Greedy
// requests match plain decoding; every cache block, state slot and
// snapshot goes back to its pool.
func TestSpecStress(t *testing.T) {
	base := goruntime.NumGoroutine()
	f := &fakeMTP{vocab: 16, noise: 1, scale: 4}
	m := fakeHybrid{f}
	rng := rand.New(rand.NewPCG(51, 52))
	const total = 240
	type job struct {
		req     runtime.Request
		want    []int32
		finish  runtime.FinishReason
		cancel  bool
		timeout time.Duration
	}
	jobs := make([]job, total)
	stems := [][]int32{randPrompt(rng, 16, f.vocab), randPrompt(rng, 16, f.vocab)}
	for i := range jobs {
		j := &jobs[i]
		j.req = runtime.Request{Prompt: randPrompt(rng, 1+rng.IntN(24), f.vocab), MaxTokens: 1 + rng.IntN(24), Sampling: greedy, Draft: rng.IntN(9) - 1}
		switch k := i - 1 - rng.IntN(16); {
		case rng.IntN(3) == 0 && k >= 0 && len(jobs[k].req.Prompt)+len(jobs[k].want) <= 56:
			// The next turn of an earlier request: reuse at its end.
			j.req.Prompt = slices.Concat(jobs[k].req.Prompt, jobs[k].want, j.req.Prompt[:1+rng.IntN(min(6, len(j.req.Prompt)))])
		case rng.IntN(2) == 0: // shares a prefix with others
			stem := stems[rng.IntN(len(stems))]
			j.req.Prompt = append(slices.Clone(stem[:1+rng.IntN(len(stem))]), j.req.Prompt[:rng.IntN(len(j.req.Prompt))]...)
		}
		if rng.IntN(3) == 0 {
			j.req.Sampling = sample.Params{Temperature: 1, TopK: 1 + rng.IntN(8), Seed: rng.Uint64()}
		}
		if rng.IntN(4) == 0 {
			j.req.Stop = []int32{int32(2 + rng.IntN(f.vocab-2))}
		}
		switch rng.IntN(10) {
		case 0:
			j.cancel = true
		case 1:
			j.timeout = time.Duration(rng.IntN(3000)) * time.Microsecond
		}
		j.want, j.finish = reference(t, m, j.req)
	}
	// 8 sequences of up to 48 tokens in 30 blocks of 4; slots for all 8
	// but snapshots for only 2.
	r, err := runtime.New(m, runtime.Options{
		KVBudget: budget(m, 30), BlockSize: blockSize, MaxBatchTokens: 24, MaxSeqs: 8,
		Draft: 4, DraftMaxSeqs: 6, StateBudget: 10 * 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	runJobs(16, total, func(i int) {
		j := &jobs[i]
		ctx, cancel := context.WithCancel(t.Context())
		if j.timeout > 0 {
			ctx, cancel = context.WithTimeout(t.Context(), j.timeout)
		}
		s, err := r.Generate(ctx, j.req)
		if err != nil {
			t.Errorf("job %d: %v", i, err)
			cancel()
			return
		}
		if j.cancel {
			s.Cancel()
		}
		got := s.Collect()
		cancel()
		greedy := j.req.Sampling.Temperature == 0
		switch {
		case got.Err != nil:
			t.Errorf("job %d: %v", i, got.Err)
		case got.Finish == runtime.FinishCancelled:
			if !j.cancel && j.timeout == 0 {
				t.Errorf("job %d: cancelled", i)
			}
			if greedy && !slices.Equal(got.Tokens, j.want[:min(len(got.Tokens), len(j.want))]) {
				t.Errorf("job %d: cancelled after %v, want a prefix of %v", i, got.Tokens, j.want)
			}
		case greedy && (!slices.Equal(got.Tokens, j.want) || got.Finish != j.finish):
			t.Errorf("job %d (draft %d):\n got %v %s\nwant %v %s", i, j.req.Draft, got.Tokens, got.Finish, j.want, j.finish)
		case len(got.Tokens) > j.req.MaxTokens || got.Finish == runtime.FinishLength && len(got.Tokens) != j.req.MaxTokens:
			t.Errorf("job %d: %d tokens, finish %s, MaxTokens %d", i, len(got.Tokens), got.Finish, j.req.MaxTokens)
		}
		for _, tok := range got.Tokens {
			if slices.Contains(j.req.Stop, tok) {
				t.Errorf("job %d: stop id %d emitted", i, tok)
			}
		}
	})
	st := waitIdle(t, r)
	t.Logf("%d steps, %d preemptions, %d verify steps, acceptance %.3f; %d prefix hits, %d tokens reused",
		st.Steps, st.Preemptions, st.VerifySteps, st.AcceptRate, st.PrefixHits, st.CachedTokens)
	if st.Preemptions == 0 || st.VerifySteps == 0 || st.PrefixHits == 0 {
		t.Errorf("stats %+v: want preemptions, speculation and prefix reuse", st)
	}
	if st.KVBlocksUsed != 0 || st.RecurrentBytes != 0 {
		t.Errorf("not returned: %d blocks, %d bytes of state", st.KVBlocksUsed, st.RecurrentBytes)
	}
	r.Close()
	checkGoroutines(t, base)
}

// Options.Draft needs an MTP module; Request.Draft is ignored without one.
func TestSpecOptions(t *testing.T) {
	m := build(t, tinyLlama)
	if _, err := runtime.New(m, runtime.Options{KVBudget: budget(m, 16), Draft: 2}); err == nil {
		t.Error("Draft on a model without MTP: no error")
	}
	if _, err := runtime.New(m, runtime.Options{KVBudget: budget(m, 16), Draft: -1}); err == nil {
		t.Error("negative Draft: no error")
	}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64)})
	req := runtime.Request{Prompt: []int32{4, 5, 6}, MaxTokens: 5, Sampling: greedy, Draft: 3}
	got := generate(t, r, t.Context(), req).Collect()
	want, _ := reference(t, m, req)
	if got.Err != nil || !slices.Equal(got.Tokens, want) || got.Usage.VerifySteps != 0 {
		t.Errorf("Request.Draft on a model without MTP: %v %v %+v, want %v", got.Tokens, got.Err, got.Usage, want)
	}
}

// oracle wraps a fixture model: its MTP module runs as usual (filling its
// cache), but the logits of each draft are replaced by a one-hot vote for
// the target's own greedy choice, worked out by a second instance of the
// model over the whole history, and deliberately wrong for about one
// history in wrongEvery. With real checkpoints (whose random-weight MTP
// modules almost never agree with the target) this exercises accepted
// drafts: partial acceptance, cache truncation past accepted tokens, and
// hybrid models' state rollback with recomputation.
type oracle struct {
	model.MTPModel
	ref        model.Model // a second instance of the model
	wrongEvery uint64

	mu   sync.Mutex
	hist map[*kvcache.Seq][]int32 // each sequence's tokens by position, as the passes have seen them
}

// Unwrap returns the wrapped model (model.NewCache and model.NewStatePool
// find its device).
func (o *oracle) Unwrap() model.Model { return o.MTPModel }

// oracleHybrid is an oracle over a model with recurrent state.
type oracleHybrid struct{ *oracle }

func (o oracleHybrid) StateLayout() []linattn.LayerShape {
	return o.MTPModel.(model.StateModel).StateLayout()
}

func newOracle(t *testing.T, name string, wrongEvery uint64) model.Model {
	m, ok := loadFixture(t, name).(model.MTPModel)
	if !ok {
		t.Fatalf("%s has no MTP module", name)
	}
	o := &oracle{MTPModel: m, ref: loadFixture(t, name), wrongEvery: wrongEvery, hist: map[*kvcache.Seq][]int32{}}
	if _, ok := m.(model.StateModel); ok {
		return oracleHybrid{o}
	}
	return o
}

// record notes that tokens sit at positions pos, pos+1, … of kv.
func (o *oracle) record(kv *kvcache.Seq, pos int, tokens []int32) {
	h := o.hist[kv]
	for len(h) < pos+len(tokens) {
		h = append(h, -1)
	}
	copy(h[pos:], tokens)
	o.hist[kv] = h
}

func (o *oracle) Forward(b *model.Batch) (*model.Output, error) {
	o.mu.Lock()
	for _, s := range b.Seqs {
		o.record(s.KV, s.Pos, s.Tokens)
	}
	o.mu.Unlock()
	return o.MTPModel.Forward(b)
}

func (o *oracle) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	b.Top = 0 // the oracle rewrites whole logit rows
	out, err := o.MTPModel.ForwardMTP(b, hidden)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	vocab := o.Info().Vocab
	for i, s := range b.Seqs {
		o.record(s.KV, s.Pos+1, s.Tokens) // row j holds the token at Pos+j+1
		if s.Logits != model.LastLogits {
			continue
		}
		hist := o.hist[s.KV][:s.Pos+len(s.Tokens)+1]
		if slices.Contains(hist, -1) {
			return nil, fmt.Errorf("oracle: history with a hole: %v", hist)
		}
		logits, err := lastLogits(o.ref, hist)
		if err != nil {
			return nil, err
		}
		best := fixtures.Argmax(logits)
		if splitmix(fakeHash(hist))%o.wrongEvery == 0 {
			best = (best + 1) % int32(vocab)
		}
		row := out.Seqs[i].Logits
		for v := range row {
			row[v] = 0
		}
		row[best] = 1
	}
	return out, nil
}

// lastLogits runs m over toks alone and returns the last position's logits.
func lastLogits(m model.Model, toks []int32) ([]float32, error) {
	info := m.Info()
	c, err := model.NewCache(m, kvcache.Options{BlockSize: blockSize, Budget: int64(len(toks)+blockSize) * info.KVBytesPerToken})
	if err != nil {
		return nil, err
	}
	kv := c.NewSeq()
	if err := c.Reserve(kv, len(toks)); err != nil {
		return nil, err
	}
	b := &model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, KV: kv, Logits: model.LastLogits}}}
	if sm, ok := m.(model.StateModel); ok {
		if b.States, err = model.NewStatePool(sm, info.StateBytesPerSeq); err != nil {
			return nil, err
		}
		if b.Seqs[0].State, err = b.States.Alloc(); err != nil {
			return nil, err
		}
	}
	out, err := m.Forward(b)
	if err != nil {
		return nil, err
	}
	return out.Seqs[0].Logits, nil
}

// With drafts that are mostly right, speculation on real checkpoints still
// emits plain greedy decoding's tokens: accepted drafts, partial acceptance,
// rollback of the cache and (hybrids) of the recurrent state.
func TestSpecOracleGreedy(t *testing.T) {
	for _, name := range []string{"qwen3_next", "glm5_next", "glm4_moe_lite"} {
		t.Run(name, func(t *testing.T) {
			if (raceOn || testing.Short()) && name != "qwen3_next" {
				t.Skip("the oracle recomputes every history: one model is enough under the race detector and in -short mode")
			}
			t.Parallel()
			m := newOracle(t, name, 4)
			n, prompt := 10, 20
			if raceOn {
				n, prompt = 6, 12
			}
			r := start(t, m, runtime.Options{KVBudget: budget(m, 14), MaxBatchTokens: 24, MaxSeqs: 5, Draft: 4, DraftMaxSeqs: -1})
			reqs := specReqs(rand.New(rand.NewPCG(71, 72)), n, prompt, 16, m.Info().Vocab)
			checkAgainstReference(t, m, r, reqs)
			st := waitIdle(t, r)
			if st.AcceptRate < 0.3 || st.AcceptedTokens == st.DraftTokens {
				t.Errorf("acceptance %.3f (%d of %d): want most drafts accepted, not all", st.AcceptRate, st.AcceptedTokens, st.DraftTokens)
			}
			t.Logf("%d steps, %d preemptions; %d verify steps, acceptance %.3f, %.2f accepted per step, by position %.2f",
				st.Steps, st.Preemptions, st.VerifySteps, st.AcceptRate, st.AcceptedPerStep, st.AcceptRateByPos)
		})
	}
}
