// Package deepseekv32 implements DeepSeek-V3.2 (model_type
// "deepseek_v32"): multi-head latent attention with the DSA lightning
// indexer on every layer (layer_types "deepseek_sparse_attention"): the
// indexer's half-split (NeoX) RoPE covers the first qk_rope_head_dim index
// dims, MLA's interleaved RoPE the last qk_rope_head_dim dims of each head,
// both with YaRN frequencies and MLA's softmax scale × mscale²; dense SwiGLU
// MLPs on the first first_k_dense_replace layers (or per mlp_layer_types),
// noaux_tc MoE with grouped top-k (n_group / topk_group, masked groups at
// −inf) elsewhere; and the NextN MTP layer with its own indexer
// (model.MTPModel). The layers live in engine/models/mla; the cache holds
// kv_lora_rank + qk_rope_head_dim values per token and layer, plus the
// index_head_dim index key.
package deepseekv32

import "github.com/ferrite-llm/ferrite/engine/models/mla"

func init() { mla.Register(spec) }

// spec is DeepSeek-V3.2's fixed choices.
var spec = mla.Spec{
	Arch:       "deepseek_v32",
	DSA:        true,
	FirstDense: 3, // DeepseekV32Config's first_k_dense_replace default
}
