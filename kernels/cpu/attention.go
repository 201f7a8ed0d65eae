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
// one (row, KV head) item per task, the group's query heads together,
// scores from the matmul tiles straight off the F32 or BF16 cache.

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

// rows computes the given rows one (row, part of the KV heads) item at a
// time: scores off the cache with the matmul tiles, softmax, then P·V by
// pv over the value rows at the row's slots. An item walks the cache block
// by block, every KV head of its part within a block, so that it reads each
// slot's keys and values of those heads as one contiguous run: the
// hardware prefetchers follow that, where one head at a time would stride
// through the whole layer once per head. Parts split the heads so that a
// single row still keeps every worker busy.
func (a *attnCall) rows(rows []int32) {
	maxLen := 0
	for _, i := range rows {
		maxLen = max(maxLen, int(a.pos[i])+1)
	}
	parts := min(a.kvh, max(1, a.b.Threads()/len(rows)))
	tiles := tilesFor(a.dt)
	esz := a.dt.Size()
	kw := a.kvh * a.hd
	hd, grp := a.hd, a.grp
	vdp := a.gemmScores() && hd%32 == 0 // scores on the gemm tiles, the queries rounded
	a.b.Parallel(len(rows)*parts, func(lo, hi int) {
		sc := make([]float32, (a.kvh+parts-1)/parts*grp*maxLen) // (heads of the part, len) scores, then probabilities
		offs := make([]int, maxLen)                             // element offsets of the row's positions in a cache layer
		var qb []uint16                                         // (heads of the part, hd) queries rounded, for vdp
		if vdp {
			qb = make([]uint16, (a.kvh+parts-1)/parts*grp*hd)
		}
		last := -1
		for item := lo; item < hi; item++ {
			i, part := int(rows[item/parts]), item%parts
			k0, k1 := part*a.kvh/parts, (part+1)*a.kvh/parts // KV heads [k0, k1)
			bt := a.table(a.seq[i])
			ln := int(a.pos[i]) + 1
			if i != last {
				a.offsets(offs[:ln], bt)
				last = i
			}
			// Scores, block by block: keys of a block are kw apart. The
			// part's heads stack as (kvh−k0)·grp + g.
			run := (k1 - k0) * hd // elements of a slot the item reads
			if vdp {
				q := a.q[(i*a.heads+k0*grp)*hd : (i*a.heads+k1*grp)*hd]
				roundBF16(qb[:len(q)], q)
			}
			for p0 := 0; p0 < ln; p0 += a.bs {
				nk := min(a.bs, ln-p0)
				if next := p0 + a.bs; next < ln { // the next block's keys, else the first values
					prefetchRows(a.dt, a.kraw[k0*hd*esz:], offs[next:min(next+a.bs, ln)], run)
				} else {
					prefetchRows(a.dt, a.vraw[k0*hd*esz:], offs[:min(a.bs, ln)], run)
				}
				for kvh := k0; kvh < k1; kvh++ {
					w := a.kraw[(offs[p0]+kvh*hd)*esz:]
					qg := a.q[(i*a.heads+kvh*grp)*hd : (i*a.heads+(kvh+1)*grp)*hd] // (group, hd)
					sg := sc[(kvh-k0)*grp*ln:]
					if vdp {
						a.scoresVDP(sg[p0:], ln, qb[(kvh-k0)*grp*hd:], w, nk)
						continue
					}
					g := 0
					for ; g+2 <= grp; g += 2 {
						x, y := qg[g*hd:], sg[g*ln+p0:]
						j := 0
						for ; j+4 <= nk; j += 4 {
							tiles.r2c4(y[j:], ln, x, hd, w[j*kw*esz:], kw, hd)
						}
						for ; j < nk; j++ {
							tiles.r2c1(y[j:], ln, x, hd, w[j*kw*esz:], kw, hd)
						}
					}
					for ; g < grp; g++ {
						x, y := qg[g*hd:], sg[g*ln+p0:]
						for j := range nk {
							tiles.r1c1(y[j:], 1, x, hd, w[j*kw*esz:], kw, hd)
						}
					}
				}
			}
			nh := (k1 - k0) * grp
			for r := range nh {
				softmaxRow(sc[r*ln:(r+1)*ln], a.scale)
			}
			o := a.out[(i*a.heads+k0*grp)*hd : (i*a.heads+k1*grp)*hd] // (heads of the part, hd)
			clear(o)
			for p0 := 0; p0 < ln; p0 += a.bs {
				blk := offs[p0:min(p0+a.bs, ln)]
				if next := p0 + a.bs; next < ln {
					prefetchRows(a.dt, a.vraw[k0*hd*esz:], offs[next:min(next+a.bs, ln)], run)
				}
				for kvh := k0; kvh < k1; kvh++ {
					v := a.vraw[kvh*hd*esz:]
					r0 := (kvh - k0) * grp
					g := 0
					for ; g+2 <= grp; g += 2 {
						pv(a.dt, o[(r0+g)*hd:], hd, sc[(r0+g)*ln+p0:], ln, v, blk, hd, 2)
					}
					if g < grp {
						pv(a.dt, o[(r0+g)*hd:], hd, sc[(r0+g)*ln+p0:], ln, v, blk, hd, 1)
					}
				}
			}
		}
	})
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
