package mixtral_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	_ "github.com/ferrite-llm/ferrite/engine/models/mixtral"
	"github.com/ferrite-llm/ferrite/kernels"
)

const tiny = `{
  "model_type": "mixtral", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
  "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": null,
  "vocab_size": 71, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
  "rope_theta": 1000000.0, "tie_word_embeddings": false
}`

func TestConformance(t *testing.T) {
	t.Run("v5-fused", func(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.F32, nil) })
	// Transformers 4 names: block_sparse_moe.experts.{e}.w1/w3/w2.
	v4 := func(name string) bool { return strings.Contains(name, ".mlp.") }
	t.Run("v4-names", func(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.BF16, v4) })
}
