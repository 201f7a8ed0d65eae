// Package llama implements the Llama architecture (model_type "llama"):
// GQA attention with NeoX RoPE (optionally llama3-scaled), optional
// attention and MLP biases, a SwiGLU MLP, and tied or separate embeddings.
package llama

import (
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("llama", New) }

// New builds a Llama model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := transformer.Read(cfg, false)
	if err != nil {
		return nil, err
	}
	attnBias := cfg.BoolOr("attention_bias", false)
	mlpBias := cfg.BoolOr("mlp_bias", false)
	transformer.RequireInter(cfg, p)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	return transformer.Build(w, p, "llama", transformer.AttnOptions{QKVBias: attnBias, OBias: attnBias}, transformer.DenseMLP(p, mlpBias), be)
}
