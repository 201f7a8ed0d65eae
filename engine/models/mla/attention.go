package mla

import (
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Form selects how an Attention evaluates MLA. Both forms give the same
// result up to float32 rounding.
type Form uint8

const (
	// FormAuto picks per sequence from the chunk's length and context,
	// whichever form costs fewer multiply-adds: naive for prefill chunks,
	// absorbed for decode and short speculative verification.
	FormAuto Form = iota
	// FormNaive always expands the cached latents into per-head keys and
	// values.
	FormNaive
	// FormAbsorbed always folds W_UK into the queries and W_UV into the
	// outputs.
	FormAbsorbed
)

// Attention is one layer's multi-head latent attention over the paged
// cache, optionally restricted by a DSA selection. Its cache layer holds,
// per token, K = [latent (KVLora) | rotated k_pe (Rope)] and, when the layer
// has an Indexer, V = the index key (Indexer.Dim); otherwise V is empty.
type Attention struct {
	Layer  int     // cache layer index
	Heads  int     // num_attention_heads
	Nope   int     // qk_nope_head_dim
	Rope   int     // qk_rope_head_dim
	V      int     // v_head_dim
	KVLora int     // kv_lora_rank
	Scale  float32 // softmax scale: (Nope+Rope)^-½, times mscale² under YaRN

	QA      *nn.Linear  // q_a_proj (q_lora_rank, hidden); nil without q-LoRA
	QANorm  *nn.RMSNorm // q_a_layernorm (q_lora_rank), eps 1e-6; nil without q-LoRA
	QB      *nn.Linear  // q_b_proj (Heads·(Nope+Rope), q_lora_rank), or q_proj (Heads·(Nope+Rope), hidden) without q-LoRA
	KVA     *nn.Linear  // kv_a_proj_with_mqa (KVLora+Rope, hidden)
	KVANorm *nn.RMSNorm // kv_a_layernorm (KVLora), eps 1e-6
	KVB     *nn.Linear  // kv_b_proj (Heads·(Nope+V), KVLora), no bias: per head [W_UK (Nope rows) | W_UV (V rows)]
	O       *nn.Linear  // o_proj (hidden, Heads·V)
	RoPE    *nn.RoPE    // rotates q_pe and k_pe (RoPE.Dim = Rope)

	// Indexer is the layer's DSA lightning indexer; nil for dense MLA and
	// for shared DSA layers.
	Indexer *Indexer
	// Share, for a shared DSA layer (no indexer of its own), is the earlier
	// layer whose selection this layer reuses in the same forward pass.
	Share *Attention

	Form Form // FormAuto unless forced (tests, benchmarks)
	Tile int  // keys the naive form expands at a time; 0 picks one from the dims

	uk   []*kernels.Mat // (Heads) each (KVLora, Nope) = W_UK_hᵀ, so x·ukᵀ = x·W_UK_h
	uv   []*kernels.Mat // (Heads) each (V, KVLora) = W_UV_h
	sel  Selection      // the last pass's selection (layers with an Indexer)
	rows []int32        // scratch: rows computed in the absorbed form
}

// Selection returns the positions every row of the last forward pass was
// allowed to attend to: the layer's own (Indexer), the shared source's
// (Share), or nil for dense MLA.
func (a *Attention) Selection() *Selection {
	switch {
	case a.Indexer != nil:
		return &a.sel
	case a.Share != nil:
		return a.Share.Selection()
	}
	return nil
}

// prepare splits kv_b_proj into the per-head W_UKᵀ and W_UV matrices of the
// absorbed form (in the weight's dtype, exactly; float32 for FP8). Call it
// once the weights have loaded.
func (a *Attention) prepare() {
	w := a.KVB.W
	nh, dn, dv, kl := a.Heads, a.Nope, a.V, a.KVLora
	dt := w.DType
	exact := dt == kernels.F32 || dt == kernels.BF16 || dt == kernels.F16
	if !exact {
		dt = kernels.F32
	}
	es := dt.Size()
	row := make([]float32, kl) // (KVLora) one decoded kv_b_proj row (FP8 only)
	a.uk, a.uv = make([]*kernels.Mat, nh), make([]*kernels.Mat, nh)
	for h := range nh {
		uk, uv := newMat(dt, kl, dn), newMat(dt, dv, kl)
		for d := range dn {
			r := h*(dn+dv) + d
			if !exact {
				w.RowF32(row, r)
			}
			for c := range kl {
				if exact {
					copyElem(uk.Data, c*dn+d, w.Data, r*kl+c, es)
				} else {
					putF32(uk.Data, c*dn+d, row[c])
				}
			}
		}
		for j := range dv {
			r := h*(dn+dv) + dn + j
			if exact {
				copy(uv.Data[j*kl*es:(j+1)*kl*es], w.Data[r*kl*es:(r+1)*kl*es])
				continue
			}
			w.RowF32(row, r)
			for c, v := range row {
				putF32(uv.Data, j*kl+c, v)
			}
		}
		a.uk[h], a.uv[h] = uk, uv
	}
}

// naiveFor reports whether a chunk of n tokens of one sequence, whose keys
// are positions [0, ctx), uses the naive form. FormAuto compares the
// multiply-adds of both forms: the naive one expands every key once
// (KVLora·(Nope+V) per key and head) and then costs Nope+Rope+V per query and
// attended key; the absorbed one costs 2·KVLora+Rope per query and attended
// key plus KVLora·(Nope+V) per query. Prefill chunks come out naive, decode
// tokens and short verification chunks over a long context absorbed.
func (a *Attention) naiveFor(n, ctx int) bool {
	switch a.Form {
	case FormNaive:
		return true
	case FormAbsorbed:
		return false
	}
	kl, dn, dr, dv := float64(a.KVLora), float64(a.Nope), float64(a.Rope), float64(a.V)
	keys := float64(ctx) - float64(n-1)/2 // keys an average query of the chunk attends to
	if k := a.topK(); k > 0 {
		keys = min(keys, float64(k))
	}
	naive := float64(ctx)*kl*(dn+dv) + float64(n)*keys*(dn+dr+dv)
	absorbed := float64(n) * (kl*(dn+dv) + keys*(2*kl+dr))
	return naive < absorbed
}

// topK is the DSA selection size of the layer (0 for dense MLA).
func (a *Attention) topK() int {
	switch {
	case a.Indexer != nil:
		return a.Indexer.TopK
	case a.Share != nil:
		return a.Share.topK()
	}
	return 0
}

// tile is the number of keys the naive form expands at a time for a
// context of ctx keys.
func (a *Attention) tile(ctx int) int {
	t := a.Tile
	if t <= 0 {
		t = min(max((1<<20)/(a.Heads*(a.Nope+a.V)), 64), 4096)
	}
	return max(1, min(t, ctx))
}

// Forward sets y (N, hidden) = MLA(x (N, hidden)) for the normed layer
// input x, after storing the batch's latents (and index keys) in the cache.
func (a *Attention) Forward(c *nn.Ctx, y, x []float32) {
	be, ar, n := c.Backend, &c.Arena, c.N()
	t := &c.Tok
	mark := ar.Mark()
	hd := a.Nope + a.Rope
	qw, kw := a.Heads*hd, a.KVLora+a.Rope

	q := ar.Get(n * qw) // (N, Heads·(Nope+Rope))
	var qr []float32    // (N, q_lora_rank) normed q latent; nil without q-LoRA
	if a.QA != nil {
		qr = ar.Get(n * a.QA.Out()) // (N, q_lora_rank)
		a.QA.Forward(be, qr, x, n)
		a.QANorm.Forward(qr, qr, n)
		a.QB.Forward(be, q, qr, n)
	} else {
		a.QB.Forward(be, q, x, n)
	}
	kv := ar.Get(n * kw) // (N, KVLora+Rope): [latent | k_pe]
	a.KVA.Forward(be, kv, x, n)
	a.RoPE.Ensure(t.MaxPos())
	for i, p := range t.Pos {
		slot := kv[i*kw : (i+1)*kw]
		a.KVANorm.Forward(slot, slot, 1) // the first KVLora values
		a.RoPE.Apply(slot[a.KVLora:], 1, a.Rope, int(p))
		a.RoPE.Apply(q[i*qw+a.Nope:], a.Heads, hd, int(p))
		copy(c.Cache.K(a.Layer, t.KV[t.Seq[i]], int(p)), slot)
	}

	var sel *Selection
	switch {
	case a.Indexer != nil:
		a.Indexer.Forward(c, a.Layer, x, qr, &a.sel)
		sel = &a.sel
	case a.Share != nil:
		sel = a.Share.Selection()
	}

	o := ar.Get(n * a.Heads * a.V) // (N, Heads·V)
	a.rows = a.rows[:0]
	for r0 := 0; r0 < n; {
		r1 := r0 + 1
		for r1 < n && t.Seq[r1] == t.Seq[r0] {
			r1++
		}
		if a.naiveFor(r1-r0, int(t.Pos[r1-1])+1) {
			a.naive(c, r0, r1, q, sel, o)
		} else {
			for r := r0; r < r1; r++ {
				a.rows = append(a.rows, int32(r))
			}
		}
		r0 = r1
	}
	if len(a.rows) > 0 {
		a.absorbed(c, a.rows, q, sel, o)
	}
	a.O.Forward(be, y, o, n)
	ar.Release(mark)
}

// absorbed sets the rows' outputs o (N, Heads·V) with the absorbed form:
// score = (W_UK_hᵀq_nope)·latent + q_pe·k_pe against the cached slots
// directly, o_h = W_UV_h · Σ p·latent.
func (a *Attention) absorbed(c *nn.Ctx, rows []int32, q []float32, sel *Selection, o []float32) {
	be, ar := c.Backend, &c.Arena
	t := &c.Tok
	mark := ar.Mark()
	m, nh, kl, dn, dv := len(rows), a.Heads, a.KVLora, a.Nope, a.V
	hd := dn + a.Rope
	qw, kw := nh*hd, kl+a.Rope

	qc := ar.Get(m * nh * kw)      // (m, Heads, KVLora+Rope): [W_UK_hᵀ q_nope_h | q_pe_h]
	in := ar.Get(m * max(dn, kl))  // (m, Nope) gathered q_nope, then (m, KVLora) gathered latent sums
	out := ar.Get(m * max(kl, dv)) // (m, KVLora) absorbed queries, then (m, V) head outputs
	for h := range nh {
		for r, i := range rows {
			copy(in[r*dn:(r+1)*dn], q[int(i)*qw+h*hd:])
		}
		be.MatMul(out, in, a.uk[h], m)
		for r, i := range rows {
			dst := qc[(r*nh+h)*kw : (r*nh+h+1)*kw]
			copy(dst[:kl], out[r*kl:(r+1)*kl])
			copy(dst[kl:], q[int(i)*qw+h*hd+dn:int(i)*qw+(h+1)*hd])
		}
	}

	lat := ar.Get(m * nh * kl) // (m, Heads, KVLora) softmax-weighted latents
	bs := c.Cache.BlockSize()
	maxLen := 0
	for _, i := range rows {
		maxLen = max(maxLen, int(t.Pos[i])+1)
	}
	be.Parallel(m*nh, func(lo, hi int) {
		scores := make([]float32, maxLen) // one (row, head)'s scores over its keys
		for item := lo; item < hi; item++ {
			i := int(rows[item/nh])
			blocks := t.KV[t.Seq[i]].Blocks()
			qv := qc[item*kw : (item+1)*kw]
			acc := lat[item*kl : (item+1)*kl]
			clear(acc)
			var idx []int32
			full := true
			if sel != nil {
				idx, full = sel.Row(i)
			}
			if full {
				ln := int(t.Pos[i]) + 1
				sc := scores[:ln]
				for p := 0; p < ln; p += bs {
					kb := c.Cache.KBlock(a.Layer, blocks[p/bs])
					for j := 0; j < bs && p+j < ln; j++ {
						sc[p+j] = nn.Dot(qv, kb[j*kw:(j+1)*kw]) * a.Scale
					}
				}
				nn.Softmax(sc)
				for p := 0; p < ln; p += bs {
					kb := c.Cache.KBlock(a.Layer, blocks[p/bs])
					for j := 0; j < bs && p+j < ln; j++ {
						nn.Axpy(acc, sc[p+j], kb[j*kw:j*kw+kl])
					}
				}
				continue
			}
			sc := scores[:len(idx)]
			for j, s := range idx {
				kb := c.Cache.KBlock(a.Layer, blocks[int(s)/bs])
				off := (int(s) % bs) * kw
				sc[j] = nn.Dot(qv, kb[off:off+kw]) * a.Scale
			}
			nn.Softmax(sc)
			for j, s := range idx {
				kb := c.Cache.KBlock(a.Layer, blocks[int(s)/bs])
				off := (int(s) % bs) * kw
				nn.Axpy(acc, sc[j], kb[off:off+kl])
			}
		}
	})

	for h := range nh {
		for r := range rows {
			copy(in[r*kl:(r+1)*kl], lat[(r*nh+h)*kl:])
		}
		be.MatMul(out, in, a.uv[h], m)
		for r, i := range rows {
			copy(o[int(i)*nh*dv+h*dv:], out[r*dv:(r+1)*dv])
		}
	}
	ar.Release(mark)
}

// naive sets the outputs o (N, Heads·V) of rows [r0, r1), one sequence's
// consecutive chunk, with the naive form: the sequence's cached latents are
// expanded tile by tile into keys [W_UK_h·latent | k_pe] and values
// W_UV_h·latent, and each (row, head) keeps an online softmax.
func (a *Attention) naive(c *nn.Ctx, r0, r1 int, q []float32, sel *Selection, o []float32) {
	be, ar := c.Backend, &c.Arena
	t := &c.Tok
	mark := ar.Mark()
	nh, kl, dn, dr, dv := a.Heads, a.KVLora, a.Nope, a.Rope, a.V
	hd := dn + dr
	qw, kw, ew := nh*hd, kl+dr, nh*(dn+dv)
	m := r1 - r0
	blocks := t.KV[t.Seq[r0]].Blocks()
	bs := c.Cache.BlockSize()
	ctx := int(t.Pos[r1-1]) + 1 // keys [0, ctx)
	tile := a.tile(ctx)

	lat := ar.Get(tile * kl)     // (tile, KVLora) latents
	kpe := ar.Get(tile * dr)     // (tile, Rope) rotated rope keys
	kx := ar.Get(tile * ew)      // (tile, Heads·(Nope+V)) expanded [k_nope | v] per head
	acc := ar.Zeros(m * nh * dv) // (m, Heads, V) unnormalised outputs
	mx := make([]float32, m*nh)  // (m, Heads) running score maximum
	sum := make([]float64, m*nh) // (m, Heads) running softmax denominator
	for i := range mx {
		mx[i] = float32(math.Inf(-1))
	}
	for t0 := 0; t0 < ctx; t0 += tile {
		t1 := min(ctx, t0+tile)
		tl := t1 - t0
		for s := t0; s < t1; s++ {
			kb := c.Cache.KBlock(a.Layer, blocks[s/bs])
			slot := kb[(s%bs)*kw : (s%bs+1)*kw]
			copy(lat[(s-t0)*kl:(s-t0+1)*kl], slot[:kl])
			copy(kpe[(s-t0)*dr:(s-t0+1)*dr], slot[kl:])
		}
		be.MatMul(kx, lat, a.KVB.W, tl)
		be.Parallel(m*nh, func(lo, hi int) {
			sc := make([]float32, tl) // one (row, head)'s scores over the tile
			for item := lo; item < hi; item++ {
				i, h := r0+item/nh, item%nh
				end := min(t1, int(t.Pos[i])+1)
				if end <= t0 {
					continue
				}
				var keys []int32 // selected positions in [t0, end); unused when every key counts
				sparse := false
				if sel != nil {
					if idx, full := sel.Row(i); !full {
						sparse = true
						k0, _ := slices.BinarySearch(idx, int32(t0))
						k1, _ := slices.BinarySearch(idx, int32(end))
						keys = idx[k0:k1]
					}
				}
				nk := end - t0
				if sparse {
					nk = len(keys)
				}
				if nk == 0 {
					continue
				}
				qv := q[i*qw+h*hd : i*qw+(h+1)*hd]
				tm := float32(math.Inf(-1))
				for j := range nk {
					s := t0 + j
					if sparse {
						s = int(keys[j])
					}
					k := kx[(s-t0)*ew+h*(dn+dv):]
					v := (nn.Dot(qv[:dn], k[:dn]) + nn.Dot(qv[dn:], kpe[(s-t0)*dr:(s-t0+1)*dr])) * a.Scale
					sc[j] = v
					tm = max(tm, v)
				}
				ac := acc[item*dv : (item+1)*dv]
				if tm > mx[item] {
					if sum[item] != 0 {
						f := math.Exp(float64(mx[item] - tm))
						sum[item] *= f
						scaleVec(ac, float32(f))
					}
					mx[item] = tm
				}
				for j := range nk {
					s := t0 + j
					if sparse {
						s = int(keys[j])
					}
					e := math.Exp(float64(sc[j] - mx[item]))
					sum[item] += e
					off := (s-t0)*ew + h*(dn+dv) + dn
					nn.Axpy(ac, float32(e), kx[off:off+dv])
				}
			}
		})
	}
	for item := range m * nh {
		i, h := r0+item/nh, item%nh
		inv := float32(1 / sum[item])
		dst := o[i*nh*dv+h*dv : i*nh*dv+(h+1)*dv]
		for j, v := range acc[item*dv : (item+1)*dv] {
			dst[j] = v * inv
		}
	}
	ar.Release(mark)
}

// Block is a pre-norm decoder layer around MLA:
// x += Attn(AttnNorm(x)); x += FFN(FFNNorm(x)).
type Block struct {
	AttnNorm *nn.RMSNorm // (hidden) input_layernorm
	Attn     *Attention
	FFNNorm  *nn.RMSNorm // (hidden) post_attention_layernorm
	FFN      nn.FFN      // dense SwiGLU MLP or noaux_tc MoE
}

// Forward updates the residual stream x (N, hidden) in place.
func (b *Block) Forward(c *nn.Ctx, x []float32) {
	n, ar := c.N(), &c.Arena
	mark := ar.Mark()
	h := ar.Get(len(x)) // (N, hidden)
	y := ar.Get(len(x)) // (N, hidden)
	b.AttnNorm.Forward(h, x, n)
	b.Attn.Forward(c, y, h)
	for i, v := range y {
		x[i] += v
	}
	b.FFNNorm.Forward(h, x, n)
	b.FFN.Forward(c.Backend, ar, y, h, n)
	for i, v := range y {
		x[i] += v
	}
	ar.Release(mark)
}
