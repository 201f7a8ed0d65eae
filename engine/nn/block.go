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

// SelfAttention is a GQA attention block: q/k/v projections, optional
// per-head QK norm, RoPE on the first Rope.Dim dims of every head, paged
// causal attention and the output projection.
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

// Forward sets y (N, hidden) = SelfAttention(x (N, hidden)) and stores the
// batch's keys and values in the cache.
func (s *SelfAttention) Forward(c *Ctx, y, x []float32) {
	be, a, n := c.Backend, &c.Arena, c.N()
	at := s.Attn
	hd := at.HeadDim
	mark := a.Mark()
	q := a.Get(n * at.Heads * hd)   // (N, heads·headDim)
	k := a.Get(n * at.KVHeads * hd) // (N, kvHeads·headDim)
	v := a.Get(n * at.KVHeads * hd) // (N, kvHeads·headDim)
	s.Q.Forward(be, q, x, n)
	s.K.Forward(be, k, x, n)
	s.V.Forward(be, v, x, n)
	if s.QNorm != nil {
		s.QNorm.Forward(q, q, n*at.Heads)
	}
	if s.KNorm != nil {
		s.KNorm.Forward(k, k, n*at.KVHeads)
	}
	if s.Rope != nil {
		s.Rope.Ensure(c.Tok.MaxPos())
		be.Parallel(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				p := int(c.Tok.Pos[i])
				s.Rope.Apply(q[i*at.Heads*hd:], at.Heads, hd, p)
				s.Rope.Apply(k[i*at.KVHeads*hd:], at.KVHeads, hd, p)
			}
		})
	}
	at.Store(c.Cache, &c.Tok, k, v)
	o := a.Get(n * at.Heads * hd) // (N, heads·headDim)
	at.Forward(be, c.Cache, &c.Tok, o, q)
	s.O.Forward(be, y, o, n)
	a.Release(mark)
}

// Block is a pre-norm decoder layer:
// x += Attn(AttnNorm(x)); x += FFN(FFNNorm(x)).
type Block struct {
	AttnNorm *RMSNorm // (hidden) input_layernorm
	Attn     *SelfAttention
	FFNNorm  *RMSNorm // (hidden) post_attention_layernorm
	FFN      FFN
}

// Forward updates the residual stream x (N, hidden) in place.
func (b *Block) Forward(c *Ctx, x []float32) {
	n, a := c.N(), &c.Arena
	mark := a.Mark()
	h := a.Get(len(x)) // (N, hidden)
	y := a.Get(len(x)) // (N, hidden)
	b.AttnNorm.Forward(h, x, n)
	b.Attn.Forward(c, y, h)
	for i, v := range y {
		x[i] += v
	}
	b.FFNNorm.Forward(h, x, n)
	b.FFN.Forward(c.Backend, a, y, h, n)
	for i, v := range y {
		x[i] += v
	}
	a.Release(mark)
}
