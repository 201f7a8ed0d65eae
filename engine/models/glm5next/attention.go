package glm5next

import (
	"math"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
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
// computed in the absorbed form: q̃_h = W_UK_hᵀ q_h scores against the
// cached latents directly and ō_h = Σ p_s c_s is expanded by W_UV_h once.
// S_t is the indexer's selection (see indexer): there is no causal mask
// besides it, so a token whose complete pool is not selected does not
// attend to itself (as in transformers).
type dsa struct {
	layer   int            // cache layer
	qa      *nn.Linear     // (q_lora, hidden) q_a_proj
	qaNorm  *nn.RMSNorm    // (q_lora) q_a_layernorm
	qb      *nn.Linear     // (heads·dn, q_lora) q_b_proj
	kva     *nn.Linear     // (kv_lora, hidden) kv_a_proj_with_mqa (qk_rope_head_dim = 0)
	kvaNorm *nn.RMSNorm    // (kv_lora) kv_a_layernorm
	ukT     []*kernels.Mat // (heads) F32 (kv_lora, dn): W_UK_hᵀ, transposed from kv_b_proj
	uv      []*kernels.Mat // (heads) (dv, kv_lora): W_UV_h, a view of kv_b_proj's rows (F32 copy for FP8)
	o       *nn.Linear     // (hidden, heads·dv) o_proj
	heads   int
	nope    int      // dn
	kvLora  int      // kv_lora_rank
	vDim    int      // dv
	scale   float32  // dn^-½
	idx     *indexer // nil on a shared layer: it reuses the previous layer's selection
}

// loadDSA loads a DSA layer under pre, caching in cache layer `layer`;
// own says whether it has its own indexer.
func loadDSA(l *nn.Loader, p *params, pre string, layer int, own bool) *dsa {
	d := &dsa{
		layer:   layer,
		qa:      l.Linear(pre+"q_a_proj", p.qLora, p.hidden, p.attnBias),
		qaNorm:  l.RMSNorm(pre+"q_a_layernorm", p.qLora, p.eps, false),
		qb:      l.Linear(pre+"q_b_proj", p.heads*p.nope, p.qLora, false),
		kva:     l.Linear(pre+"kv_a_proj_with_mqa", p.kvLora, p.hidden, p.attnBias),
		kvaNorm: l.RMSNorm(pre+"kv_a_layernorm", p.kvLora, p.eps, false),
		o:       l.Linear(pre+"o_proj", p.hidden, p.heads*p.vDim, p.attnBias),
		heads:   p.heads, nope: p.nope, kvLora: p.kvLora, vDim: p.vDim,
		scale: float32(1 / math.Sqrt(float64(p.nope))),
	}
	kvb := l.Mat(pre+"kv_b_proj.weight", p.heads*(p.nope+p.vDim), p.kvLora) // (heads·(dn+dv), kv_lora)
	if kvb.Rows == p.heads*(p.nope+p.vDim) {
		row := make([]float32, p.kvLora) // (kv_lora)
		for h := range p.heads {
			ukT := make([]float32, p.kvLora*p.nope) // (kv_lora, dn)
			base := h * (p.nope + p.vDim)
			for j := range p.nope {
				kvb.RowF32(row, base+j)
				for c, v := range row {
					ukT[c*p.nope+j] = v
				}
			}
			d.ukT = append(d.ukT, f32Mat(p.kvLora, p.nope, ukT))
			if kvb.DType != kernels.F8E4M3 {
				// W_UV_h is dv consecutive rows of kv_b_proj: a view.
				sz := kvb.DType.Size()
				off := (base + p.nope) * p.kvLora * sz
				d.uv = append(d.uv, &kernels.Mat{DType: kvb.DType, Rows: p.vDim, Cols: p.kvLora,
					Data: kvb.Data[off : off+p.vDim*p.kvLora*sz]})
				continue
			}
			uv := make([]float32, p.vDim*p.kvLora) // (dv, kv_lora)
			for e := range p.vDim {
				kvb.RowF32(uv[e*p.kvLora:(e+1)*p.kvLora], base+p.nope+e)
			}
			d.uv = append(d.uv, f32Mat(p.vDim, p.kvLora, uv))
		}
	}
	if own {
		d.idx = loadIndexer(l, p, pre+"indexer.")
	}
	return d
}

// forward sets y (N, hidden) = Attention(x (N, hidden)), storing the
// batch's latents (and index keys) in the cache. x is the layer input after
// input_layernorm.
func (d *dsa) forward(p *pass, y, x []float32) {
	be, a, n := p.Backend, &p.Arena, p.N()
	mark := a.Mark()
	H, dn, L, dv := d.heads, d.nope, d.kvLora, d.vDim
	qr := a.Get(n * d.qa.Out()) // (N, q_lora) q_resid
	d.qa.Forward(be, qr, x, n)
	d.qaNorm.Forward(qr, qr, n)
	q := a.Get(n * H * dn) // (N, heads·dn)
	d.qb.Forward(be, q, qr, n)
	c := a.Get(n * L) // (N, kv_lora)
	d.kva.Forward(be, c, x, n)
	d.kvaNorm.Forward(c, c, n)
	for r, pos := range p.Tok.Pos {
		copy(p.Cache.K(d.layer, p.Tok.KV[p.Tok.Seq[r]], int(pos)), c[r*L:(r+1)*L])
	}

	// Absorb W_UK into the queries: qt (N, heads, kv_lora).
	qt := a.Get(n * H * L)
	qh := a.Get(n * dn) // (N, dn) one head's queries
	th := a.Get(n * L)  // (N, kv_lora)
	for h := range H {
		for r := range n {
			copy(qh[r*dn:(r+1)*dn], q[r*H*dn+h*dn:])
		}
		be.MatMul(th, qh, d.ukT[h], n)
		for r := range n {
			copy(qt[r*H*L+h*L:r*H*L+(h+1)*L], th[r*L:(r+1)*L])
		}
	}

	if d.idx != nil {
		d.idx.forward(p, d.layer, x, qr)
	}

	ob := a.Get(n * H * L) // (N, heads, kv_lora) Σ p_s c_s
	kp := p.kpool
	be.Parallel(n*H, func(lo, hi int) {
		var scores []float32
		var toks []int32
		for item := lo; item < hi; item++ {
			r, h := item/H, item%H
			seq := p.Tok.KV[p.Tok.Seq[r]]
			toks = p.tokens(toks[:0], r, kp)
			if cap(scores) < len(toks) {
				scores = make([]float32, len(toks))
			}
			sc := scores[:len(toks)]
			qv := qt[r*H*L+h*L : r*H*L+(h+1)*L]
			for j, s := range toks {
				sc[j] = nn.Dot(qv, p.Cache.K(d.layer, seq, int(s))) * d.scale
			}
			nn.Softmax(sc)
			o := ob[r*H*L+h*L : r*H*L+(h+1)*L]
			clear(o)
			for j, s := range toks {
				nn.Axpy(o, sc[j], p.Cache.K(d.layer, seq, int(s)))
			}
		}
	})

	// Expand by W_UV: ov (N, heads·dv).
	ov := a.Get(n * H * dv)
	vh := a.Get(n * dv) // (N, dv)
	for h := range H {
		for r := range n {
			copy(th[r*L:(r+1)*L], ob[r*H*L+h*L:])
		}
		be.MatMul(vh, th, d.uv[h], n)
		for r := range n {
			copy(ov[r*H*dv+h*dv:r*H*dv+(h+1)*dv], vh[r*dv:(r+1)*dv])
		}
	}
	d.o.Forward(be, y, ov, n)
	a.Release(mark)
}

// indexer is the k-pool DSA lightning indexer (self_attn.indexer.*). Per
// token t it caches k_t = LayerNorm(wk x_t) and γ_t = x_t·gateᵀ in the
// cache V slot [k_t | γ_t] (2·index_head_dim values). Pools are kpool
// consecutive tokens from position 0; the key of complete pool P, per
// channel c, is
//
//	K̄_P[c] = Σ_j softmax_j(γ_{P·kpool+j}[c] + ape[j][c]) · k_{P·kpool+j}[c]
//
// and query t scores every complete pool whose last token is ≤ t:
//
//	I_{t,P} = Σ_h w_{t,h} · ReLU(d^-½ · q_{t,h}·K̄_P),  q = wq_b(q_resid), w = weights_proj(x)·n_heads^-½
//
// It keeps the best min(index_topk/kpool, #candidates) pools (ties to the
// lower pool) and, with index_kpool_always_select_tail, the incomplete tail
// [t+1 − (t+1) mod kpool, t] unscored. No RoPE.
//
// A complete pool's key never changes, and the raw k/γ of its members are
// not needed once it is complete (the tail pool is always incomplete), so
// the pass that stores a pool's last token pools it once and overwrites that
// token's slot with K̄_P (first index_head_dim values). Rolling back
// (kvcache.Truncate) or forking to a length inside the pool leaves its
// earlier members raw and rewrites the last one, so the pool is rebuilt
// from the real tokens. A pass thus costs O(new tokens) for pooling and
// O(#pools) per query for scoring.
type indexer struct {
	wqb   *nn.Linear   // (heads·dim, q_lora) wq_b
	wk    *nn.Linear   // (dim, hidden)
	kW    []float32    // (dim) k_norm.weight (LayerNorm, eps 1e-6)
	kB    []float32    // (dim) k_norm.bias
	wproj *nn.Linear   // (heads, hidden) weights_proj
	ape   []float32    // (kpool, dim) index_kpool_compress_ape
	gate  *kernels.Mat // (dim, hidden) index_kpool_compress_gate
	heads int          // index_n_heads
	dim   int          // index_head_dim
	pools int          // index_topk / index_kpool: pools kept per query
	kpool int
}

func loadIndexer(l *nn.Loader, p *params, pre string) *indexer {
	return &indexer{
		wqb:   l.Linear(pre+"wq_b", p.idxHeads*p.idxDim, p.qLora, false),
		wk:    l.Linear(pre+"wk", p.idxDim, p.hidden, false),
		kW:    l.Vec(pre+"k_norm.weight", p.idxDim),
		kB:    l.Vec(pre+"k_norm.bias", p.idxDim),
		wproj: l.Linear(pre+"weights_proj", p.idxHeads, p.hidden, false),
		ape:   l.Tensor(pre+"index_kpool_compress_ape", p.kpool, p.idxDim),
		gate:  l.Mat(pre+"index_kpool_compress_gate", p.idxDim, p.hidden),
		heads: p.idxHeads, dim: p.idxDim, pools: p.poolsPerQuery(), kpool: p.kpool,
	}
}

// forward caches the batch's index keys in layer's V slots and fills the
// pass's selection (p.sel, p.nsel) for every row. x is the layer input after
// input_layernorm, qr the normed q latent.
func (ix *indexer) forward(p *pass, layer int, x, qr []float32) {
	be, a, n := p.Backend, &p.Arena, p.N()
	mark := a.Mark()
	nh, dI, kp := ix.heads, ix.dim, ix.kpool
	q := a.Get(n * nh * dI) // (N, heads·dim)
	ix.wqb.Forward(be, q, qr, n)
	k := a.Get(n * dI) // (N, dim)
	ix.wk.Forward(be, k, x, n)
	(&nn.LayerNorm{W: ix.kW, B: ix.kB, Eps: 1e-6}).Forward(k, k, n)
	g := a.Get(n * dI) // (N, dim) gate scores γ
	be.MatMul(g, x, ix.gate, n)
	w := a.Get(n * nh) // (N, heads)
	ix.wproj.Forward(be, w, x, n)
	ws := float32(1 / math.Sqrt(float64(nh)))
	for i := range w {
		w[i] *= ws
	}
	for r, pos := range p.Tok.Pos {
		slot := p.Cache.V(layer, p.Tok.KV[p.Tok.Seq[r]], int(pos)) // (2·dim) [k | γ]
		copy(slot[:dI], k[r*dI:(r+1)*dI])
		copy(slot[dI:], g[r*dI:(r+1)*dI])
	}

	p.ensureSel(n, ix.pools)
	qs := float32(1 / math.Sqrt(float64(dI)))
	for s := range len(p.start) - 1 {
		lo, hi := p.seqRows(s)
		if lo == hi {
			continue
		}
		seq := p.Tok.KV[s]
		// Pool P is complete once its last token P·kpool+kpool−1 is stored:
		// pool the ones this pass completes into their last token's slot.
		first, last := int(p.Tok.Pos[lo]), int(p.Tok.Pos[hi-1])
		done := first / kp    // first pool completed by this pass
		np := (last + 1) / kp // complete pools visible to the last row
		be.Parallel(np-done, func(plo, phi int) {
			prob := make([]float64, kp)  // (kpool) softmax over a pool's members
			mem := make([][]float32, kp) // (kpool) the members' cached [k | γ]
			key := make([]float32, dI)   // (dim) the pooled key
			for P := done + plo; P < done+phi; P++ {
				for j := range kp {
					mem[j] = p.Cache.V(layer, seq, P*kp+j)
				}
				ref.KPoolKey(key, mem, ix.ape, prob)
				copy(mem[kp-1][:dI], key)
			}
		})
		keys := make([][]float32, np) // (pools) each complete pool's key (dim), in its last token's slot
		for P := range keys {
			keys[P] = p.Cache.V(layer, seq, P*kp+kp-1)[:dI]
		}
		be.Parallel(hi-lo, func(rlo, rhi int) {
			var scores []float32
			for r := lo + rlo; r < lo+rhi; r++ {
				npt := (int(p.Tok.Pos[r]) + 1) / kp // candidates: complete pools ending at or before t
				if cap(scores) < npt {
					scores = make([]float32, npt)
				}
				sc := scores[:npt]
				qr := q[r*nh*dI : (r+1)*nh*dI]
				wr := w[r*nh : (r+1)*nh]
				for P := range npt {
					key := keys[P]
					var acc float32
					for h := range nh {
						acc += wr[h] * max(nn.Dot(qr[h*dI:(h+1)*dI], key)*qs, 0)
					}
					sc[P] = acc
				}
				sel := ref.TopPools(p.sel[r*ix.pools:r*ix.pools:(r+1)*ix.pools], sc, ix.pools)
				p.nsel[r] = int32(len(sel))
			}
		})
	}
	a.Release(mark)
}
