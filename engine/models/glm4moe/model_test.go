package glm4moe_test

import (
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	_ "github.com/ferrite-llm/ferrite/engine/models/glm4moe"
	"github.com/ferrite-llm/ferrite/kernels"
)

// tiny has one dense layer, grouped noaux_tc routing, a shared expert,
// QK norm and partial RoPE (the 0.5 default).
const tiny = `{
  "model_type": "glm4_moe", "hidden_size": 32, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
  "moe_intermediate_size": 8, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
  "norm_topk_prob": true, "first_k_dense_replace": 1, "attention_bias": true, "use_qk_norm": true,
  "vocab_size": 83, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false
}`

func TestConformance(t *testing.T) {
	modeltest.RunDevices(t, tiny, kernels.BF16, nil)
}
