package mla_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/deepseekv32"
	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moelite"
	_ "github.com/ferrite-llm/ferrite/engine/models/glmmoedsa"
	"github.com/ferrite-llm/ferrite/engine/models/mla"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// Tiny random-weight configs. The DSA ones keep index_topk (5) below the
// conformance suite's prompt (23 tokens), so most queries attend to a
// subset; glm_moe_dsa has a shared layer; the lite one has no q-LoRA.
const (
	dsv32 = `{
  "model_type": "deepseek_v32", "hidden_size": 32, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 24,
  "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "intermediate_size": 48,
  "moe_intermediate_size": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
  "index_n_heads": 4, "index_head_dim": 8, "index_topk": 5,
  "vocab_size": 83, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
    "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0},
  "num_nextn_predict_layers": 1
}`
	glm5 = `{
  "model_type": "glm_moe_dsa", "hidden_size": 32, "num_hidden_layers": 4,
  "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
  "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48,
  "moe_intermediate_size": 8, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 2.5, "first_k_dense_replace": 2,
  "index_n_heads": 2, "index_head_dim": 8, "index_topk": 5, "index_topk_freq": 2, "index_skip_topk_offset": 2,
  "vocab_size": 83, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}
}`
	lite = `{
  "model_type": "glm4_moe_lite", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null, "kv_lora_rank": 16,
  "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48,
  "moe_intermediate_size": 8, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 1.8, "mlp_layer_types": ["sparse", "dense"], "rope_interleave": false,
  "vocab_size": 83, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "num_nextn_predict_layers": 1
}`
)

type mlaModel interface {
	model.DeviceModel
	Attention(int) *mla.Attention
	SetForm(kernels.MLAForm)
}

func build(t *testing.T, be kernels.Backend, cfg string) mlaModel {
	t.Helper()
	return buildAs(t, be, cfg, kernels.BF16)
}

// buildAs is build with weights of dtype dt.
func buildAs(t *testing.T, be kernels.Backend, cfg string, dt kernels.DType) mlaModel {
	t.Helper()
	m, ok := modeltest.BuildOn(t, be, cfg, dt, nil).(mlaModel)
	if !ok {
		t.Fatal("not an MLA model")
	}
	return m
}

// TestConformance runs the engine's random-weight suite (incremental
// decode, chunked prefill, mixed batches, fork and rollback) on the CPU in
// every form, on the strict backend and (FERRITE_TEST_DEVICE) the device,
// with BF16 and F32 caches (the BF16 ones within modeltest.BF16KVTol). The
// device gets F32 weights: for a bf16 weight the GPU's Linear multiplies 2
// to 255 rows by x split into two bf16 terms (within 2⁻¹⁷·Σ|x·w|) and one
// row in float32, so its prefill and decode logits would differ by about
// 3e-5, past Tol (seen on the CPU with the one-row products perturbed that
// much), while F32 weights take the float32 GEMV at every row count and
// leave the MLA and DSA ops the only difference.
func TestConformance(t *testing.T) {
	for name, cfg := range map[string]string{"deepseek_v32": dsv32, "glm_moe_dsa": glm5, "glm4_moe_lite": lite} {
		for dev, newBackend := range modeltest.Devices() {
			forms := []kernels.MLAForm{kernels.MLAAuto, kernels.MLANaive, kernels.MLAAbsorbed}
			if dev != "cpu" {
				forms = forms[:1] // the strict backend computes one reference
			}
			for _, kv := range []kernels.DType{kernels.BF16, kernels.F32} {
				be, err := newBackend()
				if err != nil {
					t.Fatal(err)
				}
				wdt := kernels.BF16
				if dev == "device" {
					wdt = kernels.F32
				}
				m := buildAs(t, be, cfg, wdt)
				if err := m.SetCacheDType(kv); err != nil {
					t.Fatal(err)
				}
				ran := false // not filtered out by -test.run
				for _, f := range forms {
					t.Run(fmt.Sprintf("%s/%s/kv=%v/form=%d", name, dev, kv, f), func(t *testing.T) {
						ran = true
						m.SetForm(f)
						defer m.SetForm(kernels.MLAAuto)
						tol := modeltest.Tol
						if kv == kernels.BF16 {
							tol = modeltest.BF16KVTol
						}
						modeltest.RunTol(t, m, tol)
					})
				}
				if s, ok := be.(*strict.Device); ok && ran && s.Steps() == 0 {
					t.Fatal("the strict backend ran no step")
				}
			}
		}
	}
}

// TestLayout checks the per-layer cache widths: latent + rope key, plus the
// index key on layers with their own indexer (not on shared ones), and the
// NextN layer last.
func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		cfg  string
		want kvcache.Layout
	}{
		{dsv32, kvcache.Layout{{K: 28, V: 8}, {K: 28, V: 8}, {K: 28, V: 8}, {K: 28, V: 8}}},
		{glm5, kvcache.Layout{{K: 20, V: 8}, {K: 20, V: 8}, {K: 20}, {K: 20, V: 8}}},
		{lite, kvcache.Layout{{K: 20}, {K: 20}, {K: 20}}},
	} {
		m := build(t, cpu.New(1), tc.cfg)
		for _, kv := range []kernels.DType{kernels.BF16, kernels.F32} {
			if err := m.SetCacheDType(kv); err != nil {
				t.Fatal(err)
			}
			got := m.CacheLayout()
			for i := range got {
				if got[i].K != tc.want[i].K || got[i].V != tc.want[i].V || got[i].DType != kv || len(got) != len(tc.want) {
					t.Fatalf("%s: layout %v, want %v in %v", m.Info().Arch, got, tc.want, kv)
				}
			}
			if b, want := m.Info().KVBytesPerToken, tc.want.BytesPerToken()*int64(kv.Size())/4; b != want {
				t.Errorf("%s: KVBytesPerToken %d in %v, want %d", m.Info().Arch, b, kv, want)
			}
		}
		_, isMTP := m.(model.MTPModel)
		if wantMTP := len(tc.want) > m.Info().Layers; isMTP != wantMTP {
			t.Errorf("%s: MTP model %v, want %v", m.Info().Arch, isMTP, wantMTP)
		}
	}
}

// TestSharedIndexer checks GLM-5's schedule: with freq 2 and offset 2,
// layer 2 is shared and reuses layer 1's selection.
func TestSharedIndexer(t *testing.T) {
	m := build(t, cpu.New(1), glm5)
	for i, want := range []int{-1, -1, 1, -1} {
		a := m.Attention(i)
		switch {
		case want < 0 && (a.Indexer == nil || a.Share != nil):
			t.Errorf("layer %d: want a full indexer", i)
		case want >= 0 && (a.Indexer != nil || a.Share != m.Attention(want)):
			t.Errorf("layer %d: want shared with layer %d", i, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ cfg, edit, want string }{
		{dsv32, `"q_lora_rank": 16`, "q_lora_rank"},
		{dsv32, `"index_topk": 5`, "index_topk"},
		{glm5, `"index_topk_freq": 2`, "indexer_types"},
		{lite, `"mlp_layer_types": ["sparse", "dense"]`, "mlp_layer_types"},
		{dsv32, `"qk_rope_head_dim": 4`, "qk_rope_head_dim"},
	} {
		var bad string
		switch tc.want {
		case "q_lora_rank":
			bad = strings.Replace(tc.cfg, tc.edit, `"q_lora_rank": null`, 1)
		case "index_topk":
			bad = strings.Replace(tc.cfg, tc.edit, `"index_topk": 0`, 1)
		case "indexer_types":
			bad = strings.Replace(tc.cfg, tc.edit, `"indexer_types": ["shared", "full", "full", "full"]`, 1)
		case "mlp_layer_types":
			bad = strings.Replace(tc.cfg, tc.edit, `"mlp_layer_types": ["sparse"]`, 1)
		case "qk_rope_head_dim":
			bad = strings.Replace(tc.cfg, tc.edit, `"qk_rope_head_dim": 3`, 1)
		}
		if bad == tc.cfg {
			t.Fatalf("edit %q not applied", tc.edit)
		}
		_, err := modeltest.TryBuild(bad, kernels.F32, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.edit, err, tc.want)
		}
	}
}

func TestMissingTensor(t *testing.T) {
	const name = "model.layers.1.self_attn.indexer.k_norm.bias"
	_, err := modeltest.TryBuild(dsv32, kernels.F32, func(n string) bool { return n == name })
	if err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("missing %s: error %v", name, err)
	}
}
