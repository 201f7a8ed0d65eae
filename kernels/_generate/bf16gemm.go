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
	rem := GP64()
	MOVQ(k, rem)
	ANDQ(U8(31), rem)
	JZ(LabelRef(name + "_reduce"))
	bits := GP32()
	MOVL(U32(0xffffffff), bits)
	BZHIL(rem.As32(), bits, bits)
	mask := K()
	KMOVD(bits, mask)
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
}
