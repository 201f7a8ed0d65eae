package cpu

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// Multi-head latent attention and the DSA indexer on the CPU
// (kernels.MLAOps, kernels.SparseOps). AttentionMLA runs each sequence's
// rows in the naive form (keys and values expanded from the latents tile by
// tile, an online softmax) or the absorbed form (scores straight off the
// F32 or BF16 cache with the matmul tiles, W_UK and W_UV applied per head
// as products), whichever costs fewer multiply-adds (MLAShape.Form can
// force one).

var (
	_ kernels.MLAOps    = (*Backend)(nil)
	_ kernels.SparseOps = (*Backend)(nil)
)

// maxPos is the largest position in pos (N, 1) I32; it panics on a
// negative one.
func maxPos(pos kernels.Tensor) int {
	ps := i32(pos)
	m := 0
	for i := range pos.Rows {
		p := int(ps[i*pos.Stride])
		if p < 0 {
			panic("cpu: negative position")
		}
		m = max(m, p)
	}
	return m
}

// angles returns r's cos/sin table covering the positions of pos and the
// number of rotated pairs; a nil r (no rotated dims) gives an empty table.
func (b *Backend) angles(r *kernels.Rotary, pos kernels.Tensor) (*ropeTab, int) {
	if r == nil {
		return &ropeTab{}, 0
	}
	if r.InvFreq.Elems() != r.Dim/2 {
		panic("cpu: rotary frequencies do not match its dim")
	}
	return b.ropeTable(r, maxPos(pos)+1), r.Dim / 2
}

// interleaved is r's pairing, false for nil.
func interleaved(r *kernels.Rotary) bool { return r != nil && r.Interleaved }

// putRow stores row (c.Cols values) into slot s of cache layer c, F32 or
// BF16 (rounded to nearest even).
func putRow(c kernels.Tensor, s int, row []float32) {
	if s < 0 || s >= c.Rows {
		panic("cpu: cache slot outside the cache")
	}
	w := c.Cols
	switch c.DType {
	case kernels.F32:
		copy(f32(c)[s*w:(s+1)*w], row)
	case kernels.BF16:
		dst := raw(c)[2*s*w : 2*(s+1)*w]
		roundBF16(unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(dst))), w), row[:w])
	default:
		panic("cpu: cache dtype must be F32 or BF16")
	}
}

// storeRows computes each row's cache row with fn (dst, the row's position)
// and stores it at p.Slot, rows spread over the workers.
func (b *Backend) storeRows(c kernels.Tensor, n int, p *kernels.Paged, fn func(dst []float32, i, pos int)) {
	if p.Slot.Rows != n || p.Pos.Rows != n || !c.Contiguous() {
		panic("cpu: store rows do not match the positions or slots")
	}
	pos, slots := i32(p.Pos), i32(p.Slot)
	b.Parallel(n, func(lo, hi int) {
		row := make([]float32, c.Cols)
		for i := lo; i < hi; i++ {
			fn(row, i, int(pos[i*p.Pos.Stride]))
			putRow(c, int(slots[i*p.Slot.Stride]), row)
		}
	})
}

// StoreLatent implements kernels.MLAOps.
func (b *Backend) StoreLatent(cache, kv, norm kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	contiguous(kv)
	kl, w := norm.Elems(), kv.Cols
	if cache.Cols != w || w-kl != r.RotatedDims() {
		panic("cpu: StoreLatent shapes do not match")
	}
	xs, ns := f32(kv), f32(norm)[:kl]
	tab, half := b.angles(r, p.Pos)
	b.storeRows(cache, kv.Rows, p, func(dst []float32, i, ps int) {
		ref.LatentRow(dst, xs[i*w:(i+1)*w], ns, eps, tab.cos[ps*half:(ps+1)*half], tab.sin[ps*half:(ps+1)*half], interleaved(r))
	})
}

// StoreIndexKey implements kernels.SparseOps.
func (b *Backend) StoreIndexKey(cache, k, w, bias kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	contiguous(k)
	d := k.Cols
	if cache.Cols != d || w.Elems() != d || bias.Elems() != d || r.RotatedDims() > d {
		panic("cpu: StoreIndexKey shapes do not match")
	}
	xs, ws, bs := f32(k), f32(w)[:d], f32(bias)[:d]
	tab, half := b.angles(r, p.Pos)
	b.storeRows(cache, k.Rows, p, func(dst []float32, i, ps int) {
		ref.IndexKeyRow(dst, xs[i*d:(i+1)*d], ws, bs, eps, tab.cos[ps*half:(ps+1)*half], tab.sin[ps*half:(ps+1)*half], interleaved(r))
	})
}

// mlaSplit is kv_b_proj split per head for the absorbed form, in the
// weight's dtype (exactly) or float32 for other dtypes, or as its file
// stores it split (Mat.KVB).
type mlaSplit struct {
	uk []*kernels.Mat // (Heads) each (KVLora, Nope) = W_UK_hᵀ, so x·ukᵀ = x·W_UK_h
	uv []*kernels.Mat // (Heads) each (V, KVLora) = W_UV_h
}

// mlaSplits caches the splits per kv_b_proj weight (weightCache: a split
// is made once, a caller for one being made waits for it and no other),
// made by the weight's first absorbed AttentionMLA or, for a weight
// declared with its shape (DeclareKVB), by PrepareWeights.
type mlaSplits struct {
	weightCache[*mlaSplit]
	dmu  sync.Mutex
	decl map[*kernels.Mat]kernels.MLAShape // DeclareKVB's, for PrepareWeights
}

// drop forgets every split and declaration (Backend.Close).
func (s *mlaSplits) drop() {
	s.weightCache.drop()
	s.dmu.Lock()
	s.decl = nil
	s.dmu.Unlock()
}

// DeclareKVB implements kernels.KVBDeclarer: PrepareWeights makes kvB's
// per-head split (the absorbed form's) when kvB is among its weights and
// s.Form is not MLANaive. A kvB that does not match s is not recorded
// (AttentionMLA rejects such a call).
func (b *Backend) DeclareKVB(kvB *kernels.Mat, s kernels.MLAShape) {
	if kvB == nil || s.Heads <= 0 || kvB.Rows != s.Heads*(s.Nope+s.V) || kvB.Cols != s.KVLora {
		return
	}
	b.mla.dmu.Lock()
	defer b.mla.dmu.Unlock()
	if b.mla.decl == nil {
		b.mla.decl = map[*kernels.Mat]kernels.MLAShape{}
	}
	b.mla.decl[kvB] = s
}

// prepare makes w's split where w was declared (DeclareKVB) for the
// absorbed form.
func (s *mlaSplits) prepare(w *kernels.Mat) {
	s.dmu.Lock()
	sh, ok := s.decl[w]
	s.dmu.Unlock()
	if ok && sh.Form != kernels.MLANaive {
		s.split(w, sh)
	}
}

// split returns kvB's per-head matrices, building them on first use.
func (s *mlaSplits) split(kvB *kernels.Mat, sh kernels.MLAShape) *mlaSplit {
	return s.get(kvB, func() (*mlaSplit, int64) { return newSplit(kvB, sh) })
}

// newSplit builds kvB's per-head matrices and returns them with their
// bytes; a kvB stored split (Mat.KVB, a GGUF's attn_k_b and attn_v_b)
// gives its parts as they are, no bytes.
func newSplit(kvB *kernels.Mat, sh kernels.MLAShape) (*mlaSplit, int64) {
	nh, dn, dv, kl := sh.Heads, sh.Nope, sh.V, sh.KVLora
	if hs := kvB.KVB; hs != nil && len(hs.UK) == nh && len(hs.UV) == nh && nh > 0 &&
		hs.UK[0].Rows == kl && hs.UK[0].Cols == dn && hs.UV[0].Rows == dv && hs.UV[0].Cols == kl {
		return &mlaSplit{uk: hs.UK, uv: hs.UV}, 0
	}
	dt := kvB.DType
	exact := dt == kernels.F32 || dt == kernels.BF16 || dt == kernels.F16
	if !exact {
		dt = kernels.F32
	}
	es := dt.Size()
	row := make([]float32, kl) // one decoded kv_b_proj row (other dtypes)
	newMat := func(rows, cols int) *kernels.Mat {
		return &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, rows*cols*es)}
	}
	sp := &mlaSplit{uk: make([]*kernels.Mat, nh), uv: make([]*kernels.Mat, nh)}
	var n int64
	for h := range nh {
		uk, uv := newMat(kl, dn), newMat(dv, kl)
		for d := range dn {
			r := h*(dn+dv) + d
			if !exact {
				kvB.RowF32(row, r)
			}
			for c := range kl {
				if exact {
					copy(uk.Data[(c*dn+d)*es:(c*dn+d+1)*es], kvB.Data[(r*kl+c)*es:])
				} else {
					binary.LittleEndian.PutUint32(uk.Data[4*(c*dn+d):], math.Float32bits(row[c]))
				}
			}
		}
		for j := range dv {
			r := h*(dn+dv) + dn + j
			if exact {
				copy(uv.Data[j*kl*es:(j+1)*kl*es], kvB.Data[r*kl*es:])
				continue
			}
			kvB.RowF32(row, r)
			for c, v := range row {
				binary.LittleEndian.PutUint32(uv.Data[4*(j*kl+c):], math.Float32bits(v))
			}
		}
		sp.uk[h], sp.uv[h] = uk, uv
		n += int64(len(uk.Data) + len(uv.Data))
	}
	return sp, n
}

// mlaCall is one AttentionMLA call's operands, unpacked.
type mlaCall struct {
	b                *Backend
	out, q           []float32
	cache            []byte // (slots, KVLora+Rope) elements of dt
	dt               kernels.DType
	pos, seq, blocks []int32
	maxBlocks, bs    int
	s                kernels.MLAShape
	kvB              *kernels.Mat
	sel              []int32 // (N, k) selections; nil for dense attention
	k                int
	tile             int // keys the naive form expands at a time; 0 picks one
}

// AttentionMLA implements kernels.MLAOps.
func (b *Backend) AttentionMLA(out, q, cache kernels.Tensor, kvB *kernels.Mat, r *kernels.Rotary, p *kernels.Paged, s kernels.MLAShape, sel kernels.Tensor) {
	contiguous(out)
	contiguous(q)
	hd := s.Nope + s.Rope
	n := q.Rows
	switch {
	case q.Cols != s.Heads*hd || out.Cols != s.Heads*s.V || out.Rows != n || cache.Cols != s.KVLora+s.Rope || !cache.Contiguous():
		panic("cpu: AttentionMLA shapes do not match")
	case kvB.Rows != s.Heads*(s.Nope+s.V) || kvB.Cols != s.KVLora || r.RotatedDims() != s.Rope:
		panic("cpu: AttentionMLA kv_b_proj or rotary does not match the shape")
	case cache.DType != kernels.F32 && cache.DType != kernels.BF16:
		panic("cpu: MLA cache dtype must be F32 or BF16")
	case sel.Valid() && (sel.Rows != n || !sel.Contiguous()):
		panic("cpu: AttentionMLA selection shape")
	}
	a := mlaCall{
		b: b, out: f32(out), q: f32(q), cache: raw(cache), dt: cache.DType,
		pos: i32(p.Pos), seq: i32(p.Seq), blocks: i32(p.Blocks), maxBlocks: p.Blocks.Cols, bs: p.BlockSize,
		s: s, kvB: kvB, tile: b.mlaTile,
	}
	if sel.Valid() {
		a.sel, a.k = i32(sel), sel.Cols
	}
	// Rotate every head's q_pe at its row's position.
	if tab, half := b.angles(r, p.Pos); half > 0 {
		b.Parallel(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				ps := int(a.pos[i])
				ref.RotateMLAQuery(a.q[i*q.Cols:(i+1)*q.Cols], s, tab.cos[ps*half:(ps+1)*half], tab.sin[ps*half:(ps+1)*half], r.Interleaved)
			}
		})
	}
	absorbed := seqRuns(a.seq[:n], func(lo, hi int) bool { // rows computed in the absorbed form
		if !a.naiveFor(hi-lo, int(a.pos[hi-1])+1) {
			return false
		}
		a.naive(lo, hi)
		return true
	})
	if len(absorbed) > 0 {
		a.absorbed(absorbed)
	}
}

// naiveFor reports whether a chunk of n rows of one sequence, whose keys
// are positions [0, ctx), runs in the naive form. MLAAuto compares the
// multiply-adds: the naive form expands every key once (KVLora·(Nope+V) per
// key and head), then costs Nope+Rope+V per query and attended key; the
// absorbed form costs 2·KVLora+Rope per query and attended key plus
// KVLora·(Nope+V) per query. Prefill chunks come out naive, decode rows and
// short verification chunks over a long context absorbed.
func (a *mlaCall) naiveFor(n, ctx int) bool {
	switch a.s.Form {
	case kernels.MLANaive:
		return true
	case kernels.MLAAbsorbed:
		return false
	}
	return naiveCheaper(a.s, n, ctx, a.k)
}

// naiveCheaper reports whether the naive form costs fewer multiply-adds
// than the absorbed one for n rows of one sequence over keys [0, ctx), each
// attending to at most topK of them (0: all).
func naiveCheaper(s kernels.MLAShape, n, ctx, topK int) bool {
	kl, dn, dr, dv := float64(s.KVLora), float64(s.Nope), float64(s.Rope), float64(s.V)
	keys := float64(ctx) - float64(n-1)/2 // keys an average row of the chunk attends to
	if topK > 0 {
		keys = min(keys, float64(topK))
	}
	naive := float64(ctx)*kl*(dn+dv) + float64(n)*keys*(dn+dr+dv)
	absorbed := float64(n) * (kl*(dn+dv) + keys*(2*kl+dr))
	return naive < absorbed
}

// selRow is row i's selected positions (the part before the first −1), or
// sparse = false when the call has no selection.
func (a *mlaCall) selRow(i int) (idx []int32, sparse bool) {
	if a.sel == nil {
		return nil, false
	}
	row := a.sel[i*a.k : (i+1)*a.k]
	n := 0
	for n < len(row) && row[n] >= 0 {
		n++
	}
	return row[:n], true
}

// slot is the cache slot of position p of row i's sequence.
func (a *mlaCall) slot(i, p int) int {
	bt := a.blocks[int(a.seq[i])*a.maxBlocks:]
	return int(bt[p/a.bs])*a.bs + p%a.bs
}

// rowF32 sets dst to the first len(dst) values of cache slot s.
func (a *mlaCall) rowF32(dst []float32, s int) {
	w := a.s.KVLora + a.s.Rope
	if a.dt == kernels.F32 {
		src := a.cache[4*s*w:]
		for j := range dst {
			dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*j:]))
		}
		return
	}
	src := a.cache[2*s*w:]
	for j := range dst {
		dst[j] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16)
	}
}

// absorbed computes the given rows in the absorbed form: per head
// q̃ = W_UK_hᵀ q_nope (a product over the rows), scores q̃·c + q_pe·k_pe
// straight off the cache, the softmax-weighted latents, then W_UV_h once
// per head.
func (a *mlaCall) absorbed(rows []int32) {
	b, s := a.b, a.s
	m, nh, kl, dn, dv := len(rows), s.Heads, s.KVLora, s.Nope, s.V
	hd, kw := dn+s.Rope, kl+s.Rope
	qw := nh * hd
	sp := b.mla.split(a.kvB, s)

	qc := make([]float32, m*nh*kw)          // (m, Heads, KVLora+Rope): [W_UK_hᵀ q_nope_h | q_pe_h]
	in := make([]float32, nh*m*max(dn, kl)) // (Heads, m, Nope) q_nope per head, then (Heads, m, KVLora) its latents
	ob := make([]float32, nh*m*max(kl, dv)) // (Heads, m, KVLora) absorbed queries, then (Heads, m, V) head outputs
	for h := range nh {
		for r, i := range rows {
			copy(in[(h*m+r)*dn:(h*m+r+1)*dn], a.q[int(i)*qw+h*hd:])
		}
	}
	b.headMatMuls(ob, m*kl, in, m*dn, sp.uk, m)
	for h := range nh {
		for r, i := range rows {
			dst := qc[(r*nh+h)*kw : (r*nh+h+1)*kw]
			copy(dst[:kl], ob[(h*m+r)*kl:(h*m+r+1)*kl])
			copy(dst[kl:], a.q[int(i)*qw+h*hd+dn:int(i)*qw+(h+1)*hd])
		}
	}

	lat := make([]float32, m*nh*kl) // (m, Heads, KVLora) softmax-weighted latents
	maxLen := 0
	for _, i := range rows {
		maxLen = max(maxLen, int(a.pos[i])+1)
	}
	pairs := (nh + 1) / 2
	tiles := tilesFor(a.dt)
	esz := a.dt.Size()
	b.Parallel(m*pairs, func(lo, hi int) {
		sc := make([]float32, 2*maxLen) // (heads of the pair, keys) scores, then probabilities
		var keys []int32                // the positions attended to
		for item := lo; item < hi; item++ {
			r, h0 := item/pairs, 2*(item%pairs)
			g := min(2, nh-h0)
			i := int(rows[r])
			idx, sparse := a.selRow(i)
			if !sparse {
				keys = keys[:0]
				for p := range int(a.pos[i]) + 1 {
					keys = append(keys, int32(p))
				}
				idx = keys
			}
			nk := len(idx)
			x := qc[(r*nh+h0)*kw:]
			for j := 0; j < nk; {
				s0 := a.slot(i, int(idx[j]))
				w := a.cache[s0*kw*esz:]
				// Four keys in consecutive slots take one 2×4 tile.
				if g == 2 && j+4 <= nk && a.slot(i, int(idx[j+3])) == s0+3 && idx[j+3] == idx[j]+3 {
					tiles.r2c4(sc[j:], nk, x, kw, w, kw, kw)
					j += 4
					continue
				}
				if g == 2 {
					tiles.r2c1(sc[j:], nk, x, kw, w, kw, kw)
				} else {
					tiles.r1c1(sc[j:], nk, x, kw, w, kw, kw)
				}
				j++
			}
			for k := range g {
				softmax(sc[k*nk:(k+1)*nk], s.Scale)
				acc := lat[(r*nh+h0+k)*kl : (r*nh+h0+k+1)*kl]
				clear(acc)
				for j, p := range idx {
					axpyRow(a.dt, acc, sc[k*nk+j], a.cache[a.slot(i, int(p))*kw*esz:])
				}
			}
		}
	})

	for h := range nh {
		for r := range rows {
			copy(in[(h*m+r)*kl:(h*m+r+1)*kl], lat[(r*nh+h)*kl:])
		}
	}
	b.headMatMuls(ob, m*dv, in, m*kl, sp.uv, m)
	for h := range nh {
		for r, i := range rows {
			copy(a.out[int(i)*nh*dv+h*dv:], ob[(h*m+r)*dv:(h*m+r+1)*dv])
		}
	}
}

// headMatMuls sets y_h = x_h·ws[h]ᵀ (m rows) for every head h, y_h and x_h
// the h-th runs of ys and xs (yn and xn values each). Where there are at
// least as many heads as workers, the heads run side by side, each
// product inline on one worker (as a decode's experts do, ExpertsClamp):
// a head's matrices are small (GLM-4.7-Flash's W_UK_hᵀ is 104 KB of Q8_0),
// and a MatMul per head paid the pool's hand-off twenty times a layer
// (sideBySide, its buffers kept between calls). A product's values do not
// depend on which worker runs it.
func (b *Backend) headMatMuls(ys []float32, yn int, xs []float32, xn int, ws []*kernels.Mat, m int) {
	nh := len(ws)
	if nh < b.pool.workers {
		for h, w := range ws {
			b.MatMul(ys[h*yn:(h+1)*yn], xs[h*xn:(h+1)*xn], w, m)
		}
		return
	}
	b.heads.run(b, nh, func(h int, xb *xbufs, scratch *[]float32) {
		b.matMulInline(ys[h*yn:(h+1)*yn], xs[h*xn:(h+1)*xn], ws[h], m, xb, scratch)
	})
}

// naiveTile is the number of keys the naive form expands at a time for a
// context of ctx keys.
func (a *mlaCall) naiveTile(ctx int) int {
	t := a.tile
	if t <= 0 {
		t = min(max((1<<20)/(a.s.Heads*(a.s.Nope+a.s.V)), 64), 4096)
	}
	return max(1, min(t, ctx))
}

// naive computes rows [r0, r1), consecutive rows of one sequence, in the
// naive form: the sequence's cached latents are expanded tile by tile into
// keys [W_UK_h·c | k_pe] and values W_UV_h·c with one product, then per
// head S = Q_h·K_hᵀ and O_h += P·V_h are two more products (each head on
// one worker, single-threaded), with an online softmax per (row, head)
// across the tiles. Keys a row may not see (later positions, or outside
// its selection) are masked.
func (a *mlaCall) naive(r0, r1 int) {
	b, s := a.b, a.s
	nh, kl, dn, dr, dv := s.Heads, s.KVLora, s.Nope, s.Rope, s.V
	hd := dn + dr
	qw, kw, ew := nh*hd, kl+dr, nh*(dn+dv)
	m := r1 - r0
	ctx := int(a.pos[r1-1]) + 1 // keys [0, ctx)
	tile := a.naiveTile(ctx)

	lat := make([]float32, tile*kl) // (tile, KVLora) latents
	kpe := make([]float32, tile*dr) // (tile, Rope) rotated rope keys
	row := make([]float32, kw)      // one cache row
	kx := make([]float32, tile*ew)  // (tile, Heads·(Nope+V)) expanded [k_nope | v] per head
	see := make([]bool, m*tile)     // (m, tile) the row may attend to the key
	qh := make([]float32, nh*m*hd)  // (Heads, m, Nope+Rope) the rows' queries per head
	acc := make([]float32, nh*m*dv) // (Heads, m, V) unnormalised outputs
	mx := make([]float32, nh*m)     // (Heads, m) running score maximum (scaled)
	sum := make([]float64, nh*m)    // (Heads, m) running softmax denominator
	for i := range mx {
		mx[i] = float32(math.Inf(-1))
	}
	for h := range nh {
		for r := range m {
			copy(qh[(h*m+r)*hd:(h*m+r+1)*hd], a.q[(r0+r)*qw+h*hd:])
		}
	}
	for t0 := 0; t0 < ctx; t0 += tile {
		t1 := min(ctx, t0+tile)
		tl := t1 - t0
		for p := t0; p < t1; p++ {
			a.rowF32(row, a.slot(r0, p))
			copy(lat[(p-t0)*kl:(p-t0+1)*kl], row[:kl])
			copy(kpe[(p-t0)*dr:(p-t0+1)*dr], row[kl:])
		}
		b.MatMul(kx[:tl*ew], lat[:tl*kl], a.kvB, tl)
		a.visible(see[:m*tl], r0, r1, t0, t1)
		b.Parallel(nh, func(lo, hi int) {
			sc := scratchPool.Get().(*attnScratch)
			defer scratchPool.Put(sc)
			k := grow(&sc.k, tl*hd)   // (tl, Nope+Rope) this head's keys
			vt := grow(&sc.vt, dv*tl) // (V, tl) its values, transposed
			p := grow(&sc.sc, m*tl)   // (m, tl) scores, then probabilities
			o := grow(&sc.os, m*dv)   // (m, V)
			for h := lo; h < hi; h++ {
				for j := range tl {
					e := kx[j*ew+h*(dn+dv):]
					copy(k[j*hd:j*hd+dn], e[:dn])
					copy(k[j*hd+dn:(j+1)*hd], kpe[j*dr:(j+1)*dr])
					for d, v := range e[dn : dn+dv] {
						vt[d*tl+j] = v
					}
				}
				b.MatMul(p, qh[h*m*hd:(h+1)*m*hd], &kernels.Mat{DType: kernels.F32, Rows: tl, Cols: hd, Data: f32Bytes(k), Transient: true}, m)
				sees := false
				for r := range m {
					sees = a.softmaxStep(p[r*tl:(r+1)*tl], see[r*tl:(r+1)*tl], h*m+r, mx, sum, acc[(h*m+r)*dv:(h*m+r+1)*dv]) || sees
				}
				if !sees {
					continue
				}
				b.MatMul(o, p, &kernels.Mat{DType: kernels.F32, Rows: dv, Cols: tl, Data: f32Bytes(vt), Transient: true}, m)
				for i, v := range o {
					acc[h*m*dv+i] += v
				}
			}
		})
	}
	for h := range nh {
		for r := range m {
			item := h*m + r
			dst := a.out[(r0+r)*nh*dv+h*dv : (r0+r)*nh*dv+(h+1)*dv]
			if sum[item] == 0 { // nothing attended to
				clear(dst)
				continue
			}
			inv := float32(1 / sum[item])
			for j, v := range acc[item*dv : (item+1)*dv] {
				dst[j] = v * inv
			}
		}
	}
}

// visible sets see (rows r0..r1, keys t0..t1) to whether each row may
// attend to each key: a causal one, within the row's selection if any.
func (a *mlaCall) visible(see []bool, r0, r1, t0, t1 int) {
	tl := t1 - t0
	clear(see)
	for r := r0; r < r1; r++ {
		row := see[(r-r0)*tl : (r-r0+1)*tl]
		end := min(t1, int(a.pos[r])+1)
		idx, sparse := a.selRow(r)
		if !sparse {
			for p := t0; p < end; p++ {
				row[p-t0] = true
			}
			continue
		}
		k0, _ := slices.BinarySearch(idx, int32(t0))
		for _, p := range idx[k0:] {
			if int(p) >= end {
				break
			}
			row[int(p)-t0] = true
		}
	}
}

// softmaxStep folds one (row, head)'s tile of raw scores into its online
// softmax: masked keys get probability 0, the others exp(Scale·s − max),
// with the running maximum, sum and accumulated output acc (V) rescaled
// when the maximum grows. It leaves the probabilities in sc and reports
// whether the row sees any key of the tile.
func (a *mlaCall) softmaxStep(sc []float32, see []bool, item int, mx []float32, sum []float64, acc []float32) bool {
	tm := float32(math.Inf(-1))
	for j, v := range sc {
		if see[j] {
			sc[j] = v * a.s.Scale
			tm = max(tm, sc[j])
		}
	}
	if math.IsInf(float64(tm), -1) {
		clear(sc)
		return false
	}
	if tm > mx[item] {
		if sum[item] != 0 {
			f := expf(mx[item] - tm)
			sum[item] *= float64(f)
			for d := range acc {
				acc[d] *= f
			}
		}
		mx[item] = tm
	}
	var ps float64
	for j, v := range sc {
		e := float32(0)
		if see[j] {
			e = expf(v - mx[item])
		}
		sc[j] = e
		ps += float64(e)
	}
	sum[item] += ps
	return true
}

// IndexerScores implements kernels.SparseOps: (row, key block) items over
// the workers, each head pair's scores against four keys a tile.
func (b *Backend) IndexerScores(scores, q, w, keys kernels.Tensor, p *kernels.Paged, s kernels.IndexerShape) {
	for _, t := range []kernels.Tensor{scores, q, w} {
		contiguous(t)
	}
	n, L, d, nh := q.Rows, scores.Cols, s.Dim, s.Heads
	switch {
	case q.Cols != nh*d || w.Cols != nh || w.Rows != n || scores.Rows != n || keys.Cols != d || !keys.Contiguous():
		panic("cpu: IndexerScores shapes do not match")
	case keys.DType != kernels.F32 && keys.DType != kernels.BF16:
		panic("cpu: indexer key cache dtype must be F32 or BF16")
	case n > 0 && maxPos(p.Pos) >= L:
		panic("cpu: IndexerScores scores narrower than a row's length")
	}
	sc, qs, ws := f32(scores), f32(q), f32(w)
	pos, seq, blocks := i32(p.Pos), i32(p.Seq), i32(p.Blocks)
	bs, maxBlocks := p.BlockSize, p.Blocks.Cols
	kr, esz, tiles := raw(keys), keys.DType.Size(), tilesFor(keys.DType)
	nb := (L + bs - 1) / bs
	inf := float32(math.Inf(-1))
	b.Parallel(n*nb, func(lo, hi int) {
		dots := make([]float32, nh*bs) // (heads, keys of the block)
		for item := lo; item < hi; item++ {
			i, blk := item/nb, item%nb
			row := sc[i*L : (i+1)*L]
			ln := int(pos[i]) + 1
			p0, p1 := blk*bs, min((blk+1)*bs, L)
			e := min(p1, ln) // visible keys of the block end here
			for t := max(p0, e); t < p1; t++ {
				row[t] = inf
			}
			if e <= p0 {
				continue
			}
			if ln <= s.TopK {
				clear(row[p0:e])
				continue
			}
			nk := e - p0
			kb := kr[int(blocks[int(seq[i])*maxBlocks+blk])*bs*d*esz:]
			x := qs[i*nh*d:]
			h := 0
			for ; h+2 <= nh; h += 2 {
				j := 0
				for ; j+4 <= nk; j += 4 {
					tiles.r2c4(dots[h*nk+j:], nk, x[h*d:], d, kb[j*d*esz:], d, d)
				}
				for ; j < nk; j++ {
					tiles.r2c1(dots[h*nk+j:], nk, x[h*d:], d, kb[j*d*esz:], d, d)
				}
			}
			for ; h < nh; h++ {
				for j := range nk {
					tiles.r1c1(dots[h*nk+j:], nk, x[h*d:], d, kb[j*d*esz:], d, d)
				}
			}
			wr := ws[i*nh : (i+1)*nh]
			for j := range nk {
				var v float32
				for h, wh := range wr {
					if dt := dots[h*nk+j] * s.Scale; dt > 0 {
						v += wh * dt
					}
				}
				row[p0+j] = v
			}
		}
	})
}

// TopK implements kernels.SparseOps: one row per task, a bounded heap of
// the best columns seen.
func (b *Backend) TopK(sel, scores kernels.Tensor) {
	contiguous(sel)
	contiguous(scores)
	if sel.Rows != scores.Rows {
		panic("cpu: TopK shapes do not match")
	}
	k, L := sel.Cols, scores.Cols
	out, sc := i32(sel), f32(scores)
	b.Parallel(sel.Rows, func(lo, hi int) {
		heap := make([]int32, 0, k)
		for i := lo; i < hi; i++ {
			n := topK(sc[i*L:(i+1)*L], heap, out[i*k:(i+1)*k])
			for j := n; j < k; j++ {
				out[i*k+j] = -1
			}
		}
	})
}

// topK writes into out, in ascending order, the columns of the at most
// len(out) largest finite scores (ties to the lower column) and returns
// how many it wrote. heap is scratch with capacity len(out).
func topK(scores []float32, heap, out []int32) int {
	k := len(out)
	// below reports whether column a ranks below column b.
	below := func(a, b int32) bool {
		if scores[a] != scores[b] {
			return scores[a] < scores[b]
		}
		return a > b
	}
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(heap) {
				return
			}
			m := l
			if r := l + 1; r < len(heap) && below(heap[r], heap[l]) {
				m = r
			}
			if !below(heap[m], heap[i]) {
				return
			}
			heap[i], heap[m] = heap[m], heap[i]
			i = m
		}
	}
	// A min-heap (by rank) of the best k seen so far: its root is the
	// weakest kept column.
	heap = heap[:0]
	inf := float32(math.Inf(-1))
	for c, v := range scores {
		if v == inf || k == 0 {
			continue
		}
		p := int32(c)
		if len(heap) < k {
			heap = append(heap, p)
			for i := len(heap) - 1; i > 0; {
				parent := (i - 1) / 2
				if !below(heap[i], heap[parent]) {
					break
				}
				heap[i], heap[parent] = heap[parent], heap[i]
				i = parent
			}
			continue
		}
		if below(heap[0], p) {
			heap[0] = p
			down(0)
		}
	}
	n := copy(out, heap)
	slices.Sort(out[:n])
	return n
}
