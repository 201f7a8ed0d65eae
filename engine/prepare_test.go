package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// TestPrepareSelects checks which matrices Load has the backend prepare:
// each one the model took that a step multiplies every time (an untied
// head, every layer's projections, shared experts), none of a routed
// expert, an untied input embedding, or the MTP layer.
func TestPrepareSelects(t *testing.T) {
	for _, name := range []string{"mixtral", "glm4_moe", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			be := cpu.New(1)
			defer be.Close()
			l, err := Load(filepath.Join("..", "testdata", "models", name), Options{Backend: be})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ws := l.rec.Prepare(l.Model)
			names := map[*kernels.Mat]string{}
			for _, t := range l.rec.mats {
				names[t.m] = t.name
			}
			picked := map[string]bool{}
			for _, w := range ws {
				n := names[w]
				if picked[n] {
					t.Errorf("%s picked twice", n)
				}
				picked[n] = true
			}
			layers := l.Model.Info().Layers
			for _, m := range l.rec.mats {
				skip := strings.Contains(m.name, ".experts.") && !strings.Contains(m.name, "shared") ||
					strings.HasSuffix(m.name, "embed_tokens.weight") || model.MTPWeight(m.name, layers)
				if picked[m.name] == skip {
					t.Errorf("%s: picked %v", m.name, picked[m.name])
				}
			}
			for _, want := range []string{"lm_head.weight", "model.layers.0.self_attn.q_proj.weight"} {
				if !picked[want] {
					t.Errorf("%s not picked", want)
				}
			}
		})
	}
}

// TestPrepareKeepsOnlyReachable checks that a matrix the model took but
// does not keep (it kept a copy of some of its rows instead) is not
// prepared, and that matrices kept in fields, slices, maps and interfaces,
// exported or not, are.
func TestPrepareKeepsOnlyReachable(t *testing.T) {
	mats := make([]*kernels.Mat, 6)
	r := &WeightRecorder{}
	for i := range mats {
		mats[i] = &kernels.Mat{Rows: i + 1}
		r.mats = append(r.mats, namedMat{"model.layers.0.m" + string(rune('a'+i)), mats[i]})
	}
	type block struct {
		W   *kernels.Mat
		any any
	}
	type keep struct {
		blocks []*block
		byName map[string]*kernels.Mat
		self   *keep
		small  []float32
	}
	k := &keep{blocks: []*block{{W: mats[0]}, {any: mats[2]}}, byName: map[string]*kernels.Mat{"x": mats[3]}, small: make([]float32, 8)}
	k.self = k
	got := r.prepare(k, 1)
	want := []*kernels.Mat{mats[0], mats[2], mats[3]}
	if len(got) != len(want) {
		t.Fatalf("prepared %d matrices, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("matrix %d: rows %d, want %d (in the order taken)", i, got[i].Rows, want[i].Rows)
		}
	}
}

// TestLoadPreparesWeights checks that Load has the CPU backend make its
// forms of the weights before any request (here the x8 packing of the
// matrices quantized to Q8_0), and that Close, called while that runs,
// stops it and waits for it before it unmaps the weights (run with -race).
func TestLoadPreparesWeights(t *testing.T) {
	dir := filepath.Join("..", "testdata", "models", "qwen3")
	l, err := Load(dir, Options{Threads: 2, Quant: "q8_0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WaitPrepared(context.Background()); err != nil {
		t.Fatal(err)
	}
	be := l.Backend.(kernels.MemoryReporter)
	if u := be.MemoryUse(); u.Weights == 0 {
		t.Errorf("no weights prepared before a request: %+v", u)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		l, err := Load(dir, Options{Threads: 2, Quant: "q8_0"})
		if err != nil {
			t.Fatal(err)
		}
		done := l.prepDone
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		default:
			t.Fatal("Close returned before the preparation stopped")
		}
	}
}

// TestLoadPreparesMLASplits checks that Load has the CPU backend make an
// MLA model's per-head kv_b_proj splits with the other forms (the model
// declares its kv_b_proj matrices, kernels.DeclareKVB): a request's prefill
// and absorbed decode steps then make no weight form more.
func TestLoadPreparesMLASplits(t *testing.T) {
	for _, name := range []string{"glm4_moe_lite", "glm_moe_dsa", "glm5_next"} {
		t.Run(name, func(t *testing.T) {
			l, err := Load(filepath.Join("..", "testdata", "models", name), Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.WaitPrepared(context.Background()); err != nil {
				t.Fatal(err)
			}
			be := l.Backend.(kernels.MemoryReporter)
			prepared := be.MemoryUse().Weights
			if prepared == 0 {
				t.Fatal("no kv_b_proj split prepared before a request")
			}
			rt, err := runtime.New(l.Model, runtime.Options{KVBudget: 4 << 20, MaxSeqs: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			prompt := make([]int32, 20)
			for i := range prompt {
				prompt[i] = int32(3 + 7*i)
			}
			st, err := rt.Generate(context.Background(), runtime.Request{Prompt: prompt, MaxTokens: 4, Draft: -1})
			if err != nil {
				t.Fatal(err)
			}
			if r := st.Collect(); r.Err != nil || len(r.Tokens) != 4 {
				t.Fatalf("generation: %d tokens, %v", len(r.Tokens), r.Err)
			}
			if w := be.MemoryUse().Weights; w != prepared {
				t.Errorf("a request made %d bytes of weight forms more after the preparation (%d)", w-prepared, prepared)
			}
		})
	}
}
