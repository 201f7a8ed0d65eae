package qwen3_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3"
	"github.com/ferrite-llm/ferrite/kernels"
)

// tiny has an explicit head_dim larger than hidden/heads, as Qwen3 does.
const tiny = `{
  "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
  "vocab_size": 101, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": true, "attention_bias": false
}`

func TestConformance(t *testing.T) {
	modeltest.RunDevices(t, tiny, kernels.BF16, nil)
}

func TestMissingTensor(t *testing.T) {
	m := func(name string) bool { return name == "model.layers.2.self_attn.k_norm.weight" }
	_, err := modeltest.TryBuild(tiny, kernels.F32, m)
	if err == nil || !strings.Contains(err.Error(), "model.layers.2.self_attn.k_norm.weight") {
		t.Fatalf("missing k_norm: error %v", err)
	}
}
