package nn

import "math"

// Attention is a causal grouped-query attention layer's shape: query head
// h reads K/V head h/(Heads/KVHeads); the layer's cache slot per token is K
// (KVHeads·HeadDim) and V (KVHeads·HeadDim). kernels.AttentionOps runs it.
type Attention struct {
	Layer   int     // cache layer index
	Heads   int     // query heads
	KVHeads int     // key/value heads (divides Heads)
	HeadDim int     // per-head dimension of q, k and v
	Scale   float32 // softmax scale, usually HeadDim^-½
}

// NewAttention returns a GQA attention with the standard 1/√headDim scale.
func NewAttention(layer, heads, kvHeads, headDim int) *Attention {
	return &Attention{
		Layer: layer, Heads: heads, KVHeads: kvHeads, HeadDim: headDim,
		Scale: float32(1 / math.Sqrt(float64(headDim))),
	}
}
