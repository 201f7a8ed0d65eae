package main

import (
	"fmt"

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
// clobbered) and the x block at xm.
func (c *qctx) signedDot(w VecVirtual, xm Mem, t VecVirtual) {
	xr := YMM()
	VMOVDQU(xm, xr)
	VPSIGNB(w, xr, xr)
	VPABSB(w, w)
	c.idot(xr, w, t)
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
	VEXTRACTF128(U8(1), acc, t)
	VADDPS(t, acc.AsX(), t)
	if sub != nil {
		u := XMM()
		VEXTRACTF128(U8(1), sub, u)
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
	// block emits the dot of weight block i (at w + i·bytes) with its x
	// blocks (at q + i·elems, d + 4·i·elems/32, s likewise) into acc (and
	// sub, subtracted at the end).
	block func(c *qctx, w, q, d, s GPVirtual, i int, acc, sub VecVirtual)
}

var qkernels = []qkernel{
	{
		name: "Q8_0", elems: 32, bytes: 34, unroll: 2,
		doc: "dw·d[b]·Σ int8(w)·q",
		block: func(c *qctx, w, q, d, _ GPVirtual, i int, acc, _ VecVirtual) {
			wr, t := YMM(), YMM()
			VMOVDQU(Mem{Base: w, Disp: 34*i + 2}, wr)
			c.signedDot(wr, Mem{Base: q, Disp: 32 * i}, t)
			VCVTDQ2PS(t, t)
			VMULPS(f16Bcast(Mem{Base: w, Disp: 34 * i}), t, t)
			c.fmaBcast(Mem{Base: d, Disp: 4 * i}, t, acc)
		},
	},
	{
		name: "Q4_0", elems: 32, bytes: 18, unroll: 2,
		doc: "dw·d[b]·Σ (nibble−8)·q",
		block: func(c *qctx, w, q, d, _ GPVirtual, i int, acc, _ VecVirtual) {
			lo, hi, wr, t := XMM(), XMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: w, Disp: 18*i + 2}, lo)
			VPSRLW(U8(4), lo, hi)
			VINSERTI128(U8(1), hi, lo.AsY(), wr)
			VPAND(c.low4, wr, wr)
			VPSUBB(c.b8, wr, wr)
			c.signedDot(wr, Mem{Base: q, Disp: 32 * i}, t)
			VCVTDQ2PS(t, t)
			VMULPS(f16Bcast(Mem{Base: w, Disp: 18 * i}), t, t)
			c.fmaBcast(Mem{Base: d, Disp: 4 * i}, t, acc)
		},
	},
	{
		name: "Q4K", elems: 256, bytes: 144, unroll: 1, usesSum: true,
		doc:   "Σ over sub-blocks j: dw·sc_j·d[b]·Σ nibble·q − dmin·m_j·s[b]",
		block: q4kBlock,
	},
	{
		name: "Q6K", elems: 256, bytes: 210, unroll: 1,
		doc:   "Σ over sub-blocks of 16: dw·sc·d[b]·Σ (q6−32)·q",
		block: q6kBlock,
	},
}

// bcastB returns a ymm with every byte c.
func bcastB(c uint8) VecVirtual {
	return bcastD(uint32(c) * 0x01010101)
}

// q4kScales unpacks a Q4_K/Q5_K block's twelve scale bytes at w+4 (ggml's
// utmp shuffle) into the eight 6-bit scales and the eight 6-bit mins, as
// int32 lanes of sc and mn. It goes through general registers, not memory,
// so no load waits on a store it only partly overlaps.
func q4kScales(w GPVirtual, sc, mn VecVirtual) {
	a0, a1, a2 := GP64(), GP64(), GP64()
	MOVLQZX(Mem{Base: w, Disp: 4}, a0)
	MOVLQZX(Mem{Base: w, Disp: 8}, a1)
	MOVLQZX(Mem{Base: w, Disp: 12}, a2)
	// scales 4..7 per byte: (a2 & 0x0f) | ((a0 >> 6) & 3) << 4, above
	// scales 0..3: a0 & 0x3f.
	t, u := GP64(), GP64()
	MOVQ(a0, t)
	SHRQ(U8(6), t)
	ANDQ(U32(0x03030303), t)
	SHLQ(U8(4), t)
	MOVQ(a2, u)
	ANDQ(U32(0x0f0f0f0f), u)
	ORQ(u, t)
	SHLQ(U8(32), t)
	ANDQ(U32(0x3f3f3f3f), a0)
	ORQ(a0, t)
	VMOVQ(t, sc.AsX())
	VPMOVZXBD(sc.AsX(), sc)
	// mins 4..7: (a2 >> 4) & 0x0f | ((a1 >> 6) & 3) << 4, above mins 0..3:
	// a1 & 0x3f.
	MOVQ(a1, t)
	SHRQ(U8(6), t)
	ANDQ(U32(0x03030303), t)
	SHLQ(U8(4), t)
	SHRQ(U8(4), a2)
	ANDQ(U32(0x0f0f0f0f), a2)
	ORQ(a2, t)
	SHLQ(U8(32), t)
	ANDQ(U32(0x3f3f3f3f), a1)
	ORQ(a1, t)
	VMOVQ(t, mn.AsX())
	VPMOVZXBD(mn.AsX(), mn)
}

// q4kBlock is one Q4_K super-block: 8 sub-blocks of 32, sub-block 2c the
// low nibbles of qs[32c:32c+32], 2c+1 the high ones.
func q4kBlock(c *qctx, w, q, d, s GPVirtual, _ int, acc, sub VecVirtual) {
	local := AllocLocal(32) // dw·sc_j·d[b], float32[8]
	sc, mn := YMM(), YMM()
	q4kScales(w, sc, mn)
	dw, dmin := f16Bcast(Mem{Base: w}), f16Bcast(Mem{Base: w, Disp: 2})
	VCVTDQ2PS(sc, sc)
	VMULPS(dw, sc, sc)
	VMULPS(Mem{Base: d}, sc, sc)
	VMOVUPS(sc, local)
	VCVTDQ2PS(mn, mn)
	VMULPS(dmin, mn, mn)
	VFMADD231PS(Mem{Base: s}, mn, sub)
	for h := range 4 {
		raw, lo, t := YMM(), YMM(), YMM()
		VMOVDQU(Mem{Base: w, Disp: 16 + 32*h}, raw)
		VPAND(c.low4, raw, lo)
		VPSRLW(U8(4), raw, raw)
		VPAND(c.low4, raw, raw)
		for k, u := range []VecVirtual{lo, raw} {
			j := 2*h + k
			c.idot(Mem{Base: q, Disp: 32 * j}, u, t)
			VCVTDQ2PS(t, t)
			c.fmaBcast(local.Offset(4*j), t, acc)
		}
	}
}

// q6kBlock is one Q6_K super-block: in half h, x block 4h+g takes the low
// (g < 2) or high nibbles of ql[64h+32(g&1):] and bits 2g, 2g+1 of
// qh[32h:]; its int32 lanes 0-3 are sub-block 2(4h+g), lanes 4-7 the next.
func q6kBlock(c *qctx, w, q, d, _ GPVirtual, _ int, acc, _ VecVirtual) {
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
			c.signedDot(u, Mem{Base: q, Disp: 32 * b}, t)
			VCVTDQ2PS(t, t)
			lo, hi, sv := XMM(), XMM(), YMM()
			VBROADCASTSS(local.Offset(8*b), lo)
			VBROADCASTSS(local.Offset(8*b+4), hi)
			VINSERTF128(U8(1), hi, lo.AsY(), sv)
			VMULPS(sv, t, t)
			c.fmaBcast(Mem{Base: d, Disp: 4 * b}, t, acc)
		}
	}
}

func qtile(a qisa, k qkernel) {
	name := fmt.Sprintf("qtile%sR1%s", k.name, a.suffix)
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, q []int8, d, s []float32, ldq int, w []byte, k int)")
	Doc(
		fmt.Sprintf("%s sets y[0] to the dot product of one row of %s blocks w with one", name, k.name),
		"x row quantized to int8 in blocks of 32 (q, scales d, d·Σq in s); per block b:",
		"",
		"\t"+k.doc,
		"",
		"k is the row's length (a multiple of the block). The caller guarantees the",
		"bounds; nothing is checked.",
	)
	Pragma("noescape")
	yp := Load(Param("y").Base(), GP64())
	qp := Load(Param("q").Base(), GP64()).(GPVirtual)
	dp := Load(Param("d").Base(), GP64()).(GPVirtual)
	sp := Load(Param("s").Base(), GP64()).(GPVirtual)
	wp := Load(Param("w").Base(), GP64()).(GPVirtual)
	n := Load(Param("k"), GP64())
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), n) // blocks

	accs := make([]VecVirtual, k.unroll)
	for u := range accs {
		accs[u] = YMM()
		VXORPS(accs[u], accs[u], accs[u])
	}
	sub := YMM()
	VXORPS(sub, sub, sub)
	c := &qctx{qisa: a, low4: bcastB(0x0f)}
	if !a.vnni {
		c.ones = bcastD(0x00010001)
	}
	if k.name == "Q4_0" {
		c.b8 = bcastB(8)
	}
	advance := func(blocks int) {
		ADDQ(U32(blocks*k.bytes), wp)
		ADDQ(U32(blocks*k.elems), qp)
		ADDQ(U32(blocks*k.elems/32*4), dp)
		ADDQ(U32(blocks*k.elems/32*4), sp)
		SUBQ(U8(blocks), n)
	}
	if k.unroll > 1 {
		Label(name + "_loopU")
		CMPQ(n, U8(k.unroll))
		JB(LabelRef(name + "_loop1"))
		for u := range k.unroll {
			k.block(c, wp, qp, dp, sp, u, accs[u], sub)
		}
		advance(k.unroll)
		JMP(LabelRef(name + "_loopU"))
	}
	Label(name + "_loop1")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	k.block(c, wp, qp, dp, sp, 0, accs[0], sub)
	advance(1)
	JMP(LabelRef(name + "_loop1"))

	Label(name + "_done")
	for u := 1; u < k.unroll; u++ {
		VADDPS(accs[u], accs[0], accs[0])
	}
	var s VecVirtual
	if k.usesSum {
		s = sub
	}
	hsumStore(accs[0], s, Mem{Base: yp})
	VZEROUPPER()
	RET()
}
