// Package qwen3next implements Qwen3-Next (model_type "qwen3_next"), a hybrid
// of Gated DeltaNet linear attention and gated full attention with sparse
// MoE feed-forward blocks and a multi-token-prediction (MTP) head.
//
// Layer schedule. Layer i is "linear_attention" or "full_attention" as
// config.json's layer_types says, or, without it, full attention iff
// (i+1) % full_attention_interval == 0 (default 4). Its FFN is a sparse MoE
// iff i ∉ mlp_only_layers, num_experts > 0 and (i+1) % decoder_sparse_step
// == 0, and a dense SwiGLU MLP (intermediate_size) otherwise. Every layer is
// pre-norm with a plain residual:
//
//	h = x + Mixer(input_layernorm(x));  y = h + FFN(post_attention_layernorm(h))
//
// and the stack ends with model.norm and lm_head. Every RMSNorm of the model
// is zero-centred, y = (1 + w) ⊙ rmsnorm(x) — input/post-attention norms,
// the final norm, q_norm/k_norm and all MTP norms — except the gated norm at
// the output of the GatedDeltaNet, which multiplies by a plain w.
//
// The model runs on the op set: a gqa.Decoder whose blocks' mixers are
// gqa.LinearAttention (the delta rule, kernels.LinearAttentionOps) or a
// gated gqa.Attention, with the MTP layer as a gqa.NextN.
//
// Gated DeltaNet (linear_attn.*). in_proj_qkvz and in_proj_ba are grouped
// per key head: row block g of in_proj_qkvz is [q dk | k dk | v r·dv |
// z r·dv] and of in_proj_ba [b r | a r], with r = Hv/Hk value heads per key
// head (value head j belongs to key head j/r); their rows are rearranged at
// load into the [q | k | v], z, b and a projections. The [q|k|v] channels go
// through a causal depthwise convolution (kernel K, no bias) and SiLU; q and
// k are L2-normalised (q then scaled by dk^-½); β = sigmoid(b) and the log
// decay g = −exp(A_log)·softplus(a + dt_bias) drive the gated delta rule,
// chunkwise for prompt chunks and recurrent for a few tokens, always
// continuing from the sequence's state; the output is
// w ⊙ rmsnorm(o) ⊙ silu(z) per value head, then out_proj. The rule's state
// S [Hv, dk, dv] and the last K−1 raw conv inputs [K−1, conv_dim] of every
// linear layer live in the sequence's linattn.Slot (Seq.State) of a state
// pool in the model's device memory (model.NewStatePool); the model
// reports their shapes through StateLayout and their size in
// Info().StateBytesPerSeq. A chunk at Pos 0 starts from a zeroed state.
//
// Gated attention (self_attn.*). q_proj yields, per head, the query and an
// output gate ([q headDim | gate headDim], interleaved per head, split at
// load); q and k get the per-head zero-centred QK norm, then NeoX RoPE on
// the first
// head_dim·partial_rotary_factor dims (0.25 by default); causal GQA softmax
// attention over the paged KV cache; the attention output is multiplied by
// sigmoid(gate) before o_proj. Only these layers (and the MTP layer) take
// KV-cache space: CacheLayout has a zero-width entry for each linear layer.
//
// MoE (mlp.*): softmax router, top num_experts_per_tok, renormalised when
// norm_topk_prob, plus the shared expert scaled by
// sigmoid(shared_expert_gate(x)).
//
// MTP (mtp.*, when the checkpoint has mtp.fc.weight and
// mtp_num_hidden_layers > 0): for the main model's post-final-norm hidden h_p
// and the token at p+1,
//
//	x = fc([pre_fc_norm_embedding(embed(tok_{p+1})) | pre_fc_norm_hidden(h_p)])
//	x = mtp.layers.0(x)   at position p, full attention with its own KV cache
//	logits = lm_head(mtp.norm(x))
//
// The MTP layer's KV cache is the last entry of CacheLayout (index
// Info().Layers). A model loaded with an MTP head implements
// model.MTPModel; one without does not.
package qwen3next
