// Package glm4moelite implements GLM-4.7-Flash (model_type
// "glm4_moe_lite"): multi-head latent attention without DSA (q-LoRA,
// kv_a_proj_with_mqa → [latent | k_pe], kv_b_proj; RoPE on the last
// qk_rope_head_dim dims of each head, interleaved unless rope_interleave is
// false), dense SwiGLU MLPs where mlp_layer_types says "dense" (the first
// layer by default) and DeepSeek-V3 noaux_tc MoE elsewhere (sigmoid scores,
// e_score_correction_bias for selection only, renormalised weights ×
// routed_scaling_factor, shared experts), and the NextN MTP layer
// model.layers.{num_hidden_layers} (model.MTPModel). The layers live in
// engine/models/mla; the cache holds kv_lora_rank + qk_rope_head_dim values
// per token and layer.
package glm4moelite

import "github.com/ferrite-llm/ferrite/engine/models/mla"

func init() { mla.Register(spec) }

// spec is GLM-4.7-Flash's fixed choices.
var spec = mla.Spec{
	Arch:              "glm4_moe_lite",
	RopeInterleaveKey: true,
	FirstDense:        1, // mlp_layer_types defaults to ["dense"] + ["sparse"]*(L-1)
}
