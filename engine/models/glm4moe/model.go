// Package glm4moe implements GLM-4.5/4.6/4.7 (model_type "glm4_moe"): GQA
// attention with q/k/v biases, optional per-head QK norm (use_qk_norm) and
// partial NeoX RoPE (partial_rotary_factor, 0.5 by default) on the first
// dims of each head; dense SwiGLU MLPs on the first first_k_dense_replace
// layers and DeepSeek-V3 noaux_tc MoE elsewhere — sigmoid scores, the
// e_score_correction_bias for selection only, grouped top-k, renormalised
// weights times routed_scaling_factor — plus always-on shared experts.
// The NextN MTP layer (model.layers.{num_hidden_layers}) is loaded when
// num_nextn_predict_layers ≥ 1 and the checkpoint has it (see mtp.go).
package glm4moe

import (
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("glm4_moe", New) }

// New builds a GLM-4.5-family MoE model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := transformer.Read(cfg, false)
	if err != nil {
		return nil, err
	}
	if !cfg.RopeHas("partial_rotary_factor") {
		p.Rope.PartialRotaryFactor = 0.5 // Glm4MoeConfig's default
	}
	bias := cfg.BoolOr("attention_bias", false)
	qkNorm := cfg.BoolOr("use_qk_norm", false)
	shape := nn.GroupedMoEShape{
		Experts:    cfg.IntOr("n_routed_experts", 128),
		Shared:     cfg.IntOr("n_shared_experts", 1),
		TopK:       cfg.IntOr("num_experts_per_tok", 8),
		Inter:      cfg.IntOr("moe_intermediate_size", 1408),
		Groups:     cfg.IntOr("n_group", 1),
		TopKGroups: cfg.IntOr("topk_group", 1),
	}
	scale := cfg.FloatOr("routed_scaling_factor", 1)
	normTopK := cfg.BoolOr("norm_topk_prob", true)
	firstDense := cfg.IntOr("first_k_dense_replace", 1)
	if err := cfg.Err(); err != nil {
		return nil, err
	}
	if err := shape.Check(); err != nil {
		return nil, err
	}
	ffn := func(l *nn.Loader, i int) nn.FFN {
		pre := transformer.FFNPrefix(i)
		if i < firstDense {
			return l.MLP(pre, nn.HFNames, p.Hidden, p.Inter, false)
		}
		return l.GroupedMoE(pre, shape, p.Hidden, normTopK, float32(scale))
	}
	// block loads model.layers.{i}; i = num_hidden_layers is the MTP layer's.
	l, block, err := transformer.Blocks(w, p, transformer.AttnOptions{QKVBias: bias, QKNorm: qkNorm}, ffn)
	if err != nil {
		return nil, err
	}
	layers := make([]*nn.Block, p.Layers)
	for i := range layers {
		layers[i] = block(i)
	}
	return newModel(cfg, l, p, layers, block, be)
}
