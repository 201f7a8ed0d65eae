package nn

// FFN is a feed-forward block's weights as loaded: *MLP (dense) or *MoE
// (sparse); engine/gqa's Uploader converts it for the op set.
type FFN interface{ ffn() }

func (*MLP) ffn() {}
func (*MoE) ffn() {}

// SelfAttention is a GQA attention block's weights as loaded: q/k/v
// projections, optional per-head QK norm, RoPE on the first Rope.Dim dims
// of every head, the attention shape and the output projection. engine/gqa
// runs it on the op set.
type SelfAttention struct {
	Q     *Linear  // (heads·headDim, hidden)
	K     *Linear  // (kvHeads·headDim, hidden)
	V     *Linear  // (kvHeads·headDim, hidden)
	O     *Linear  // (hidden, heads·headDim)
	QNorm *RMSNorm // (headDim) applied per head before RoPE; nil when absent
	KNorm *RMSNorm // (headDim); nil when absent
	Rope  *RoPE    // nil for no rotary embedding
	Attn  *Attention
}

// Block is a pre-norm decoder layer's weights as loaded,
// x += Attn(AttnNorm(x)); x += FFN(FFNNorm(x)); engine/gqa runs it.
type Block struct {
	AttnNorm *RMSNorm // (hidden) input_layernorm
	Attn     *SelfAttention
	FFNNorm  *RMSNorm // (hidden) post_attention_layernorm
	FFN      FFN
}
