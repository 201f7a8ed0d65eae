// Package qwen3 implements dense Qwen3 (model_type "qwen3"): Llama-style
// GQA with an explicit head_dim and per-head RMSNorm on q and k (q_norm,
// k_norm) applied before RoPE.
package qwen3

import (
	"errors"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("qwen3", New) }

// New builds a Qwen3 model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := transformer.Read(cfg, false)
	if err != nil {
		return nil, err
	}
	bias := cfg.BoolOr("attention_bias", false)
	sliding := cfg.BoolOr("use_sliding_window", false)
	transformer.RequireInter(cfg, p)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	if sliding {
		return nil, errors.New("use_sliding_window: sliding-window attention is not supported")
	}
	return transformer.Build(w, p, "qwen3", transformer.AttnOptions{QKVBias: bias, OBias: bias, QKNorm: true}, transformer.DenseMLP(p, false), be)
}
