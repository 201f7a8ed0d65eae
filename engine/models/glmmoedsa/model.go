// Package glmmoedsa implements GLM-5 (model_type "glm_moe_dsa"): the
// DeepSeek-V3.2 design — multi-head latent attention, the DSA lightning
// indexer, noaux_tc MoE after the first first_k_dense_replace dense layers,
// a NextN MTP layer with its own indexer (model.MTPModel) — with two GLM-5
// differences: the indexer's RoPE rotates interleaved pairs, and the
// IndexCache schedule (indexer_types, else index_topk_pattern, else
// index_topk_freq / index_skip_topk_offset: full iff
// max(i − offset + 1, 0) mod freq = 0) marks "shared" layers that have no
// indexer weights and reuse the top-k of the previous full layer in the same
// forward pass (runs of shared layers chain). The layers live in
// engine/models/mla; only full layers cache an index key.
package glmmoedsa

import "github.com/ferrite-llm/ferrite/engine/models/mla"

func init() { mla.Register(spec) }

// spec is GLM-5's fixed choices.
var spec = mla.Spec{
	Arch:               "glm_moe_dsa",
	DSA:                true,
	IndexerInterleaved: true,
	SharedIndexers:     true,
	FirstDense:         3, // GlmMoeDsaConfig's first_k_dense_replace default
}
