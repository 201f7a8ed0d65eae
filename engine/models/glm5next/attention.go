package glm5next

import (
	"math"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// dsa is a NoPE MLA attention layer with a k-pool DSA indexer (self_attn.*
// of a deepseek_sparse_attention layer, and of the MTP layer). Per token,
// with dn = qk_nope_head_dim (the whole query/key head: no RoPE part):
//
//	q_resid = q_a_layernorm(q_a_proj x);  q_h = q_b_proj(q_resid)_h         [dn]
//	c_t     = kv_a_layernorm(kv_a_proj_with_mqa x)                          [kv_lora] → cache K slot
//	k_h,s = W_UK_h c_s,  v_h,s = W_UV_h c_s                                 (kv_b_proj = [W_UK_h; W_UV_h] per head)
//	o_h   = Σ_{s ∈ S_t} softmax_s(q_h·k_h,s · dn^-½) v_h,s;   y = o_proj(concat_h o_h)
//
// on MLAOps (StoreLatent, then AttentionMLA over the selection; the
// backend picks the naive or absorbed form). S_t is the indexer's token
// selection (see indexer): there is no causal mask besides it, so a token
// whose complete pool is not selected does not attend to itself (as in
// transformers), and a token with no selection attends to nothing (zero
// output).
type dsa struct {
	dev     device
	layer   int          // cache layer
	qa      gqa.Linear   // (q_lora, hidden) q_a_proj
	qaNorm  *gqa.Norm    // (q_lora) q_a_layernorm
	qb      gqa.Linear   // (heads·dn, q_lora) q_b_proj
	kva     gqa.Linear   // (kv_lora, hidden) kv_a_proj_with_mqa (qk_rope_head_dim = 0)
	kvaNorm *gqa.Norm    // (kv_lora) kv_a_layernorm, applied by StoreLatent
	kvb     *kernels.Mat // (heads·(dn+dv), kv_lora) kv_b_proj
	o       gqa.Linear   // (hidden, heads·dv) o_proj
	shape   kernels.MLAShape
	idx     *indexer // nil on a shared layer: it reuses src's selection
	src     *dsa     // the DSA layer before a shared one

	// sel is the step's selection (N, idx.kp.SelWidth()) I32, set by
	// Forward for the shared layer after it.
	sel kernels.Tensor
}

// dsa loads a DSA layer under pre, caching in cache layer `layer`; own
// says whether it has its own indexer.
func (l *loader) dsa(pre string, layer int, own bool) *dsa {
	p := l.p
	lin := func(name string, out, in int) gqa.Linear { return l.u.Linear(l.Linear(name, out, in, p.attnBias)) }
	d := &dsa{
		dev:     l.dev,
		layer:   layer,
		qa:      lin(pre+"q_a_proj", p.qLora, p.hidden),
		qaNorm:  l.u.Norm(l.RMSNorm(pre+"q_a_layernorm", p.qLora, p.eps, false)),
		qb:      l.linear(pre+"q_b_proj", p.heads*p.nope, p.qLora),
		kva:     lin(pre+"kv_a_proj_with_mqa", p.kvLora, p.hidden),
		kvaNorm: l.u.Norm(l.RMSNorm(pre+"kv_a_layernorm", p.kvLora, p.eps, false)),
		kvb:     l.Mat(pre+"kv_b_proj.weight", p.heads*(p.nope+p.vDim), p.kvLora),
		o:       lin(pre+"o_proj", p.hidden, p.heads*p.vDim),
		shape: kernels.MLAShape{
			Heads: p.heads, Nope: p.nope, V: p.vDim, KVLora: p.kvLora,
			Scale: float32(1 / math.Sqrt(float64(p.nope))),
		},
	}
	kernels.DeclareKVB(l.dev, d.kvb, d.shape) // its per-head split is then made after the load
	if own {
		d.idx = l.indexer(pre + "indexer.")
	}
	return d
}

// Forward implements gqa.Mixer: y (N, hidden) = Attention(x (N, hidden)),
// storing the step's latents (and index keys) in the cache. x is the layer
// input after input_layernorm.
func (d *dsa) Forward(c *gqa.Ctx, y, x kernels.Tensor) {
	dev, n, s := d.dev, c.N, d.shape
	qr := dev.Scratch(kernels.F32, n, d.qa.W.Rows) // (N, q_lora) q_resid
	d.qa.Forward(dev, qr, x, false)
	dev.RMSNorm(qr, qr, d.qaNorm.W, d.qaNorm.Eps, d.qaNorm.Offset)
	q := dev.Scratch(kernels.F32, n, s.Heads*s.Nope) // (N, heads·dn)
	d.qb.Forward(dev, q, qr, false)
	kv := dev.Scratch(kernels.F32, n, s.KVLora) // (N, kv_lora) before its norm
	d.kva.Forward(dev, kv, x, false)
	latents, index := c.Cache(d.layer)
	dev.StoreLatent(latents, kv, d.kvaNorm.W, d.kvaNorm.Eps, nil, &c.Paged)
	if d.idx != nil {
		d.sel = d.idx.forward(c, dev, index, x, qr)
	} else {
		d.sel = d.src.sel
	}
	o := dev.Scratch(kernels.F32, n, s.Heads*s.V) // (N, heads·dv)
	dev.AttentionMLA(o, q, latents, d.kvb, nil, &c.Paged, s, d.sel)
	d.o.Forward(dev, y, o, false)
}

// indexer is the k-pool DSA lightning indexer (self_attn.indexer.*) on
// KPoolOps (kernels.KPool describes the pools, their keys and the
// selection):
//
//	k_t = LayerNorm(wk x_t),  γ_t = x_t·gateᵀ             cached as [k_t | γ_t] in the cache V slot
//	I_{t,P} = Σ_h w_{t,h}·ReLU(d^-½·q_{t,h}·K̄_P),  q = wq_b(q_resid), w = weights_proj(x)·n_heads^-½
//
// (n_heads^-½ is folded into the score scale, where it commutes with the
// ReLU). No RoPE. A complete pool's key replaces the raw k of its last
// token when that token is stored; rolling back (kvcache.Truncate) or
// forking to a length inside the pool rewrites that token, so the pool is
// rebuilt from the real ones. A step thus costs O(new tokens) for pooling
// and O(#pools) per query for scoring.
type indexer struct {
	wqb   gqa.Linear // (heads·dim, q_lora) wq_b
	wk    gqa.Linear // (dim, hidden)
	wproj gqa.Linear // (heads, hidden) weights_proj
	gate  gqa.Linear // (dim, hidden) index_kpool_compress_gate
	kp    kernels.KPool
}

func (l *loader) indexer(pre string) *indexer {
	p := l.p
	return &indexer{
		wqb:   l.linear(pre+"wq_b", p.idxHeads*p.idxDim, p.qLora),
		wk:    l.linear(pre+"wk", p.idxDim, p.hidden),
		wproj: l.linear(pre+"weights_proj", p.idxHeads, p.hidden),
		gate:  gqa.Linear{W: l.Mat(pre+"index_kpool_compress_gate", p.idxDim, p.hidden)},
		kp: kernels.KPool{
			Size: p.kpool, Dim: p.idxDim, Heads: p.idxHeads, Keep: p.poolsPerQuery(), Tail: p.tail,
			Ape:     l.u.Tensor(l.Tensor(pre+"index_kpool_compress_ape", p.kpool, p.idxDim), p.kpool),
			Scale:   float32(1 / math.Sqrt(float64(p.idxDim)*float64(p.idxHeads))),
			NormW:   l.u.Vec(l.Vec(pre+"k_norm.weight", p.idxDim)),
			NormB:   l.u.Vec(l.Vec(pre+"k_norm.bias", p.idxDim)),
			NormEps: 1e-6,
		},
	}
}

// forward caches the step's index keys in the cache layer and returns
// every row's selection (N, SelWidth) I32. x is the layer input after
// input_layernorm, qr the normed q latent.
func (ix *indexer) forward(c *gqa.Ctx, dev device, cache, x, qr kernels.Tensor) kernels.Tensor {
	n, kp := c.N, &ix.kp
	q := dev.Scratch(kernels.F32, n, kp.Heads*kp.Dim) // (N, heads·dim)
	ix.wqb.Forward(dev, q, qr, false)
	k := dev.Scratch(kernels.F32, n, kp.Dim) // (N, dim) before k_norm
	ix.wk.Forward(dev, k, x, false)
	g := dev.Scratch(kernels.F32, n, kp.Dim) // (N, dim) gate scores γ
	ix.gate.Forward(dev, g, x, false)
	w := dev.Scratch(kernels.F32, n, kp.Heads) // (N, heads)
	ix.wproj.Forward(dev, w, x, false)
	dev.StoreKPool(cache, k, g, &c.Paged, kp)
	sel := dev.Scratch(kernels.I32, n, kp.SelWidth())
	dev.KPoolSelect(sel, q, w, cache, &c.Paged, kp)
	return sel
}
