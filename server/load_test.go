package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/internal/chatprompt"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// loadQuestions are in-domain questions for ferrite-tiny (replies of 10
// to 60 tokens).
var loadQuestions = []string{
	"What does ephemeral mean?", "What does length mean?", "Who are you?", "What can you do?",
	"Give me a synonym for big.", "Use candid in a sentence.", "Tell me a quote about time.",
	"What does the Devil's Dictionary say about air?",
}

// loadStats is what a load run saw.
type loadStats struct {
	requests, completed, disconnected, apiErrors int
	ttft                                         []time.Duration // completed and streamed requests: request sent → first text
	elapsed                                      time.Duration
	failures                                     []string // malformed output, transport errors, hangs
}

// loadRun runs clients concurrent streaming clients for dur, each sending
// chat requests back to back; disconnect is the share of requests the
// client abandons at a random point (before the response, or after some
// chunks).
func loadRun(t *testing.T, url string, clients int, dur time.Duration, disconnect float64, seed uint64) *loadStats {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	return drive(t, clients, dur, seed, func(rng *rand.Rand) loadResult { return loadRequest(hc, url, rng, disconnect) })
}

// drive runs clients goroutines sending requests with send back to back
// for dur.
func drive(t *testing.T, clients int, dur time.Duration, seed uint64, send func(rng *rand.Rand) loadResult) *loadStats {
	t.Helper()
	var mu sync.Mutex
	st := &loadStats{}
	t0 := time.Now()
	deadline := t0.Add(dur)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for time.Now().Before(deadline) {
				r := send(rng)
				mu.Lock()
				st.requests++
				switch {
				case r.failure != "":
					st.failures = append(st.failures, r.failure)
				case r.disconnected:
					st.disconnected++
				case r.apiError:
					st.apiErrors++
				default:
					st.completed++
					st.ttft = append(st.ttft, r.ttft)
				}
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(dur + 2*time.Minute):
		t.Fatalf("clients still waiting two minutes after the end of the run")
	}
	st.elapsed = time.Since(t0)
	return st
}

// loadResult is one request's outcome.
type loadResult struct {
	disconnected bool   // the client gave up on purpose
	apiError     bool   // a clean error: OpenAI's error object, as a response or an event
	failure      string // anything else
	ttft         time.Duration
}

// maxTokens bounds the replies of the load: 8 to maxTokens tokens.
const maxTokens = 40

// loadReq is one request of the load: a question, n choices of at most
// maxTokens tokens, temperature 0.8 with a seed; extra are more fields
// (a stop string or the usage).
type loadReq struct {
	question  string
	n         int
	maxTokens int
	seed      int64
	extra     string
}

func randomRequest(rng *rand.Rand) loadReq {
	r := loadReq{question: loadQuestions[rng.IntN(len(loadQuestions))], n: 1, maxTokens: 8 + rng.IntN(maxTokens-7), seed: rng.Int64N(1000)}
	if rng.IntN(4) == 0 {
		r.n = 2
	}
	r.extra = []string{"", `,"stop":["."]`, `,"stream_options":{"include_usage":true}`}[rng.IntN(3)]
	return r
}

// loadRequest sends one streaming chat request and reads it to its end (or
// abandons it).
func loadRequest(hc *http.Client, url string, rng *rand.Rand, disconnect float64) loadResult {
	lr := randomRequest(rng)
	n := lr.n
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"stream":true,"n":%d,"max_tokens":%d,"temperature":0.8,"seed":%d%s}`,
		lr.question, n, lr.maxTokens, lr.seed, lr.extra)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaveAfter := -1 // chunks read before giving up; -1: never
	if rng.Float64() < disconnect {
		if rng.IntN(3) == 0 {
			time.AfterFunc(time.Duration(rng.IntN(20))*time.Millisecond, cancel) // maybe before the response
		} else {
			leaveAfter = 1 + rng.IntN(12)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() == context.Canceled {
			return loadResult{disconnected: true}
		}
		return loadResult{failure: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e wireError
		if json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error.Message == "" {
			return loadResult{failure: fmt.Sprintf("status %d without an error object", resp.StatusCode)}
		}
		return loadResult{apiError: true}
	}
	var ttft time.Duration
	finished := map[int]bool{}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return loadResult{failure: fmt.Sprintf("line %q is not an SSE data line", line)}
		}
		if data == "[DONE]" {
			if len(finished) != n {
				return loadResult{failure: fmt.Sprintf("[DONE] after %d of %d finish reasons", len(finished), n)}
			}
			return loadResult{ttft: ttft}
		}
		var ch struct {
			chatChunk
			Error *wireErrorBody `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return loadResult{failure: fmt.Sprintf("chunk %q: %v", data, err)}
		}
		if ch.Error != nil {
			return loadResult{apiError: true}
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" && ttft == 0 {
				ttft = time.Since(t0)
			}
			if c.FinishReason != nil {
				finished[c.Index] = true
			}
		}
		if chunks++; chunks == leaveAfter {
			cancel()
			return loadResult{disconnected: true}
		}
	}
	if ctx.Err() == context.Canceled {
		return loadResult{disconnected: true}
	}
	return loadResult{failure: fmt.Sprintf("the stream ended without [DONE]: %v", sc.Err())}
}

// directRequest is loadRequest's request straight to the runtime, without
// HTTP, JSON or the server's goroutines: the baseline of the benchmark.
func directRequest(b *Backend, rng *rand.Rand) loadResult {
	lr := randomRequest(rng)
	p, err := chatprompt.Encode(b.Tokenizer, []tokenizer.Message{{Role: "user", Content: lr.question}},
		tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		return loadResult{failure: err.Error()}
	}
	t0 := time.Now()
	var streams []*runtime.Stream
	for i := range lr.n {
		st, err := b.Runtime.Generate(context.Background(), runtime.Request{Prompt: p.IDs, MaxTokens: lr.maxTokens,
			Sampling: sample.Params{Temperature: 0.8, TopP: 1, RepeatPenalty: 1, Seed: uint64(lr.seed) + uint64(i) + 1}, Stop: b.Tokenizer.EOS()})
		if err != nil {
			return loadResult{failure: err.Error()}
		}
		streams = append(streams, st)
	}
	var ttft time.Duration
	for _, st := range streams {
		for {
			ev, ok := st.Next()
			if !ok {
				break
			}
			if len(ev.Tokens) > 0 && ttft == 0 {
				ttft = time.Since(t0)
			}
			if ev.Type == runtime.EventError {
				return loadResult{failure: ev.Err.Error()}
			}
		}
	}
	return loadResult{ttft: ttft}
}

// percentile is the p-th percentile (0 to 100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// TestLoad: 64 concurrent streaming clients on loopback for two seconds,
// a third of the requests abandoned at random points: every request ends
// with a result, a clean error or the client's own disconnect; no cache
// block or state slot leaks; the server keeps answering.
// FERRITE_SERVE_LOAD=DURATION (e.g. 2m) runs it longer.
func TestLoad(t *testing.T) {
	dur := 2 * time.Second
	if v := os.Getenv("FERRITE_SERVE_LOAD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FERRITE_SERVE_LOAD=%q: %v", v, err)
		}
		dur = d
	}
	// A cache of 12 blocks (192 tokens) for 64 clients: admission waits,
	// cached prefixes are evicted, and now and then a sequence is preempted.
	b := tinyBackend(t, runtime.Options{KVBudget: 12 * 16 * tinyBytesPerToken(t)})
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	st := loadRun(t, ts.url, 64, dur, 0.33, 1)
	t.Logf("%d requests in %v: %d completed, %d disconnected by the client, %d clean errors; TTFT p50 %v p99 %v; %d preemptions",
		st.requests, st.elapsed.Round(time.Millisecond), st.completed, st.disconnected, st.apiErrors,
		percentile(st.ttft, 50), percentile(st.ttft, 99), b.Runtime.Stats().Preemptions)
	for i, f := range st.failures {
		if i == 10 {
			t.Errorf("… and %d more failures", len(st.failures)-10)
			break
		}
		t.Errorf("request failed: %s", f)
	}
	if st.completed < 8 || st.disconnected == 0 {
		t.Errorf("%d completed and %d disconnected requests: the run did not exercise both", st.completed, st.disconnected)
	}
	waitIdle(t, b.Runtime)
	resp := chatJSON(t, ts, `{"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"max_tokens":8}`)
	if resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != 8 {
		t.Errorf("after the load: %+v", resp)
	}
	waitIdle(t, b.Runtime)
}

// tinyBytesPerToken is ferrite-tiny's KV-cache bytes per token.
func tinyBytesPerToken(t *testing.T) int64 {
	l, err := tiny()
	if err != nil {
		t.Fatal(err)
	}
	return l.Model.Info().KVBytesPerToken
}

// TestLoadBenchmark measures requests per second and time to first token
// at 1, 8 and 64 concurrent streaming clients (BENCHMARKS.md §6), through
// the server and, as a baseline, straight to the runtime. It runs only
// with FERRITE_SERVE_BENCH=DURATION (per concurrency level and path).
func TestLoadBenchmark(t *testing.T) {
	v := os.Getenv("FERRITE_SERVE_BENCH")
	if v == "" {
		t.Skip("set FERRITE_SERVE_BENCH=DURATION (e.g. 20s) to measure")
	}
	dur, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("FERRITE_SERVE_BENCH=%q: %v", v, err)
	}
	b := tinyBackend(t, runtime.Options{KVBudget: 64 << 20, MaxSeqs: 64})
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	loadRun(t, ts.url, 8, time.Second, 0, 99) // warm up
	fmt.Printf("| path | clients | requests | requests/s | completion tok/s | TTFT p50 | TTFT p99 |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, clients := range []int{1, 8, 64} {
		for _, direct := range []bool{false, true} {
			g0 := b.Runtime.Stats().GeneratedTokens
			var st *loadStats
			path := "HTTP (server)"
			if direct {
				path = "runtime.Generate"
				st = drive(t, clients, dur, uint64(clients), func(rng *rand.Rand) loadResult { return directRequest(b, rng) })
			} else {
				st = loadRun(t, ts.url, clients, dur, 0, uint64(clients))
			}
			if len(st.failures) > 0 || st.apiErrors > 0 {
				t.Fatalf("%d clients: %d failures (%v), %d errors", clients, len(st.failures), st.failures[:min(3, len(st.failures))], st.apiErrors)
			}
			sec := st.elapsed.Seconds()
			fmt.Printf("| %s | %d | %d | %.1f | %.0f | %.0f ms | %.0f ms |\n", path, clients, st.completed, float64(st.completed)/sec,
				float64(b.Runtime.Stats().GeneratedTokens-g0)/sec,
				float64(percentile(st.ttft, 50).Microseconds())/1000, float64(percentile(st.ttft, 99).Microseconds())/1000)
		}
	}
}
