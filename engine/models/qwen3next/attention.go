package qwen3next

import (
	"github.com/ferrite-llm/ferrite/engine/nn"
)

// gatedAttention is Qwen3-Next's full-attention mixer (self_attn.*): GQA
// softmax attention whose output is gated per channel by sigmoid of a second
// half of q_proj.
type gatedAttention struct {
	q     *nn.Linear  // (heads·2·headDim, hidden): per head [query headDim | gate headDim]
	k     *nn.Linear  // (kvHeads·headDim, hidden)
	v     *nn.Linear  // (kvHeads·headDim, hidden)
	o     *nn.Linear  // (hidden, heads·headDim)
	qNorm *nn.RMSNorm // (headDim) per query head, 1+w, before RoPE
	kNorm *nn.RMSNorm // (headDim) per key head, 1+w, before RoPE
	rope  *nn.RoPE    // NeoX on the first headDim·partial_rotary_factor dims
	attn  *nn.Attention
}

// loadAttention loads prefix ("model.layers.3.self_attn.") as the attention
// of cache layer cacheLayer.
func loadAttention(l *nn.Loader, p *params, prefix string, cacheLayer int, rope *nn.RoPE) *gatedAttention {
	qw, kvw := p.Heads*p.HeadDim, p.KVHeads*p.HeadDim
	return &gatedAttention{
		q:     l.Linear(prefix+"q_proj", 2*qw, p.Hidden, p.attnBias),
		k:     l.Linear(prefix+"k_proj", kvw, p.Hidden, p.attnBias),
		v:     l.Linear(prefix+"v_proj", kvw, p.Hidden, p.attnBias),
		o:     l.Linear(prefix+"o_proj", p.Hidden, qw, p.attnBias),
		qNorm: l.RMSNorm(prefix+"q_norm", p.HeadDim, p.Eps, true),
		kNorm: l.RMSNorm(prefix+"k_norm", p.HeadDim, p.Eps, true),
		rope:  rope,
		attn:  nn.NewAttention(cacheLayer, p.Heads, p.KVHeads, p.HeadDim),
	}
}

// forward sets y (N, hidden) = GatedAttention(x (N, hidden)) and stores the
// batch's keys and values in the cache.
func (g *gatedAttention) forward(p *pass, y, x []float32) {
	be, a, n := p.Backend, &p.Arena, p.N()
	at := g.attn
	hd, heads, kvh := at.HeadDim, at.Heads, at.KVHeads
	qw := heads * hd
	mark := a.Mark()
	qg := a.Get(n * 2 * qw)  // (N, heads·2·headDim) query|gate per head
	q := a.Get(n * qw)       // (N, heads·headDim)
	gate := a.Get(n * qw)    // (N, heads·headDim)
	k := a.Get(n * kvh * hd) // (N, kvHeads·headDim)
	v := a.Get(n * kvh * hd) // (N, kvHeads·headDim)
	g.q.Forward(be, qg, x, n)
	g.k.Forward(be, k, x, n)
	g.v.Forward(be, v, x, n)
	for i := range n * heads {
		copy(q[i*hd:(i+1)*hd], qg[2*i*hd:(2*i+1)*hd])
		copy(gate[i*hd:(i+1)*hd], qg[(2*i+1)*hd:(2*i+2)*hd])
	}
	g.qNorm.Forward(q, q, n*heads)
	g.kNorm.Forward(k, k, n*kvh)
	g.rope.Ensure(p.Tok.MaxPos())
	be.Parallel(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			pos := int(p.Tok.Pos[i])
			g.rope.Apply(q[i*qw:], heads, hd, pos)
			g.rope.Apply(k[i*kvh*hd:], kvh, hd, pos)
		}
	})
	at.Store(p.Cache, &p.Tok, k, v)
	o := a.Get(n * qw) // (N, heads·headDim)
	at.Forward(be, p.Cache, &p.Tok, o, q)
	for i, gv := range gate {
		o[i] *= nn.Sigmoid(gv)
	}
	g.o.Forward(be, y, o, n)
	a.Release(mark)
}
