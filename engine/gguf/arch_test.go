package gguf

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
)

// convert writes a fixture's F32 GGUF conversion, edited, and opens it.
func convert(t *testing.T, fixture string, edit func(w *ggufwrite.Writer)) *Model {
	t.Helper()
	w, err := ggufwrite.Convert(fixtures.Dir(fixture), ggufwrite.F32)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(w)
	}
	return openWriter(t, w)
}

// TestConfigMatchesFixture checks the config built from GGUF metadata
// against the fixture's config.json on the keys the models read.
func TestConfigMatchesFixture(t *testing.T) {
	for _, name := range []string{"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "glm4_moe_lite", "qwen3_next", "deepseek_v32", "glm_moe_dsa"} {
		fx, err := fixtures.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := fx.TextConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := convert(t, name, nil).Config()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg.ModelType != want["model_type"] {
			t.Errorf("%s: model_type %q", name, cfg.ModelType)
		}
		for _, key := range []string{"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
			"vocab_size", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers",
			"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim", "index_topk",
			"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"} {
			w, ok := fixtures.Int(want, key)
			if !ok {
				continue
			}
			if got := cfg.Int(key); got != w {
				t.Errorf("%s: %s = %d, want %d", name, key, got, w)
			}
		}
		if tied, _ := fixtures.Bool(want, "tie_word_embeddings"); cfg.BoolOr("tie_word_embeddings", false) != tied {
			t.Errorf("%s: tie_word_embeddings %v", name, !tied)
		}
		if err := cfg.Err(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestConfigErrors checks that metadata ferrite cannot use is an error
// naming the key.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		fixture, want string
		edit          func(w *ggufwrite.Writer)
	}{
		{"qwen3", "a vision projector", func(w *ggufwrite.Writer) { w.Set("general.architecture", "clip") }},
		{"qwen3", `architecture "gemma3" is not supported (GGUF architectures ferrite runs: deepseek2, deepseek32, glm-dsa, glm4moe, llama, qwen3, qwen3moe, qwen3next)`,
			func(w *ggufwrite.Writer) { w.Set("general.architecture", "gemma3") }},
		{"qwen3", "missing metadata qwen3.embedding_length", func(w *ggufwrite.Writer) { w.Set("qwen3.embedding_length", nil) }},
		{"qwen3", "metadata qwen3.attention.head_count is a string", func(w *ggufwrite.Writer) { w.Set("qwen3.attention.head_count", "four") }},
		{"qwen3", `rope.scaling.type "longrope" is not supported`, func(w *ggufwrite.Writer) { w.Add("qwen3.rope.scaling.type", "longrope") }},
		{"qwen3", "differs from attention.value_length", func(w *ggufwrite.Writer) { w.Set("qwen3.attention.value_length", uint32(8)) }},
		{"glm4_moe", "expert_gating_func is 1", func(w *ggufwrite.Writer) { w.Set("glm4moe.expert_gating_func", uint32(1)) }},
		{"glm4_moe", "leaves no layers", func(w *ggufwrite.Writer) { w.Set("glm4moe.nextn_predict_layers", uint32(9)) }},
		{"llama", "missing tensor token_embd.weight", func(w *ggufwrite.Writer) { w.Tensors = w.Tensors[1:] }},
	} {
		m := convert(t, c.fixture, func(w *ggufwrite.Writer) {
			c.edit(w)
			w.KV = deleteNil(w.KV)
		})
		_, err := m.Config()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one containing %q", err, c.want)
		}
	}
}

// deleteNil drops the pairs a test removed by setting them to nil.
func deleteNil(kv []ggufwrite.KV) []ggufwrite.KV {
	out := kv[:0]
	for _, x := range kv {
		if x.Value != nil {
			out = append(out, x)
		}
	}
	return out
}

// TestWeightNames checks the Hugging Face → GGUF name mapping against
// llama.cpp's names (gguf-py tensor_mapping.py), independently of the
// converter the other tests use.
func TestWeightNames(t *testing.T) {
	m := convert(t, "glm4_moe", nil)
	w, err := m.Weights()
	if err != nil {
		t.Fatal(err)
	}
	for hf, want := range map[string]string{
		"model.embed_tokens.weight":                        "token_embd.weight",
		"model.norm.weight":                                "output_norm.weight",
		"lm_head.weight":                                   "output.weight",
		"model.layers.0.input_layernorm.weight":            "blk.0.attn_norm.weight",
		"model.layers.0.post_attention_layernorm.weight":   "blk.0.ffn_norm.weight",
		"model.layers.2.self_attn.q_proj.bias":             "blk.2.attn_q.bias",
		"model.layers.2.self_attn.o_proj.weight":           "blk.2.attn_output.weight",
		"model.layers.2.self_attn.k_norm.weight":           "blk.2.attn_k_norm.weight",
		"model.layers.0.mlp.down_proj.weight":              "blk.0.ffn_down.weight",
		"model.layers.1.mlp.gate.weight":                   "blk.1.ffn_gate_inp.weight",
		"model.layers.1.mlp.gate.e_score_correction_bias":  "blk.1.exp_probs_b.bias",
		"model.layers.1.mlp.shared_experts.up_proj.weight": "blk.1.ffn_up_shexp.weight",
		"model.layers.3.mlp.experts.5.down_proj.weight":    "blk.3.ffn_down_exps.weight",
		"model.layers.4.eh_proj.weight":                    "blk.4.nextn.eh_proj.weight",
		"model.layers.4.shared_head.norm.weight":           "blk.4.nextn.shared_head_norm.weight",
	} {
		r, ok := w.resolve(hf)
		if !ok || r.name != want {
			t.Errorf("%s -> %q (%v), want %q", hf, r.name, ok, want)
		}
	}
	if r, _ := w.resolve("model.layers.3.mlp.experts.5.down_proj.weight"); r.expert != 5 {
		t.Errorf("expert slice %d, want 5", r.expert)
	}
	for _, hf := range []string{"model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.eh_proj.weight", "visual.patch_embed.weight"} {
		if w.Has(hf) {
			t.Errorf("Has(%q) = true", hf)
		}
	}
	if _, err := w.Mat("model.layers.0.self_attn.q_proj.weight", 3, 64); err == nil || !strings.Contains(err.Error(), "blk.0.attn_q.weight has shape [128 64]") {
		t.Errorf("wrong shape: %v", err)
	}
	if _, err := w.Mat("model.layers.9.self_attn.q_proj.weight", 128, 64); err == nil || !strings.Contains(err.Error(), "missing tensor blk.9.attn_q.weight") {
		t.Errorf("missing layer: %v", err)
	}
}

// TestUnsupportedTensorType checks that a tensor type the kernels lack is
// named, both when listing and when loading.
func TestUnsupportedTensorType(t *testing.T) {
	m := convert(t, "qwen3", func(w *ggufwrite.Writer) {
		ggufwrite.AddByteTokenizer(w, 512)
		for i := range w.Tensors {
			if w.Tensors[i].Name == "blk.0.attn_q.weight" {
				x := &w.Tensors[i]
				x.Type = 3 // Q4_1: 32 elements in 20 bytes
				x.Data = make([]byte, int(x.Dims[0]/32*20*x.Dims[1]))
			}
		}
	})
	if p := m.Problem(); !strings.Contains(p, "blk.0.attn_q.weight has type Q4_1") {
		t.Errorf("Problem() = %q", p)
	}
	w, _ := m.Weights()
	if _, err := w.Mat("model.layers.0.self_attn.q_proj.weight", 128, 64); err == nil || !strings.Contains(err.Error(), "type Q4_1, which ferrite does not support") {
		t.Errorf("Mat: %v", err)
	}
}

// TestJoinKVB rebuilds kv_b_proj from split halves of different types,
// which gives an F32 matrix carrying the halves as stored, per head.
func TestJoinKVB(t *testing.T) {
	const heads, nope, v, lora = 2, 2, 3, 4
	// kv_b_proj rows h·(nope+v)+r, columns j hold 100h + 10r + j.
	want := make([]float32, heads*(nope+v)*lora)
	kb := make([]float32, heads*lora*nope)
	vb := make([]float32, heads*v*lora)
	for h := range heads {
		for r := range nope + v {
			for j := range lora {
				x := float32(100*h + 10*r + j)
				want[(h*(nope+v)+r)*lora+j] = x
				if r < nope {
					kb[(h*lora+j)*nope+r] = x
				} else {
					vb[(h*v+r-nope)*lora+j] = x
				}
			}
		}
	}
	w := &ggufwrite.Writer{}
	w.Add("general.architecture", "deepseek2")
	w.Tensors = []ggufwrite.Tensor{
		{Name: "blk.0.attn_k_b.weight", Type: ggufwrite.F16, Dims: []uint64{nope, lora, heads}, Data: weightsF16(kb)},
		{Name: "blk.0.attn_v_b.weight", Type: ggufwrite.F32, Dims: []uint64{lora, v, heads}, Data: ggufwrite.EncodeF32(vb)},
	}
	ws, err := openWriter(t, w).Weights()
	if err != nil {
		t.Fatal(err)
	}
	name := "model.layers.0.self_attn.kv_b_proj.weight"
	if !ws.Has(name) {
		t.Fatal("kv_b_proj not found")
	}
	m, err := ws.Mat(name, heads*(nope+v), lora)
	if err != nil {
		t.Fatal(err)
	}
	if m.DType != kernels.F32 || !slices.Equal(ggufwrite.DecodeF32(m.Data), want) {
		t.Errorf("kv_b_proj %v %v, want %v", m.DType, ggufwrite.DecodeF32(m.Data), want)
	}
	// The halves as stored, per head (Mat.KVB): UK[h] (lora, nope) is
	// W_UK_hᵀ, UV[h] (v, lora) W_UV_h, the same values in their dtypes;
	// a second Mat of the same name has the same parts.
	hs := m.KVB
	if hs == nil || len(hs.UK) != heads || len(hs.UV) != heads {
		t.Fatalf("kv_b_proj's parts: %+v", hs)
	}
	for h := range heads {
		uk, uv := hs.UK[h], hs.UV[h]
		if uk.DType != kernels.F16 || uk.Rows != lora || uk.Cols != nope || uv.DType != kernels.F32 || uv.Rows != v || uv.Cols != lora {
			t.Fatalf("head %d: UK %v %dx%d, UV %v %dx%d", h, uk.DType, uk.Rows, uk.Cols, uv.DType, uv.Rows, uv.Cols)
		}
		row := make([]float32, max(nope, lora))
		for j := range lora {
			uk.RowF32(row[:nope], j)
			for r := range nope {
				if x := want[(h*(nope+v)+r)*lora+j]; row[r] != x {
					t.Errorf("UK[%d][%d][%d] = %g, want %g", h, j, r, row[r], x)
				}
			}
		}
		for r := range v {
			uv.RowF32(row[:lora], r)
			for j := range lora {
				if x := want[(h*(nope+v)+nope+r)*lora+j]; row[j] != x {
					t.Errorf("UV[%d][%d][%d] = %g, want %g", h, r, j, row[j], x)
				}
			}
		}
	}
	if m2, err := ws.Mat(name, heads*(nope+v), lora); err != nil || m2.KVB != hs {
		t.Errorf("a second kv_b_proj: parts %p, want %p (%v)", m2.KVB, hs, err)
	}
	// Halves of one plain type rebuild in it, with no parts.
	w.Tensors[1] = ggufwrite.Tensor{Name: "blk.0.attn_v_b.weight", Type: ggufwrite.F16, Dims: []uint64{lora, v, heads}, Data: weightsF16(vb)}
	ws2, err := openWriter(t, w).Weights()
	if err != nil {
		t.Fatal(err)
	}
	if m, err := ws2.Mat(name, heads*(nope+v), lora); err != nil || m.DType != kernels.F16 || m.KVB != nil {
		t.Errorf("F16 halves: %v, parts %v (%v)", m.DType, m.KVB, err)
	}
	if _, err := ws.Mat(name, heads*(nope+v), lora+1); err == nil {
		t.Error("wrong shape accepted")
	}
}

// weightsF16 encodes float32 values (exact in F16 here) as F16.
func weightsF16(vals []float32) []byte {
	out := make([]byte, 2*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint16(out[2*i:], f16(v))
	}
	return out
}

// f16 converts small integers to IEEE half precision.
func f16(v float32) uint16 {
	if v == 0 {
		return 0
	}
	bits := math.Float32bits(v)
	exp := int(bits>>23&0xff) - 127 + 15
	return uint16(bits>>16&0x8000) | uint16(exp)<<10 | uint16(bits>>13&0x3ff)
}

// TestProblem checks what listing a model says about it.
func TestProblem(t *testing.T) {
	ok := convert(t, "qwen3", func(w *ggufwrite.Writer) { ggufwrite.AddByteTokenizer(w, 512) })
	if p := ok.Problem(); p != "" {
		t.Errorf("a runnable file: %q", p)
	}
	broken := convert(t, "qwen3", func(w *ggufwrite.Writer) {
		ggufwrite.AddByteTokenizer(w, 512)
		w.Set("qwen3.embedding_length", nil)
		w.KV = deleteNil(w.KV)
	})
	if p := broken.Problem(); p != "missing metadata qwen3.embedding_length" {
		t.Errorf("missing metadata: %q", p)
	}
}
