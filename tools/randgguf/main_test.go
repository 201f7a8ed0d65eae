package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
)

// TestWritesLoadableGGUF writes the qwen3 fixture's shape cut to one layer,
// checks the tensors and their types, and has ferrite load and run it.
func TestWritesLoadableGGUF(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := run(fixtures.Dir("qwen3"), out, "bf16", 1, 7, ""); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	names := m.TensorNames()
	quant := m.Quantization()
	m.Close()
	// token_embd, output_norm, output (the fixture does not tie it), and per
	// layer two norms, q/k/v/o, q/k norms, gate/up/down.
	if want := 3 + 11; len(names) != want {
		t.Errorf("%d tensors %v, want %d", len(names), names, want)
	}
	if quant != "BF16" {
		t.Errorf("quantization %q, want BF16", quant)
	}
	l, err := engine.Load(out, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Config.IntOr("num_hidden_layers", 0); got != 1 {
		t.Errorf("%d layers, want 1", got)
	}
	// The real Qwen3-0.6B config (top-level rope_theta) cut to one layer.
	if err := run("../../engine/testdata/qwen3-0.6b", out, "bf16", 1, 7, ""); err != nil {
		t.Fatal(err)
	}
	if m, err = gguf.Open(out); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v, _ := m.Meta.Get("qwen3.rope.freq_base")
	if f, ok := v.Float(); !ok || f != 1e6 {
		t.Errorf("rope.freq_base %v, want 1e6", v)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "config.json"), []byte(`{"model_type": "nonesuch", "num_hidden_layers": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(bad, out, "bf16", 0, 1, ""); err == nil {
		t.Error("an unknown model_type was accepted")
	}
	if err := run(fixtures.Dir("qwen3"), out, "q3_k", 0, 1, ""); err == nil {
		t.Error("an unknown type was accepted")
	}
}

// TestSeeded checks that the file depends on the config and the seed only:
// the same seed writes the same bytes (general.name is the config
// directory's name, not a temporary one), another seed other weights.
func TestSeeded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, seed uint64) []byte {
		out := filepath.Join(dir, name)
		if err := run(fixtures.Dir("qwen3"), out, "bf16", 1, seed, ""); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, c := write("a.gguf", 3), write("b.gguf", 3), write("c.gguf", 4)
	if !bytes.Equal(a, b) {
		t.Error("two files of seed 3 differ")
	}
	if len(a) != len(c) || bytes.Equal(a, c) {
		t.Errorf("seeds 3 and 4: %d and %d bytes, equal %v; want the same size, other bytes", len(a), len(c), bytes.Equal(a, c))
	}
	m, err := gguf.Open(filepath.Join(dir, "a.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v, _ := m.Meta.Get("general.name")
	if s, _ := v.Str(); s != filepath.Base(fixtures.Dir("qwen3")) {
		t.Errorf("general.name %v, want %q", v, filepath.Base(fixtures.Dir("qwen3")))
	}
}

// TestMoE writes the qwen3_moe fixture's shape (experts in every other
// layer) in Q8_0 with lazily encoded experts, checks that the file is
// byte for byte what the eager converter writes, and has ferrite load it.
func TestMoE(t *testing.T) {
	dir := fixtures.Dir("qwen3_moe")
	out := filepath.Join(t.TempDir(), "moe.gguf")
	if err := run(dir, out, "q8_0", 0, 3, ""); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	names := m.TensorNames()
	m.Close()
	for _, want := range []string{"blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_inp.weight", "blk.0.ffn_up.weight"} {
		if !slices.Contains(names, want) {
			t.Errorf("no tensor %s in %v", want, names)
		}
	}
	if slices.Contains(names, "blk.0.ffn_gate_exps.weight") {
		t.Error("experts in layer 0 (decoder_sparse_step 2)")
	}
	var c config
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	src, err := newSource(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	eager, err := ggufwrite.ConvertFrom(dir, src, ggufwrite.Q8_0)
	if err != nil {
		t.Fatal(err)
	}
	lazy, err := ggufwrite.ConvertLazy(dir, src, ggufwrite.Q8_0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(eager.Bytes(), lazy.Bytes()) {
		t.Error("the lazy experts encode differently from the eager ones")
	}
	l, err := engine.Load(out, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Config.IntOr("num_hidden_layers", 0); got != 4 {
		t.Errorf("%d layers, want 4", got)
	}
}

// TestMLA writes the glm4_moe_lite fixture's shape (an architecture whose
// tensors come from recording ferrite's model, recordSource) in Q8_0 with
// -kvb q8_0: attn_v_b (rows of kv_lora 32) in Q8_0, attn_k_b (rows of nope
// 16) F32, as llama-quantize would leave them; ferrite loads it.
func TestMLA(t *testing.T) {
	out := filepath.Join(t.TempDir(), "mla.gguf")
	if err := run(fixtures.Dir("glm4_moe_lite"), out, "q8_0", 0, 5, "q8_0"); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	kb, okK := m.Tensor("blk.1.attn_k_b.weight")
	vb, okV := m.Tensor("blk.1.attn_v_b.weight")
	exps, okE := m.Tensor("blk.1.ffn_gate_exps.weight")
	if !okK || !okV || !okE || kb.Type != gguf.TypeF32 || vb.Type != gguf.TypeQ8_0 || exps.Type != gguf.TypeQ8_0 {
		t.Errorf("attn_k_b %+v, attn_v_b %+v, ffn_gate_exps %+v", kb, vb, exps)
	}
	m.Close()
	l, err := engine.Load(out, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Model.Info().Arch; got != "glm4_moe_lite" {
		t.Errorf("arch %q", got)
	}
	if err := run(fixtures.Dir("glm4_moe_lite"), out, "q8_0", 0, 5, "q4_0"); err == nil {
		t.Error("-kvb q4_0 was accepted")
	}
}
