// Package qwen3moe implements Qwen3-MoE (model_type "qwen3_moe"): Qwen3
// attention (QK norm, explicit head_dim) with sparse MoE FFNs — a softmax
// router over num_experts experts, top num_experts_per_tok, renormalised
// when norm_topk_prob — on the layers selected by decoder_sparse_step and
// mlp_only_layers, and dense SwiGLU MLPs elsewhere.
package qwen3moe

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("qwen3_moe", New) }

// New builds a Qwen3-MoE model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := transformer.Read(cfg, false)
	if err != nil {
		return nil, err
	}
	bias := cfg.BoolOr("attention_bias", false)
	sliding := cfg.BoolOr("use_sliding_window", false)
	// Hub checkpoints spell it num_experts; Transformers 5 saves num_local_experts.
	expertsKey := "num_experts"
	if !cfg.Has(expertsKey) && cfg.Has("num_local_experts") {
		expertsKey = "num_local_experts"
	}
	experts := cfg.Int(expertsKey)
	topK := cfg.Int("num_experts_per_tok")
	moeInter := cfg.Int("moe_intermediate_size")
	step := cfg.IntOr("decoder_sparse_step", 1)
	normTopK := cfg.BoolOr("norm_topk_prob", false)
	var mlpOnly []int
	if cfg.Has("mlp_only_layers") {
		mlpOnly = cfg.Ints("mlp_only_layers")
	}
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	switch {
	case sliding:
		return nil, errors.New("use_sliding_window: sliding-window attention is not supported")
	case experts > 0 && (topK <= 0 || topK > experts || moeInter <= 0 || step <= 0):
		return nil, fmt.Errorf("bad MoE shape: %s %d, num_experts_per_tok %d, moe_intermediate_size %d, decoder_sparse_step %d",
			expertsKey, experts, topK, moeInter, step)
	}
	ffn := func(l *nn.Loader, i int) nn.FFN {
		pre := transformer.FFNPrefix(i)
		if !slices.Contains(mlpOnly, i) && experts > 0 && (i+1)%step == 0 {
			return l.SoftmaxMoE(pre, nn.HFNames, experts, topK, normTopK, p.Hidden, moeInter)
		}
		if p.Inter <= 0 {
			l.Failf("layer %d is dense but intermediate_size is %d", i, p.Inter)
		}
		return l.MLP(pre, nn.HFNames, p.Hidden, p.Inter, false)
	}
	return transformer.Build(w, p, "qwen3_moe", transformer.AttnOptions{QKVBias: bias, OBias: bias, QKNorm: true}, ffn, be)
}
