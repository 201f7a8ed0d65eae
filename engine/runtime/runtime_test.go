package runtime_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/kernels"
)

// mixedRequests returns n requests with prompt lengths spread over
// [1, maxPrompt] and MaxTokens in [4, 15]; odd ones sample with a seed.
func mixedRequests(rng *rand.Rand, n, maxPrompt, vocab int) []runtime.Request {
	reqs := make([]runtime.Request, n)
	for i := range reqs {
		reqs[i] = runtime.Request{
			Prompt:    randPrompt(rng, 1+rng.IntN(maxPrompt), vocab),
			MaxTokens: 4 + rng.IntN(12),
			Sampling:  greedy,
		}
		if i%2 == 1 {
			reqs[i].Sampling = sample.Params{Temperature: 0.9, TopP: 0.95, Seed: uint64(100 + i)}
		}
	}
	return reqs
}

// checkAgainstReference runs reqs concurrently on r and compares each
// output with the request run alone.
func checkAgainstReference(t *testing.T, m model.Model, r *runtime.Runtime, reqs []runtime.Request) []runtime.Result {
	t.Helper()
	want := make([][]int32, len(reqs))
	wantFinish := make([]runtime.FinishReason, len(reqs))
	for i, req := range reqs {
		want[i], wantFinish[i] = reference(t, m, req)
	}
	streams := make([]*runtime.Stream, len(reqs))
	for i, req := range reqs {
		streams[i] = generate(t, r, t.Context(), req)
	}
	res := collectAll(streams)
	for i, got := range res {
		if got.Err != nil {
			t.Errorf("request %d (prompt %d): %v", i, len(reqs[i].Prompt), got.Err)
			continue
		}
		if !slices.Equal(got.Tokens, want[i]) || got.Finish != wantFinish[i] {
			t.Errorf("request %d (prompt %d, %+v):\n got %v %s\nwant %v %s", i, len(reqs[i].Prompt), reqs[i].Sampling, got.Tokens, got.Finish, want[i], wantFinish[i])
		}
		u := got.Usage
		if u.PromptTokens != len(reqs[i].Prompt) || u.GeneratedTokens != len(got.Tokens) {
			t.Errorf("request %d: usage %+v, want %d prompt and %d generated tokens", i, u, len(reqs[i].Prompt), len(got.Tokens))
		}
		if len(got.Tokens) > 0 && (u.TimeToFirstToken <= 0 || u.Total < u.TimeToFirstToken || u.PromptTokensPerSec <= 0) {
			t.Errorf("request %d: timing %+v", i, u)
		}
	}
	return res
}

func TestBatchedEqualsAlone(t *testing.T) {
	for _, tc := range []struct{ name, cfg string }{{"llama", tinyLlama}, {"qwen3", tinyQwen3}} {
		t.Run(tc.name, func(t *testing.T) {
			hm := &hookModel{Model: build(t, tc.cfg)}
			r := start(t, hm, runtime.Options{KVBudget: budget(hm, 256), MaxBatchTokens: 16, MaxSeqs: 6})
			reqs := mixedRequests(rand.New(rand.NewPCG(1, 2)), 14, 40, hm.Info().Vocab)
			checkAgainstReference(t, hm, r, reqs)
			maxSeqs, maxTokens, chunked, _ := hm.seen()
			if maxSeqs < 2 || maxTokens > 16 || chunked == 0 {
				t.Errorf("batches: at most %d sequences and %d tokens, %d partial chunks; want batching, ≤ 16 tokens, chunked prefill", maxSeqs, maxTokens, chunked)
			}
			st := waitIdle(t, r)
			if st.Preemptions != 0 {
				t.Errorf("%d preemptions with a large cache", st.Preemptions)
			}
		})
	}
}

// Copies of one seeded request, batched with each other and with others
// and preempted, all draw the same tokens as the request alone.
func TestSeededSampling(t *testing.T) {
	m := build(t, tinyQwen3)
	r := start(t, m, runtime.Options{KVBudget: budget(m, 20), MaxBatchTokens: 12, MaxSeqs: 8})
	rng := rand.New(rand.NewPCG(25, 26))
	seeded := runtime.Request{
		Prompt:    randPrompt(rng, 9, m.Info().Vocab),
		MaxTokens: 16,
		Sampling:  sample.Params{Temperature: 1.2, TopK: 20, MinP: 0.02, RepeatPenalty: 1.1, Seed: 42},
	}
	reqs := mixedRequests(rng, 10, 20, m.Info().Vocab)
	for i := 0; i < len(reqs); i += 2 {
		reqs[i] = seeded
	}
	res := checkAgainstReference(t, m, r, reqs)
	for i := 0; i < len(res); i += 2 {
		if res[i].Usage.Seed != 42 {
			t.Errorf("request %d: Usage.Seed %d, want 42", i, res[i].Usage.Seed)
		}
	}
	if st := waitIdle(t, r); st.Preemptions == 0 {
		t.Error("no preemption: the test does not exercise it")
	}
}

func TestPreemptionKeepsOutput(t *testing.T) {
	hm := &hookModel{Model: build(t, tinyLlama)}
	// 16 blocks of 4 tokens: 8 sequences of up to ~35 tokens cannot all fit.
	r := start(t, hm, runtime.Options{KVBudget: budget(hm, 16), MaxBatchTokens: 24, MaxSeqs: 8})
	reqs := mixedRequests(rand.New(rand.NewPCG(3, 4)), 16, 24, hm.Info().Vocab)
	for i := range reqs {
		reqs[i].MaxTokens = 12
	}
	res := checkAgainstReference(t, hm, r, reqs)
	st := waitIdle(t, r)
	preempted := 0
	for _, g := range res {
		preempted += g.Usage.Preemptions
	}
	if st.Preemptions == 0 || preempted == 0 {
		t.Errorf("no preemption (stats %d, usage %d): the test does not exercise it", st.Preemptions, preempted)
	}
	t.Logf("%d preemptions, %d steps", st.Preemptions, st.Steps)
}

func TestStopAndLength(t *testing.T) {
	m := build(t, tinyLlama)
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64)})
	rng := rand.New(rand.NewPCG(5, 6))
	prompt := randPrompt(rng, 10, m.Info().Vocab)

	// Stop at the first occurrence of the reference's 4th token.
	full, _ := reference(t, m, runtime.Request{Prompt: prompt, MaxTokens: 8, Sampling: greedy})
	stopAt := slices.Index(full, full[3])
	got := generate(t, r, t.Context(), runtime.Request{Prompt: prompt, MaxTokens: 8, Sampling: greedy, Stop: []int32{full[3]}}).Collect()
	if got.Err != nil || got.Finish != runtime.FinishStop || !slices.Equal(got.Tokens, full[:stopAt]) {
		t.Errorf("stop: got %v %s %v, want %v stop", got.Tokens, got.Finish, got.Err, full[:stopAt])
	}

	// No MaxTokens: generation runs to the model's context of 96 tokens;
	// the last sampled token is emitted without being computed.
	long := randPrompt(rng, 90, m.Info().Vocab)
	got = generate(t, r, t.Context(), runtime.Request{Prompt: long, Sampling: greedy}).Collect()
	if want := 96 - 90 + 1; got.Err != nil || got.Finish != runtime.FinishLength || got.Limit != runtime.LimitContext || len(got.Tokens) != want {
		t.Errorf("context limit: %d tokens, %s (%s), %v; want %d, length (context)", len(got.Tokens), got.Finish, got.Limit, got.Err, want)
	}
	got = generate(t, r, t.Context(), runtime.Request{Prompt: prompt, MaxTokens: 3, Sampling: greedy}).Collect()
	if got.Finish != runtime.FinishLength || got.Limit != runtime.LimitMaxTokens || len(got.Tokens) != 3 {
		t.Errorf("max tokens: %d tokens, %s (%s); want 3, length (max_tokens)", len(got.Tokens), got.Finish, got.Limit)
	}
	if r.SeqLimit() != runtime.LimitContext {
		t.Errorf("SeqLimit %s with a cache larger than the context", r.SeqLimit())
	}

	// A prompt of exactly the context still gets one token.
	got = generate(t, r, t.Context(), runtime.Request{Prompt: randPrompt(rng, 96, m.Info().Vocab), Sampling: greedy}).Collect()
	if got.Err != nil || got.Finish != runtime.FinishLength || len(got.Tokens) != 1 {
		t.Errorf("full-context prompt: %d tokens, %s, %v; want 1, length", len(got.Tokens), got.Finish, got.Err)
	}
	waitIdle(t, r)
}

func TestImpossibleRequests(t *testing.T) {
	m := build(t, tinyLlama)
	vocab := m.Info().Vocab
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64)}) // 256 tokens of cache, context 96
	small := start(t, m, runtime.Options{KVBudget: budget(m, 5)})
	if got := small.MaxSeqLen(); got != 20 {
		t.Fatalf("MaxSeqLen %d, want 20", got)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		name string
		r    *runtime.Runtime
		req  runtime.Request
		want error
	}{
		{"over context", r, runtime.Request{Prompt: randPrompt(rng, 97, vocab)}, runtime.ErrPromptTooLong},
		{"over cache", small, runtime.Request{Prompt: randPrompt(rng, 21, vocab)}, runtime.ErrPromptTooLong},
		{"empty", r, runtime.Request{}, nil},
		{"token out of vocab", r, runtime.Request{Prompt: []int32{1, int32(vocab)}}, nil},
		{"negative token", r, runtime.Request{Prompt: []int32{-1}}, nil},
		{"negative max tokens", r, runtime.Request{Prompt: []int32{1}, MaxTokens: -1}, nil},
	} {
		s, err := tc.r.Generate(t.Context(), tc.req)
		if err == nil || s != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: stream %v, error %v; want an immediate error (%v)", tc.name, s, err, tc.want)
		}
	}
	// The small cache still serves a prompt that fits exactly.
	got := generate(t, small, t.Context(), runtime.Request{Prompt: randPrompt(rng, 20, vocab), Sampling: greedy}).Collect()
	if got.Err != nil || len(got.Tokens) != 1 || got.Finish != runtime.FinishLength || got.Limit != runtime.LimitKVCache {
		t.Errorf("prompt filling the cache: %v %s (%s) %v; want the KV cache named", got.Tokens, got.Finish, got.Limit, got.Err)
	}
	if small.SeqLimit() != runtime.LimitKVCache {
		t.Errorf("SeqLimit %s with a cache smaller than the context", small.SeqLimit())
	}
	waitIdle(t, small)
}

// slowModel sleeps before every forward pass so a test can act mid-request.
func slowModel(m model.Model, d time.Duration) *hookModel {
	return &hookModel{Model: m, before: func(*model.Batch) error { time.Sleep(d); return nil }}
}

func TestCancel(t *testing.T) {
	m := slowModel(build(t, tinyLlama), time.Millisecond)
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), MaxSeqs: 1})
	vocab := m.Info().Vocab
	rng := rand.New(rand.NewPCG(9, 10))

	// Mid-generation, through the context.
	ctx, cancel := context.WithCancel(t.Context())
	running := generate(t, r, ctx, runtime.Request{Prompt: randPrompt(rng, 30, vocab), Sampling: greedy})
	// MaxSeqs 1: this one waits behind the first.
	queued := generate(t, r, t.Context(), runtime.Request{Prompt: randPrompt(rng, 5, vocab), Sampling: greedy})
	var n int
	for n < 3 {
		ev, ok := running.Next()
		if !ok || ev.Type != runtime.EventDelta {
			t.Fatalf("event %+v before cancellation", ev)
		}
		n += len(ev.Tokens)
	}
	if st := r.Stats(); st.KVBlocksUsed == 0 || st.Running != 1 || st.Waiting != 1 {
		t.Errorf("while running: %+v", st)
	}
	queued.Cancel()
	cancel()
	for _, s := range []*runtime.Stream{running, queued} {
		got := s.Collect()
		if got.Err != nil || got.Finish != runtime.FinishCancelled {
			t.Errorf("stream %d: %s %v, want cancelled", s.ID(), got.Finish, got.Err)
		}
	}
	waitIdle(t, r)

	// Already cancelled when submitted.
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	got := generate(t, r, ctx, runtime.Request{Prompt: randPrompt(rng, 5, vocab)}).Collect()
	if got.Finish != runtime.FinishCancelled || len(got.Tokens) != 0 {
		t.Errorf("pre-cancelled: %v %s %v", got.Tokens, got.Finish, got.Err)
	}
	waitIdle(t, r)
}

// poison tokens at position 0 make the hooked model misbehave.
const (
	panicToken = 0 // the model panics
	errorToken = 1 // the model returns an error
)

func poisonModel(m model.Model) *hookModel {
	return &hookModel{Model: m, before: func(b *model.Batch) error {
		for _, s := range b.Seqs {
			if s.Pos == 0 && s.Tokens[0] == panicToken {
				panic("poisoned prompt")
			}
			if s.Pos == 0 && s.Tokens[0] == errorToken {
				return errors.New("refused prompt")
			}
		}
		return nil
	}}
}

func TestPanicBecomesError(t *testing.T) {
	hm := poisonModel(build(t, tinyLlama))
	r := start(t, hm, runtime.Options{KVBudget: budget(hm, 64), MaxBatchTokens: 16, MaxSeqs: 4})
	vocab := hm.Info().Vocab
	rng := rand.New(rand.NewPCG(11, 12))

	var streams []*runtime.Stream
	for i := range 8 {
		p := randPrompt(rng, 2+rng.IntN(10), vocab)
		p[0] = int32(2 + i) // innocent
		streams = append(streams, generate(t, r, t.Context(), runtime.Request{Prompt: p, MaxTokens: 6, Sampling: greedy}))
	}
	bad := generate(t, r, t.Context(), runtime.Request{Prompt: []int32{panicToken, 5, 6}, MaxTokens: 6, Sampling: greedy})
	var pe *runtime.PanicError
	if got := bad.Collect(); !errors.As(got.Err, &pe) || !strings.Contains(got.Err.Error(), "poisoned prompt") || len(pe.Stack) == 0 {
		t.Errorf("panicking request: %v, want a PanicError", got.Err)
	}
	refused := generate(t, r, t.Context(), runtime.Request{Prompt: []int32{errorToken, 5, 6}, MaxTokens: 6, Sampling: greedy})
	if got := refused.Collect(); got.Err == nil || !strings.Contains(got.Err.Error(), "refused prompt") {
		t.Errorf("refused request: %v, want the Forward error", got.Err)
	}
	// Requests sharing a failed step fail with it; the rest finish.
	for i, got := range collectAll(streams) {
		if got.Err != nil && !errors.As(got.Err, &pe) && !strings.Contains(got.Err.Error(), "refused prompt") {
			t.Errorf("innocent request %d: %v", i, got.Err)
		}
	}
	st := waitIdle(t, r)
	if st.Failed < 2 {
		t.Errorf("Stats.Failed %d, want ≥ 2", st.Failed)
	}
	// The runtime keeps serving, with unchanged outputs.
	reqs := mixedRequests(rand.New(rand.NewPCG(13, 14)), 6, 20, vocab)
	for i := range reqs {
		reqs[i].Prompt[0] = 2
	}
	checkAgainstReference(t, hm, r, reqs)
	waitIdle(t, r)
}

// panicDecoder panics on its first id.
type panicDecoder struct{}

func (panicDecoder) Add(int32) string { panic("decoder bug") }

// byteDecoder emits one byte of text per id, cycling through a string
// full of multi-byte characters, so characters split across ids.
type byteDecoder struct{ i int }

const byteText = "naïve café — ✓ 日本語 😀 "

func (d *byteDecoder) Add(int32) string {
	b := byteText[d.i%len(byteText)]
	d.i++
	return string([]byte{b})
}

func (d *byteDecoder) Flush() string { return "" }

func TestDecoderPanicIsolated(t *testing.T) {
	m := build(t, tinyLlama)
	var made atomic.Int32
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), NewDecoder: func() runtime.TextDecoder {
		if made.Add(1) == 2 {
			return panicDecoder{}
		}
		return &byteDecoder{}
	}})
	rng := rand.New(rand.NewPCG(15, 16))
	req := func() runtime.Request {
		return runtime.Request{Prompt: randPrompt(rng, 8, m.Info().Vocab), MaxTokens: 5, Sampling: greedy}
	}
	streams := []*runtime.Stream{generate(t, r, t.Context(), req()), generate(t, r, t.Context(), req()), generate(t, r, t.Context(), req())}
	res := collectAll(streams)
	var pe *runtime.PanicError
	if !errors.As(res[1].Err, &pe) {
		t.Errorf("request with the panicking decoder: %v, want a PanicError", res[1].Err)
	}
	for _, i := range []int{0, 2} {
		if res[i].Err != nil || len(res[i].Tokens) != 5 {
			t.Errorf("request %d: %d tokens, %v", i, len(res[i].Tokens), res[i].Err)
		}
	}
	waitIdle(t, r)
}

func TestTextIsValidUTF8(t *testing.T) {
	m := build(t, tinyLlama)
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), NewDecoder: func() runtime.TextDecoder { return &byteDecoder{} }})
	rng := rand.New(rand.NewPCG(17, 18))
	for _, n := range []int{1, 2, 3, 5, 9, 14, 27, 40} {
		s := generate(t, r, t.Context(), runtime.Request{Prompt: randPrompt(rng, 4, m.Info().Vocab), MaxTokens: n, Sampling: greedy})
		var text strings.Builder
		tokens := 0
		for {
			ev, ok := s.Next()
			if !ok {
				break
			}
			if !utf8.ValidString(ev.Text) {
				t.Errorf("MaxTokens %d: invalid UTF-8 delta %q", n, ev.Text)
			}
			text.WriteString(ev.Text)
			tokens += len(ev.Tokens)
		}
		raw := strings.Repeat(byteText, 3)[:tokens]
		if want := strings.ToValidUTF8(raw, "\uFFFD"); text.String() != want {
			t.Errorf("MaxTokens %d: text %q, want %q", n, text.String(), want)
		}
	}
}

func TestSlowConsumer(t *testing.T) {
	hm := poisonModel(build(t, tinyLlama))
	r := start(t, hm, runtime.Options{KVBudget: budget(hm, 64), NewDecoder: func() runtime.TextDecoder { return &byteDecoder{} }})
	rng := rand.New(rand.NewPCG(19, 20))
	req := runtime.Request{Prompt: randPrompt(rng, 6, hm.Info().Vocab), MaxTokens: 30, Sampling: greedy}
	want, _ := reference(t, hm, req)

	// Nobody reads until the request has finished. (The two run one after
	// the other: sharing a step with the poisoned one would fail ok too.)
	waitDone := func(s *runtime.Stream) {
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("request did not finish without a consumer")
		}
	}
	ok := generate(t, r, t.Context(), req)
	waitDone(ok)
	bad := generate(t, r, t.Context(), runtime.Request{Prompt: []int32{panicToken, 3}, MaxTokens: 30})
	waitDone(bad)
	var events []runtime.Event
	for {
		ev, more := ok.Next()
		if !more {
			break
		}
		events = append(events, ev)
	}
	if len(events) != 2 || events[0].Type != runtime.EventDelta || !slices.Equal(events[0].Tokens, want) ||
		events[0].Text != strings.ToValidUTF8(byteText[:30], "\uFFFD") || events[1].Type != runtime.EventDone || events[1].Finish != runtime.FinishLength {
		t.Errorf("slow consumer got %d events: %+v; want one coalesced delta of %v, then done", len(events), events, want)
	}
	if ev, more := bad.Next(); !more || ev.Type != runtime.EventError {
		t.Errorf("slow consumer of a failing request: %+v", ev)
	}
	if _, more := bad.Next(); more {
		t.Error("events after the final one")
	}

	// Close with requests pending: each still gets its final event.
	hm.setBefore(func(*model.Batch) error { time.Sleep(time.Millisecond); return nil })
	var pending []*runtime.Stream
	for range 4 {
		pending = append(pending, generate(t, r, t.Context(), runtime.Request{Prompt: randPrompt(rng, 6, hm.Info().Vocab), Sampling: greedy}))
	}
	if ev, _ := pending[0].Next(); ev.Type != runtime.EventDelta {
		t.Fatalf("first event %+v", ev)
	}
	r.Close()
	for i, s := range pending {
		if got := s.Collect(); !errors.Is(got.Err, runtime.ErrClosed) && got.Finish != runtime.FinishLength {
			t.Errorf("pending request %d after Close: %s %v", i, got.Finish, got.Err)
		}
	}
	if _, err := r.Generate(t.Context(), req); !errors.Is(err, runtime.ErrClosed) {
		t.Errorf("Generate after Close: %v", err)
	}
	if st := r.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after Close: %+v", st)
	}
}

func TestStats(t *testing.T) {
	m := slowModel(build(t, tinyLlama), time.Millisecond)
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), MaxBatchTokens: 8, MaxSeqs: 2})
	st := r.Stats()
	if st.KVBlocksTotal != 64 || st.KVBlockSize != blockSize || st.KVBudget != budget(m, 64) || st.KVBytesTotal != budget(m, 64) {
		t.Errorf("idle stats: %+v", st)
	}
	rng := rand.New(rand.NewPCG(21, 22))
	var streams []*runtime.Stream
	for range 3 {
		streams = append(streams, generate(t, r, t.Context(), runtime.Request{Prompt: randPrompt(rng, 10, m.Info().Vocab), MaxTokens: 20, Sampling: greedy}))
	}
	streams[0].Next()
	for deadline := time.Now().Add(5 * time.Second); r.Stats().Running < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	st = r.Stats()
	if st.Running != 2 || st.Waiting != 1 || st.KVBlocksUsed == 0 || st.KVBytesUsed == 0 || st.LastBatchSeqs == 0 ||
		st.LastBatchTokens == 0 || st.LastBatchTokens > 8 || st.Steps == 0 || st.StepsPerSec <= 0 || st.RecurrentBytes != 0 {
		t.Errorf("busy stats: %+v", st)
	}
	collectAll(streams)
	st = waitIdle(t, r)
	if st.GeneratedTokens != 60 || st.PromptTokens != 30 || st.StepsPerSec != 0 {
		t.Errorf("final stats: %+v", st)
	}
}

// TestDeviceErrorFailsTheStep checks Options.DeviceErr: once the backend
// reports a failure, the step's requests end with it as an error event, and
// the runtime goes on (later requests fail alike while the device stays
// dead, and succeed once it answers nil again).
func TestDeviceErrorFailsTheStep(t *testing.T) {
	m := build(t, tinyLlama)
	var mu sync.Mutex
	var devErr error
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), DeviceErr: func() error {
		mu.Lock()
		defer mu.Unlock()
		return devErr
	}})
	req := runtime.Request{Prompt: []int32{3, 4, 5}, MaxTokens: 4, Sampling: greedy}
	if got := generate(t, r, t.Context(), req).Collect(); got.Err != nil || len(got.Tokens) != 4 {
		t.Fatalf("healthy device: %+v", got)
	}
	mu.Lock()
	devErr = errors.New("cuda: cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS")
	mu.Unlock()
	for range 2 {
		if got := generate(t, r, t.Context(), req).Collect(); got.Err == nil || !strings.Contains(got.Err.Error(), "CUDA_ERROR_ILLEGAL_ADDRESS") {
			t.Fatalf("dead device: %v, want the device error", got.Err)
		}
	}
	mu.Lock()
	devErr = nil
	mu.Unlock()
	if got := generate(t, r, t.Context(), req).Collect(); got.Err != nil {
		t.Fatalf("after the device recovered: %v", got.Err)
	}
}

// TestDeviceMemoryInStats checks Options.DeviceMemory: its answer after the
// latest step is in Stats.Memory.
func TestDeviceMemoryInStats(t *testing.T) {
	m := build(t, tinyLlama)
	var mu sync.Mutex
	use := kernels.MemoryUse{OnDevice: true, Weights: 5 << 30, Tensors: 1 << 30, Arena: 64 << 20, Total: 139 << 30, Free: 100 << 30}
	r := start(t, m, runtime.Options{KVBudget: budget(m, 64), DeviceMemory: func() kernels.MemoryUse {
		mu.Lock()
		defer mu.Unlock()
		return use
	}})
	if got := r.Stats().Memory; got != use {
		t.Errorf("Stats.Memory at start = %+v, want %+v", got, use)
	}
	mu.Lock()
	use.Arena, use.Free = 128<<20, 99<<30
	want := use
	mu.Unlock()
	req := runtime.Request{Prompt: []int32{3, 4, 5}, MaxTokens: 2, Sampling: greedy}
	if got := generate(t, r, t.Context(), req).Collect(); got.Err != nil {
		t.Fatal(got.Err)
	}
	if got := waitIdle(t, r).Memory; got != want {
		t.Errorf("Stats.Memory after a request = %+v, want %+v", got, want)
	}
}

// TestKVBudgetBoundedByContext: a budget larger than the running sequences
// and cached prefixes can ever hold at the model's context reserves only
// what they can hold, and sequences of the whole context still run.
func TestKVBudgetBoundedByContext(t *testing.T) {
	m := build(t, tinyLlama) // context 96: 24 blocks of 4, 26 with a draft overhang
	r := start(t, m, runtime.Options{KVBudget: budget(m, 100_000), MaxBatchTokens: 32, MaxSeqs: 2, PrefixCache: 3})
	perSeq := (m.Info().MaxContext+runtime.MaxDraft+blockSize-1)/blockSize + 1
	if st := r.Stats(); st.KVBlocksTotal != (2+3)*perSeq || st.KVBytesTotal != budget(m, (2+3)*perSeq) {
		t.Fatalf("KV cache of %d blocks (%d bytes), want %d: 2 sequences and 3 cached prefixes of %d blocks",
			st.KVBlocksTotal, st.KVBytesTotal, (2+3)*perSeq, perSeq)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 6 {
		req := runtime.Request{Prompt: randPrompt(rng, 80, m.Info().Vocab), MaxTokens: 16, Sampling: greedy}
		want, _ := reference(t, m, req)
		if got := generate(t, r, t.Context(), req).Collect(); got.Err != nil || !slices.Equal(got.Tokens, want) {
			t.Fatalf("request %d: %v, tokens %v, want %v", i, got.Err, got.Tokens, want)
		}
	}
	// A budget below the bound is kept as given.
	small := start(t, m, runtime.Options{KVBudget: budget(m, 64), MaxBatchTokens: 32, MaxSeqs: 2, PrefixCache: 3})
	if st := small.Stats(); st.KVBlocksTotal != 64 {
		t.Errorf("a 64-block budget gave %d blocks", st.KVBlocksTotal)
	}
}
