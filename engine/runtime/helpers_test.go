package runtime_test

import (
	"context"
	"math/rand/v2"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/llama"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// Tiny configs: fast enough to run hundreds of requests under -race.
const (
	tinyLlama = `{
  "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
  "vocab_size": 64, "max_position_embeddings": 96, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false
}`
	tinyQwen3 = `{
  "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
  "vocab_size": 72, "max_position_embeddings": 96, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": true, "attention_bias": false
}`
)

// blockSize is the cache block size the tests use: small, so short
// sequences span several blocks.
const blockSize = 4

// build makes a random-weight model on the strict backend: single-threaded
// reference ops, every output row depends on its input row alone, never on
// the batch it is in, so batched output must equal unbatched output exactly.
func build(t testing.TB, cfgJSON string) model.Model {
	t.Helper()
	cfg, err := config.Parse("config.json", []byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(cfg, randweights.New(7, kernels.F32), strict.New())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// budget is the KV byte budget of n blocks of m.
func budget(m model.Model, blocks int) int64 {
	return int64(blocks*blockSize) * m.Info().KVBytesPerToken
}

// start builds a runtime that the test closes. Its drafting ignores cost
// (these tests check what drafting does, not whether it pays on a fake
// model's timings); startCostAware keeps the default.
func start(t testing.TB, m model.Model, opts runtime.Options) *runtime.Runtime {
	t.Helper()
	opts.DraftIgnoreCost = true
	return startCostAware(t, m, opts)
}

// startCostAware is start with Options.DraftIgnoreCost as given.
func startCostAware(t testing.TB, m model.Model, opts runtime.Options) *runtime.Runtime {
	t.Helper()
	if opts.BlockSize == 0 {
		opts.BlockSize = blockSize
	}
	r, err := runtime.New(m, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// reference generates req's tokens alone, with a plain prefill-then-decode
// loop over its own cache and a fresh sampler: what the runtime must match
// however it batches, chunks or preempts.
func reference(t testing.TB, m model.Model, req runtime.Request) (out []int32, finish runtime.FinishReason) {
	t.Helper()
	if h, ok := m.(*hookModel); ok {
		m = h.Model // neither hooked nor counted
	}
	info := m.Info()
	c, err := model.NewCache(m, kvcache.Options{BlockSize: blockSize, Budget: int64(min(info.MaxContext, 1024)+blockSize) * info.KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	kv := c.NewSeq()
	defer c.Free(kv)
	var states *linattn.StatePool
	var slot *linattn.Slot
	if sm, ok := m.(model.StateModel); ok && len(sm.StateLayout()) > 0 {
		var per int64
		for _, l := range sm.StateLayout() {
			per += l.Bytes()
		}
		if states, err = model.NewStatePool(sm, per); err != nil {
			t.Fatal(err)
		}
		if slot, err = states.Alloc(); err != nil {
			t.Fatal(err)
		}
	}
	smp := sample.New(req.Sampling)
	toks := slices.Clone(req.Prompt)
	pos := 0
	for {
		if err := c.Reserve(kv, len(toks)); err != nil {
			t.Fatal(err)
		}
		o, err := m.Forward(&model.Batch{Cache: c, States: states, Seqs: []model.Seq{{Tokens: toks[pos:], Pos: pos, KV: kv, Logits: model.LastLogits, State: slot}}})
		if err != nil {
			t.Fatal(err)
		}
		pos = len(toks)
		tok := smp.Sample(o.Seqs[0].Logits, toks)
		if slices.Contains(req.Stop, tok) {
			return out, runtime.FinishStop
		}
		toks = append(toks, tok)
		out = append(out, tok)
		if req.MaxTokens > 0 && len(out) >= req.MaxTokens || len(toks) > info.MaxContext {
			return out, runtime.FinishLength
		}
	}
}

// randPrompt returns n random ids in [2, vocab), leaving 0 and 1 free for
// the tests' poison tokens.
func randPrompt(rng *rand.Rand, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(2 + rng.IntN(vocab-2))
	}
	return p
}

// greedy is deterministic argmax sampling.
var greedy = sample.Params{Temperature: 0}

// hookModel wraps a model: before runs ahead of every Forward (it may fail
// or panic), and it records the largest batch it saw.
type hookModel struct {
	model.Model
	before func(b *model.Batch) error

	mu        sync.Mutex
	maxSeqs   int // most sequences in one batch
	maxTokens int // most tokens in one batch
	chunked   int // prompt chunks that did not end at the sequence's last token
	steps     int
}

// Unwrap returns the wrapped model (model.NewCache finds its device).
func (h *hookModel) Unwrap() model.Model { return h.Model }

func (h *hookModel) Forward(b *model.Batch) (*model.Output, error) {
	h.mu.Lock()
	h.steps++
	h.maxSeqs = max(h.maxSeqs, len(b.Seqs))
	h.maxTokens = max(h.maxTokens, b.Tokens())
	for _, s := range b.Seqs {
		if s.Logits == model.NoLogits {
			h.chunked++
		}
	}
	before := h.before
	h.mu.Unlock()
	if before != nil {
		if err := before(b); err != nil {
			return nil, err
		}
	}
	return h.Model.Forward(b)
}

// setBefore replaces the hook while the runtime may be running.
func (h *hookModel) setBefore(f func(b *model.Batch) error) {
	h.mu.Lock()
	h.before = f
	h.mu.Unlock()
}

func (h *hookModel) seen() (maxSeqs, maxTokens, chunked, steps int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxSeqs, h.maxTokens, h.chunked, h.steps
}

// waitIdle polls Stats until no sequence runs or waits, then empties the
// prefix cache and checks that every cache block and state byte is back
// in its pool.
func waitIdle(t testing.TB, r *runtime.Runtime) runtime.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := r.Stats()
		if st.Running == 0 && st.Waiting == 0 {
			r.DropPrefixCache()
			st = r.Stats()
		}
		if st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 && st.RecurrentBytes == 0 &&
			st.PrefixEntries == 0 && st.PrefixBlocks == 0 && st.PrefixStateBytes == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("runtime not idle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkGoroutines fails t when more goroutines than base remain after a
// grace period.
func checkGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for goruntime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d, want ≤ %d\n%s", goruntime.NumGoroutine(), base, buf[:goruntime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// generate is Generate that fails t on error.
func generate(t testing.TB, r *runtime.Runtime, ctx context.Context, req runtime.Request) *runtime.Stream {
	t.Helper()
	s, err := r.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// collectAll collects every stream concurrently.
func collectAll(streams []*runtime.Stream) []runtime.Result {
	res := make([]runtime.Result, len(streams))
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Go(func() { res[i] = s.Collect() })
	}
	wg.Wait()
	return res
}

// runJobs calls job(i) for every i < total from workers goroutines, each
// taking the next i in turn, and returns when all are done.
func runJobs(workers, total int, job func(i int)) {
	var next atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				job(i)
			}
		})
	}
	wg.Wait()
}
