package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The gemm tiles (-set bf16 → kernels/cpu/bf16gemm_amd64.s) are the bf16
// path's prefill and batched-decode kernels where VDPBF16PS runs at full
// rate (AMD Zen 4 and 5: two a cycle, 64 multiply-adds each, twice the
// float32 FMAs). A tile multiplies R bfloat16 x rows by C bfloat16 weight
// rows over k columns, like tileBF16xR4C4 (bf16.go), but
//
//   - its accumulators fill the 32 zmm registers (R·C of them, up to 24),
//     reduced with EVEX shuffles, not VHADDPS, which reaches Z0-Z15 only;
//   - it adds to y when acc ≠ 0, so the caller can cut k into chunks that
//     keep a block of weights and of x in L1 together;
//   - every (r, c) ≤ (R, C) exists, for the rows a block leaves over.
//
// Registers: accumulators Z0…, weights after them, x in Z30/Z31. Rows are
// addressed as base + (0, 1, 2)·ld from one base pointer per three rows,
// the bases stepping 64 bytes a chunk, so a tile needs few general
// registers.

// gemmR, gemmC is the tile shape generated (and every smaller one).
const gemmR, gemmC = 4, 6

// gemmName is the name of the (r, c) tile.
func gemmName(r, c int) string { return fmt.Sprintf("gemmBF16R%dC%d", r, c) }

// rowBases returns one base pointer per three rows of a row block starting
// at p with byte stride ld, and the addressing of row i at byte offset d.
func rowBases(p, ld GPVirtual, rows int) func(i, d int) Mem {
	bases := []GPVirtual{p}
	for r := 3; r < rows; r += 3 {
		q := GP64()
		LEAQ(Mem{Base: bases[len(bases)-1], Index: ld, Scale: 2}, q)
		ADDQ(ld, q)
		bases = append(bases, q)
	}
	return func(i, d int) Mem {
		m := Mem{Base: bases[i/3], Disp: d}
		if i%3 > 0 {
			m.Index, m.Scale = ld, uint8(i%3)
		}
		return m
	}
}

func gemmTile(R, C int) {
	name := gemmName(R, C)
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int, acc int)")
	Doc(
		fmt.Sprintf("%s adds (acc ≠ 0) or writes an (%d, %d) tile of y = x·wᵀ, x and w", name, R, C),
		"in BF16 (AVX-512 BF16):",
		"",
		fmt.Sprintf("\tfor r := range %d {", R),
		fmt.Sprintf("\t\tfor c := range %d {", C),
		"\t\t\tvar sum float32",
		"\t\t\tfor i := range k {",
		"\t\t\t\tsum += kernels.BF16ToF32(x[r*ldx+i]) * kernels.BF16ToF32(binary.LittleEndian.Uint16(w[2*(c*ldw+i):]))",
		"\t\t\t}",
		"\t\t\tif acc != 0 { sum += y[r*ldy+c] }",
		"\t\t\ty[r*ldy+c] = sum",
		"\t\t}",
		"\t}",
		"",
		"x rows are read in whole 32-column chunks (the caller pads them with",
		"zeros), weight rows to k exactly. The caller guarantees the bounds;",
		"nothing is checked. Denormal products and sums flush to zero.",
	)
	Pragma("noescape")

	ldx := Load(Param("ldx"), GP64()).(GPVirtual)
	SHLQ(U8(1), ldx)
	ldw := Load(Param("ldw"), GP64()).(GPVirtual)
	SHLQ(U8(1), ldw)
	xm := rowBases(Load(Param("x").Base(), GP64()).(GPVirtual), ldx, R)
	wm := rowBases(Load(Param("w").Base(), GP64()).(GPVirtual), ldw, C)
	k := Load(Param("k"), GP64())

	acc := func(r, c int) VecPhysical { return zmm(r*C + c) }
	wv := func(c int) VecPhysical { return zmm(R*C + c) }
	xv := func(r int) VecPhysical { return zmm(30 + r%2) }
	for i := range R * C {
		VPXORD(zmm(i), zmm(i), zmm(i))
	}
	// step multiplies the 32 columns at the bases; mask, if not nil,
	// zeroes the weights past k.
	step := func(mask Op) {
		for c := range C {
			if mask == nil {
				VMOVDQU16(wm(c, 0), wv(c))
			} else {
				VMOVDQU16_Z(wm(c, 0), mask, wv(c))
			}
		}
		for r := range R {
			VMOVDQU16(xm(r, 0), xv(r))
			for c := range C {
				vdpbf16ps(xv(r), wv(c), acc(r, c))
			}
		}
	}
	n := GP64()
	MOVQ(k, n)
	SHRQ(U8(5), n)
	JZ(LabelRef(name + "_tail"))
	Label(name + "_loop")
	step(nil)
	// Step every base (the row closures hold them): re-derive them from
	// the addressing of their first rows.
	for r := 0; r < R; r += 3 {
		ADDQ(U8(64), xm(r, 0).Base)
	}
	for c := 0; c < C; c += 3 {
		ADDQ(U8(64), wm(c, 0).Base)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))

	Label(name + "_tail")
	_, mask := tailMask32(k, name+"_reduce")
	step(mask)

	Label(name + "_reduce")
	// Fold every accumulator to 8 lanes.
	for i := range R * C {
		VEXTRACTF64X4(U8(1), zmm(i), Y30)
		VADDPS(Y30, zmm(i).AsY(), zmm(i).AsY())
	}
	zero := Y31
	VPXORD(zero, zero, zero)
	yp := Load(Param("y").Base(), GP64())
	ldy := Load(Param("ldy"), GP64())
	SHLQ(U8(2), ldy)
	cmask := K()
	if C%4 != 0 {
		t := GP32()
		MOVL(U32(1<<(C%4)-1), t)
		KMOVW(t, cmask)
	}
	a := Load(Param("acc"), GP64())
	// Two copies of the stores: adding to y, and writing it.
	for _, add := range []bool{false, true} {
		if !add {
			TESTQ(a, a)
			JNZ(LabelRef(name + "_add"))
		} else {
			Label(name + "_add")
		}
		yr := GP64()
		MOVQ(yp, yr)
		for r := range R {
			if r > 0 {
				ADDQ(ldy, yr)
			}
			for c0 := 0; c0 < C; c0 += 4 {
				v := func(c int) VecPhysical {
					if c0+c < C {
						return zmm(r*C + c0 + c).AsY().(VecPhysical)
					}
					return zero
				}
				// (a, b) → a = [a0+a2, b0+b2, a1+a3, b1+b3] per 128 bits; the
				// same for (c, d); then [Σa, Σb, Σc, Σd] per 128 bits.
				s, t := v(0), Y30
				VUNPCKLPS(v(1), s, t)
				VUNPCKHPS(v(1), s, s)
				VADDPS(t, s, s)
				if c0+2 < C {
					u := v(2)
					VUNPCKLPS(v(3), u, t)
					VUNPCKHPS(v(3), u, u)
					VADDPS(t, u, u)
					VUNPCKLPD(u, s, t)
					VUNPCKHPD(u, s, s)
				} else {
					VUNPCKLPD(zero, s, t)
					VUNPCKHPD(zero, s, s)
				}
				VADDPS(t, s, s)
				VEXTRACTF32X4(U8(1), s, X30)
				VADDPS(X30, s.AsX(), s.AsX())
				m := Mem{Base: yr, Disp: 4 * c0}
				if c0+4 <= C {
					if add {
						VADDPS(m, s.AsX(), s.AsX())
					}
					VMOVUPS(s.AsX(), m)
				} else {
					if add {
						VMOVUPS_Z(m, cmask, X30)
						VADDPS(X30, s.AsX(), s.AsX())
					}
					VMOVUPS(s.AsX(), cmask, m)
				}
			}
		}
		if !add {
			JMP(LabelRef(name + "_done"))
		}
	}
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func gemmKernels() {
	for r := 1; r <= gemmR; r++ {
		for c := 1; c <= gemmC; c++ {
			gemmTile(r, c)
		}
	}
	for _, d := range []int{0, 4096} {
		gemvBF16(d)
	}
	pairConsts()
	pairBF16()
	for _, add := range []bool{true, false} {
		for r := 1; r <= 4; r++ {
			pvPairs(r, add)
		}
	}
}

// gemvBF16 is the bf16 path's decode kernel: one bfloat16 x row against
// rows consecutive weight rows of k columns (row stride ldw elements),
// walked in order so the weights stream from memory sequentially, with
// PREFETCHT0 ahead distance bytes (0: none). Four accumulators a row, 128
// columns a step.
func gemvBF16(distance int) {
	name := "gemvBF16"
	if distance > 0 {
		name = fmt.Sprintf("gemvBF16P%d", distance)
	}
	TEXT(name, NOSPLIT, "func(y []float32, x []uint16, w []byte, ldw int, k int, rows int)")
	Doc(
		name+" sets y[j] = Σᵢ<k x[i]·w[j*ldw+i] for j < rows, x and w in BF16",
		"(AVX-512 BF16):",
		"",
		"\tfor j := range rows {",
		"\t\tvar sum float32",
		"\t\tfor i := range k {",
		"\t\t\tsum += kernels.BF16ToF32(x[i]) * kernels.BF16ToF32(binary.LittleEndian.Uint16(w[2*(j*ldw+i):]))",
		"\t\t}",
		"\t\ty[j] = sum",
		"\t}",
		"",
		"x is read in whole 32-column chunks (the caller pads it with zeros),",
		"weight rows to k exactly. The caller guarantees the bounds; nothing",
		"is checked. Denormal products and sums flush to zero.",
	)
	Pragma("noescape")
	yp := Load(Param("y").Base(), GP64())
	xb := Load(Param("x").Base(), GP64())
	wp := Load(Param("w").Base(), GP64())
	ldw := Load(Param("ldw"), GP64())
	SHLQ(U8(1), ldw)
	k := Load(Param("k"), GP64())
	rows := Load(Param("rows"), GP64())
	TESTQ(rows, rows)
	JZ(LabelRef(name + "_done"))
	rem, mask := tailMask32(k, "")
	k4 := GP64() // bytes of the row in whole 128-column steps
	MOVQ(k, k4)
	SHRQ(U8(7), k4)
	SHLQ(U8(8), k4)
	k1 := GP64() // bytes in whole 32-column chunks
	MOVQ(k, k1)
	SHRQ(U8(5), k1)
	SHLQ(U8(6), k1)

	Label(name + "_row")
	for a := range 4 {
		VPXORD(zmm(a), zmm(a), zmm(a))
	}
	i := GP64()
	XORQ(i, i)
	Label(name + "_loop4")
	CMPQ(i, k4)
	JAE(LabelRef(name + "_loop1"))
	for u := range 4 {
		if distance > 0 {
			PREFETCHT0(Mem{Base: wp, Index: i, Scale: 1, Disp: distance + 64*u})
		}
		VMOVDQU16(Mem{Base: wp, Index: i, Scale: 1, Disp: 64 * u}, zmm(8+u))
		VMOVDQU16(Mem{Base: xb, Index: i, Scale: 1, Disp: 64 * u}, zmm(12+u))
		vdpbf16ps(zmm(12+u), zmm(8+u), zmm(u))
	}
	ADDQ(U32(256), i)
	JMP(LabelRef(name + "_loop4"))
	Label(name + "_loop1")
	CMPQ(i, k1)
	JAE(LabelRef(name + "_tail"))
	VMOVDQU16(Mem{Base: wp, Index: i, Scale: 1}, zmm(8))
	VMOVDQU16(Mem{Base: xb, Index: i, Scale: 1}, zmm(12))
	vdpbf16ps(zmm(12), zmm(8), zmm(0))
	ADDQ(U8(64), i)
	JMP(LabelRef(name + "_loop1"))
	Label(name + "_tail")
	TESTQ(rem, rem)
	JZ(LabelRef(name + "_reduce"))
	VMOVDQU16_Z(Mem{Base: wp, Index: i, Scale: 1}, mask, zmm(8))
	VMOVDQU16(Mem{Base: xb, Index: i, Scale: 1}, zmm(12))
	vdpbf16ps(zmm(12), zmm(8), zmm(1))
	Label(name + "_reduce")
	VADDPS(Z1, Z0, Z0)
	VADDPS(Z3, Z2, Z2)
	VADDPS(Z2, Z0, Z0)
	VEXTRACTF64X4(U8(1), Z0, Y1)
	VADDPS(Y1, Y0, Y0)
	VEXTRACTF32X4(U8(1), Y0, X1)
	VADDPS(X1, X0, X0)
	VPERMILPD(U8(1), X0, X1)
	VADDPS(X1, X0, X0)
	VMOVSHDUP(X0, X1)
	VADDSS(X1, X0, X0)
	VMOVSS(X0, Mem{Base: yp})
	ADDQ(U8(4), yp)
	ADDQ(ldw, wp)
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// Prefill attention's O = P·V on VDPBF16PS (kernels/cpu attention.go,
// tileVDP) runs as outer products: per pair of keys (2j, 2j+1), the value
// rows interleaved into one row of pairs (pairBF16: vp[2d], vp[2d+1] =
// v[2j][d], v[2j+1][d]), each probability row's pair broadcast as a dword,
// so lane d of an accumulator gains p[2j]·v[2j][d] + p[2j+1]·v[2j+1][d]:
// no transposition and no horizontal sums.

// pairIdx are VPERMT2W's word indices: the low 16 columns of two rows
// interleaved, then the high 16.
var pairIdx Mem

func pairConsts() {
	pairIdx = GLOBL("pairidx", RODATA|NOPTR)
	for h := range 2 {
		for i := range 16 {
			DATA(64*h+4*i, U16(16*h+i))
			DATA(64*h+4*i+2, U16(32+16*h+i))
		}
	}
}

func pairBF16() {
	TEXT("pairBF16", NOSPLIT, "func(dst []uint16, a, b []byte, n int)")
	Doc(
		"pairBF16 interleaves n bfloat16 values of rows a and b (AVX-512 BW):",
		"dst[2i], dst[2i+1] = a[i], b[i] (little-endian bytes) for i < n, n a",
		"multiple of 32. The caller guarantees the bounds; nothing is checked.",
	)
	Pragma("noescape")
	d := Load(Param("dst").Base(), GP64())
	a := Load(Param("a").Base(), GP64())
	b := Load(Param("b").Base(), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(U8(5), n)
	JZ(LabelRef("pairBF16_done"))
	lo, hi := ZMM(), ZMM()
	VMOVDQU16(pairIdx, lo)
	VMOVDQU16(pairIdx.Offset(64), hi)
	Label("pairBF16_loop")
	t0, t1 := ZMM(), ZMM()
	VMOVDQU16(Mem{Base: a}, t0)
	VMOVDQU16(Mem{Base: a}, t1)
	VPERMT2W(Mem{Base: b}, lo, t0)
	VPERMT2W(Mem{Base: b}, hi, t1)
	VMOVDQU16(t0, Mem{Base: d})
	VMOVDQU16(t1, Mem{Base: d, Disp: 64})
	ADDQ(U8(64), a)
	ADDQ(U8(64), b)
	ADDQ(U32(128), d)
	DECQ(n)
	JNZ(LabelRef("pairBF16_loop"))
	Label("pairBF16_done")
	VZEROUPPER()
	RET()
}

// pvPairs adds (add) or writes R probability rows (bfloat16, pairs of
// keys) times the paired value rows to 64 columns of o. The writing ones
// (qkPairs) are the scores' product: query rows, pairs of head dims, and
// keys transposed as dwords (each pair of dims of 64 keys in a row).
func pvPairs(R int, add bool) {
	name, sym := fmt.Sprintf("pvPairsR%d", R), "+="
	if !add {
		name, sym = fmt.Sprintf("qkPairsR%d", R), "="
	}
	TEXT(name, NOSPLIT, "func(o []float32, ldo int, p []uint16, ldp int, vp []uint16, ldv int, npairs int)")
	Doc(
		fmt.Sprintf("%s sets 64 columns of %d rows of o (AVX-512 BF16):", name, R),
		"",
		fmt.Sprintf("\tfor r := range %d {", R),
		"\t\tfor d := range 64 {",
		"\t\t\tvar s float32",
		"\t\t\tfor j := range npairs {",
		"\t\t\t\ts += BF16(p[r*ldp+2*j])·BF16(vp[j*ldv+2*d]) + BF16(p[r*ldp+2*j+1])·BF16(vp[j*ldv+2*d+1])",
		"\t\t\t}",
		"\t\t\to[r*ldo+d] "+sym+" s",
		"\t\t}",
		"\t}",
		"",
		"each pair's two products summed exactly and added to a float32 lane sum.",
		"The caller guarantees the bounds; nothing is checked. Denormal",
		"products and sums flush to zero.",
	)
	Pragma("noescape")
	ldp := Load(Param("ldp"), GP64()).(GPVirtual)
	SHLQ(U8(1), ldp)
	pm := rowBases(Load(Param("p").Base(), GP64()).(GPVirtual), ldp, R)
	vp := Load(Param("vp").Base(), GP64())
	ldv := Load(Param("ldv"), GP64())
	SHLQ(U8(1), ldv)
	n := Load(Param("npairs"), GP64())
	acc := func(r, b int) VecPhysical { return zmm(4*r + b) }
	for i := range 4 * R {
		VPXORD(zmm(i), zmm(i), zmm(i))
	}
	TESTQ(n, n)
	JZ(LabelRef(name + "_store"))
	Label(name + "_loop")
	for b := range 4 {
		VMOVDQU16(Mem{Base: vp, Disp: 64 * b}, zmm(16+b))
	}
	for r := range R {
		bc := zmm(20 + r)
		VPBROADCASTD(pm(r, 0), bc)
		for b := range 4 {
			vdpbf16ps(bc, zmm(16+b), acc(r, b))
		}
	}
	for r := 0; r < R; r += 3 {
		ADDQ(U8(4), pm(r, 0).Base)
	}
	ADDQ(ldv, vp)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_store")
	op := Load(Param("o").Base(), GP64())
	ldo := Load(Param("ldo"), GP64())
	SHLQ(U8(2), ldo)
	for r := range R {
		if r > 0 {
			ADDQ(ldo, op)
		}
		for b := range 4 {
			m := Mem{Base: op, Disp: 64 * b}
			if add {
				VADDPS(m, acc(r, b), acc(r, b))
			}
			VMOVUPS(acc(r, b), m)
		}
	}
	VZEROUPPER()
	RET()
}
