package qwen3moe_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3moe"
	"github.com/ferrite-llm/ferrite/kernels"
)

// tiny has a dense layer (mlp_only_layers) between sparse ones.
const tiny = `{
  "model_type": "qwen3_moe", "hidden_size": 32, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
  "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 3,
  "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": true,
  "vocab_size": 89, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": false
}`

func TestConformance(t *testing.T) {
	t.Run("fused", func(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.F32, nil) })
	perExpert := func(name string) bool { return strings.HasSuffix(name, "gate_up_proj") }
	t.Run("per-expert", func(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.BF16, perExpert) })
}
