package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AVX2 decode kernels ("gemv", qgemv*AVX2) dot a run of weight rows
// with one x row in one call, the loop over rows in assembly. They cost
// fewer vector instructions per weight than the qtile*AVX2 tiles:
//
//   - Q4_0 multiplies the unsigned nibbles n directly (VPMADDUBSW of n
//     and x), so no sign trick; the −8 offset comes off once per block as
//     dw·s (s = d·Σq, kept per block with x).
//   - Q4_K and Q6_K take x quantized with one scale per 256 columns (as
//     llama.cpp's Q8_K), so their 6- and 8-bit sub-block scales apply in
//     the integers (VPMADDWD against the scale instead of against ones)
//     and a super-block takes one conversion and one multiply-add; the
//     mins (Q4_K) and the −32 offset (Q6_K) come off with one VPMADDWD of
//     the scales against Σq per 16 columns (bs).
//   - Q8_0 keeps the sign trick; its block scales go as Q4_0's.
//
// Signature: func(y []float32, q []int8, ds []float32, bs []int16, w []byte,
// k, rows int); y[j] for j < rows is weight row j (k columns, at
// w[j·rowBytes:]) against x row (q, ds, bs).

// gemvKernel is one dtype's decode kernel.
type gemvKernel struct {
	name  string
	elems int // per weight block
	bytes int // per weight block
	// unroll is blocks per loop step; blocks % unroll must be 0 for the
	// k the callers pass (k is a multiple of 256 for every model shape;
	// the Go side checks).
	unroll int
	doc    []string
	// setup makes the kernel's constants; block emits weight block u of
	// the step (at wp + u·bytes) against the x blocks at qp, dsp, bsp,
	// accumulating into acc[u%len(acc)] and sub (nil when unused).
	setup func() []VecVirtual
	block func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual, sub VecVirtual)
	accs  int  // float accumulators
	sub   bool // a second accumulator subtracted at the end
}

// gemvPtrs are the moving pointers of the inner loop.
type gemvPtrs struct {
	wp, qp, dsp, bsp GPVirtual
	f16              GPVirtual // the float16 → float32 table
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
		name: "Q8_0", elems: 32, bytes: 34, unroll: 2, accs: 2,
		doc: []string{"per block: dw·d·Σ w·q (sign trick, VPMADDUBSW)."},
		setup: func() []VecVirtual {
			return []VecVirtual{bcastD(0x00010001)}
		},
		block: func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual, _ VecVirtual) {
			w, aw, x, t := YMM(), YMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: p.wp, Disp: 34*u + 2}, w)
			VPABSB(w, aw)
			VMOVDQU(Mem{Base: p.qp, Disp: 32 * u}, x)
			VPSIGNB(w, x, x)
			VPMADDUBSW(x, aw, t)
			VPMADDWD(c[0], t, t)
			VCVTDQ2PS(t, t)
			dw, d := p.f16Tab(Mem{Base: p.wp, Disp: 34 * u}), YMM()
			VBROADCASTSS(Mem{Base: p.dsp, Disp: 8 * u}, d)
			VMULPS(dw, d, d)
			VFMADD231PS(t, d, acc[u%len(acc)])
		},
	},
	{
		name: "Q4_0", elems: 32, bytes: 18, unroll: 2, accs: 2, sub: true,
		doc: []string{"per block: dw·(d·Σ n·q − 8·s), n the unsigned nibbles."},
		setup: func() []VecVirtual {
			shift := YMM() // VPSRLVD counts: 0 in the low 128 bits, 4 in the high
			VMOVDQU(q40ShiftData2, shift)
			return []VecVirtual{bcastD(0x00010001), bcastB(0x0f), shift}
		},
		block: func(c []VecVirtual, p gemvPtrs, u int, acc []VecVirtual, sub VecVirtual) {
			w, t := YMM(), YMM()
			VBROADCASTI128(Mem{Base: p.wp, Disp: 18*u + 2}, w)
			VPSRLVD(c[2], w, w)
			VPAND(c[1], w, w)
			VPMADDUBSW(Mem{Base: p.qp, Disp: 32 * u}, w, t)
			VPMADDWD(c[0], t, t)
			VCVTDQ2PS(t, t)
			dw, d, s := p.f16Tab(Mem{Base: p.wp, Disp: 18 * u}), YMM(), YMM()
			VBROADCASTSS(Mem{Base: p.dsp, Disp: 8 * u}, d)
			VBROADCASTSS(Mem{Base: p.dsp, Disp: 8*u + 4}, s)
			VMULPS(dw, d, d)
			VFMADD231PS(t, d, acc[u%len(acc)])
			VFMADD231PS(s, dw, sub) // all 8 lanes: 8·dw·s once summed
		},
	},
	{
		name: "Q4K", elems: 256, bytes: 144, unroll: 1, accs: 1,
		doc: []string{"per super-block: dw·d·Σⱼ scⱼ·Σ nⱼ·q − dmin·d·Σⱼ mⱼ·Σⱼq (d: x's scale of the 256 columns)."},
		setup: func() []VecVirtual {
			return []VecVirtual{bcastB(0x0f)}
		},
		block: q4kGemvBlock,
	},
	{
		name: "Q6K", elems: 256, bytes: 210, unroll: 1, accs: 1,
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

// kScaleBytes unpacks a Q4_K block's twelve scale bytes at w+4 (ggml's
// utmp shuffle) into the eight 6-bit scales (bytes of the returned sc)
// and the eight 6-bit mins (bytes of mn), both GP64.
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
// (dw, dm) at m and x's scale d at dm0.
func superScales(m, d Mem) (a, b VecVirtual) {
	v, dv := YMM(), YMM()
	VPBROADCASTD(m, v)
	VCVTPH2PS(v.AsX(), v) // dw dm dw dm ...
	VBROADCASTSS(d, dv)
	VMULPS(dv, v, v)
	a, b = YMM(), YMM()
	VPERMILPS(U8(0x00), v, a)
	VPERMILPS(U8(0x55), v, b)
	return a, b
}

// q4kGemvBlock is one Q4_K super-block against x quantized with one scale
// per 256 columns: the sub-block scales multiply the integer pair sums.
func q4kGemvBlock(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual, _ VecVirtual) {
	sc8, mn8 := kScaleBytes(p.wp)
	scv, mnv := YMM(), YMM()
	VMOVQ(sc8, scv.AsX())
	VPMOVZXBW(scv.AsX(), scv.AsX())
	VINSERTI128(U8(1), scv.AsX(), scv, scv) // sc0..sc7 as int16, in both halves
	VMOVQ(mn8, mnv.AsX())
	VPMOVZXBW(mnv.AsX(), mnv.AsX())
	hi := XMM()
	VPUNPCKHWD(mnv.AsX(), mnv.AsX(), hi)
	VPUNPCKLWD(mnv.AsX(), mnv.AsX(), mnv.AsX())
	VINSERTI128(U8(1), hi, mnv, mnv) // m0 m0 m1 m1 ... m7 m7
	msum := YMM()
	VPMADDWD(Mem{Base: p.bsp}, mnv, msum) // mⱼ·Σⱼq in lane j

	isum := YMM()
	for h := range 4 {
		raw, lo := YMM(), YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 16 + 32*h}, raw)
		VPAND(c[0], raw, lo)
		VPSRLW(U8(4), raw, raw)
		VPAND(c[0], raw, raw)
		for k, n := range []VecVirtual{lo, raw} {
			j := 2*h + k
			t, s := YMM(), YMM()
			VPMADDUBSW(Mem{Base: p.qp, Disp: 32 * j}, n, t)
			VPSHUFB(k4ShufData.Offset(32*j), scv, s)
			if j == 0 {
				VPMADDWD(s, t, isum)
			} else {
				VPMADDWD(s, t, t)
				VPADDD(t, isum, isum)
			}
		}
	}
	a, b := superScales(Mem{Base: p.wp}, Mem{Base: p.dsp})
	VCVTDQ2PS(isum, isum)
	VCVTDQ2PS(msum, msum)
	VFMADD231PS(isum, a, acc[0])
	VFNMADD231PS(msum, b, acc[0])
}

// q6kGemvBlock is one Q6_K super-block against x quantized with one scale
// per 256 columns: in half h, x block 4h+g takes the low (g < 2) or high
// nibbles of ql[64h+32(g&1):] and bits 2g, 2g+1 of qh[32h:]; its int16
// pair sums 0-7 belong to sub-block 2(4h+g), 8-15 to the next.
func q6kGemvBlock(c []VecVirtual, p gemvPtrs, _ int, acc []VecVirtual, _ VecVirtual) {
	low4, m30 := c[0], c[1]
	scb := YMM()
	VBROADCASTI128(Mem{Base: p.wp, Disp: 192}, scb) // 16 int8 scales, both halves
	isum := YMM()
	for h := range 2 {
		qh := YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 128 + 32*h}, qh)
		for g := range 4 {
			b := 4*h + g
			u, hb, t, s := YMM(), YMM(), YMM(), YMM()
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
			VPMADDUBSW(Mem{Base: p.qp, Disp: 32 * b}, u, t)
			VPSHUFB(q6ShufData.Offset(32*b), scb, s)
			VPSRAW(U8(8), s, s) // the int8 scales sign-extended
			if b == 0 {
				VPMADDWD(s, t, isum)
			} else {
				VPMADDWD(s, t, t)
				VPADDD(t, isum, isum)
			}
		}
	}
	// − 32·Σ sc·Σq over the 16 sub-blocks of 16 columns.
	sc16, off := YMM(), YMM()
	VPMOVSXBW(Mem{Base: p.wp, Disp: 192}, sc16)
	VPMADDWD(Mem{Base: p.bsp}, sc16, off)
	VPSLLD(U8(5), off, off)
	VPSUBD(off, isum, isum)
	dw, d := f16Bcast(Mem{Base: p.wp, Disp: 208}), YMM()
	VBROADCASTSS(Mem{Base: p.dsp}, d)
	VMULPS(dw, d, d)
	VCVTDQ2PS(isum, isum)
	VFMADD231PS(isum, d, acc[0])
}

// qgemv writes kernel k's decode function for AVX2.
func qgemv(k gemvKernel) {
	name := fmt.Sprintf("qgemv%sAVX2", k.name)
	TEXT(name, NOSPLIT, "func(y []float32, q []int8, ds []float32, bs []int16, w []byte, k, rows int, f16 *[65536]float32)")
	Doc(append([]string{
		fmt.Sprintf("%s sets y[j] for j < rows to the dot product of row j of the %s", name, k.name),
		"weight rows w (k columns each, one after the other) with one x row quantized",
		"to int8 (q; ds, its (d, d·Σq) pairs per 32 columns; bs, Σq per 16 columns);",
	}, append(k.doc,
		"",
		"k is a multiple of 256. The caller guarantees the bounds; nothing is checked.")...)...)
	Pragma("noescape")
	yp := Load(Param("y").Base(), GP64()).(GPVirtual)
	p := gemvPtrs{
		wp:  Load(Param("w").Base(), GP64()).(GPVirtual),
		qp:  Load(Param("q").Base(), GP64()).(GPVirtual),
		dsp: Load(Param("ds").Base(), GP64()).(GPVirtual),
		bsp: Load(Param("bs").Base(), GP64()).(GPVirtual),
		f16: Load(Param("f16"), GP64()).(GPVirtual),
	}
	// Per x row: q advances k bytes, ds k/4, bs k/8; the loop rewinds them
	// by these after every weight row.
	kq := Load(Param("k"), GP64())
	back := AllocLocal(24)
	MOVQ(kq, back)
	SHRQ(U8(2), kq)
	MOVQ(kq, back.Offset(8))
	SHRQ(U8(1), kq)
	MOVQ(kq, back.Offset(16))
	rows := AllocLocal(8)
	r := Load(Param("rows"), GP64())
	MOVQ(r, rows)

	c := k.setup()
	acc := make([]VecVirtual, k.accs)
	var sub VecVirtual
	step := k.unroll
	Label(name + "_row")
	CMPQ(rows, U8(0))
	JE(LabelRef(name + "_done"))
	for i := range acc {
		acc[i] = YMM()
		VXORPS(acc[i], acc[i], acc[i])
	}
	if k.sub {
		sub = YMM()
		VXORPS(sub, sub, sub)
	}
	n := Load(Param("k"), GP64())
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), n) // blocks
	Label(name + "_blk")
	for u := range step {
		k.block(c, p, u, acc, sub)
	}
	ADDQ(U32(step*k.bytes), p.wp)
	ADDQ(U32(step*k.elems), p.qp)
	ADDQ(U32(step*k.elems/32*8), p.dsp)
	ADDQ(U32(step*k.elems/16*2), p.bsp)
	SUBQ(U8(step), n)
	JNZ(LabelRef(name + "_blk"))

	for i := 1; i < len(acc); i++ {
		VADDPS(acc[i], acc[0], acc[0])
	}
	hsumStore(acc[0], sub, Mem{Base: yp})
	ADDQ(U8(4), yp)
	SUBQ(back, p.qp)
	SUBQ(back.Offset(8), p.dsp)
	SUBQ(back.Offset(16), p.bsp)
	DECQ(rows)
	JMP(LabelRef(name + "_row"))

	Label(name + "_done")
	VZEROUPPER()
	RET()
}
