package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The quantized tiles dot one row of GGML blocks (Q8_0, Q4_0, Q4_K, Q6_K)
// with one x row quantized to int8 in blocks of 32 (kernels/cpu/quant.go):
// each 32 columns become u8×s8 products summed four at a time into eight
// int32 lanes, converted to float32 and accumulated with the block's scales.
// The u8×s8 step is VPDPBUSD with AVX-512 VNNI, and VPMADDUBSW then
// VPMADDWD against ones on AVX2. Signed weights (Q8_0, Q4_0, Q6_K) take
// llama.cpp's sign trick: |w| as the unsigned operand and x with w's sign
// as the signed one; |w| ≤ 128 and |x| ≤ 127 keep VPMADDUBSW's int16 pair
// sums from saturating.

// qisa is an instruction set the quantized tiles are generated for.
type qisa struct {
	suffix string
	vnni   bool
}

var qisas = []qisa{{suffix: "AVX2"}, {suffix: "VNNI", vnni: true}}

// qctx holds a tile's broadcast constants.
type qctx struct {
	qisa
	ones, low4, b8 VecVirtual // int16 ones (AVX2 only), bytes 0x0f, bytes 8 (Q4_0 only)
}

// bcastD sets v's four bytes in every dword to c.
func bcastD(c uint32) VecVirtual {
	t := GP32()
	MOVL(U32(c), t)
	v := YMM()
	VMOVD(t, v.AsX())
	VPBROADCASTD(v.AsX(), v)
	return v
}

// idot sets t to the eight int32 sums of four u8×s8 products of u (ymm)
// and x (m256 or ymm).
func (c *qctx) idot(x Op, u, t VecVirtual) {
	if c.vnni {
		VPXOR(t, t, t)
		VPDPBUSD(x, u, t)
		return
	}
	VPMADDUBSW(x, u, t)
	VPMADDWD(c.ones, t, t)
}

// fmaBcast sets acc += t·m where m is one float32 in memory.
func (c *qctx) fmaBcast(m Mem, t, acc VecVirtual) {
	if c.vnni {
		VFMADD231PS_BCST(m, t, acc)
		return
	}
	b := YMM()
	VBROADCASTSS(m, b)
	VFMADD231PS(t, b, acc)
}

// signedDot sets t to the int32 lane sums of w·x for signed bytes w (ymm,
// with |w| in aw) and the x block at xm.
func (c *qctx) signedDot(w, aw VecVirtual, xm Mem, t VecVirtual) {
	xr := YMM()
	VMOVDQU(xm, xr)
	VPSIGNB(w, xr, xr)
	c.idot(xr, aw, t)
}

// xrow addresses one x row of a tile: its int8 values at q0 + idx·scale,
// its (d, s) pairs (float32 block scale and d·Σq) at ds0 + dsIdx·scale.
type xrow struct {
	q0, ds0    GPVirtual
	idx, dsIdx Register // nil for the first row
	scale      uint8
}

// q is the int8 value at byte off of the row.
func (x xrow) q(off int) Mem { return x.mem(x.q0, x.idx, off) }

// d is block b's scale; s its d·Σq.
func (x xrow) d(b int) Mem { return x.mem(x.ds0, x.dsIdx, 8*b) }
func (x xrow) s(b int) Mem { return x.mem(x.ds0, x.dsIdx, 8*b+4) }

func (x xrow) mem(base GPVirtual, idx Register, off int) Mem {
	m := Mem{Base: base, Disp: off}
	if idx != nil {
		m.Index, m.Scale = idx, x.scale
	}
	return m
}

// signedBlock accumulates w·x over one block of 32 signed weights w for
// every x row: acc[r] += dw·d_r[b]·Σ w·q_r.
func (c *qctx) signedBlock(w VecVirtual, dw VecVirtual, xs []xrow, b int, acc []VecVirtual) {
	aw := YMM()
	VPABSB(w, aw)
	for r, x := range xs {
		t := YMM()
		c.signedDot(w, aw, x.q(32*b), t)
		VCVTDQ2PS(t, t)
		VMULPS(dw, t, t)
		c.fmaBcast(x.d(b), t, acc[r])
	}
}

// f16Bcast returns the float16 at m widened into all eight float32 lanes.
func f16Bcast(m Mem) VecVirtual {
	v := YMM()
	VPBROADCASTW(m, v.AsX())
	VCVTPH2PS(v.AsX(), v)
	return v
}

// hsumStore stores the sum of acc's eight lanes, minus the sum of sub's
// (when sub is not nil), to y.
func hsumStore(acc, sub VecVirtual, y Mem) {
	t := XMM()
	VEXTRACTF128(U8(1), acc.AsY(), t)
	VADDPS(t, acc.AsX(), t)
	if sub != nil {
		u := XMM()
		VEXTRACTF128(U8(1), sub.AsY(), u)
		VADDPS(u, sub.AsX(), u)
		VSUBPS(u, t, t)
	}
	VHADDPS(t, t, t)
	VHADDPS(t, t, t)
	VMOVSS(t, y)
}

// qkernel is one quantized dtype's tile body.
type qkernel struct {
	name    string
	elems   int // per weight block
	bytes   int // per weight block
	unroll  int // blocks per loop step (for accumulators in flight)
	doc     string
	usesSum bool
	rows    []int // the tile heights generated (x rows per call)
	// block emits the dot of weight block i (at w + i·bytes) with the x
	// rows' blocks (from column i·elems) into acc[r] (and sub[r],
	// subtracted at the end) for each x row r.
	block func(c *qctx, w GPVirtual, xs []xrow, i int, acc, sub []VecVirtual)
}

var qkernels = []qkernel{
	{
		name: "Q8_0", elems: 32, bytes: 34, unroll: 2, rows: []int{1, 4},
		doc: "dw·d[b]·Σ int8(w)·q",
		block: func(c *qctx, w GPVirtual, xs []xrow, i int, acc, _ []VecVirtual) {
			wr := YMM()
			VMOVDQU(Mem{Base: w, Disp: 34*i + 2}, wr)
			c.signedBlock(wr, f16Bcast(Mem{Base: w, Disp: 34 * i}), xs, i, acc)
		},
	},
	{
		name: "Q4_0", elems: 32, bytes: 18, unroll: 2, rows: []int{1, 4},
		doc: "dw·d[b]·Σ (nibble−8)·q",
		block: func(c *qctx, w GPVirtual, xs []xrow, i int, acc, _ []VecVirtual) {
			lo, hi, wr := XMM(), XMM(), YMM()
			VMOVDQU(Mem{Base: w, Disp: 18*i + 2}, lo)
			VPSRLW(U8(4), lo, hi)
			VINSERTI128(U8(1), hi, lo.AsY(), wr)
			VPAND(c.low4, wr, wr)
			VPSUBB(c.b8, wr, wr)
			c.signedBlock(wr, f16Bcast(Mem{Base: w, Disp: 18 * i}), xs, i, acc)
		},
	},
	{
		name: "Q4K", elems: 256, bytes: 144, unroll: 1, usesSum: true, rows: []int{1, 4},
		doc:   "Σ over sub-blocks j: dw·sc_j·d[b]·Σ nibble·q − dmin·m_j·s[b]",
		block: q4kBlock,
	},
	{
		name: "Q5K", elems: 256, bytes: 176, unroll: 1, usesSum: true, rows: []int{1, 4},
		doc:   "Σ over sub-blocks j: dw·sc_j·d[b]·Σ (nibble + 16·bit_j(qh))·q − dmin·m_j·s[b]",
		block: q5kBlock,
	},
	{
		name: "Q6K", elems: 256, bytes: 210, unroll: 1, rows: []int{1},
		doc:   "Σ over sub-blocks of 16: dw·sc·d[b]·Σ (q6−32)·q",
		block: q6kBlock,
	},
}

// bcastB returns a ymm with every byte c.
func bcastB(c uint8) VecVirtual {
	return bcastD(uint32(c) * 0x01010101)
}

// q4kScales unpacks a Q4_K/Q5_K block's twelve scale bytes at w+4 into
// the eight 6-bit scales and the eight 6-bit mins, as int32 lanes of sc and
// mn (kScaleBytes, then widened).
func q4kScales(w GPVirtual, sc, mn VecVirtual) {
	s8, m8 := kScaleBytes(w)
	VMOVQ(s8, sc.AsX())
	VPMOVZXBD(sc.AsX(), sc.AsY())
	VMOVQ(m8, mn.AsX())
	VPMOVZXBD(mn.AsX(), mn.AsY())
}

// q4kBlock is one Q4_K super-block: 8 sub-blocks of 32, sub-block 2c the
// low nibbles of qs[32c:32c+32], 2c+1 the high ones.
func q4kBlock(c *qctx, w GPVirtual, xs []xrow, i int, acc, sub []VecVirtual) {
	kBlock(c, w, xs, acc, sub, false)
}

// q5kBlock is one Q5_K super-block: Q4_K's layout with the quants at
// w+48, plus bit j of qh[l] (w+16) as bit 4 of sub-block j's element l.
func q5kBlock(c *qctx, w GPVirtual, xs []xrow, i int, acc, sub []VecVirtual) {
	kBlock(c, w, xs, acc, sub, true)
}

// kBlock is q4kBlock, or q5kBlock when five is set.
func kBlock(c *qctx, w GPVirtual, xs []xrow, acc, sub []VecVirtual, five bool) {
	// Per x row, the sub-blocks' dw·sc_j·d[b] in the lane order
	// [0 1 4 5 2 3 6 7] that de-interleaving the (d, s) pairs gives.
	local := AllocLocal(32 * len(xs))
	sc, mn := YMM(), YMM()
	q4kScales(w, sc, mn)
	dw, dmin := f16Bcast(Mem{Base: w}), f16Bcast(Mem{Base: w, Disp: 2})
	VCVTDQ2PS(sc, sc)
	VMULPS(dw, sc, sc)
	VPERMPD(U8(0xd8), sc, sc)
	VCVTDQ2PS(mn, mn)
	VMULPS(dmin, mn, mn)
	VPERMPD(U8(0xd8), mn, mn)
	for r, x := range xs {
		p, d, s := YMM(), YMM(), YMM()
		VMOVUPS(x.d(0), p) // d0 s0 d1 s1 | d2 s2 d3 s3
		VSHUFPS(U8(0x88), x.d(4), p, d)
		VSHUFPS(U8(0xdd), x.d(4), p, s)
		VMULPS(sc, d, d)
		VMOVUPS(d, local.Offset(32*r))
		VFMADD231PS(mn, s, sub[r])
	}
	qs := 16
	var qh, one VecVirtual
	if five {
		qs = 48
		qh, one = YMM(), bcastB(1)
		VMOVDQU(Mem{Base: w, Disp: 16}, qh)
	}
	for h := range 4 {
		raw, lo := YMM(), YMM()
		VMOVDQU(Mem{Base: w, Disp: qs + 32*h}, raw)
		VPAND(c.low4, raw, lo)
		VPSRLW(U8(4), raw, raw)
		VPAND(c.low4, raw, raw)
		for k, u := range []VecVirtual{lo, raw} {
			j := 2*h + k
			if five { // u |= ((qh >> j) & 1) << 4
				hb := YMM()
				VPSRLW(U8(j), qh, hb)
				VPAND(one, hb, hb)
				VPSLLW(U8(4), hb, hb)
				VPOR(hb, u, u)
			}
			lane := []int{0, 1, 4, 5, 2, 3, 6, 7}[j]
			for r, x := range xs {
				t := YMM()
				c.idot(x.q(32*j), u, t)
				VCVTDQ2PS(t, t)
				c.fmaBcast(local.Offset(32*r+4*lane), t, acc[r])
			}
		}
	}
}

// q6kBlock is one Q6_K super-block: in half h, x block 4h+g takes the low
// (g < 2) or high nibbles of ql[64h+32(g&1):] and bits 2g, 2g+1 of
// qh[32h:]; its int32 lanes 0-3 are sub-block 2(4h+g), lanes 4-7 the next.
func q6kBlock(c *qctx, w GPVirtual, xs []xrow, _ int, acc, _ []VecVirtual) {
	x := xs[0]              // one x row
	local := AllocLocal(64) // dw·sc float32[16]
	dw := f16Bcast(Mem{Base: w, Disp: 208})
	for half := range 2 {
		v := YMM()
		VPMOVSXBD(Mem{Base: w, Disp: 192 + 8*half}, v)
		VCVTDQ2PS(v, v)
		VMULPS(dw, v, v)
		VMOVUPS(v, local.Offset(32*half))
	}
	three, b32 := bcastB(3), bcastB(32)
	for h := range 2 {
		qh := YMM()
		VMOVDQU(Mem{Base: w, Disp: 128 + 32*h}, qh)
		for g := range 4 {
			b := 4*h + g
			u, hb, t := YMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: w, Disp: 64*h + 32*(g&1)}, u)
			if g >= 2 {
				VPSRLW(U8(4), u, u)
			}
			VPAND(c.low4, u, u)
			if g > 0 {
				VPSRLW(U8(2*g), qh, hb)
				VPAND(three, hb, hb)
			} else {
				VPAND(three, qh, hb)
			}
			VPSLLW(U8(4), hb, hb)
			VPOR(hb, u, u)
			VPSUBB(b32, u, u)
			au := YMM()
			VPABSB(u, au)
			c.signedDot(u, au, x.q(32*b), t)
			VCVTDQ2PS(t, t)
			lo, hi, sv := XMM(), XMM(), YMM()
			VBROADCASTSS(local.Offset(8*b), lo)
			VBROADCASTSS(local.Offset(8*b+4), hi)
			VINSERTF128(U8(1), hi, lo.AsY(), sv)
			VMULPS(sv, t, t)
			c.fmaBcast(x.d(b), t, acc[0])
		}
	}
}

func qtile(a qisa, k qkernel, R int) {
	name := fmt.Sprintf("qtile%sR%d%s", k.name, R, a.suffix)
	q0, ds0, wp, n := qtileBegin(name,
		fmt.Sprintf("%s sets y[r·ldy] for r < %d to the dot product of one row of %s", name, R, k.name),
		"blocks w with x row r, quantized to int8 in blocks of 32 (q[r·ldq:], and (d, d·Σq)",
		"pairs in ds[2·r·ldq/32:]); per block b:",
		"",
		"\t"+k.doc,
		"",
		"k is the row's length (a multiple of the block). The caller guarantees the",
		"bounds; nothing is checked.",
	)
	xs := xrows(q0, ds0, R)
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), n) // blocks

	unroll := k.unroll
	if R > 1 {
		unroll = 1 // R accumulators are in flight already
	}
	acc := make([][]VecVirtual, unroll) // [unroll][R]
	for u := range acc {
		acc[u] = zeros(R, YMM)
	}
	var sub []VecVirtual
	if k.usesSum {
		sub = zeros(R, YMM)
	}
	c := &qctx{qisa: a, low4: bcastB(0x0f)}
	if !a.vnni {
		c.ones = bcastD(0x00010001)
	}
	if k.name == "Q4_0" {
		c.b8 = bcastB(8)
	}
	advance := func(blocks int) {
		ADDQ(U32(blocks*k.bytes), wp)
		ADDQ(U32(blocks*k.elems), q0)
		ADDQ(U32(blocks*k.elems/32*8), ds0)
		SUBQ(U8(blocks), n)
	}
	if unroll > 1 {
		Label(name + "_loopU")
		CMPQ(n, U8(unroll))
		JB(LabelRef(name + "_loop1"))
		for u := range unroll {
			k.block(c, wp, xs, u, acc[u], sub)
		}
		advance(unroll)
		JMP(LabelRef(name + "_loopU"))
	}
	Label(name + "_loop1")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	k.block(c, wp, xs, 0, acc[0], sub)
	advance(1)
	JMP(LabelRef(name + "_loop1"))

	Label(name + "_done")
	for u := 1; u < unroll; u++ {
		VADDPS(acc[u][0], acc[0][0], acc[0][0])
	}
	yp := Load(Param("y").Base(), GP64()).(GPVirtual)
	var ldy Register
	if R > 1 {
		ldy = Load(Param("ldy"), GP64())
	}
	for r := range R {
		var s VecVirtual
		if sub != nil {
			s = sub[r]
		}
		if r > 0 {
			LEAQ(Mem{Base: yp, Index: ldy, Scale: 4}, yp)
		}
		hsumStore(acc[0][r], s, Mem{Base: yp})
	}
	VZEROUPPER()
	RET()
}

// The 512-bit Q4_K tile (AVX-512 VNNI and BW) takes two sub-blocks per
// instruction: a super-block's nibbles qs[32h:32h+32] broadcast to both
// halves of a zmm, the upper half shifted right by 4, give sub-blocks 2h and
// 2h+1, whose x blocks are the 64 contiguous bytes at column 64h.
var (
	q4kIdxData   Mem // [4][16]uint32: VPERMPS picks of sub-blocks 2h, 2h+1's scales
	q4kShiftData Mem // [32]uint16: 0 in the low half, 4 in the high half
)

// q4kConsts512 writes the 512-bit Q4_K tile's constant tables.
func q4kConsts512() {
	// The per-row scale vector holds sub-block j in lane
	// [0 1 4 5 2 3 6 7][j] (see kBlock).
	lane := []uint32{0, 1, 4, 5, 2, 3, 6, 7}
	q4kIdxData = GLOBL("q4kidx", RODATA|NOPTR)
	for h := range 4 {
		for l := range 16 {
			DATA(64*h+4*l, U32(lane[2*h+l/8]))
		}
	}
	q4kShiftData = GLOBL("q4kshift", RODATA|NOPTR)
	for l := range 32 {
		DATA(2*l, U16(4*(l/16)))
	}
}

// qtileQ4K512 is the R-row Q4_K tile on zmm registers.
func qtileQ4K512(R int) {
	name := fmt.Sprintf("qtileQ4KR%dVNNI512", R)
	q0, ds0, wp, n := qtileBegin(name,
		fmt.Sprintf("%s is qtileQ4KR%dVNNI on 512-bit registers (AVX-512 VNNI and BW):", name, R),
		"two sub-blocks per integer dot product, conversion and multiply-add.",
	)
	xs := xrows(q0, ds0, R)
	SHRQ(U8(8), n) // super-blocks
	// The count lives on the stack: the loop needs every general register
	// but this one.
	left := AllocLocal(8)
	MOVQ(n, left)

	acc, sub := make([]VecVirtual, R), make([]VecVirtual, R)
	for r := range R {
		acc[r] = ZMM()
		VXORPS(acc[r].AsY(), acc[r].AsY(), acc[r].AsY())
	}
	for r := range R {
		sub[r] = ZMM() // used as ymm; ZMM lets the allocator use registers 16-31
		VXORPS(sub[r].AsY(), sub[r].AsY(), sub[r].AsY())
	}
	low4 := ZMM()
	t32 := GP32()
	MOVL(U32(0x0f0f0f0f), t32)
	VPBROADCASTD(t32, low4)
	shift := ZMM()
	VMOVDQU64(q4kShiftData, shift)

	Label(name + "_loop")
	CMPQ(left, U8(0))
	JE(LabelRef(name + "_done"))
	sc, mn := ZMM(), ZMM()
	q4kScales(wp, sc, mn)
	dw, dmin := f16Bcast(Mem{Base: wp}), f16Bcast(Mem{Base: wp, Disp: 2})
	scy, mny := sc.AsY(), mn.AsY()
	VCVTDQ2PS(scy, scy)
	VMULPS(dw, scy, scy)
	VPERMPD(U8(0xd8), scy, scy)
	VCVTDQ2PS(mny, mny)
	VMULPS(dmin, mny, mny)
	VPERMPD(U8(0xd8), mny, mny)
	rs := make([]VecVirtual, R) // per row: dw·sc_j·d[b], lanes permuted (low half)
	for r, x := range xs {
		p, s := ZMM(), ZMM()
		rs[r] = ZMM()
		// Define all of rs[r] first: VPERMPS reads it as a zmm, and a
		// register only ever written in its low half would count as live
		// from the function's entry.
		VXORPS(rs[r], rs[r], rs[r])
		VMOVUPS(x.d(0), p.AsY())
		VSHUFPS(U8(0x88), x.d(4), p.AsY(), rs[r].AsY())
		VSHUFPS(U8(0xdd), x.d(4), p.AsY(), s.AsY())
		VMULPS(scy, rs[r].AsY(), rs[r].AsY())
		VFMADD231PS(mny, s.AsY(), sub[r].AsY())
	}
	for h := range 4 {
		idx := ZMM()
		VMOVDQU64(q4kIdxData.Offset(64*h), idx)
		u := ZMM()
		VBROADCASTI64X4(Mem{Base: wp, Disp: 16 + 32*h}, u)
		VPSRLVW(shift, u, u)
		VPANDD(low4, u, u)
		for r, x := range xs {
			t, sv := ZMM(), ZMM()
			VXORPS(t, t, t) // a zeroing idiom avo knows (VPXORD reads as a use)
			VPDPBUSD(x.q(64*h), u, t)
			VCVTDQ2PS(t, t)
			VPERMPS(rs[r], idx, sv)
			VFMADD231PS(sv, t, acc[r])
		}
	}
	ADDQ(U32(144), wp)
	ADDQ(U32(256), q0)
	ADDQ(U32(64), ds0)
	DECQ(left)
	JMP(LabelRef(name + "_loop"))

	Label(name + "_done")
	qtileEnd(acc, sub)
}

// The 512-bit Q8_0 and Q4_0 tiles (AVX-512 VNNI and BW) take two blocks per
// instruction. AVX-512 has no VPSIGNB for the sign trick, so the weights
// are biased to unsigned bytes instead: u = w + bias (Q8_0: w XOR 0x80 =
// w + 128; Q4_0: the nibble itself, w + 8), and Σu·q = Σw·q + bias·Σq,
// whose excess bias·dw·(d·Σq) = bias·dw·s is summed separately (in all 8
// lanes of a block: 8× the block's) and taken off at the end.
var q8IdxData Mem // [2][16]uint32: VPERMPS picks of d (lanes 0, 2) and s (1, 3)

func q8Consts512() {
	q8IdxData = GLOBL("q8idx", RODATA|NOPTR)
	for k := range 2 {
		for l := range 16 {
			DATA(64*k+4*l, U32(2*(l/8)+k))
		}
	}
}

// biased32 is a 32-element block type for the biased 512-bit tile.
type biased32 struct {
	name  string
	bytes int     // per block; the float16 scale first
	bias  float32 // u − w
	// consts sets up the loaders' broadcast constants.
	consts func() []VecVirtual
	// one loads block 0 at w into the ymm u as unsigned bytes; two loads
	// blocks 0 and 1 into the zmm u.
	one, two func(w GPVirtual, c []VecVirtual, u VecVirtual)
}

var biasedTypes = []biased32{
	{
		name: "Q8_0", bytes: 34, bias: 128,
		consts: func() []VecVirtual { return []VecVirtual{bcastZ(0x80808080)} },
		one: func(w GPVirtual, c []VecVirtual, u VecVirtual) {
			VPXORD(Mem{Base: w, Disp: 2}, c[0].AsY(), u.AsY())
		},
		two: func(w GPVirtual, c []VecVirtual, u VecVirtual) {
			VMOVDQU(Mem{Base: w, Disp: 2}, u.AsY())
			VINSERTI64X4(U8(1), Mem{Base: w, Disp: 36}, u, u)
			VPXORD(c[0], u, u)
		},
	},
	{
		// 16 bytes [A A | B B] in 128-bit lanes, shifted right by 0 or 4
		// per lane and masked: the low then high nibbles of each block.
		name: "Q4_0", bytes: 18, bias: 8,
		consts: func() []VecVirtual {
			shift := ZMM()
			VMOVDQU64(q40ShiftData, shift)
			return []VecVirtual{bcastZ(0x0f0f0f0f), shift}
		},
		one: func(w GPVirtual, c []VecVirtual, u VecVirtual) {
			VBROADCASTI32X4(Mem{Base: w, Disp: 2}, u.AsY())
			VPSRLVW(c[1].AsY(), u.AsY(), u.AsY())
			VPANDD(c[0].AsY(), u.AsY(), u.AsY())
		},
		two: func(w GPVirtual, c []VecVirtual, u VecVirtual) {
			VBROADCASTI32X4(Mem{Base: w, Disp: 2}, u)
			VINSERTI32X4(U8(2), Mem{Base: w, Disp: 20}, u, u)
			VINSERTI32X4(U8(3), Mem{Base: w, Disp: 20}, u, u)
			VPSRLVW(c[1], u, u)
			VPANDD(c[0], u, u)
		},
	},
}

var q40ShiftData Mem // [32]uint16: 0 in 128-bit lanes 0 and 2, 4 in lanes 1 and 3

func q40Consts512() {
	q40ShiftData = GLOBL("q40shift", RODATA|NOPTR)
	for l := range 32 {
		DATA(2*l, U16(4*((l/8)%2)))
	}
}

// bcastZ returns a zmm with every dword c.
func bcastZ(c uint32) VecVirtual {
	t := GP32()
	MOVL(U32(c), t)
	v := ZMM()
	VPBROADCASTD(t, v)
	return v
}

// qtileBiased512 is the R-row tile of a biased32 type on zmm registers.
func qtileBiased512(bt biased32, R int) {
	name := fmt.Sprintf("qtile%sR%dVNNI512", bt.name, R)
	q0, ds0, wp, n := qtileBegin(name,
		fmt.Sprintf("%s is qtile%sR%dVNNI on 512-bit registers (AVX-512 VNNI and BW):", name, bt.name, R),
		"two blocks per integer dot product, with biased weights (see kernels/_generate/quant.go).",
	)
	xs := xrows(q0, ds0, R)
	SHRQ(U8(5), n) // blocks

	acc, corr := zeros(R, ZMM), zeros(R, ZMM)
	c := bt.consts()

	// An odd block first, on ymm: 256-bit writes clear the upper halves,
	// which are still zero here.
	TESTQ(U32(1), n)
	JZ(LabelRef(name + "_pairs"))
	{
		u, dw := ZMM(), f16Bcast(Mem{Base: wp})
		bt.one(wp, c, u)
		for r, x := range xs {
			t := ZMM()
			VXORPS(t.AsY(), t.AsY(), t.AsY())
			VPDPBUSD(x.q(0), u.AsY(), t.AsY())
			VCVTDQ2PS(t.AsY(), t.AsY())
			VMULPS(dw, t.AsY(), t.AsY())
			VFMADD231PS_BCST(x.d(0), t.AsY(), acc[r].AsY())
			VFMADD231PS_BCST(x.s(0), dw, corr[r].AsY())
		}
	}
	ADDQ(U8(bt.bytes), wp)
	ADDQ(U8(32), q0)
	ADDQ(U8(8), ds0)
	DECQ(n)

	Label(name + "_pairs")
	idxD, idxS := ZMM(), ZMM()
	VMOVDQU64(q8IdxData, idxD)
	VMOVDQU64(q8IdxData.Offset(64), idxS)
	Label(name + "_loop")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	u := ZMM()
	bt.two(wp, c, u)
	dw, dwB := f16Bcast(Mem{Base: wp}), f16Bcast(Mem{Base: wp, Disp: bt.bytes})
	dwv := ZMM()
	VINSERTF64X4(U8(1), dwB, dw.AsZ(), dwv)
	for r, x := range xs {
		t, p, dv, sv := ZMM(), ZMM(), ZMM(), ZMM()
		VXORPS(t, t, t)
		VPDPBUSD(x.q(0), u, t)
		VCVTDQ2PS(t, t)
		VMULPS(dwv, t, t)
		VBROADCASTF32X4(x.d(0), p) // dA sA dB sB, four times
		VPERMPS(p, idxD, dv)
		VPERMPS(p, idxS, sv)
		VFMADD231PS(dv, t, acc[r])
		VFMADD231PS(dwv, sv, corr[r])
	}
	ADDQ(U8(2*bt.bytes), wp)
	ADDQ(U8(64), q0)
	ADDQ(U8(16), ds0)
	SUBQ(U8(2), n)
	JMP(LabelRef(name + "_loop"))

	Label(name + "_done")
	k := bcastZ(math.Float32bits(bt.bias / 8))
	for r := range R {
		VFNMADD231PS(k, corr[r], acc[r]) // acc −= bias/8·corr
	}
	qtileEnd(acc, nil)
}

// xrows addresses R x rows from q0 and ds0: rows 1 and 2 at index ×1 and
// ×2 of the strides, row 3 at three strides ×1.
func xrows(q0, ds0 GPVirtual, R int) []xrow {
	xs := []xrow{{q0: q0, ds0: ds0}}
	if R == 1 {
		return xs
	}
	ldq := Load(Param("ldq"), GP64()).(GPVirtual)
	ldds := GP64()
	MOVQ(ldq, ldds)
	SHRQ(U8(2), ldds) // ldq/32 (d, s) pairs of 8 bytes
	for r := 1; r < R; r++ {
		x := xrow{q0: q0, ds0: ds0, idx: ldq, dsIdx: ldds, scale: uint8(r)}
		if r == 3 {
			q3, ds3 := GP64(), GP64()
			LEAQ(Mem{Base: ldq, Index: ldq, Scale: 2}, q3)
			LEAQ(Mem{Base: ldds, Index: ldds, Scale: 2}, ds3)
			x.idx, x.dsIdx, x.scale = q3, ds3, 1
		}
		xs = append(xs, x)
	}
	return xs
}

// The 512-bit Q6_K tile (AVX-512 VNNI and BW, one x row) takes two x blocks
// (four 16-element sub-blocks) per instruction. The 6-bit values q are
// unsigned bytes; the offset 32 is taken off in the integer lanes with a
// second VPDPBUSD of x against 32s, since each lane's four products belong
// to one sub-block.
var (
	q6kIdxData   Mem // [4][16]uint32: VPERMPS picks of sub-blocks 4p..4p+3's scales, 4 lanes each
	q6kShiftData Mem // [2][32]uint16: the qh shifts of groups 2p, 2p+1 (p = 0, 1)
)

func q6kConsts512() {
	q6kIdxData = GLOBL("q6kidx", RODATA|NOPTR)
	for p := range 4 {
		for l := range 16 {
			DATA(64*p+4*l, U32(4*p+l/4))
		}
	}
	q6kShiftData = GLOBL("q6kshift", RODATA|NOPTR)
	for p := range 2 {
		for l := range 32 {
			DATA(64*p+2*l, U16(4*p+2*(l/16)))
		}
	}
}

// qtileQ6K512 is the R-row Q6_K tile: the weights are unpacked once and
// their scales picked once for all R x rows.
func qtileQ6K512(R int) {
	name := fmt.Sprintf("qtileQ6KR%dVNNI512", R)
	q0, ds0, wp, n := qtileBegin(name,
		fmt.Sprintf("%s sets y[r·ldy] for r < %d to the dot product of one row of Q6_K blocks", name, R),
		"w with x row r (see qtileQ6KR1VNNI) on 512-bit registers (AVX-512 VNNI and BW):",
		"two x blocks per integer dot product.",
	)
	xs := xrows(q0, ds0, R)
	SHRQ(U8(8), n) // super-blocks

	acc := zeros(R, ZMM)
	low4, three, b32 := bcastZ(0x0f0f0f0f), bcastZ(0x03030303), bcastZ(0x20202020)
	shift := []VecVirtual{ZMM(), ZMM()}
	for p := range shift {
		VMOVDQU64(q6kShiftData.Offset(64*p), shift[p])
	}
	idxD := ZMM()
	VMOVDQU64(q8IdxData, idxD)

	Label(name + "_loop")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	dw, sc := ZMM(), ZMM()
	VPBROADCASTW(Mem{Base: wp, Disp: 208}, dw.AsY())
	VCVTPH2PS(dw.AsY(), dw)
	VPMOVSXBD(Mem{Base: wp, Disp: 192}, sc)
	VCVTDQ2PS(sc, sc)
	VMULPS(dw, sc, sc) // dw·scale of each of the 16 sub-blocks
	for h := range 2 {
		qh, ql := ZMM(), ZMM()
		VBROADCASTI64X4(Mem{Base: wp, Disp: 128 + 32*h}, qh)
		VMOVDQU64(Mem{Base: wp, Disp: 64 * h}, ql)
		for pr := range 2 {
			b := 4*h + 2*pr // the pair's first x block
			u, hb := ZMM(), ZMM()
			if pr == 0 {
				VPANDD(low4, ql, u)
			} else {
				VPSRLW(U8(4), ql, u)
				VPANDD(low4, u, u)
			}
			VPSRLVW(shift[pr], qh, hb)
			VPANDD(three, hb, hb)
			VPSLLW(U8(4), hb, hb)
			VPORD(hb, u, u)
			idx, sv := ZMM(), ZMM()
			VMOVDQU64(q6kIdxData.Offset(64*(2*h+pr)), idx)
			VPERMPS(sc, idx, sv)
			for r, x := range xs {
				t, t2, p, dv := ZMM(), ZMM(), ZMM(), ZMM()
				VXORPS(t, t, t)
				VPDPBUSD(x.q(32*b), u, t)
				VXORPS(t2, t2, t2)
				VPDPBUSD(x.q(32*b), b32, t2)
				VPSUBD(t2, t, t)
				VCVTDQ2PS(t, t)
				VMULPS(sv, t, t)
				VBROADCASTF32X4(x.d(b), p) // dA sA dB sB, four times
				VPERMPS(p, idxD, dv)
				VFMADD231PS(dv, t, acc[r])
			}
		}
	}
	ADDQ(U32(210), wp)
	ADDQ(U32(256), q0)
	ADDQ(U8(64), ds0)
	DECQ(n)
	JMP(LabelRef(name + "_loop"))

	Label(name + "_done")
	qtileEnd(acc, nil)
}

// qtileBegin starts a quantized tile: its TEXT with the qtileFunc
// signature, its doc, and the loads of q's, ds's and w's bases and of k.
func qtileBegin(name string, doc ...string) (q0, ds0, wp GPVirtual, k Register) {
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, q []int8, ds []float32, ldq int, w []byte, k int)")
	Doc(doc...)
	Pragma("noescape")
	q0 = Load(Param("q").Base(), GP64()).(GPVirtual)
	ds0 = Load(Param("ds").Base(), GP64()).(GPVirtual)
	wp = Load(Param("w").Base(), GP64()).(GPVirtual)
	k = Load(Param("k"), GP64())
	return q0, ds0, wp, k
}

// qtileEnd stores the R rows' sums, the lanes of acc[r] (zmm) less those of
// sub[r] (ymm; nil for none), to y[r·ldy], and returns.
func qtileEnd(acc, sub []VecVirtual) {
	yp := Load(Param("y").Base(), GP64()).(GPVirtual)
	var ldy Register
	if len(acc) > 1 {
		ldy = Load(Param("ldy"), GP64())
	}
	for r := range acc {
		var s VecVirtual
		if sub != nil {
			s = sub[r]
		}
		h := YMM()
		VEXTRACTF64X4(U8(1), acc[r], h)
		VADDPS(acc[r].AsY(), h, h)
		if r > 0 {
			LEAQ(Mem{Base: yp, Index: ldy, Scale: 4}, yp)
		}
		hsumStore(h, s, Mem{Base: yp})
	}
	VZEROUPPER()
	RET()
}

// sumInto emits op, the next term of the running sum *sum: the first term
// (first) op writes into a new register that becomes *sum, later ones into
// t, which add (VPADDD for int32 sums, VPADDW for int16) then adds in.
func sumInto(sum *VecVirtual, first bool, t VecVirtual, add func(...Op), op func(dst VecVirtual)) {
	if first {
		*sum = YMM()
		op(*sum)
		return
	}
	op(t)
	add(t, *sum, *sum)
}

// zerosInt returns n new registers of vec set to zero with VPSUBD: a zero
// idiom avo knows, with an EVEX form (AVX-512 F, where VXORPS needs DQ).
func zerosInt(n int, vec func() VecVirtual) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = vec()
		VPSUBD(v[i], v[i], v[i])
	}
	return v
}

// shrStrides returns new registers holding ld>>s and ld3>>s: the strides of
// one and of three rows of an array with 2^s times fewer bytes a row.
func shrStrides(ld, ld3 GPVirtual, s uint8) (GPVirtual, GPVirtual) {
	a, a3 := GP64(), GP64()
	MOVQ(ld, a)
	SHRQ(U8(s), a)
	MOVQ(ld3, a3)
	SHRQ(U8(s), a3)
	return a, a3
}

// zeros returns n new registers of vec (YMM or ZMM) set to zero.
func zeros(n int, vec func() VecVirtual) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = vec()
		VXORPS(v[i], v[i], v[i])
	}
	return v
}
