// Package bench measures generation throughput of a model under the
// continuous-batching runtime: a sweep over concurrency, prompt length,
// generation length and speculative decoding (MTP), with the weight bytes a
// decode step reads and the memory-bandwidth roofline they imply. `ferrite
// bench` is its command line.
//
// Each case starts its own runtime.Runtime on the model, primes it with an
// untimed one-token request (which also writes to every page of the new KV
// cache, so the timed requests do not pay first-touch page faults: a
// long-running server pays them once), then queues Concurrency requests at
// once (random prompt ids from a fixed seed, greedy, no stop ids, exactly
// GenLen tokens each) and reads their events until all end.
// Throughput figures are computed from per-request Usage and the times the
// requests were queued:
//
//   - decode tok/s (aggregate): the tokens all requests generate after the
//     last of them got its first token (from then on every step is pure
//     decode), divided by the time from then to the last token. Requests
//     queued at once may still start in different steps (the scheduler can
//     pick up the first before the rest arrive, and MaxBatchTokens bounds
//     a step's prompt tokens); this window leaves those prefills out. The
//     tail, where early requests have finished, runs smaller batches.
//   - prompt tok/s (aggregate): Σ prompt tokens divided by the time from
//     queueing the first request to the last request's first token.
//   - TTFT: per request, from Generate to its first sampled token.
//   - peak KV: the most cache bytes reserved at the start of any forward
//     pass of the case (whole blocks, so up to a block per sequence more
//     than the tokens held).
//
// The roofline: a decode step at batch 1 must stream every weight it uses
// from memory once, so bandwidth ÷ Footprint.DecodeBytes(1, 0) bounds
// decode steps per second. A case's achieved fraction is its decode steps/s
// ((decode tokens − accepted drafts) ÷ concurrency ÷ the decode span) times
// the weight bytes of one step over its batch (with MTP, plus the MTP
// module once per draft token) over the bandwidth. KV-cache reads and
// activations are not counted.
//
// MTP cases set runtime.Options.Draft (and DraftMaxSeqs); the acceptance is
// the share of verified draft tokens accepted, summed over the requests.
// A model without an MTP module gets a Skipped "mtp: not available" row.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/kernels"
)

// ErrMTPUnavailable is a case's Skipped reason when MTP is asked for but the
// model has no MTP module (model.MTPModel).
var ErrMTPUnavailable = errors.New("mtp: not available")

// ChatQuestions are in-domain chat questions for the built-in model, whose
// trained MTP layer makes acceptance meaningful (MODEL_CARD.md): the
// prompts of `ferrite bench --chat` and of the engine's MTP device test.
var ChatQuestions = []string{
	"What does serendipity mean?", "Who are you?", "Give me a synonym for small.",
	"Use meticulous in a sentence.", "Tell me a quote about patience.", "What can you help me with?",
}

// DefaultDraft is the draft length of MTP cases when Options.Draft is 0.
const DefaultDraft = 3

// Options configure a sweep.
type Options struct {
	Concurrency []int  // requests in flight at once; each ≥ 1
	PromptLens  []int  // prompt tokens per request; each ≥ 1
	GenLens     []int  // generated tokens per request; each ≥ 1 (1: the prompt only, no decode figures)
	MTP         []bool // speculative decoding off/on; empty means {false}
	Draft       int    // MTP draft tokens per step (runtime.Options.Draft); 0 means DefaultDraft
	// Drafts, when set, are several draft lengths: every MTP case runs
	// once with each (Draft is then unused).
	Drafts []int
	// DraftMaxSeqs is runtime.Options.DraftMaxSeqs: above this many
	// running sequences the runtime stops drafting; 0 means its default,
	// negative means no limit.
	DraftMaxSeqs int
	// DraftAlways drafts on every step however it pays
	// (runtime.Options.DraftIgnoreCost): the speed-up speculation gives at
	// its acceptance, rather than the runtime's cost-aware choice.
	DraftAlways bool
	Seed        uint64 // prompts and sampler seeds

	// Prompts, when not empty, replace the random prompts: request i of a
	// case sends Prompts[i mod len(Prompts)] (real text, for a model whose
	// MTP module was trained on it: random tokens are hardly ever
	// predictable). PromptLens then only labels the cases.
	Prompts [][]int32

	// KVBudget is the cache size in bytes; 0 sizes it so the largest case
	// fits without preemption (concurrency × (prompt + gen + a block)).
	KVBudget       int64
	MaxBatchTokens int // per-step token budget; 0 means the runtime's default

	// Warmup runs one request of the longest prompt on its own runtime
	// before the sweep (first-touch page faults of mapped weights and of
	// the activation buffers a prompt that long needs, worker start-up),
	// as llama-bench warms up with a run of the measured size. On a device
	// that replays steps as graphs (kernels.StepGrapher: a GPU) it then
	// runs, on that runtime, requests of the longest prompt that fill two
	// steps of the token budget (one token each, fillCase), so that the
	// backend's step scratch has grown to the largest step the sweep can
	// form before any case is timed, as llama.cpp reserves its compute
	// buffers for the largest batch when a context is made. The cases'
	// own one-time costs (GEMM plans, the first eager step of a shape and
	// its graph capture) stay in their windows; WarmupCase takes those out.
	Warmup bool
	// WarmupCase runs, before each case's timed requests and on its
	// runtime, untimed: first enough requests of the case's prompt to fill
	// two steps of the step token budget (one token each), so that a step
	// as large as any of the case's has run — a GPU backend's scratch
	// arena, sized by the largest step, then no longer grows and is
	// re-laid out (and its step graphs re-captured) inside the
	// measurement, which the prompts' arrival order otherwise decides —
	// and then the case's own requests for warmupCaseGen tokens: the
	// one-time costs of the case's batch shape (GEMM plans, the eager first
	// decode step and the graph capture of the second). The decode window
	// then holds the steady state, as a long-running server runs.
	WarmupCase bool
	// NoPrime skips each case's untimed one-token request, which also
	// writes to every page of the new runtime's KV cache so that the
	// timed requests do not pay the kernel's first-touch page faults
	// (a long-running server pays them once).
	NoPrime bool

	// Progress, when set, is called before each case starts, and Done
	// with each result as it comes.
	Progress func(c Case)
	Done     func(r Result)

	// Profiler, when set and profiling, is reset just before each case's
	// timed requests and its table written to the case's Profile after
	// them (the CUDA backend under FERRITE_CUDA_PROFILE=1).
	Profiler kernels.Profiler
}

// batchTokens is the runtimes' step token budget: Options.MaxBatchTokens,
// or the model's preferred budget (at least maxSeqs).
func (o *Options) batchTokens(m model.Model, maxSeqs int) int {
	if o.MaxBatchTokens > 0 {
		return o.MaxBatchTokens
	}
	return max(runtime.BatchTokens(m), maxSeqs)
}

// fillCase is the untimed requests that fill two steps of a token budget
// of budget tokens with c's prompts (one token each, at least c's
// concurrency of them): with them queued, the runtime forms the largest
// step c's runtime can.
func fillCase(c Case, budget int) Case {
	return Case{Concurrency: max(c.Concurrency, (2*budget+c.PromptLen-1)/c.PromptLen), PromptLen: c.PromptLen, GenLen: 1}
}

// warmupCaseGen is the tokens a request of WarmupCase generates: two
// decode steps, the second sighting of a step being what a GPU backend
// captures as a graph.
const warmupCaseGen = 3

// Case is one point of the sweep.
type Case struct {
	Concurrency int  `json:"concurrency"`
	PromptLen   int  `json:"prompt_len"`
	GenLen      int  `json:"gen_len"`
	MTP         bool `json:"mtp"`
	Draft       int  `json:"mtp_draft,omitempty"` // MTP on: the draft length asked for
}

func (c Case) String() string {
	mtp := "off"
	if c.MTP {
		mtp = fmt.Sprintf("on, draft %d", c.Draft)
	}
	return fmt.Sprintf("concurrency %d, prompt %d, gen %d, mtp %s", c.Concurrency, c.PromptLen, c.GenLen, mtp)
}

// Result is one case's measurements. Skipped is set (and the numbers are
// zero) for a case that could not run, such as MTP without a drafter.
type Result struct {
	Case
	Skipped string `json:"skipped,omitempty"`
	Profile string `json:"profile,omitempty"` // Options.Profiler's table for the case

	WallSec         float64 `json:"wall_s"`                       // first Generate to last final event
	DecodeTokPerSec float64 `json:"decode_tok_per_s"`             // aggregate, see the package doc
	DecodeWindowSec float64 `json:"decode_window_s"`              // the span it is measured over
	PerReqDecodeTPS float64 `json:"per_request_decode_tok_per_s"` // mean of the requests' own decode rates
	PromptTokPerSec float64 `json:"prompt_tok_per_s"`             // aggregate
	TTFTMeanMs      float64 `json:"ttft_mean_ms"`
	TTFTP50Ms       float64 `json:"ttft_p50_ms"`
	TTFTMaxMs       float64 `json:"ttft_max_ms"`
	GeneratedTokens int     `json:"generated_tokens"` // over all requests
	PromptTokens    int     `json:"prompt_tokens"`

	PeakKVBytes int64  `json:"peak_kv_bytes"`
	KVBudget    int64  `json:"kv_budget_bytes"`
	Preemptions uint64 `json:"preemptions"`
	Steps       uint64 `json:"steps"` // engine steps (forward passes), prefill included

	// MTP on only: the share of verified draft tokens that were accepted
	// (nil when no draft was verified, e.g. above DraftMaxSeqs), and the
	// counts behind it.
	MTPAcceptance  *float64 `json:"mtp_acceptance,omitempty"`
	DraftTokens    int      `json:"mtp_draft_tokens,omitempty"`
	AcceptedTokens int      `json:"mtp_accepted_tokens,omitempty"`
	// OneStepDrafts counts the steps that ran their drafts and verification
	// as one device step (runtime.Options.OneStepDrafts).
	OneStepDrafts uint64 `json:"mtp_one_step_steps,omitempty"`

	// Roofline (filled by Roofline.Apply): decode steps per second, the
	// weight bytes one step over this batch reads, the weight bytes per
	// second that implies and its fraction of the measured bandwidth.
	DecodeStepsPerSec  float64 `json:"decode_steps_per_s"`
	WeightBytesPerStep int64   `json:"weight_bytes_per_step,omitempty"`
	WeightBytesPerSec  float64 `json:"weight_bytes_per_s,omitempty"`
	RooflineFraction   float64 `json:"roofline_fraction,omitempty"`

	// Step graphs over the case, on a device that replays repeated steps
	// (kernels.StepGrapher: CUDA graphs; zero elsewhere): device steps
	// (forward passes, MTP passes included) replayed as one graph, graphs
	// captured (each also replayed), steps launched eagerly.
	GraphReplays  int `json:"graph_replays,omitempty"`
	GraphCaptures int `json:"graph_captures,omitempty"`
	GraphEager    int `json:"graph_eager_steps,omitempty"`
}

// Cases expands the options into the sweep, in the order they run:
// concurrency outermost, then prompt length, generation length, MTP (on:
// each draft length).
func (o *Options) Cases() []Case {
	mtp := o.MTP
	if len(mtp) == 0 {
		mtp = []bool{false}
	}
	var cs []Case
	for _, c := range o.Concurrency {
		for _, p := range o.PromptLens {
			for _, g := range o.GenLens {
				for _, m := range mtp {
					if !m {
						cs = append(cs, Case{Concurrency: c, PromptLen: p, GenLen: g})
						continue
					}
					for _, d := range o.drafts() {
						cs = append(cs, Case{Concurrency: c, PromptLen: p, GenLen: g, MTP: true, Draft: d})
					}
				}
			}
		}
	}
	return cs
}

// Validate checks the options against the model.
func (o *Options) Validate(info model.Info) error {
	check := func(what string, v []int, least int) error {
		if len(v) == 0 {
			return fmt.Errorf("bench: no %s given", what)
		}
		for _, x := range v {
			if x < least {
				return fmt.Errorf("bench: %s %d: must be at least %d", what, x, least)
			}
		}
		return nil
	}
	if err := errors.Join(
		check("concurrency", o.Concurrency, 1),
		check("prompt length", o.PromptLens, 1),
		check("generation length", o.GenLens, 1),
		check("draft length", o.drafts(), 1),
	); err != nil {
		return err
	}
	if o.KVBudget < 0 || o.MaxBatchTokens < 0 {
		return fmt.Errorf("bench: negative KV budget (%d) or max batch tokens (%d)", o.KVBudget, o.MaxBatchTokens)
	}
	for _, p := range o.Prompts {
		if len(p) == 0 {
			return fmt.Errorf("bench: an empty prompt")
		}
		for _, t := range p {
			if t < 0 || int(t) >= info.Vocab {
				return fmt.Errorf("bench: prompt token %d outside the vocabulary", t)
			}
		}
	}
	longest := o.longestPrompt() + slices.Max(o.GenLens)
	if info.MaxContext > 0 && longest > info.MaxContext {
		return fmt.Errorf("bench: prompt + gen = %d tokens exceeds the model's context %d", longest, info.MaxContext)
	}
	return nil
}

// longestPrompt is the most prompt tokens a request of the sweep sends.
func (o *Options) longestPrompt() int {
	n := slices.Max(o.PromptLens)
	for _, p := range o.Prompts {
		n = max(n, len(p))
	}
	return n
}

// kvBudget is the cache size for a sweep: the given budget, or enough for
// the largest case to run without preemption.
func (o *Options) kvBudget(info model.Info) int64 {
	if o.KVBudget > 0 {
		return o.KVBudget
	}
	const block = 16 // kvcache.DefaultBlockSize, plus per-sequence slack
	tokens := slices.Max(o.Concurrency) * (o.longestPrompt() + slices.Max(o.GenLens) + 2*block)
	return max(int64(tokens)*info.KVBytesPerToken, 1<<20)
}

// Run runs every case on m in turn and returns their results. The model
// must not be in use elsewhere: each case starts (and closes) a runtime
// that owns it. A case that fails to run ends the sweep with an error
// (results so far are returned); an unavailable option is reported in the
// case's Skipped field instead.
func Run(ctx context.Context, m model.Model, o Options) ([]Result, error) {
	info := m.Info()
	if err := o.Validate(info); err != nil {
		return nil, err
	}
	budget := o.kvBudget(info)
	wm, pm := watch(m)
	maxSeqs := slices.Max(o.Concurrency)
	var dev any // the model's device, for its step-graph counts
	if dm := model.AsDevice(m); dm != nil {
		dev = dm.Device()
	}
	newRuntime := func(c Case) (*runtime.Runtime, error) {
		// Conversation reuse off: the prompts are random, and cached
		// prefixes would only hold cache blocks (and show in peak KV).
		ro := runtime.Options{KVBudget: budget, MaxBatchTokens: o.batchTokens(m, maxSeqs), MaxSeqs: maxSeqs, PrefixCache: -1}
		if c.MTP {
			if _, ok := m.(model.MTPModel); !ok {
				return nil, fmt.Errorf("%w (%s has no MTP module)", ErrMTPUnavailable, info.Arch)
			}
			ro.Draft, ro.DraftMaxSeqs, ro.DraftIgnoreCost = c.Draft, o.DraftMaxSeqs, o.DraftAlways
		}
		return runtime.New(wm, ro)
	}
	if o.Warmup {
		rt, err := newRuntime(Case{})
		if err != nil {
			return nil, err
		}
		w := Case{Concurrency: 1, PromptLen: slices.Max(o.PromptLens), GenLen: 2}
		_, err = runCase(ctx, rt, pm, w, info.Vocab, o.Seed, o.Prompts)
		if _, graphs := kernels.StepGraphStats(dev); err == nil && graphs {
			w.Concurrency = maxSeqs
			_, err = runCase(ctx, rt, pm, fillCase(w, o.batchTokens(m, maxSeqs)), info.Vocab, o.Seed, o.Prompts)
		}
		rt.Close()
		if err != nil {
			return nil, fmt.Errorf("bench: warm-up: %w", err)
		}
	}
	var out []Result
	for _, c := range o.Cases() {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if o.Progress != nil {
			o.Progress(c)
		}
		rt, err := newRuntime(c)
		if errors.Is(err, ErrMTPUnavailable) {
			out = append(out, Result{Case: c, Skipped: err.Error()})
			continue
		}
		if err != nil {
			return out, fmt.Errorf("bench: %v: %w", c, err)
		}
		if !o.NoPrime {
			pm.prefault.Store(true)
			var s *runtime.Stream
			if s, err = rt.Generate(ctx, runtime.Request{Prompt: []int32{0}, MaxTokens: 1}); err == nil {
				err = s.Collect().Err
			}
			pm.prefault.Store(false)
			if err != nil {
				rt.Close()
				return out, fmt.Errorf("bench: %v: priming: %w", c, err)
			}
		}
		if o.WarmupCase {
			for _, w := range []Case{fillCase(c, o.batchTokens(m, maxSeqs)), {Concurrency: c.Concurrency, PromptLen: c.PromptLen, GenLen: min(c.GenLen, warmupCaseGen), MTP: c.MTP}} {
				if _, err := runCase(ctx, rt, pm, w, info.Vocab, o.Seed, o.Prompts); err != nil {
					rt.Close()
					return out, fmt.Errorf("bench: %v: warm-up: %w", c, err)
				}
			}
		}
		g0, _ := kernels.StepGraphStats(dev)
		prof := o.Profiler != nil && o.Profiler.Profiling()
		if prof {
			o.Profiler.ResetProfile()
		}
		r, err := runCase(ctx, rt, pm, c, info.Vocab, o.Seed, o.Prompts)
		if err == nil && prof {
			var sb strings.Builder
			err = o.Profiler.WriteProfile(&sb)
			r.Profile = sb.String()
		}
		rt.Close()
		if err != nil {
			return out, fmt.Errorf("bench: %v: %w", c, err)
		}
		if g, ok := kernels.StepGraphStats(dev); ok {
			g = g.Sub(g0)
			r.GraphReplays, r.GraphCaptures, r.GraphEager = g.Replays, g.Captures, g.Eager
		}
		if o.Done != nil {
			o.Done(r)
		}
		out = append(out, r)
	}
	return out, nil
}

// drafts are the draft lengths of the MTP cases.
func (o *Options) drafts() []int {
	switch {
	case len(o.Drafts) > 0:
		return o.Drafts
	case o.Draft > 0:
		return []int{o.Draft}
	}
	return []int{DefaultDraft}
}

// reqTiming is what one request's consumer records.
type reqTiming struct {
	queued time.Time // just before Generate
	u      runtime.Usage
	finish runtime.FinishReason
	err    error
	points []progress // from every event, in order
}

// progress is a request's counts as of one event (Usage is stamped when
// the scheduler posts it: queued + Usage.Total).
type progress struct {
	at            time.Time
	gen, accepted int
}

// runCase runs one case on rt and measures it.
func runCase(ctx context.Context, rt *runtime.Runtime, pm *peakModel, c Case, vocab int, seed uint64, prompts [][]int32) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reqs := make([]runtime.Request, c.Concurrency)
	for i := range reqs {
		var p []int32
		if len(prompts) > 0 {
			p = prompts[i%len(prompts)]
		} else {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			p = make([]int32, c.PromptLen)
			for j := range p {
				p[j] = int32(rng.IntN(vocab))
			}
		}
		reqs[i] = runtime.Request{
			Prompt:    p,
			MaxTokens: c.GenLen,
			Sampling:  sample.Params{Seed: seed + uint64(i) + 1}, // Temperature 0: greedy
			// No Stop ids: EOS is ignored, every request runs to MaxTokens.
		}
	}
	before := rt.Stats()
	times := make([]reqTiming, len(reqs))
	pm.peak.Store(0)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range reqs {
		t := &times[i]
		t.queued = time.Now()
		s, err := rt.Generate(ctx, reqs[i])
		if err != nil {
			cancel()
			wg.Wait()
			return Result{}, err
		}
		wg.Go(func() {
			for {
				ev, ok := s.Next()
				if !ok {
					return
				}
				t.points = append(t.points, progress{t.queued.Add(ev.Usage.Total), ev.Usage.GeneratedTokens, ev.Usage.AcceptedTokens})
				switch ev.Type {
				case runtime.EventDone:
					t.u, t.finish = ev.Usage, ev.Finish
				case runtime.EventError:
					t.u, t.err = ev.Usage, ev.Err
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	// The final events are posted inside the last step; its Stats snapshot
	// is published just after.
	after := rt.Stats()
	for wait := 0; (after.Running > 0 || after.Waiting > 0) && wait < 1000; wait++ {
		time.Sleep(time.Millisecond)
		after = rt.Stats()
	}

	r := Result{Case: c, KVBudget: after.KVBudget, PeakKVBytes: pm.peak.Load(),
		Preemptions: after.Preemptions - before.Preemptions, Steps: after.Steps - before.Steps,
		OneStepDrafts: after.Passes.OneStep - before.Passes.OneStep}
	var (
		firstTok, lastTok, lastFirst time.Time
		decodeToks                   int
		ttft                         []float64
		perReq                       float64
	)
	for i, t := range times {
		switch {
		case t.err != nil:
			return Result{}, fmt.Errorf("request %d: %w", i, t.err)
		case t.finish != runtime.FinishLength || t.u.GeneratedTokens != c.GenLen:
			return Result{}, fmt.Errorf("request %d ended (%s) after %d tokens, want %d", i, t.finish, t.u.GeneratedTokens, c.GenLen)
		}
		ft := t.queued.Add(t.u.TimeToFirstToken)
		lt := t.queued.Add(t.u.Total)
		if i == 0 || ft.Before(firstTok) {
			firstTok = ft
		}
		if lt.After(lastTok) {
			lastTok = lt
		}
		if ft.After(lastFirst) {
			lastFirst = ft
		}
		decodeToks += t.u.GeneratedTokens - 1
		r.DraftTokens += t.u.DraftTokens
		r.AcceptedTokens += t.u.AcceptedTokens
		r.GeneratedTokens += t.u.GeneratedTokens
		r.PromptTokens += t.u.PromptTokens
		ttft = append(ttft, float64(t.u.TimeToFirstToken)/float64(time.Millisecond))
		perReq += t.u.DecodeTokensPerSec
	}
	r.WallSec = lastTok.Sub(start).Seconds()
	// Decode throughput over the window in which every request is past its
	// prompt: from the last first token to the last token. Each request's
	// count at the window's start is its last progress at or before it
	// (at least its first token).
	winToks, winAcc := 0, 0
	for _, t := range times {
		base := progress{gen: 1}
		for _, p := range t.points {
			if !p.at.After(lastFirst) && p.gen > base.gen {
				base = p
			}
		}
		winToks += t.u.GeneratedTokens - base.gen
		winAcc += t.u.AcceptedTokens - base.accepted
	}
	from, toks, acc := lastFirst, winToks, winAcc
	if lastTok.Sub(lastFirst) <= 0 || winToks == 0 {
		from, toks, acc = firstTok, decodeToks, r.AcceptedTokens // every request finished at its first token's step
	}
	if d := lastTok.Sub(from).Seconds(); d > 0 && c.GenLen > 1 {
		r.DecodeWindowSec = d
		r.DecodeTokPerSec = float64(toks) / d
		// A step emits one token per sequence plus its accepted drafts.
		r.DecodeStepsPerSec = float64(toks-acc) / d / float64(c.Concurrency)
	}
	if r.DraftTokens > 0 {
		a := float64(r.AcceptedTokens) / float64(r.DraftTokens)
		r.MTPAcceptance = &a
	}
	if d := lastFirst.Sub(start).Seconds(); d > 0 {
		r.PromptTokPerSec = float64(r.PromptTokens) / d
	}
	r.PerReqDecodeTPS = perReq / float64(len(times))
	r.TTFTMeanMs, r.TTFTP50Ms, r.TTFTMaxMs = meanP50Max(ttft)
	return r, nil
}

// meanP50Max summarises v (the median of an even count is the mean of the
// middle two).
func meanP50Max(v []float64) (mean, p50, mx float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	for _, x := range s {
		mean += x
	}
	mean /= float64(len(s))
	n := len(s)
	p50 = s[n/2]
	if n%2 == 0 {
		p50 = (s[n/2-1] + s[n/2]) / 2
	}
	return mean, p50, s[n-1]
}

// Roofline is the memory-bandwidth bound on decode.
type Roofline struct {
	Bandwidth        Bandwidth
	WeightBytesStep1 int64   // Footprint.DecodeBytes(1, 0)
	MaxStepsPerSec   float64 // bandwidth ÷ WeightBytesStep1
}

// NewRoofline combines a bandwidth measurement with a model's footprint.
func NewRoofline(bw Bandwidth, f Footprint) Roofline {
	r := Roofline{Bandwidth: bw, WeightBytesStep1: f.DecodeBytes(1, 0)}
	if r.WeightBytesStep1 > 0 {
		r.MaxStepsPerSec = bw.BytesPerSec / float64(r.WeightBytesStep1)
	}
	return r
}

// Apply fills the roofline fields of r.
func (rl Roofline) Apply(r *Result, f Footprint) {
	if r.Skipped != "" {
		return
	}
	mtpPasses := 0
	if r.MTP && r.DraftTokens > 0 {
		mtpPasses = r.Draft
	}
	r.WeightBytesPerStep = f.DecodeBytes(r.Concurrency, mtpPasses)
	r.WeightBytesPerSec = r.DecodeStepsPerSec * float64(r.WeightBytesPerStep)
	if rl.Bandwidth.BytesPerSec > 0 {
		r.RooflineFraction = r.WeightBytesPerSec / rl.Bandwidth.BytesPerSec
	}
}

// peakModel passes Forward on to a model, first noting the cache bytes in
// use: every block of the step is reserved by then, so the maximum over
// all calls is the case's peak KV use (a Stats snapshot, taken after
// finished requests have freed their blocks, can miss it).
type peakModel struct {
	model.Model
	peak atomic.Int64
	// prefault: the next Forward first writes a zero into every page of
	// its cache. Set only around a fresh runtime's first (priming)
	// request, whose own K/V that Forward has not written yet.
	prefault atomic.Bool
}

// Unwrap returns the wrapped model (model.NewCache finds its device).
func (p *peakModel) Unwrap() model.Model { return p.Model }

func (p *peakModel) Forward(b *model.Batch) (*model.Output, error) {
	p.note(b)
	return p.Model.Forward(b)
}

// note prefaults b's cache when asked and records its bytes in use.
func (p *peakModel) note(b *model.Batch) {
	if b.Cache != nil && p.prefault.CompareAndSwap(true, false) {
		b.Cache.Prefault()
	}
	if b.Cache != nil {
		used := b.Cache.Stats().BytesUsed
		for {
			old := p.peak.Load()
			if used <= old || p.peak.CompareAndSwap(old, used) {
				break
			}
		}
	}
}

// The optional model interfaces, with methods of their own, so that
// embedding them next to *peakModel promotes nothing ambiguous.
type (
	mtpForwarder interface {
		ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error)
	}
	stateLayouter interface {
		StateLayout() []linattn.LayerShape
	}
	specForwarder interface {
		SpecReady() bool
		ForwardSpec(s *model.SpecStep) ([]*model.Output, *model.Output, error)
	}
)

// peakSpec is a model.SpecModel's ForwardSpec behind a peakModel: the
// verification's cache use is noted as Forward's is.
type peakSpec struct {
	p  *peakModel
	sm specForwarder
}

func (s peakSpec) SpecReady() bool { return s.sm.SpecReady() }

func (s peakSpec) ForwardSpec(st *model.SpecStep) ([]*model.Output, *model.Output, error) {
	if st.Verify != nil {
		s.p.note(st.Verify)
	}
	return s.sm.ForwardSpec(st)
}

// watch wraps m in a peakModel that keeps m's optional interfaces
// (model.MTPModel, model.SpecModel, model.StateModel), which the runtime
// may look for.
func watch(m model.Model) (model.Model, *peakModel) {
	p := &peakModel{Model: m}
	mtp, isMTP := m.(mtpForwarder)
	st, isState := m.(stateLayouter)
	sm, isSpec := m.(specForwarder)
	switch {
	case isMTP && isSpec && isState:
		return struct {
			*peakModel
			mtpForwarder
			specForwarder
			stateLayouter
		}{p, mtp, peakSpec{p, sm}, st}, p
	case isMTP && isSpec:
		return struct {
			*peakModel
			mtpForwarder
			specForwarder
		}{p, mtp, peakSpec{p, sm}}, p
	case isMTP && isState:
		return struct {
			*peakModel
			mtpForwarder
			stateLayouter
		}{p, mtp, st}, p
	case isMTP:
		return struct {
			*peakModel
			mtpForwarder
		}{p, mtp}, p
	case isState:
		return struct {
			*peakModel
			stateLayouter
		}{p, st}, p
	}
	return p, p
}
