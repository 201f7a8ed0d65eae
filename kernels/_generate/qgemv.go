package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AVX2 gemv kernels (qgemv*R1AVX2, qgemv*R4AVX2) dot a run of weight
// rows with one or four x rows in one call, the loop over rows in
// assembly, each weight block decoded once for the x rows. They cost
// fewer vector instructions per weight than the qtile*AVX2 tiles:
//
//   - Q4_0 multiplies the unsigned nibbles n directly (VPMADDUBSW of n
//     and x), so no sign trick; the −8 offset comes off in the same
//     multiply-add that applies x's scale: dw·(d·Σn·q − 8·s), s = d·Σq
//     kept per block with x.
//   - Q4_K and Q6_K take x quantized with one scale per 256 columns (as
//     llama.cpp's Q8_K), so their 6- and 8-bit sub-block scales apply in
//     the integers (VPMADDWD against the scale instead of against ones)
//     and a super-block takes one conversion and one multiply-add; the
//     mins (Q4_K) and the −32 offset (Q6_K) come off with one VPMADDWD of
//     the scales against Σq per 16 columns (bs).
//   - Q8_0 keeps the sign trick. The Q8_0 and Q4_0 block scales are
//     widened through the float16 table (two loads, no vector work).
//
// Signature: func(y []float32, ldy int, q []int8, ds []float32, bs
// []int16, ldq int, w []byte, k, rows int, f16 *[65536]float32); y[r·ldy +
// j] for j < rows, r < R is weight row j (k columns, at w[j·rowBytes:])
// against x row r (q[r·ldq:], ds[2·r·ldq/32:], bs[r·ldq/16:]).

// gemvKernel is one dtype's gemv kernel.
type gemvKernel struct {
	name  string
	isa   string // the name's suffix: "" for AVX2
	elems int    // per weight block
	bytes int    // per weight block
	// unroll is blocks per loop step with one x row (k is a multiple of
	// 256 for the callers, so the block count is a multiple of it).
	unroll int
	doc    []string
	// setup makes the kernel's constants; block emits weight block u of
	// the step (at wp + u·bytes) against the x rows' blocks, accumulating
	// x row r into acc[r].
	setup func() []VecVirtual
	block func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual)
}

// gemvPtrs address the weight block and the x rows' blocks of the inner
// loop.
type gemvPtrs struct {
	wp, qp, dsp, bsp GPVirtual
	f16              GPVirtual // the float16 → float32 table
	rows             int       // x rows
	ldq, ldq3        GPVirtual // x row strides of q: 1 and 3 rows (R > 1)
	dsOff, bsOff     Mem       // [3]int64 locals: ds and bs byte offsets of x rows 1-3
	ldds, ldds3      GPVirtual // ds's offsets of x rows 1 and 3 in registers (nil: from dsOff)
}

// q is x row r's int8 value at byte off (of the current block).
func (p gemvPtrs) q(r, off int) Mem { return stridedRow(p.qp, p.ldq, p.ldq3, r, off) }

// ds is x row r's float32 at byte off of the (d, s) pairs; bs its int16
// sums at byte off. Rows past the first load their offset into a register
// (ds: unless its strides are in ldds, ldds3).
func (p gemvPtrs) ds(r, off int) Mem {
	if r == 0 || p.ldds == nil {
		return rowMem(p.dsp, p.dsOff, r, off)
	}
	return stridedRow(p.dsp, p.ldds, p.ldds3, r, off)
}
func (p gemvPtrs) bs(r, off int) Mem { return rowMem(p.bsp, p.bsOff, r, off) }

// stridedRow addresses byte off of row r < 4 of an array at base whose
// row stride is ld (ld3: three rows) bytes.
func stridedRow(base, ld, ld3 GPVirtual, r, off int) Mem {
	switch r {
	case 0:
		return Mem{Base: base, Disp: off}
	case 3:
		return Mem{Base: base, Index: ld3, Scale: 1, Disp: off}
	}
	return Mem{Base: base, Index: ld, Scale: uint8(r), Disp: off}
}

func rowMem(base GPVirtual, offs Mem, r, off int) Mem {
	if r == 0 {
		return Mem{Base: base, Disp: off}
	}
	t := GP64()
	MOVQ(offs.Offset(8*(r-1)), t)
	return Mem{Base: base, Index: t, Scale: 1, Disp: off}
}

// f16Tab returns the float16 at m widened into all eight float32 lanes,
// through the table: two loads, no vector instruction.
func (p gemvPtrs) f16Tab(m Mem) VecVirtual {
	i, v := GP32(), YMM()
	MOVWLZX(m, i)
	VBROADCASTSS(Mem{Base: p.f16, Index: i.As64(), Scale: 4}, v)
	return v
}

var gemvKernels = []gemvKernel{
	{
		name: "Q8_0", elems: 32, bytes: 34, unroll: 2,
		doc: []string{"per block: dw·d·Σ w·q (sign trick, VPMADDUBSW)."},
		setup: func() []VecVirtual {
			return []VecVirtual{bcastD(0x00010001)}
		},
		block: func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual) {
			w, aw := YMM(), YMM()
			VMOVDQU(Mem{Base: p.wp, Disp: 34*u + 2}, w)
			VPABSB(w, aw)
			dw := p.f16Tab(Mem{Base: p.wp, Disp: 34 * u})
			for r := range p.rows {
				x, t, d := YMM(), YMM(), YMM()
				VMOVDQU(p.q(r, 32*u), x)
				VPSIGNB(w, x, x)
				VPMADDUBSW(x, aw, t)
				VPMADDWD(c[0], t, t)
				VCVTDQ2PS(t, t)
				VBROADCASTSS(p.ds(r, 8*u), d)
				VMULPS(dw, d, d)
				VFMADD231PS(t, d, acc[r])
			}
		},
	},
	{
		name: "Q4_0", elems: 32, bytes: 18, unroll: 2,
		doc: []string{"per block: dw·(d·Σ n·q − 8·s), n the unsigned nibbles."},
		setup: func() []VecVirtual {
			shift := YMM() // VPSRLVD counts: 0 in the low 128 bits, 4 in the high
			VMOVDQU(q40ShiftData2, shift)
			return []VecVirtual{bcastD(0x00010001), bcastB(0x0f), shift}
		},
		block: func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual) {
			w := YMM()
			VBROADCASTI128(Mem{Base: p.wp, Disp: 18*u + 2}, w)
			VPSRLVD(c[2], w, w)
			VPAND(c[1], w, w)
			dw := p.f16Tab(Mem{Base: p.wp, Disp: 18 * u})
			for r := range p.rows {
				t, d, s := YMM(), YMM(), YMM()
				VPMADDUBSW(p.q(r, 32*u), w, t)
				VPMADDWD(c[0], t, t)
				VCVTDQ2PS(t, t)
				dm := p.ds(r, 8*u)
				VBROADCASTSS(dm, d)
				VBROADCASTSS(dm.Offset(4), s)
				VFMSUB213PS(s, d, t)       // t·d − s in each lane: d·Σn·q − 8·s once summed
				VFMADD231PS(t, dw, acc[r]) // acc += dw·that
			}
		},
	},
	{
		name: "Q4K", elems: 256, bytes: 144, unroll: 1,
		doc: []string{"per super-block: dw·d·Σⱼ scⱼ·Σ nⱼ·q − dmin·d·Σⱼ mⱼ·Σⱼq (d: x's scale of the 256 columns)."},
		setup: func() []VecVirtual {
			return []VecVirtual{bcastB(0x0f)}
		},
		block: q4kGemvBlock,
	},
	{
		name: "Q6K", elems: 256, bytes: 210, unroll: 1,
		doc: []string{"per super-block: dw·d·Σ over sub-blocks of 16: sc·(Σ q6·q − 32·Σq)."},
		setup: func() []VecVirtual {
			return []VecVirtual{bcastB(0x0f), bcastB(0x30)}
		},
		block: q6kGemvBlock,
	},
}

var (
	q40ShiftData2 Mem // [8]uint32: 0, 0, 0, 0, 4, 4, 4, 4
	k4ShufData    Mem // [8][32]byte: VPSHUFB picks of int16 lane j in every lane
	q6ShufData    Mem // [8][32]byte: int16 lanes = byte 2b (low half), 2b+1 (high half), << 8
)

func gemvConsts() {
	q40ShiftData2 = GLOBL("q40shiftv", RODATA|NOPTR)
	for l := range 8 {
		DATA(4*l, U32(4*(l/4)))
	}
	k4ShufData = GLOBL("k4shuf", RODATA|NOPTR)
	for j := range 8 {
		for l := range 16 {
			DATA(32*j+2*l, U8(2*j))
			DATA(32*j+2*l+1, U8(2*j+1))
		}
	}
	q6ShufData = GLOBL("q6shuf", RODATA|NOPTR)
	for b := range 8 {
		for l := range 16 {
			src := 2*b + l/8 // low 128 bits: sub-block 2b; high: 2b+1
			DATA(32*b+2*l, U8(0x80))
			DATA(32*b+2*l+1, U8(src))
		}
	}
}

// kScaleBytes unpacks a Q4_K/Q5_K block's twelve scale bytes at w+4
// (ggml's utmp shuffle) into the eight 6-bit scales (bytes of the returned
// sc) and the eight 6-bit mins (bytes of mn), both GP64. It goes through
// general registers, not memory, so no load waits on a store it only
// partly overlaps; at most five are live.
func kScaleBytes(w GPVirtual) (sc, mn GPVirtual) {
	a0, a2 := GP64(), GP64()
	MOVLQZX(Mem{Base: w, Disp: 4}, a0)
	MOVLQZX(Mem{Base: w, Disp: 12}, a2)
	sc, u := GP64(), GP64()
	MOVQ(a0, sc)
	SHRQ(U8(6), sc)
	ANDQ(U32(0x03030303), sc)
	SHLQ(U8(4), sc)
	MOVQ(a2, u)
	ANDQ(U32(0x0f0f0f0f), u)
	ORQ(u, sc)
	SHLQ(U8(32), sc)
	ANDQ(U32(0x3f3f3f3f), a0)
	ORQ(a0, sc)
	mn = GP64()
	MOVLQZX(Mem{Base: w, Disp: 8}, mn)
	MOVQ(mn, u)
	SHRQ(U8(6), u)
	ANDQ(U32(0x03030303), u)
	SHLQ(U8(4), u)
	SHRQ(U8(4), a2)
	ANDQ(U32(0x0f0f0f0f), a2)
	ORQ(a2, u)
	SHLQ(U8(32), u)
	ANDQ(U32(0x3f3f3f3f), mn)
	ORQ(u, mn)
	return sc, mn
}

// superScales returns dw·d and dm·d broadcast, for the float16 pair
// (dw, dm) widened in v (dw dm dw dm ...) and x's scale d at dm.
func superScales(v VecVirtual, d Mem) (a, b VecVirtual) {
	dv := YMM()
	VBROADCASTSS(d, dv)
	VMULPS(v, dv, dv)
	a, b = YMM(), YMM()
	VPERMILPS(U8(0x00), dv, a)
	VPERMILPS(U8(0x55), dv, b)
	return a, b
}

// q4kGemvBlock is one Q4_K super-block against x quantized with one scale
// per 256 columns: the sub-block scales multiply the integer pair sums.
func q4kGemvBlock(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual) {
	sc8, mn8 := kScaleBytes(p.wp)
	scv := YMM()
	VMOVQ(sc8, scv.AsX())
	VPMOVZXBW(scv.AsX(), scv.AsX())
	VINSERTI128(U8(1), scv.AsX(), scv, scv) // sc0..sc7 as int16, in both halves
	mins := XMM()
	VMOVQ(mn8, mins)

	isum := make([]VecVirtual, p.rows)
	for h := range 4 {
		raw, lo := YMM(), YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 16 + 32*h}, raw)
		VPAND(c[0], raw, lo)
		VPSRLW(U8(4), raw, raw)
		VPAND(c[0], raw, raw)
		for k, n := range []VecVirtual{lo, raw} {
			j := 2*h + k
			s := YMM()
			VPSHUFB(k4ShufData.Offset(32*j), scv, s)
			for r := range p.rows {
				t := YMM()
				VPMADDUBSW(p.q(r, 32*j), n, t)
				sumInto(&isum[r], j == 0, t, VPADDD, func(d VecVirtual) { VPMADDWD(s, t, d) })
			}
		}
	}
	q4kGemvEnd(p, mins, acc, func(r int) VecVirtual { return isum[r] })
}

// q4kGemvEnd ends a Q4_K super-block: the eight mins (bytes of mins)
// widened to int16 pairs, and per x row r, isum(r) emits (or returns) the
// row's eight int32 sums Σ scⱼ·Σ nⱼ·q, and acc[r] += dw·d·that −
// dmin·d·Σⱼ mⱼ·Σⱼq.
func q4kGemvEnd(p gemvPtrs, mins VecVirtual, acc []VecVirtual, isum func(r int) VecVirtual) {
	mnv, hi := YMM(), XMM()
	VPMOVZXBW(mins, mnv.AsX())
	VPUNPCKHWD(mnv.AsX(), mnv.AsX(), hi)
	VPUNPCKLWD(mnv.AsX(), mnv.AsX(), mnv.AsX())
	VINSERTI128(U8(1), hi, mnv, mnv) // m0 m0 m1 m1 ... m7 m7
	v := YMM()
	VPBROADCASTD(Mem{Base: p.wp}, v)
	VCVTPH2PS(v.AsX(), v) // dw dmin dw dmin ...
	for r := range p.rows {
		i := isum(r)
		msum := YMM()
		VPMADDWD(p.bs(r, 0), mnv, msum) // mⱼ·Σⱼq in lane j
		a, b := superScales(v, p.ds(r, 0))
		VCVTDQ2PS(i, i)
		VCVTDQ2PS(msum, msum)
		VFMADD231PS(i, a, acc[r])
		VFNMADD231PS(msum, b, acc[r])
	}
}

// q6kGemvBlock is one Q6_K super-block against x quantized with one scale
// per 256 columns: in half h, x block 4h+g takes the low (g < 2) or high
// nibbles of ql[64h+32(g&1):] and bits 2g, 2g+1 of qh[32h:]; its int16
// pair sums 0-7 belong to sub-block 2(4h+g), 8-15 to the next.
func q6kGemvBlock(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual) {
	low4, m30 := c[0], c[1]
	isum := make([]VecVirtual, p.rows)
	for h := range 2 {
		qh := YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 128 + 32*h}, qh)
		for g := range 4 {
			b := 4*h + g
			u, hb, s := YMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: p.wp, Disp: 64*h + 32*(g&1)}, u)
			if g >= 2 {
				VPSRLW(U8(4), u, u)
			}
			VPAND(low4, u, u)
			switch g { // ((qh >> 2g) & 3) << 4 = bits 4, 5 of qh shifted by 4 − 2g
			case 0:
				VPSLLW(U8(4), qh, hb)
			case 1:
				VPSLLW(U8(2), qh, hb)
			case 3:
				VPSRLW(U8(2), qh, hb)
			}
			if g == 2 {
				VPAND(m30, qh, hb)
			} else {
				VPAND(m30, hb, hb)
			}
			VPOR(hb, u, u)
			VBROADCASTI128(Mem{Base: p.wp, Disp: 192}, s) // 16 int8 scales, both halves
			VPSHUFB(q6ShufData.Offset(32*b), s, s)
			VPSRAW(U8(8), s, s) // the int8 scales sign-extended
			for r := range p.rows {
				t := YMM()
				VPMADDUBSW(p.q(r, 32*b), u, t)
				sumInto(&isum[r], b == 0, t, VPADDD, func(d VecVirtual) { VPMADDWD(s, t, d) })
			}
		}
	}
	// − 32·Σ sc·Σq over the 16 sub-blocks of 16 columns.
	sc16 := YMM()
	VPMOVSXBW(Mem{Base: p.wp, Disp: 192}, sc16)
	q6kGemvEnd(p, sc16, acc, func(r int) VecVirtual { return isum[r] })
}

// q6kGemvEnd ends a Q6_K super-block, sc16 its sixteen scales as int16:
// per x row r, isum(r) emits (or returns) the row's eight int32 sums
// Σ sc·Σ q6·q, less 32·Σ sc·Σq, and acc[r] += dw·d·that.
func q6kGemvEnd(p gemvPtrs, sc16 VecVirtual, acc []VecVirtual, isum func(r int) VecVirtual) {
	dw := f16Bcast(Mem{Base: p.wp, Disp: 208})
	for r := range p.rows {
		i := isum(r)
		off, d := YMM(), YMM()
		VPMADDWD(p.bs(r, 0), sc16, off)
		VPSLLD(U8(5), off, off)
		VPSUBD(off, i, i)
		VBROADCASTSS(p.ds(r, 0), d)
		VMULPS(dw, d, d)
		VCVTDQ2PS(i, i)
		VFMADD231PS(i, d, acc[r])
	}
}

// xRewind stores k, k/4 and k/8 in a new 24-byte local: the bytes the x
// pointers into q, ds and bs advance over k columns, which rewind them.
func xRewind() Mem {
	t := Load(Param("k"), GP64())
	back := AllocLocal(24)
	MOVQ(t, back)
	SHRQ(U8(2), t)
	MOVQ(t, back.Offset(8))
	SHRQ(U8(1), t)
	MOVQ(t, back.Offset(16))
	return back
}

// prefetchAhead is how many bytes ahead of the weight block the gemv
// kernels prefetch: the hardware prefetchers stop at 4 KiB pages, and a
// decode step streams the weights from memory.
const prefetchAhead = 4096

// qgemv writes kernel k's AVX2 gemv function for R x rows.
func qgemv(k gemvKernel, R int) {
	isa := k.isa
	if isa == "" {
		isa = "AVX2"
	}
	name := fmt.Sprintf("qgemv%sR%d%s", k.name, R, isa)
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, q []int8, ds []float32, bs []int16, ldq int, w []byte, k, rows int, f16 *[65536]float32)")
	Doc(append([]string{
		fmt.Sprintf("%s sets y[r·ldy + j] for j < rows, r < %d to the dot product of row j", name, R),
		fmt.Sprintf("of the %s weight rows w (k columns each, one after the other) with x", k.name),
		"row r quantized to int8 (q[r·ldq:]; ds, its (d, d·Σq) pairs per 32 columns;",
		"bs, Σq per 16 columns); f16 is the float16 → float32 table;",
	}, append(k.doc,
		"",
		"k is a multiple of 256. The caller guarantees the bounds; nothing is checked.")...)...)
	Pragma("noescape")
	p := gemvPtrs{
		wp:   Load(Param("w").Base(), GP64()).(GPVirtual),
		qp:   Load(Param("q").Base(), GP64()).(GPVirtual),
		dsp:  Load(Param("ds").Base(), GP64()).(GPVirtual),
		bsp:  Load(Param("bs").Base(), GP64()).(GPVirtual),
		rows: R,
	}
	if k.elems == 32 {
		p.f16 = Load(Param("f16"), GP64()).(GPVirtual)
	}
	// Per weight row the x pointers advance k bytes (q), k/4 (ds) and
	// k/8 (bs); the loop rewinds them by these after every weight row.
	back := xRewind()
	rows := AllocLocal(8)
	r := Load(Param("rows"), GP64())
	MOVQ(r, rows)
	yoff, yloc := AllocLocal(8), AllocLocal(8) // ldy in bytes; y's row-0 address
	{
		t := Load(Param("y").Base(), GP64())
		MOVQ(t, yloc)
	}
	if R > 1 {
		p.ldq, p.ldq3 = Load(Param("ldq"), GP64()).(GPVirtual), GP64()
		LEAQ(Mem{Base: p.ldq, Index: p.ldq, Scale: 2}, p.ldq3)
		p.dsOff, p.bsOff = AllocLocal(24), AllocLocal(24)
		if k.elems == 32 { // the inner loop reads ds for every block: keep its offsets in registers
			p.ldds, p.ldds3 = shrStrides(p.ldq, p.ldq3, 2)
		}
		t := GP64()
		for i := range 3 { // ldq·(i+1)/4 and /8
			switch i {
			case 0:
				MOVQ(p.ldq, t)
			case 1:
				LEAQ(Mem{Base: p.ldq, Index: p.ldq, Scale: 1}, t)
			case 2:
				MOVQ(p.ldq3, t)
			}
			SHRQ(U8(2), t)
			MOVQ(t, p.dsOff.Offset(8*i))
			SHRQ(U8(1), t)
			MOVQ(t, p.bsOff.Offset(8*i))
		}
		ly := Load(Param("ldy"), GP64())
		SHLQ(U8(2), ly)
		MOVQ(ly, yoff)
	}

	c := k.setup()
	unroll := k.unroll
	if R > 1 {
		unroll = 1 // R accumulators are in flight already
	}
	Label(name + "_row")
	CMPQ(rows, U8(0))
	JE(LabelRef(name + "_done"))
	acc := make([][]VecVirtual, unroll) // [unroll][R]
	for u := range acc {
		acc[u] = zeros(R, YMM)
	}
	n := Load(Param("k"), GP64())
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), n) // blocks
	Label(name + "_blk")
	for i := range (unroll*k.bytes + 63) / 64 {
		PREFETCHT0(Mem{Base: p.wp, Disp: prefetchAhead + 64*i})
	}
	for u := range unroll {
		k.block(c, p, u, acc[u])
	}
	ADDQ(U32(unroll*k.bytes), p.wp)
	ADDQ(U32(unroll*k.elems), p.qp)
	ADDQ(U32(unroll*k.elems/32*8), p.dsp)
	ADDQ(U32(unroll*k.elems/16*2), p.bsp)
	SUBQ(U8(unroll), n)
	JNZ(LabelRef(name + "_blk"))

	yp := GP64()
	MOVQ(yloc, yp)
	for r := range R {
		for u := 1; u < unroll; u++ {
			VADDPS(acc[u][r], acc[0][r], acc[0][r])
		}
		if r > 0 {
			ADDQ(yoff, yp)
		}
		hsumStore(acc[0][r], nil, Mem{Base: yp})
	}
	ADDQ(U8(4), yloc)
	SUBQ(back, p.qp)
	SUBQ(back.Offset(8), p.dsp)
	SUBQ(back.Offset(16), p.bsp)
	DECQ(rows)
	JMP(LabelRef(name + "_row"))

	Label(name + "_done")
	VZEROUPPER()
	RET()
}

var quantPermData Mem // [8]uint32: VPERMD picks that undo VPACKSS*'s lane interleave

// quantX writes quantXAVX2, kernels/cpu's qrows.quantizeRows on AVX2.
func quantX() {
	quantPermData = GLOBL("quantperm", RODATA|NOPTR)
	for i, v := range []uint32{0, 4, 1, 5, 2, 6, 3, 7} {
		DATA(4*i, U32(v))
	}
	TEXT("quantXAVX2", NOSPLIT, "func(q []int8, ds []float32, bs []int16, x []float32, group int)")
	Doc("quantXAVX2 quantizes x (len(x) a multiple of group, group a multiple of 32) to",
		"int8 with one scale per group columns, as qrows.quantizeRows does: per block of",
		"32, q = round(x·127/amax) half away from zero, ds = (amax/127, d·Σq), bs = Σq",
		"of each 16. The caller guarantees the bounds; nothing is checked.")
	Pragma("noescape")
	qp := Load(Param("q").Base(), GP64())
	dsp := Load(Param("ds").Base(), GP64())
	bsp := Load(Param("bs").Base(), GP64())
	xp := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	g := Load(Param("group"), GP64())
	absMask, half, perm := bcastD(0x7fffffff), bcastD(0x3f000000), YMM()
	VMOVDQU(quantPermData, perm)
	c127 := XMM()
	t32 := GP32()
	MOVL(U32(0x42fe0000), t32) // 127
	VMOVD(t32, c127)

	Label("quantX_group")
	TESTQ(n, n)
	JZ(LabelRef("quantX_done"))
	m := YMM()
	VXORPS(m, m, m)
	i, p := GP64(), GP64()
	MOVQ(g, i)
	MOVQ(xp, p)
	Label("quantX_max")
	v := YMM()
	VANDPS(Mem{Base: p}, absMask, v)
	VMAXPS(v, m, m)
	ADDQ(U8(32), p)
	SUBQ(U8(8), i)
	JNZ(LabelRef("quantX_max"))
	h := XMM()
	VEXTRACTF128(U8(1), m, h)
	VMAXPS(h, m.AsX(), h)
	u := XMM()
	VPERMILPS(U8(0x4e), h, u)
	VMAXPS(u, h, h)
	VPERMILPS(U8(0xb1), h, u)
	VMAXPS(u, h, h) // amax in every lane
	d, id := XMM(), XMM()
	VXORPS(d, d, d)
	VXORPS(id, id, id)
	VUCOMISS(d, h)
	JE(LabelRef("quantX_scaled")) // amax == 0: d = id = 0, q = 0
	VDIVSS(c127, h, d)            // amax/127
	VDIVSS(h, c127, id)           // 127/amax
	Label("quantX_scaled")
	idv := YMM()
	VBROADCASTSS(id, idv)
	MOVQ(g, i)
	Label("quantX_block")
	iv := make([]VecVirtual, 4)
	for c := range 4 {
		t, a, s := YMM(), YMM(), YMM()
		VMULPS(Mem{Base: xp, Disp: 32 * c}, idv, t)
		VANDPS(absMask, t, a)
		VADDPS(half, a, a)
		VROUNDPS(U8(3), a, a) // truncate
		VANDNPS(t, absMask, s)
		VORPS(s, a, a)
		iv[c] = YMM()
		VCVTTPS2DQ(a, iv[c])
	}
	s01, s23 := YMM(), YMM()
	VPADDD(iv[0], iv[1], s01)
	VPADDD(iv[2], iv[3], s23)
	VPHADDD(s23, s01, s01)
	VPHADDD(s01, s01, s01)
	sx := XMM()
	VEXTRACTI128(U8(1), s01, sx)
	VPADDD(sx, s01.AsX(), sx) // Σq of columns 0-15, 16-31, (again)
	w := XMM()
	VPACKSSDW(sx, sx, w)
	VMOVD(w, t32)
	MOVL(t32, Mem{Base: bsp})
	VPSHUFD(U8(0x55), sx, w)
	VPADDD(w, sx, sx)
	VCVTDQ2PS(sx, sx)
	VMULSS(d, sx, sx)
	VMOVSS(d, Mem{Base: dsp})
	VMOVSS(sx, Mem{Base: dsp, Disp: 4})
	p01, p23 := YMM(), YMM()
	VPACKSSDW(iv[1], iv[0], p01)
	VPACKSSDW(iv[3], iv[2], p23)
	VPACKSSWB(p23, p01, p01)
	VPERMD(p01, perm, p01)
	VMOVDQU(p01, Mem{Base: qp})
	ADDQ(U8(128), xp)
	ADDQ(U8(32), qp)
	ADDQ(U8(8), dsp)
	ADDQ(U8(4), bsp)
	SUBQ(U8(32), n)
	SUBQ(U8(32), i)
	JNZ(LabelRef("quantX_block"))
	JMP(LabelRef("quantX_group"))

	Label("quantX_done")
	VZEROUPPER()
	RET()
}

// q6kGemv512 is the Q6_K gemv on zmm registers (AVX-512 BW and VNNI): per
// half of a super-block, the 64 bytes of ql give two zmm vectors of 6-bit
// values (low nibbles: x blocks 4h, 4h+1; high: 4h+2, 4h+3), their high
// bits from qh broadcast to both 256-bit halves and shifted per half
// (VPSLLVW/VPSRLVW); x's 64 bytes against each, VPMADDUBSW (≤ 2·63·127 a
// pair), then VPDPWSSD against the sub-block scales spread by VPERMW. The
// int32 sums are folded to eight lanes per super-block and finished as
// q6kGemvBlock does (the −32 offset through bs, one conversion and
// multiply-add): half the vector instructions of the ymm kernel.
var q6kGemv512 = gemvKernel{
	name: "Q6K", isa: "VNNI512", elems: 256, bytes: 210, unroll: 1,
	doc: []string{"per super-block: dw·d·Σ over sub-blocks of 16: sc·(Σ q6·q − 32·Σq), on zmm registers."},
	setup: func() []VecVirtual {
		low4, m30 := bcastZ(0x0f0f0f0f), bcastZ(0x30303030)
		lsh, rsh := ZMM(), ZMM() // word shift counts: (4, 2) and (0, 2) for the two 256-bit halves
		VMOVDQU64(q6ShiftData, lsh)
		VMOVDQU64(q6ShiftData.Offset(64), rsh)
		return []VecVirtual{low4, m30, lsh, rsh}
	},
	block: q6kGemvBlock512,
}

var (
	q6ShiftData Mem // [2][32]uint16: VPSLLVW counts 4 (low half), 2 (high); VPSRLVW counts 0, 2
	q6PermData  Mem // [4][32]uint16: VPERMW picks of scale 2b + i/8 for b = 0, 2, 4, 6
)

func q6kConsts512Gemv() {
	q6ShiftData = GLOBL("q6shiftv", RODATA|NOPTR)
	for i := range 64 { // in increasing offsets, as the assembler wants them
		DATA(2*i, U16([]int{4, 2, 0, 2}[i/16]))
	}
	q6PermData = GLOBL("q6permw", RODATA|NOPTR)
	for b := range 4 {
		for i := range 32 {
			DATA(64*b+2*i, U16(4*b+i/8))
		}
	}
}

// q6kGemvBlock512 is q6kGemv512's super-block.
func q6kGemvBlock512(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual) {
	low4, m30, lsh, rsh := c[0], c[1], c[2], c[3]
	sc16 := YMM()
	VPMOVSXBW(Mem{Base: p.wp, Disp: 192}, sc16)
	isum := zerosInt(p.rows, ZMM)
	for h := range 2 {
		ql, qh := ZMM(), ZMM()
		VMOVDQU64(Mem{Base: p.wp, Disp: 64 * h}, ql)
		VBROADCASTI64X4(Mem{Base: p.wp, Disp: 128 + 32*h}, qh)
		for g2 := range 2 { // x blocks 4h + 2·g2 and the next
			u, hb, scl, idx := ZMM(), ZMM(), ZMM(), ZMM()
			if g2 == 0 {
				VPANDD(low4, ql, u)
				VPSLLVW(lsh, qh, hb)
			} else {
				VPSRLW(U8(4), ql, u)
				VPANDD(low4, u, u)
				VPSRLVW(rsh, qh, hb)
			}
			VPANDD(m30, hb, hb)
			VPORD(hb, u, u)
			b := 4*h + 2*g2 // first x block
			VMOVDQU64(q6PermData.Offset(64*(b/2)), idx)
			VPERMW(sc16.AsZ(), idx, scl)
			scaledPairSums(p, 32*b, u, scl, isum)
		}
	}
	q6kGemvEnd(p, sc16, acc, foldZ(isum))
}

// scaledPairSums adds, per x row r, x's 64 bytes at off (of the block) against
// the unsigned bytes u as int16 pair sums (VPMADDUBSW), times the int16
// scales scl (VPDPWSSD), into the zmm isum[r].
func scaledPairSums(p gemvPtrs, off int, u, scl VecVirtual, isum []VecVirtual) {
	for r := range p.rows {
		t := ZMM()
		VPMADDUBSW(p.q(r, off), u, t)
		VPDPWSSD(scl, t, isum[r])
	}
}

// foldZ is the isum argument of q4kGemvEnd and q6kGemvEnd for sums in zmm
// registers: it folds x row r's sums to eight lanes.
func foldZ(isum []VecVirtual) func(r int) VecVirtual {
	return func(r int) VecVirtual {
		lo := YMM()
		VEXTRACTI64X4(U8(1), isum[r], lo)
		VPADDD(isum[r].AsY(), lo, lo)
		return lo
	}
}

// q4kGemv512 is the Q4_K gemv on zmm registers (AVX-512 BW and VNNI): each
// 32 bytes of nibbles broadcast to both 256-bit halves, the low nibbles
// kept in the low half and the high ones shifted down in the high
// (VPSRLVW), so one vector holds sub-blocks 2h and 2h+1 against x's 64
// contiguous bytes; VPMADDUBSW, then VPDPWSSD against the two sub-block
// scales spread by VPERMW. The int32 sums are folded to eight lanes per
// super-block and finished as q4kGemvBlock does.
var q4kGemv512 = gemvKernel{
	name: "Q4K", isa: "VNNI512", elems: 256, bytes: 144, unroll: 1,
	doc: []string{"per super-block: dw·d·Σⱼ scⱼ·Σ nⱼ·q − dmin·d·Σⱼ mⱼ·Σⱼq (d: x's scale of the 256 columns), on zmm registers."},
	setup: func() []VecVirtual {
		low4, sh := bcastZ(0x0f0f0f0f), ZMM()
		VMOVDQU64(k4ShiftData, sh)
		return []VecVirtual{low4, sh}
	},
	block: q4kGemvBlock512,
}

var (
	k4ShiftData Mem // [32]uint16: VPSRLVW counts 0 (low half), 4 (high half)
	k4PermData  Mem // [4][32]uint16: VPERMW picks of scale 2h + i/16
)

func q4kConsts512Gemv() {
	k4ShiftData = GLOBL("k4shiftv", RODATA|NOPTR)
	for i := range 32 {
		DATA(2*i, U16(4*(i/16)))
	}
	k4PermData = GLOBL("k4permw", RODATA|NOPTR)
	for h := range 4 {
		for i := range 32 {
			DATA(64*h+2*i, U16(2*h+i/16))
		}
	}
}

// q4kGemvBlock512 is q4kGemv512's super-block.
func q4kGemvBlock512(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual) {
	low4, sh := c[0], c[1]
	sc8, mn8 := kScaleBytes(p.wp)
	scv := XMM() // sc0..sc7 as int16
	VMOVQ(sc8, scv)
	VPMOVZXBW(scv, scv)
	mins := XMM()
	VMOVQ(mn8, mins)
	isum := zerosInt(p.rows, ZMM)
	for h := range 4 {
		u, scl, idx := ZMM(), ZMM(), ZMM()
		VBROADCASTI64X4(Mem{Base: p.wp, Disp: 16 + 32*h}, u)
		VPSRLVW(sh, u, u)
		VPANDD(low4, u, u)
		VMOVDQU64(k4PermData.Offset(64*h), idx)
		VPERMW(scv.AsZ(), idx, scl)
		scaledPairSums(p, 64*h, u, scl, isum)
	}
	q4kGemvEnd(p, mins, acc, foldZ(isum))
}
