package llama_test

import (
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	_ "github.com/ferrite-llm/ferrite/engine/models/llama"
	"github.com/ferrite-llm/ferrite/kernels"
)

const tiny = `{
  "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
  "vocab_size": 97, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false
}`

// tinyScaled has llama3 RoPE scaling, biases, tied embeddings and a head_dim
// that is not hidden/heads.
const tinyScaled = `{
  "model_type": "llama", "hidden_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 80,
  "vocab_size": 61, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
  "attention_bias": true, "mlp_bias": true, "tie_word_embeddings": true,
  "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
}`

func TestConformance(t *testing.T) {
	t.Run("f32", func(t *testing.T) { modeltest.RunDevices(t, tiny, kernels.F32, nil) })
	t.Run("bf16-scaled", func(t *testing.T) { modeltest.RunDevices(t, tinyScaled, kernels.BF16, nil) })
}
