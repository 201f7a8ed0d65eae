package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/all"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

func TestActiveExperts(t *testing.T) {
	for _, c := range []struct {
		n, k, batch int
		want        float64
	}{
		{8, 2, 1, 2},
		{8, 2, 2, 8 * (1 - 0.75*0.75)},
		{64, 8, 1000, 64},
		{8, 0, 1, 8}, // top-k unknown: all
		{0, 2, 1, 0},
	} {
		if got := ActiveExperts(c.n, c.k, c.batch); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("ActiveExperts(%d, %d, %d) = %g, want %g", c.n, c.k, c.batch, got, c.want)
		}
	}
}

func TestFootprint(t *testing.T) {
	c := NewCounter(randweights.New(1, kernels.BF16))
	mat := func(name string, r, k int) {
		if _, err := c.Mat(name, r, k); err != nil {
			t.Fatal(err)
		}
	}
	mat("model.embed_tokens.weight", 100, 8)                     // untied: one row per token
	mat("lm_head.weight", 100, 8)                                // dense
	mat("model.embed_tokens.weight", 100, 8)                     // loaded twice, counted once
	mat("model.layers.0.self_attn.q_proj.weight", 8, 8)          // dense
	mat("model.layers.0.mlp.shared_expert.up_proj.weight", 4, 8) // dense
	for e := range 4 {                                           // per-expert storage, layer 0
		mat("model.layers.0.mlp.experts."+string(rune('0'+e))+".up_proj.weight", 4, 8)
	}
	for e := range 4 { // fused storage, layer 1
		if _, err := c.Expert("model.layers.1.mlp.experts.gate_up_proj", e, 8, 8); err != nil {
			t.Fatal(err)
		}
	}
	mat("model.layers.2.eh_proj.weight", 8, 16) // NextN layer (layers = 2)
	mat("mtp.fc.weight", 8, 16)                 // Qwen3-Next MTP
	if _, err := c.Float32("model.norm.weight", 8); err != nil {
		t.Fatal(err)
	}
	f := c.Footprint(2, 1)
	want := Footprint{
		EmbeddingBytes: 1600,
		DenseBytes:     1600 + 128 + 64 + 32,
		ExpertBytes:    4*64 + 4*128,
		MTPBytes:       256 + 256,
		MoELayers:      2, Experts: 4, TopK: 1,
	}
	if f.EmbeddingBytes != want.EmbeddingBytes || f.DenseBytes != want.DenseBytes || f.ExpertBytes != want.ExpertBytes ||
		f.MTPBytes != want.MTPBytes || f.MoELayers != want.MoELayers || f.Experts != want.Experts || f.Tied {
		t.Fatalf("footprint %+v, want %+v", f, want)
	}
	if f.TotalBytes != f.DenseBytes+f.EmbeddingBytes+f.ExpertBytes+f.MTPBytes {
		t.Errorf("total %d is not the sum of the parts", f.TotalBytes)
	}
	// Batch 1, top-1 of 4: a quarter of each layer's experts.
	if got, want := f.DecodeBytes(1, 0), f.DenseBytes+64+128; got != want {
		t.Errorf("DecodeBytes(1) = %d, want %d", got, want)
	}
	if got, want := f.DecodeBytes(1, 2), f.DenseBytes+64+128+2*512; got != want {
		t.Errorf("DecodeBytes(1, mtp) = %d, want %d", got, want)
	}
	if got := f.DecodeBytes(1000, 0); got != f.DenseBytes+f.ExpertBytes {
		t.Errorf("DecodeBytes(1000) = %d, want every expert", got)
	}
}

// TestRun sweeps a tiny random llama and checks the measurements add up.
func TestRun(t *testing.T) {
	m := tinyLlama(t)
	opts := Options{Concurrency: []int{1, 3}, PromptLens: []int{4}, GenLens: []int{3}, MTP: []bool{true, false}, Seed: 1, Warmup: true}
	res, err := Run(context.Background(), m, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results", len(res))
	}
	for _, r := range res {
		if r.MTP {
			if !strings.HasPrefix(r.Skipped, ErrMTPUnavailable.Error()) {
				t.Errorf("%v: skipped %q", r.Case, r.Skipped)
			}
			continue
		}
		if r.GeneratedTokens != r.Concurrency*3 || r.PromptTokens != r.Concurrency*4 || r.DecodeTokPerSec <= 0 ||
			r.PeakKVBytes <= 0 || r.Preemptions != 0 || r.Steps < 3 {
			t.Errorf("%+v", r)
		}
	}
	// Gen-len 1 times the prompt alone: prompt tok/s and TTFT, no decode
	// figures.
	res, err = Run(context.Background(), m, Options{Concurrency: []int{1}, PromptLens: []int{9}, GenLens: []int{1}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.GeneratedTokens != 1 || r.PromptTokens != 9 || r.PromptTokPerSec <= 0 || r.TTFTMeanMs <= 0 ||
		r.DecodeTokPerSec != 0 || r.DecodeStepsPerSec != 0 {
		t.Errorf("gen-len 1: %+v", r)
	}
	// Too long for the context, and gen-len 0, are refused.
	for _, o := range []Options{
		{Concurrency: []int{1}, PromptLens: []int{120}, GenLens: []int{10}},
		{Concurrency: []int{1}, PromptLens: []int{4}, GenLens: []int{0}},
		{Concurrency: []int{}, PromptLens: []int{4}, GenLens: []int{2}},
	} {
		if _, err := Run(context.Background(), m, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func TestMeasureBandwidth(t *testing.T) {
	be := cpu.New(2)
	defer be.Close()
	bw := MeasureBandwidth(be, 3<<20, 2)
	if bw.BytesPerSec <= 0 || bw.BufferBytes != 3<<20 || bw.Rounds != 2 || bw.Threads != 2 {
		t.Fatalf("%+v", bw)
	}
}

// TestRunReleasesMemory: every case's runtime releases its KV cache when it
// closes, so a sweep of several cases on the CPU backend ends with the
// backend's tensors at the model's own plus its step inputs, the same after
// a second sweep: no cache outlives its case.
func TestRunReleasesMemory(t *testing.T) {
	cfg, err := config.Parse("config.json", []byte(`{"model_type": "qwen3", "hidden_size": 32, "head_dim": 16,
		"intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
		"vocab_size": 64, "max_position_embeddings": 128, "tie_word_embeddings": true}`))
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(1)
	defer be.Close()
	m := randomModel(t, be, cfg)
	loaded := be.MemoryUse().Tensors
	opts := Options{Concurrency: []int{1, 2, 4}, PromptLens: []int{4, 9}, GenLens: []int{3}, Seed: 1, Warmup: true}
	sweep := func() int64 {
		res, err := Run(context.Background(), m, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 6 {
			t.Fatalf("%d results, want 6", len(res))
		}
		return be.MemoryUse().Tensors
	}
	after := sweep()
	cache := opts.kvBudget(m.Info()) // each case's cache
	if after-loaded >= cache {
		t.Errorf("after a sweep of 6 cases: Tensors %d above the loaded model's, a cache is %d: caches kept", after-loaded, cache)
	}
	if again := sweep(); again != after {
		t.Errorf("after a second sweep: Tensors %d, want %d as after the first", again, after)
	}
}

// fakeProfiler counts resets and writes how many it has had.
type fakeProfiler struct {
	on             bool
	resets, writes int
}

func (p *fakeProfiler) Profiling() bool { return p.on }
func (p *fakeProfiler) ResetProfile()   { p.resets++ }
func (p *fakeProfiler) WriteProfile(w io.Writer) error {
	p.writes++
	_, err := fmt.Fprintf(w, "after reset %d", p.resets)
	return err
}

// TestRunProfiler checks Options.Profiler: reset before each case, its
// table in the case's Profile, handed to Done as each case ends; untouched
// while it is not profiling.
func TestRunProfiler(t *testing.T) {
	m := tinyLlama(t)
	for _, on := range []bool{true, false} {
		p := &fakeProfiler{on: on}
		var done []Result
		res, err := Run(context.Background(), m, Options{Concurrency: []int{1, 2}, PromptLens: []int{4}, GenLens: []int{2}, Seed: 1,
			Profiler: p, Done: func(r Result) { done = append(done, r) }})
		if err != nil {
			t.Fatal(err)
		}
		if len(done) != len(res) {
			t.Fatalf("Done called %d times for %d cases", len(done), len(res))
		}
		for i, r := range res {
			if done[i].Profile != r.Profile || done[i].Case != r.Case {
				t.Errorf("Done's result %d differs from Run's", i)
			}
			want := fmt.Sprintf("after reset %d", i+1)
			if !on {
				want = ""
			}
			if r.Profile != want {
				t.Errorf("profiling %v, case %d: Profile %q, want %q", on, i, r.Profile, want)
			}
		}
		if n := map[bool]int{true: 2, false: 0}[on]; p.resets != n || p.writes != n {
			t.Errorf("profiling %v: %d resets, %d writes; want %d each", on, p.resets, p.writes, n)
		}
	}
}

// TestWatchKeepsInterfaces checks that the bench's model wrapper keeps the
// optional interfaces the runtime looks for: a speculating glm5_next stays
// a model.SpecModel (one-step speculation), model.MTPModel and
// model.StateModel; a llama is none of them.
func TestWatchKeepsInterfaces(t *testing.T) {
	dir := fixtures.Dir("glm5_next")
	if _, err := os.Stat(dir); err != nil {
		t.Skip("fixture glm5_next not present")
	}
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(1)
	defer be.Close()
	m := randomModel(t, be, cfg)
	w, _ := watch(m)
	_, spec := w.(model.SpecModel)
	_, mtp := w.(model.MTPModel)
	_, state := w.(model.StateModel)
	if !spec || !mtp || !state {
		t.Errorf("glm5_next behind watch: SpecModel %v, MTPModel %v, StateModel %v", spec, mtp, state)
	}
	w, _ = watch(tinyLlama(t))
	if _, ok := w.(model.MTPModel); ok {
		t.Error("llama behind watch is an MTPModel")
	}
	if _, ok := w.(model.SpecModel); ok {
		t.Error("llama behind watch is a SpecModel")
	}
}

// tinyLlama is a one-layer random llama on a one-worker CPU backend (closed
// when the test ends).
func tinyLlama(t *testing.T) model.Model {
	t.Helper()
	be := cpu.New(1)
	t.Cleanup(func() { be.Close() })
	return randomModel(t, be, tinyLlamaConfig(t))
}

// tinyLlamaConfig is tinyLlama's config.
func tinyLlamaConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("config.json", []byte(`{"model_type": "llama", "hidden_size": 32,
		"intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
		"vocab_size": 64, "max_position_embeddings": 128, "tie_word_embeddings": true}`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// randomModel is cfg's model with random float32 weights on be.
func randomModel(t *testing.T, be kernels.Backend, cfg *config.Config) model.Model {
	t.Helper()
	m, err := model.New(cfg, randweights.New(1, kernels.F32), be)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tokenCounter counts the tokens of the forward passes.
type tokenCounter struct {
	model.Model
	tokens int
}

// Unwrap returns the counted model (model.NewCache finds its device).
func (c *tokenCounter) Unwrap() model.Model { return c.Model }

func (c *tokenCounter) Forward(b *model.Batch) (*model.Output, error) {
	c.tokens += b.Tokens()
	return c.Model.Forward(b)
}

// TestRunWarmupCase checks Options.WarmupCase: before each case's timed
// requests the model runs, untimed, requests that fill two steps of the
// token budget (the prompt and one token each) and then the case's own
// requests for warmupCaseGen tokens; the timed results count only the
// timed requests.
func TestRunWarmupCase(t *testing.T) {
	m := tinyLlama(t)
	const conc, prompt, gen, budget = 3, 4, 6, 10
	var res [2][]Result
	var tokens [2]int
	for i, warm := range []bool{false, true} {
		c := &tokenCounter{Model: m}
		r, err := Run(context.Background(), c, Options{Concurrency: []int{conc}, PromptLens: []int{prompt}, GenLens: []int{gen}, Seed: 1,
			NoPrime: true, WarmupCase: warm, MaxBatchTokens: budget})
		if err != nil {
			t.Fatal(err)
		}
		res[i], tokens[i] = r, c.tokens
	}
	for i := range res {
		if r := res[i][0]; r.GeneratedTokens != conc*gen || r.PromptTokens != conc*prompt {
			t.Errorf("warm-up %v: %+v", i == 1, r)
		}
	}
	fill := (2*budget + prompt - 1) / prompt // 5 requests of a prompt and one token
	want := fill*prompt + conc*(prompt+warmupCaseGen-1)
	if extra := tokens[1] - tokens[0]; extra != want {
		t.Errorf("the warm-up ran %d tokens through the model, want %d (%d to fill the budget, then %d requests of %d)", extra, want, fill, conc, warmupCaseGen)
	}
}

// graphBackend is the CPU backend saying it replays steps as graphs, as
// a GPU backend does (kernels.StepGrapher).
type graphBackend struct{ *cpu.Backend }

func (graphBackend) StepGraphStats() kernels.StepGraphs { return kernels.StepGraphs{} }

// TestRunWarmupFillsSteps checks Options.Warmup on a device that replays
// steps as graphs: after the warm-up request it runs untimed requests of
// the longest prompt that fill two steps of the token budget (fillCase),
// so that the backend's step scratch reaches its largest size before the
// sweep; on other devices it does not.
func TestRunWarmupFillsSteps(t *testing.T) {
	cfg := tinyLlamaConfig(t)
	be := cpu.New(1)
	t.Cleanup(func() { be.Close() })
	const prompt, gen, budget = 4, 3, 10
	opts := Options{Concurrency: []int{1}, PromptLens: []int{prompt}, GenLens: []int{gen}, Seed: 1, NoPrime: true, Warmup: true,
		MaxBatchTokens: budget}
	var tokens [2]int
	for i, dev := range []kernels.Backend{be, graphBackend{be}} {
		c := &tokenCounter{Model: randomModel(t, dev, cfg)}
		r, err := Run(context.Background(), c, opts)
		if err != nil {
			t.Fatal(err)
		}
		if r[0].GeneratedTokens != gen || r[0].PromptTokens != prompt {
			t.Errorf("timed case: %+v", r[0])
		}
		tokens[i] = c.tokens
	}
	fill := (2*budget + prompt - 1) / prompt // requests of a prompt and one token
	if extra := tokens[1] - tokens[0]; extra != fill*prompt {
		t.Errorf("the graph device's warm-up ran %d tokens more than the plain one's, want %d (%d requests of %d)", extra, fill*prompt, fill, prompt)
	}
}
