// Package mla holds the layers shared by the DeepSeek-V3-style
// architectures (deepseek_v32, glm_moe_dsa, glm4_moe_lite): multi-head
// latent attention (MLA) and the DeepSeek Sparse Attention (DSA) lightning
// indexer on the op set (kernels.MLAOps, kernels.SparseOps), and the model
// assembly the architecture packages configure: each is a Spec and an init
// calling Register. Everything else is
// engine/gqa's: the Attention here is a gqa.Mixer inside gqa's pre-norm
// Block, the FFN is gqa's MLP or grouped noaux_tc MoE, the embedding and
// output head are gqa.Decoder's, and the NextN layer is gqa's MTPDecoder.
// The backend must implement both capability interfaces (kernels/cpu and
// kernels/strict do).
//
// # MLA
//
// Per token x (after input_layernorm), with dn = qk_nope_head_dim,
// dr = qk_rope_head_dim, dv = v_head_dim, c = kv_lora_rank:
//
//	q     = q_b_proj(RMSNorm(q_a_proj(x)))          (or q_proj(x) without q-LoRA)
//	q_h   = [q_nope_h (dn) | RoPE(q_pe_h) (dr)]
//	[c̃|k] = kv_a_proj_with_mqa(x);  lat = RMSNorm(c̃);  kpe = RoPE(k)   (one rope key shared by all heads)
//
// The cache keeps only lat and kpe: one K slot of c+dr values per token
// (kvcache.LayerWidth.K), BF16 by default (SetCacheDType(kernels.F32) or
// engine.Options.KVFloat32 for float32); StoreLatent norms, rotates and
// stores them in one op. kv_b_proj, viewed as (heads, dn+dv, c), holds W_UK
// (rows 0..dn) and W_UV (rows dn..). AttentionMLA computes one of two
// mathematically equal forms, which the backend chooses per sequence from
// the chunk's length and context by comparing their multiply-adds
// (kernels.MLAAuto; SetForm forces one):
//
//   - naive (prefill): expand the cached latents into per-head keys
//     [W_UK·lat | kpe] and values W_UV·lat, tile by tile over the context,
//     and run an online softmax; cheaper when many queries share the keys;
//   - absorbed (decode): fold W_UK into the query (q̃ = W_UKᵀ q_nope), score
//     q̃·lat + q_pe·kpe directly against the cached slot, average the latents
//     and apply W_UV once per head; cheaper for a few queries.
//
// The softmax scale is (dn+dr)^-½, times mscale² for YaRN
// (mscale = 0.1·mscale_all_dim·ln(factor) + 1). The q/kv latent norms use eps
// 1e-6 whatever rms_norm_eps says (transformers builds them without an eps).
// MLA RoPE rotates interleaved pairs (2i, 2i+1) of the last dr dims
// (rope_interleave), or half-split pairs when a glm4_moe_lite config turns it
// off; transformers de-interleaves its output, which permutes q and k alike
// and leaves every score unchanged.
//
// # DSA lightning indexer
//
// A DSA layer restricts each query's attention to index_topk cached
// positions chosen by its indexer (StoreIndexKey, IndexerScores, TopK; the
// selection is an (N, index_topk) I32 tensor AttentionMLA reads):
//
//	k_s   = RoPE(LayerNorm(wk(x_s)))                       cached in the layer's V slot (index_head_dim)
//	q_t,j = RoPE(wq_b(q_resid_t))_j                        j < index_n_heads; q_resid = RMSNorm(q_a_proj(x))
//	w_t,j = weights_proj(x_t)_j · index_n_heads^-½
//	I_t,s = Σ_j w_t,j · ReLU(index_head_dim^-½ · q_t,j·k_s)     for s ≤ t
//
// RoPE covers the first qk_rope_head_dim index dims: half-split for
// DeepSeek-V3.2, interleaved for GLM-5. Query t attends to the top
// min(index_topk, t+1) positions by I (causal positions only, so the
// selection is causal by construction); when t+1 ≤ index_topk that is every
// visible position and no score is computed, and a step whose rows all
// are so attends densely without a selection. The index keys share the
// cache's dtype (BF16 by default). Rounding anything upstream of an indexer
// can flip near-tied top-k choices, which on the random-weight transformers
// fixtures changes the greedy tokens: they are checked exactly with a
// float32 cache, and with BF16 flip by flip (Indexer.Scores,
// Attention.Selection; engine's dsaMarginFixture). A GLM-5 "shared" layer
// (indexer_types) has no indexer and reuses the selection of the nearest
// earlier full layer in the same forward pass.
//
// # NextN
//
// The DeepSeek/GLM MTP layer model.layers.{num_hidden_layers} runs
// x = eh_proj([enorm(embed(tok_{p+1})) | hnorm(h_p)]), one full decoder block
// at position p with its own cache layer (and its own indexer in DSA
// models), then shared_head.head(shared_head.norm(x)) (gqa.LoadNextN,
// gqa.MTPDecoder). Its cache is the extra last entry of the model's
// kvcache.Layout.
package mla
