// Package glm5next implements GLM-5.3-Flash (model_type "glm5_next"): a
// hybrid of Kimi Delta Attention (KDA) linear layers and NoPE MLA layers
// with a k-pool DSA indexer, with manifold-constrained hyper-connection
// (mHC) residual streams, dense and MoE clamped-SwiGLU FFNs and a NextN
// multi-token-prediction (MTP) layer. It follows transformers 5.17
// (Glm5NextTextModel; testdata/models/README.md lists where that differs
// from shared/reference/hybrid-arch-spec.md).
//
// Checkpoints. Both the vision-language checkpoint (Glm5NextForConditional
// Generation: text_config nested in config.json, which engine/config merges
// so the text model's model_type is "glm5_next_text"; text weights under
// model.language_model.) and a flat text checkpoint (model_type "glm5_next"
// or "glm5_next_text", weights under model.) load; lm_head.weight is at the
// top in both. Only the text model is served: the vision tower
// (model.visual.*, vision_config) is ignored and image/video inputs are not
// supported. Tensor names are the hub checkpoint's (hc_attn_fn,
// {q,k,v}_conv1d, forget gate without a prefix); transformers' in-memory KDA
// names (conv1d, forget_gate.*) are accepted too, and experts may be fused
// (experts.gate_up_proj / experts.down_proj) or per expert.
//
// Layer schedule. layer_types[i] is "linear_attention" (KDA) or
// "deepseek_sparse_attention" ("full_attention" is an alias);
// mlp_layer_types[i] "dense" or "sparse"; indexer_types[i] "full" or
// "shared" (a shared DSA layer reuses the selection of the DSA layer just
// before it, which transformers requires to be a full one). The defaults are
// transformers': DSA at i % 4 == 3, dense for the first three layers, all
// indexers full.
//
// The model runs on the op set (kernels.Device plus MLAOps, KPoolOps,
// LinearAttentionOps, HyperOps and ClampOps; engine/gqa's step inputs,
// output head, FFNs and MTP decoder): activations, the KV cache and the
// recurrent states live in the backend's memory.
//
// Residual streams (mHC). The embedding is copied into hc_mult streams
// X [hc, hidden] (kernels.HyperOps). Each layer has two hyper-connection sites, around the
// mixer and around the FFN, each with its own (fn, base, scale):
//
//	r = rsqrt(mean(vec(X)²) + eps);  mix = (vec(X)·r)·fnᵀ   split [pre n | post n | comb n·n]
//	pre = sigmoid(·scale₀ + base) + hc_eps;  post = 2·sigmoid(·scale₁ + base)
//	comb = Sinkhorn(·scale₂ + base): row softmax + hc_eps, then column/row
//	       normalisations (denominators + hc_eps), hc_sinkhorn_iters in all, ending on columns
//	X'[j] = post[j]·Sublayer(norm(Σ_i pre[i]·X[i])) + Σ_i comb[i][j]·X[i]
//
// in float32 with float64 sums. The stack ends with the unweighted mean of
// the streams, model.norm and lm_head.
//
// KDA (self_attn.* of linear layers): q/k/v projections, three causal
// depthwise convolutions (kernel linear_conv_kernel_dim, SiLU) with a
// rolling state, the per-channel forget gate g = lower·sigmoid(exp(A_log)·
// (f_b(f_a(x)) + dt_bias)) (Kimi's −exp(A_log)·softplus(·) when
// linear_lower_bound is null), β = sigmoid(b_proj x), L2-normalised q
// (× dk^-½) and k, the gated delta rule with per-channel decay
// (kernels.LinearAttentionOps: chunkwise for prompt chunks, recurrent for a
// few tokens, always continuing from the sequence's state), and
// o_proj(o_norm(o) ⊙ sigmoid(g_b(g_a(x)))). The rule's state S [heads, dk,
// dk] and the conv state [K−1, 3·heads·dk] of each KDA layer live in the
// sequence's row of a device state pool (model.NewStatePool), shaped by
// StateLayout. A chunk at Pos 0 starts from a zeroed state.
//
// DSA (self_attn.* of sparse layers): MLA with q LoRA and no RoPE
// (qk_rope_head_dim must be 0), scale qk_nope_head_dim^-½, over the cached
// normed latent (kernels.MLAOps; the backend picks the naive or absorbed
// form). The k-pool indexer (kernels.KPoolOps) caches k_t =
// LayerNorm(wk x_t) and γ_t = x_t·index_kpool_compress_gateᵀ per token
// (x = the layer input after input_layernorm). Pools are index_kpool tokens
// from position 0; a complete pool's key (a per-channel softmax of γ + ape
// over the members weighting k) is computed once, by the pass that stores
// its last token, and kept in that token's slot in place of its raw k/γ
// (a rollback or fork into the pool rewrites that token, so the pool is
// rebuilt). Query t scores the complete pools whose last token is ≤ t,
// keeps the best min(index_topk/index_kpool, #candidates) (ties to the lower
// pool) and, with index_kpool_always_select_tail, adds the incomplete tail
// pool's tokens [t+1−(t+1) mod kpool, t]. Attention runs over exactly those
// tokens: as in transformers there is no other causal mask, so a token that
// closes a pool that is not kept does not attend to itself. (With the tail
// option off, a query before the first complete pool attends to nothing and
// its attention output is zero, where transformers' eager attention would
// average every token of its cache. Released checkpoints set the option.)
//
// Cache. CacheLayout has, per layer, zero width for KDA; K = kv_lora_rank
// (latent) and V = 2·index_head_dim ([k_t | γ_t], or the pool key in a
// pool's last token) for a DSA layer (V = 0 for a shared one); the MTP
// layer follows as one more DSA entry when loaded. The latents are BF16 by
// default (SetCacheDType), the indexer data always F32 (rounding them flips
// near-tied pool selections). Info().KVBytesPerToken is the layout's size,
// and Info().StateBytesPerSeq the KDA slot size.
//
// FFN: clamped SwiGLU everywhere (dense MLP, routed experts, shared
// expert): silu(min(gate, L))·clamp(up, −L, L) with L = swiglu_limit. MoE:
// DeepSeek-V3 noaux_tc routing (sigmoid scores, e_score_correction_bias for
// selection, group masking with −inf, renormalised × routed_scaling_factor)
// plus shared experts of width moe_intermediate_size·n_shared_experts.
//
// MTP (layers.{num_hidden_layers}.*, when num_nextn_predict_layers > 0 and
// the checkpoint has eh_proj): a plain residual block without
// hyper-connections, x = eh_proj([enorm(embed(tok_{p+1})) | hnorm(h_p)]),
// NoPE MLA with its own k-pool indexer and cache, the MoE, and
// shared_head.head(shared_head.norm(x)), run by engine/gqa's MTP decoder
// with the DSA layer as its block's mixer. h_p is the main model's
// post-final-norm hidden (Seq.Hidden of Forward). A model loaded with it
// implements model.MTPModel.
package glm5next
