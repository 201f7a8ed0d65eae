package cpu

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Paged attention on the CPU. A sequence contributing at least
// prefillRows rows (a prompt chunk) runs as two matrix products per KV head
// and query tile, each tile reading only the keys its last row can see
// (causal skipping); the other rows (decode, short verification chunks) run
// as (row, range of blocks) items, split-KV: scores from the matmul tiles
// straight off the F32 or BF16 cache, the ranges' partial softmaxes merged.

// prefillRows is the chunk length from which a sequence's attention runs as
// matrix products.
const prefillRows = 16

// queryTile is how many query rows share one pair of products; smaller
// tiles skip more of the masked half, larger ones amortise the products.
const queryTile = 64

// StoreKV implements kernels.AttentionOps.
func (b *Backend) StoreKV(kc, vc, k, v kernels.Tensor, p *kernels.Paged) {
	store(kc, k, p)
	store(vc, v, p)
}

// store writes the rows of x (N, width) F32 into cache slots p.Slot.
func store(c, x kernels.Tensor, p *kernels.Paged) {
	if x.Cols != c.Cols || p.Slot.Rows != x.Rows || !c.Contiguous() {
		panic("cpu: StoreKV shapes do not match the cache")
	}
	xs, slots, w := f32(x), i32(p.Slot), x.Cols
	for i := range x.Rows {
		putRow(c, int(slots[i*p.Slot.Stride]), xs[i*x.Stride:i*x.Stride+w])
	}
}

// attnCall is one Attention call's operands, unpacked.
type attnCall struct {
	b                   *Backend
	out, q              []float32
	kraw, vraw          []byte // cache layers, (slots, width) elements of dt
	dt                  kernels.DType
	pos, seq, blocks    []int32
	maxBlocks, bs       int
	heads, kvh, hd, grp int
	scale               float32
}

// Attention implements kernels.AttentionOps.
func (b *Backend) Attention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape) {
	contiguous(out)
	contiguous(q)
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	switch {
	case s.KVHeads <= 0 || s.Heads%s.KVHeads != 0:
		panic("cpu: Attention head counts")
	case q.Cols != qw || out.Cols != qw || out.Rows != q.Rows || kc.Cols != kw || vc.Cols != kw || kc.DType != vc.DType:
		panic("cpu: Attention shapes do not match")
	case kc.DType != kernels.F32 && kc.DType != kernels.BF16:
		panic("cpu: KV cache dtype must be F32 or BF16")
	}
	a := attnCall{
		b: b, out: f32(out), q: f32(q), kraw: raw(kc), vraw: raw(vc), dt: kc.DType,
		pos: i32(p.Pos), seq: i32(p.Seq), blocks: i32(p.Blocks), maxBlocks: p.Blocks.Cols, bs: p.BlockSize,
		heads: s.Heads, kvh: s.KVHeads, hd: s.HeadDim, grp: s.Heads / s.KVHeads, scale: s.Scale,
	}
	short := seqRuns(a.seq[:q.Rows], func(lo, hi int) bool { // rows handled item by item
		if hi-lo < prefillRows {
			return false
		}
		a.chunk(lo, hi)
		return true
	})
	if len(short) > 0 {
		a.rows(short)
	}
}

// seqRuns calls whole for every run [lo, hi) of consecutive rows of one
// sequence (seq holds each row's sequence) and returns, in order, the rows
// of the runs it declined (whole returned false).
func seqRuns(seq []int32, whole func(lo, hi int) bool) []int32 {
	var rest []int32
	for lo := 0; lo < len(seq); {
		hi := lo + 1
		for hi < len(seq) && seq[hi] == seq[lo] {
			hi++
		}
		if !whole(lo, hi) {
			for i := lo; i < hi; i++ {
				rest = append(rest, int32(i))
			}
		}
		lo = hi
	}
	return rest
}

// slot is the cache slot of position p of the sequence with block table bt.
func (a *attnCall) slot(bt []int32, p int) int { return int(bt[p/a.bs])*a.bs + p%a.bs }

// table is sequence s's block table.
func (a *attnCall) table(s int32) []int32 {
	return a.blocks[int(s)*a.maxBlocks : (int(s)+1)*a.maxBlocks]
}

// rows computes the given rows (decode rows, short verification chunks)
// as (row, split) items, flash-decoding style: a split is a range of
// whole blocks of the row's positions, and its item walks them block by
// block, reading every KV head of a block's keys (whole slot rows, one
// contiguous run a block) for the scores off the matmul tiles, then per
// query head the split's largest scaled score m and l = Σ exp(s·scale −
// m) (the scores become those exponentials), then the block's values the
// same way for o = Σ exp(s·scale − m)·v by pv. A row of one split is
// o/l; a row of several is merged once they are all done: out =
// Σ e^(m−M)·o / Σ e^(m−M)·l over its splits, M their largest m. A row
// splits over the workers it would otherwise leave idle (threads/rows
// splits), so that a batch-1 step reads each worker's own contiguous run
// of the cache, where splitting the heads would have every worker stride
// through every slot row.
func (a *attnCall) rows(rows []int32) {
	nb := 0 // blocks of the longest row
	for _, i := range rows {
		nb = max(nb, (int(a.pos[i])+a.bs)/a.bs)
	}
	splits := min(nb, max(1, a.b.Threads()/len(rows)))
	span := (nb + splits - 1) / splits * a.bs // positions of the longest split
	hd, nh := a.hd, a.heads
	var ps *decodeScratch
	var part, stat []float32
	if splits > 1 {
		ps = decodePool.Get().(*decodeScratch)
		defer decodePool.Put(ps)
		part = grow(&ps.sc, len(rows)*splits*nh*hd) // (row, split, head, hd) unnormalised outputs
		stat = grow(&ps.inv, len(rows)*splits*nh*2) // (row, split, head) m and l
	}
	a.b.Parallel(len(rows)*splits, func(lo, hi int) {
		s := decodePool.Get().(*decodeScratch)
		defer decodePool.Put(s)
		sc := grow(&s.sc, nh*span) // (heads, n) scores, then exponentials
		if cap(s.offs) < span {
			s.offs = make([]int, span)
		}
		for item := lo; item < hi; item++ {
			i, sp := int(rows[item/splits]), item%splits
			ln := int(a.pos[i]) + 1
			rb := (ln + a.bs - 1) / a.bs // the row's blocks
			p0, p1 := sp*rb/splits*a.bs, min(ln, (sp+1)*rb/splits*a.bs)
			o := a.out[i*nh*hd : (i+1)*nh*hd] // (heads, hd)
			var st []float32
			if splits > 1 {
				o = part[item*nh*hd : (item+1)*nh*hd]
				st = stat[item*nh*2 : (item+1)*nh*2]
			}
			clear(o)
			if p0 >= p1 { // a short row's empty split
				clear(st)
				continue
			}
			n := p1 - p0
			offs := s.offs[:n]
			a.offsets(offs, a.table(a.seq[i])[p0/a.bs:])
			a.splitScores(s, sc[:nh*n], i, offs)
			inv := grow(&s.inv, nh) // one split's 1/l by head
			for h := range nh {
				x := sc[h*n : (h+1)*n]
				m := scaledMax(x, a.scale)
				l := expSum(x, a.scale, m)
				if splits == 1 {
					inv[h] = float32(1 / l)
				} else {
					st[2*h], st[2*h+1] = m, float32(l)
				}
			}
			a.splitPV(o, sc[:nh*n], offs)
			if splits == 1 {
				for h := range nh {
					scale(o[h*hd:(h+1)*hd], o[h*hd:(h+1)*hd], inv[h])
				}
			}
		}
	})
	if splits > 1 {
		for r, i := range rows {
			a.merge(ps, a.out[int(i)*nh*hd:(int(i)+1)*nh*hd], part[r*splits*nh*hd:(r+1)*splits*nh*hd], stat[r*splits*nh*2:(r+1)*splits*nh*2], splits)
		}
	}
}

// prefetchBlocks is how many blocks ahead of the one it reads a rows item
// prefetches, a KV head at a time (about 4 KiB each for Qwen3-0.6B, spread
// over the block's work): on the Zen 5 BenchmarkAttnDecodeCold took 155
// µs so, 173 one block ahead, 200 three ahead, 231 prefetching whole
// blocks one ahead at once (the path before) and 296 with no prefetch
// (session 16, BENCHMARKS.md §13).
const prefetchBlocks = 2

// prefetchAhead asks for KV head kvh's part of the rows of the block
// prefetchBlocks ahead of position p0 in data (offs: the split's element
// offsets, whole blocks but the last), or, past the split's last block,
// of the first blocks of then (the values after the keys; nil: none).
func (a *attnCall) prefetchAhead(data, then []byte, offs []int, p0, kvh int) {
	n, e := len(offs), kvh*a.hd*a.dt.Size()
	next := p0 + prefetchBlocks*a.bs
	if next >= n {
		if then == nil {
			return
		}
		data, next = then, next-roundUp(n, a.bs)
		if next >= n {
			return
		}
	}
	prefetchRows(a.dt, data[e:], offs[next:min(next+a.bs, n)], a.hd)
}

// splitScores sets sc (heads, n) to query row i's scores (unscaled) over
// the n keys at element offsets offs, block by block (a block's offsets
// run on, kw apart), every KV head of a block before the next, prefetching
// ahead (prefetchAhead) the keys, then the first values.
func (a *attnCall) splitScores(s *decodeScratch, sc []float32, i int, offs []int) {
	tiles := tilesFor(a.dt)
	hd, grp, n, kw := a.hd, a.grp, len(offs), a.kvh*a.hd
	esz := a.dt.Size()
	vdp := a.gemmScores() && hd%32 == 0 // scores on the gemm tiles, the queries rounded
	var qb []uint16                     // (heads, hd) queries rounded, for vdp
	if vdp {
		qb = growU16(&s.qb, a.heads*hd)
		roundBF16(qb, a.q[i*a.heads*hd:(i+1)*a.heads*hd])
	}
	for p0 := 0; p0 < n; p0 += a.bs {
		nk := min(a.bs, n-p0)
		for kvh := range a.kvh {
			a.prefetchAhead(a.kraw, a.vraw, offs, p0, kvh)
			w := a.kraw[(offs[p0]+kvh*hd)*esz:]
			sg := sc[kvh*grp*n+p0:] // the group's heads, n apart
			if vdp {
				a.scoresVDP(sg, n, qb[kvh*grp*hd:], w, nk)
				continue
			}
			qg := a.q[(i*a.heads+kvh*grp)*hd : (i*a.heads+(kvh+1)*grp)*hd] // (group, hd)
			g := 0
			for ; g+2 <= grp; g += 2 {
				x, y := qg[g*hd:], sg[g*n:]
				j := 0
				for ; j+4 <= nk; j += 4 {
					tiles.r2c4(y[j:], n, x, hd, w[j*kw*esz:], kw, hd)
				}
				for ; j < nk; j++ {
					tiles.r2c1(y[j:], n, x, hd, w[j*kw*esz:], kw, hd)
				}
			}
			for ; g < grp; g++ {
				x, y := qg[g*hd:], sg[g*n:]
				for j := range nk {
					tiles.r1c1(y[j:], 1, x, hd, w[j*kw*esz:], kw, hd)
				}
			}
		}
	}
}

// splitPV adds P (heads, n) · V to o (heads, hd) over the value rows at
// element offsets offs, block by block, every KV head of a block before
// the next, two query heads of a group a pv call, prefetching ahead.
func (a *attnCall) splitPV(o, p []float32, offs []int) {
	hd, grp, n := a.hd, a.grp, len(offs)
	esz := a.dt.Size()
	for p0 := 0; p0 < n; p0 += a.bs {
		blk := offs[p0:min(p0+a.bs, n)]
		for kvh := range a.kvh {
			a.prefetchAhead(a.vraw, nil, offs, p0, kvh)
			v := a.vraw[kvh*hd*esz:]
			r0 := kvh * grp
			g := 0
			for ; g+2 <= grp; g += 2 {
				pv(a.dt, o[(r0+g)*hd:], hd, p[(r0+g)*n+p0:], n, v, blk, hd, 2)
			}
			if g < grp {
				pv(a.dt, o[(r0+g)*hd:], hd, p[(r0+g)*n+p0:], n, v, blk, hd, 1)
			}
		}
	}
}

// merge sets out (heads, hd) to one row's attention from its splits'
// unnormalised outputs part (splits, heads, hd) and their (m, l) pairs in
// stat (splits, heads, 2): out = Σ e^(m−M)·o / Σ e^(m−M)·l, M the
// largest m of the splits with l > 0 (an empty split has l = 0).
func (a *attnCall) merge(scr *decodeScratch, out, part, stat []float32, splits int) {
	hd, nh := a.hd, a.heads
	if cap(scr.w) < splits {
		scr.w = make([]float64, splits)
	}
	w := scr.w[:splits] // e^(m−M) by split
	for h := range nh {
		mx := float32(math.Inf(-1))
		for s := range splits {
			if stat[(s*nh+h)*2+1] > 0 {
				mx = max(mx, stat[(s*nh+h)*2])
			}
		}
		var den float64
		for s := range splits {
			w[s] = 0
			if l := stat[(s*nh+h)*2+1]; l > 0 {
				w[s] = math.Exp(float64(stat[(s*nh+h)*2] - mx))
				den += w[s] * float64(l)
			}
		}
		o := out[h*hd : (h+1)*hd]
		clear(o)
		for s := range splits {
			if w[s] != 0 {
				axpy(o, float32(w[s]/den), part[(s*nh+h)*hd:(s*nh+h+1)*hd])
			}
		}
	}
}

// decodeScratch is one rows worker's scratch.
type decodeScratch struct {
	sc, inv []float32 // scores; 1/l by head (as the caller's: the splits' outputs, their m and l)
	offs    []int     // the split's key offsets
	qb      []uint16  // rounded queries
	w       []float64 // merge's weights by split
}

// decodePool recycles decodeScratch between calls and workers.
var decodePool = sync.Pool{New: func() any { return new(decodeScratch) }}

// scaledMaxGo returns the largest x[i]·scale (each product a float32),
// −inf for an empty x: the pure-Go twin of scaledMaxF32.
func scaledMaxGo(x []float32, scale float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v*scale)
	}
	return m
}

// expSumGo sets x[i] = exp(x[i]·scale − m) by expf (0 below −87) and
// returns their sum in float64: the pure-Go twin of expSumF32.
func expSumGo(x []float32, scale, m float32) float64 {
	var sum float64
	for i, v := range x {
		e := expf(v*scale - m)
		x[i] = e
		sum += float64(e)
	}
	return sum
}

// scoresVDP is rows' scores of one KV head's query group over nk keys of
// a block on the gemm tiles: y (grp, ldy) = q (grp, hd) bfloat16 · the keys
// at w, kw elements apart, up to 4 heads by 6 keys a tile.
func (a *attnCall) scoresVDP(y []float32, ldy int, q []uint16, w []byte, nk int) {
	g := bf16TilesFor().gemm
	hd, kw := a.hd, a.kvh*a.hd
	for r0 := 0; r0 < a.grp; r0 += g.R {
		r := min(g.R, a.grp-r0)
		for j := 0; j < nk; j += g.C {
			g.t[r-1][min(g.C, nk-j)-1](y[r0*ldy+j:], ldy, q[r0*hd:], hd, w[2*j*kw:], kw, hd, 0)
		}
	}
}

// offsets sets offs[p] to the element offset of position p's row in a
// cache layer (slot·KV width), for the sequence with block table bt.
func (a *attnCall) offsets(offs []int, bt []int32) {
	kw := a.kvh * a.hd
	for p0 := 0; p0 < len(offs); p0 += a.bs {
		e := int(bt[p0/a.bs]) * a.bs * kw
		for p := p0; p < min(p0+a.bs, len(offs)); p++ {
			offs[p] = e
			e += kw
		}
	}
}

// pvGo adds P (rows, ldp) · V to o (rows, ldo), V's hd-wide rows at
// element offsets offs of v (F32 or BF16), summing over the keys in order:
// the pure-Go twin of the attnPV kernels.
func pvGo(dt kernels.DType, o []float32, ldo int, p []float32, ldp int, v []byte, offs []int, hd, rows int) {
	esz := dt.Size()
	for r := range rows {
		or := o[r*ldo : r*ldo+hd]
		for i, e := range offs {
			axpyGo(dt, or, p[r*ldp+i], v[e*esz:])
		}
	}
}

// keyRow sets dst to the len(dst) cache values at element e of layer data,
// as float32.
func (a *attnCall) keyRow(dst []float32, data []byte, e int) {
	if a.dt == kernels.F32 {
		all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/4)
		copy(dst, all[e:e+len(dst)])
		return
	}
	src := data[2*e : 2*(e+len(dst))]
	for j := range dst {
		dst[j] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16)
	}
}

// chunk computes rows [lo, hi), consecutive tokens of one sequence, with
// two matrix products per KV head and query tile: S = Q·Kᵀ over the
// group's stacked query heads and the keys the tile's last row can see, a
// causal softmax per row, then O = S·V. The (tile, KV head) items run in one
// Parallel call, each on one worker with single-threaded products (a MatMul
// issued inside Parallel runs inline), so a layer's attention is one
// synchronisation, not a few per tile: on a busy machine every wake-up of a
// helper costs a scheduling delay.
func (a *attnCall) chunk(lo, hi int) {
	tiles := (hi - lo + queryTile - 1) / queryTile
	// Items alternate cheap (early) and expensive (late) tiles, so the
	// contiguous ranges Parallel hands out cost about the same.
	order := make([]int, 0, tiles)
	for i, j := 0, tiles-1; i <= j; i, j = i+1, j-1 {
		order = append(order, i)
		if i != j {
			order = append(order, j)
		}
	}
	a.b.Parallel(tiles*a.kvh, func(i0, i1 int) {
		s := scratchPool.Get().(*attnScratch)
		defer scratchPool.Put(s)
		amx := a.dt == kernels.BF16 && a.b.bf16x && a.hd%32 == 0 && amxKernelsFor() != nil
		vdp := a.vdpAttention()
		for item := i0; item < i1; item++ {
			t0 := lo + order[item/a.kvh]*queryTile
			if amx {
				a.tileAMX(s, item%a.kvh, t0, min(hi, t0+queryTile))
			} else if vdp {
				a.tileVDP(s, item%a.kvh, t0, min(hi, t0+queryTile))
			} else {
				a.tile(s, item%a.kvh, t0, min(hi, t0+queryTile))
			}
		}
	})
}

// tile computes query rows [t0, t1) of one sequence for KV head kvh: the
// head's keys and values are copied out of the cache into contiguous rows
// (the cache's rows of one head are the KV width apart, a stride that maps
// them onto a few cache sets), S = Q·Kᵀ is a matrix product (keys in the
// cache's dtype unless that would round the queries to bfloat16, then
// widened to float32), a causal softmax per row, then O = P·V by pv, two
// rows of a head at a time, into the output.
func (a *attnCall) tile(s *attnScratch, kvh, t0, t1 int) {
	b, hd, grp := a.b, a.hd, a.grp
	qw := a.heads * hd
	esz := a.dt.Size()
	bt := a.table(a.seq[t0])
	nt := t1 - t0
	tk := int(a.pos[t1-1]) + 1 // keys visible to the tile's last row
	m := grp * nt              // stacked rows: (g, i) → g·nt + i−t0
	qs := grow(&s.qs, m*hd)    // (m, hd) stacked queries
	sc := grow(&s.sc, m*tk)    // (m, tk) scores, then probabilities
	kr := growBytes(&s.kr, tk*hd*esz)
	if cap(s.offs) < 2*tk {
		s.offs = make([]int, 2*tk)
	}
	offs, lin := s.offs[:tk], s.offs[tk:2*tk] // key positions in a cache layer, in kr and vr
	a.offsets(offs, bt)
	off := kvh * hd
	vr := growBytes(&s.vr, tk*hd*esz)
	for p, e := range offs {
		e = (e + off) * esz
		copy(kr[p*hd*esz:(p+1)*hd*esz], a.kraw[e:e+hd*esz])
		copy(vr[p*hd*esz:(p+1)*hd*esz], a.vraw[e:e+hd*esz])
		lin[p] = p * hd
	}
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i++ {
			r := g*nt + i - t0
			copy(qs[r*hd:(r+1)*hd], a.q[i*qw+h*hd:i*qw+(h+1)*hd])
		}
	}
	// Transient: kr is refilled for every KV head (see Mat.Transient).
	kmat := &kernels.Mat{DType: a.dt, Rows: tk, Cols: hd, Data: kr, Transient: true}
	if b.RoundsXToBF16(kmat, m) && !a.gemmScores() {
		k := grow(&s.k, tk*hd)
		for p := range tk {
			a.keyRow(k[p*hd:(p+1)*hd], kr, p*hd)
		}
		kmat = &kernels.Mat{DType: kernels.F32, Rows: tk, Cols: hd, Data: f32Bytes(k), Transient: true}
	}
	b.MatMul(sc, qs, kmat, m)
	for r := range m {
		row := sc[r*tk : (r+1)*tk]
		ln := int(a.pos[t0+r%nt]) + 1
		softmaxRow(row[:ln], a.scale)
		clear(row[ln:])
	}
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i += 2 {
			rows := min(2, t1-i)
			n := int(a.pos[i+rows-1]) + 1 // keys the pair's last row sees
			for r := range rows {
				clear(a.out[(i+r)*qw+h*hd : (i+r)*qw+(h+1)*hd])
			}
			pv(a.dt, a.out[i*qw+h*hd:], qw, sc[(g*nt+i-t0)*tk:], tk, vr, lin[:n], hd, rows)
		}
	}
}

// tileVDP is tile on VDPBF16PS, for a BF16 cache where bfloat16
// activations are allowed and VDPBF16PS runs at full rate (vdpAttention),
// both products as outer products with no horizontal sums (see
// qkPairsR4): S = Q·Kᵀ with the queries rounded to bfloat16 and the head's
// keys transposed as dwords (a row per pair of head dims, 64 keys a call),
// four query rows at a time over the key blocks their last row sees; the
// causal softmax; then O = P·V by pvVDP.
func (a *attnCall) tileVDP(s *attnScratch, kvh, t0, t1 int) {
	t := bf16TilesFor()
	hd, grp, qw := a.hd, a.grp, a.heads*a.hd
	nt := t1 - t0
	tk := int(a.pos[t1-1]) + 1 // keys visible to the tile's last row
	ld := roundUp(tk, 64)      // keys padded to whole blocks: the score rows' stride
	m := grp * nt              // stacked rows: (g, i) → g·nt + i−t0
	if cap(s.offs) < tk {
		s.offs = make([]int, tk)
	}
	offs := s.offs[:tk]
	a.offsets(offs, a.table(a.seq[t0]))
	k := growU16(&s.vk, ld*hd) // (ld, hd) keys, zero rows past tk
	for p, e := range offs {
		e = 2 * (e + kvh*hd)
		copy(u16Bytes(k[p*hd:(p+1)*hd]), a.kraw[e:e+2*hd])
	}
	clear(k[tk*hd:])
	hp := hd / 2 // dwords (pairs of head dims) a key
	kt := growU32(&s.vkt, hp*ld)
	k32 := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(k))), ld*hp)
	for kb := 0; kb < ld; kb += 16 {
		for pb := 0; pb < hp; pb += 16 {
			t.transpose(kt[pb*ld+kb:], ld, k32[kb*hp+pb:], hp, 16)
		}
	}
	kt16 := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(kt))), 2*hp*ld)
	q := growU16(&s.vq, m*hd) // (m, hd) stacked queries, rounded
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i++ {
			r := g*nt + i - t0
			roundBF16(q[r*hd:(r+1)*hd], a.q[i*qw+h*hd:i*qw+(h+1)*hd])
		}
	}
	sc := grow(&s.sc, m*ld) // (m, ld) scores, then probabilities
	for g := range grp {
		for i := t0; i < t1; i += 4 {
			rows := min(4, t1-i)
			n := int(a.pos[i+rows-1]) + 1 // keys the group's last row sees
			r := g*nt + i - t0
			for c0 := 0; c0 < n; c0 += 64 {
				t.qk[rows-1](sc[r*ld+c0:], ld, q[r*hd:], hd, kt16[2*c0:], 2*ld, hp)
			}
		}
	}
	for r := range m {
		row := sc[r*ld : (r+1)*ld]
		ln := int(a.pos[t0+r%nt]) + 1
		softmaxRow(row[:ln], a.scale)
		clear(row[ln:])
	}
	a.pvVDP(s, kvh, t0, t1, offs, ld)
}

// vdpAttention reports whether prefill attention runs as tileVDP: a BF16
// cache, bfloat16 activations allowed, the gemm tiles (VDPBF16PS at full
// rate), and a head dim of whole 64-column blocks.
func (a *attnCall) vdpAttention() bool { return a.gemmScores() && a.hd%64 == 0 }

// growU32 is grow for uint32s.
func growU32(p *[]uint32, n int) []uint32 {
	if cap(*p) < n {
		*p = make([]uint32, n)
	}
	return (*p)[:n]
}

// pvVDP is tileVDP's O = P·V, as outer products (see pvPairsR4): the
// probabilities in s.sc (the tile's stacked rows ld apart, causal zeros
// included) rounded to bfloat16, the head's value rows interleaved in
// pairs of keys straight from the cache (offs: the keys' element offsets
// in a cache layer), then four query rows at a time over the pairs their
// last row sees, 64 columns a call.
func (a *attnCall) pvVDP(s *attnScratch, kvh, t0, t1 int, offs []int, ld int) {
	t := bf16TilesFor()
	hd, grp, qw := a.hd, a.grp, a.heads*a.hd
	nt, tk := t1-t0, len(offs)
	m := grp * nt
	np := (tk + 1) / 2
	tkp := 2 * np
	vp := growU16(&s.vt16, np*2*hd) // (np, hd) pairs of value rows
	if cap(s.zero) < 2*hd {
		s.zero = make([]byte, 2*hd)
	}
	off := 2 * kvh * hd
	for j := range np {
		b := s.zero[:2*hd]
		if 2*j+1 < tk {
			b = a.vraw[2*offs[2*j+1]+off:]
		}
		t.pair(vp[j*2*hd:(j+1)*2*hd], a.vraw[2*offs[2*j]+off:], b, hd)
	}
	ps := growU16(&s.k16, m*tkp) // (m, tkp) probabilities
	for r := range m {
		roundBF16(ps[r*tkp:r*tkp+tk], s.sc[r*ld:r*ld+tk])
		if tkp > tk {
			ps[r*tkp+tk] = 0
		}
	}
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i += 4 {
			rows := min(4, t1-i)
			pairs := (int(a.pos[i+rows-1]) + 2) / 2 // the key pairs the last row sees
			o := a.out[i*qw+h*hd:]
			for r := range rows {
				clear(o[r*qw : r*qw+hd])
			}
			p := ps[(g*nt+i-t0)*tkp:]
			for d0 := 0; d0 < hd; d0 += 64 {
				t.pv[rows-1](o[d0:], qw, p, tkp, vp[2*d0:], 2*hd, pairs)
			}
		}
	}
}

// gemmScores reports whether tile's Q·Kᵀ runs on the gemm tiles over the
// BF16 keys as cached, the queries rounded to bfloat16 (the precision
// tileAMX has): where bfloat16 activations are allowed and VDPBF16PS runs at
// full rate. Elsewhere a rounding path gets the keys widened to float32, so
// that the queries stay float32.
func (a *attnCall) gemmScores() bool {
	t := bf16TilesFor()
	return a.dt == kernels.BF16 && a.b.bf16x && t != nil && t.gemm != nil && !attnGemmOff.Load()
}

// attnGemmOff turns gemmScores off (the benchmarks that compare).
var attnGemmOff atomic.Bool

// growBytes is grow for bytes.
func growBytes(p *[]byte, n int) []byte {
	if cap(*p) < n {
		*p = make([]byte, n)
	}
	return (*p)[:n]
}

// tileAMX is tile for a BF16 cache where bfloat16 activations are allowed
// (Backend.SetBF16Activations) and AMX is there: K and Vᵀ are gathered as
// the cache's bfloat16 (no conversion), padded with zeros to whole
// 32-key chunks, and both products run on the AMX path, which rounds the
// queries and the probabilities to bfloat16.
func (a *attnCall) tileAMX(s *attnScratch, kvh, t0, t1 int) {
	hd, grp := a.hd, a.grp
	qw, kw := a.heads*hd, a.kvh*hd
	bt := a.table(a.seq[t0])
	nt := t1 - t0
	tk := int(a.pos[t1-1]) + 1 // keys visible to the tile's last row
	tkp := roundUp(tk, 32)
	m := grp * nt
	k := growU16(&s.k16, tkp*hd)   // (tkp, hd) keys, zero rows past tk
	vt := growU16(&s.vt16, hd*tkp) // (hd, tkp) values transposed, zero columns past tk
	qs := grow(&s.qs, m*hd)
	sc := grow(&s.sc, m*tkp)
	os := grow(&s.os, m*hd)
	off := kvh * hd
	for p := range tk {
		e := 2 * (a.slot(bt, p)*kw + off)
		copy(u16Bytes(k[p*hd:(p+1)*hd]), a.kraw[e:e+2*hd])
		vs := a.vraw[e : e+2*hd]
		for d := range hd {
			vt[d*tkp+p] = binary.LittleEndian.Uint16(vs[2*d:])
		}
	}
	clear(k[tk*hd:])
	for d := range hd {
		clear(vt[d*tkp+tk : (d+1)*tkp])
	}
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i++ {
			r := g*nt + i - t0
			copy(qs[r*hd:(r+1)*hd], a.q[i*qw+h*hd:i*qw+(h+1)*hd])
		}
	}
	// Transient: k and vt are refilled for every KV head (see Mat.Transient).
	a.b.matMulInline(sc, qs, &kernels.Mat{DType: kernels.BF16, Rows: tkp, Cols: hd, Data: u16Bytes(k), Transient: true}, m, &s.xs, &s.f32)
	for r := range m {
		row := sc[r*tkp : (r+1)*tkp]
		ln := int(a.pos[t0+r%nt]) + 1
		softmax(row[:ln], a.scale)
		clear(row[ln:])
	}
	a.b.matMulInline(os, sc, &kernels.Mat{DType: kernels.BF16, Rows: hd, Cols: tkp, Data: u16Bytes(vt), Transient: true}, m, &s.xs, &s.f32)
	for g := range grp {
		h := kvh*grp + g
		for i := t0; i < t1; i++ {
			r := g*nt + i - t0
			copy(a.out[i*qw+h*hd:i*qw+(h+1)*hd], os[r*hd:(r+1)*hd])
		}
	}
}

// attnScratch is one worker's scratch for prefill tiles.
type attnScratch struct {
	k, vt, qs, sc, os []float32
	offs              []int     // tile's key offsets
	kr, vr            []byte    // tile's keys and values, contiguous
	k16, vt16         []uint16  // tileAMX's keys and values; pvVDP's probabilities and value pairs
	zero              []byte    // pvVDP's zero value row
	vk, vq            []uint16  // tileVDP's keys and rounded queries
	vkt               []uint32  // and its keys transposed
	xs                xbufs     // its products' converted x
	f32               []float32 // and their task scratch
}

// growU16 is grow for uint16s.
func growU16(p *[]uint16, n int) []uint16 {
	if cap(*p) < n {
		*p = make([]uint16, n)
	}
	return (*p)[:n]
}

// u16Bytes views uint16 values as little-endian bytes.
func u16Bytes(v []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*2)
}

// scratchPool recycles attnScratch between calls and workers.
var scratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// f32Bytes views float32 values as the little-endian bytes a kernels.Mat
// holds.
func f32Bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// softmax replaces x with softmax(scale·x): max-subtracted, a float32 exp,
// a float64 sum.
func softmax(x []float32, scale float32) {
	if len(x) == 0 {
		return
	}
	m := x[0] * scale
	for i, v := range x {
		x[i] = v * scale
		m = max(m, x[i])
	}
	var sum float64
	for i, v := range x {
		e := expf(v - m)
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// expf is e^x for x ≤ 0 in float32 arithmetic, within 2 ulp of the exact
// value (Cephes expf: x = k·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial in r;
// the result 2^k·e^r is built in the exponent bits). It underflows to 0
// below −87.
func expf(x float32) float32 {
	if x < -87 {
		return 0
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	k := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - k*ln2hi - k*ln2lo
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	e := p*r*r + r + 1
	return e * math.Float32frombits(uint32(int32(k)+127)<<23)
}
