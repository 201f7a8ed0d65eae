package nn

import (
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Ctx is what a layer needs during one forward pass: the backend, the cache
// storage, the batch's row → sequence map and scratch space.
type Ctx struct {
	Backend kernels.Backend
	Cache   *kvcache.Cache
	Tok     Tokens
	Arena   Arena
}

// N is the number of rows (tokens) in the pass.
func (c *Ctx) N() int { return c.Tok.N() }

// FFN is a feed-forward block: MLP (dense) or MoE (sparse).
type FFN interface {
	// Forward sets y (n, hidden) = FFN(x (n, hidden)).
	Forward(be kernels.Backend, a *Arena, y, x []float32, n int)
}

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
