package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The BF16×BF16 tiles serve BF16 weights with AVX-512 BF16: the caller
// rounds each x row to bfloat16 once per MatMul (bf16Round below), in rows
// padded with zeros to a multiple of 32 columns, and every 32 columns of a
// weight row then take one VDPBF16PS per x row: lane i of a float32
// accumulator gains w[2i]·x[2i] + w[2i+1]·x[2i+1], the products exact and
// the sums rounded to float32. Neither avo nor the Go assembler knows the
// instruction, so it is emitted as bytes (vdpbf16ps) and these tiles keep
// their vector values in fixed registers: accumulators Z0-Z15 (VHADDPS, VEX
// only, reduces them), weights from Z16, x from Z24. The last k%32 columns
// load the weights under a mask (zeros past k, and no read past the row).

// vdpbf16ps emits VDPBF16PS b, a, acc (Go operand order): for each float32
// lane i, acc[i] += a.bf16[2i]·b.bf16[2i] + a.bf16[2i+1]·b.bf16[2i+1], on
// zmm registers. Its encoding is EVEX.512.F3.0F38.W0 52 /r with acc in
// ModRM.reg, a in EVEX.vvvv and b in ModRM.rm.
func vdpbf16ps(b, a, acc Physical) {
	d, s1, s2 := byte(acc.PhysicalIndex()), byte(a.PhysicalIndex()), byte(b.PhysicalIndex())
	inv := func(v byte, bit uint) byte { return (^v >> bit & 1) }
	p0 := inv(d, 3)<<7 | inv(s2, 4)<<6 | inv(s2, 3)<<5 | inv(d, 4)<<4 | 0b10 // mm = 0F38
	p1 := (^s1&15)<<3 | 1<<2 | 0b10                                          // W0, vvvv, pp = F3
	p2 := byte(0b10)<<5 | inv(s1, 4)<<3                                      // L'L = 512, V'
	modrm := 0b11<<6 | (d&7)<<3 | s2&7
	Comment(fmt.Sprintf("VDPBF16PS %s, %s, %s", b.Asm(), a.Asm(), acc.Asm()))
	for _, v := range []byte{0x62, p0, p1, p2, 0x52, modrm} {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(v)}})
	}
}

// zmm returns physical register Zi.
func zmm(i int) VecPhysical {
	return []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
		Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23, Z24, Z25, Z26, Z27, Z28, Z29, Z30, Z31}[i]
}

// bf16Shape is one BF16×BF16 tile: R x rows, C weight rows, the main loop
// unrolled U times (R·C·U ≤ 16 accumulators, C·U ≤ 8 weight registers,
// R·U ≤ 8 x registers).
type bf16Shape struct{ R, C, U int }

// bf16Shapes: 4×4 for prefill (each weight load feeds four x rows, each x
// load four weight rows), 1×4 for the x rows left over, and 1×1 for decode,
// which streams one weight row at a time (see shapes in gen.go).
var bf16Shapes = []bf16Shape{{4, 4, 1}, {1, 4, 2}, {1, 1, 8}}

func bf16Tile(s bf16Shape) {
	name := fmt.Sprintf("tileBF16xR%dC%d", s.R, s.C)
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, x []uint16, ldx int, w []byte, ldw int, k int)")
	Doc(
		fmt.Sprintf("%s sets an (%d, %d) tile of y = x·wᵀ, x and w in BF16 (AVX-512 BF16):", name, s.R, s.C),
		"",
		fmt.Sprintf("\tfor r := range %d {", s.R),
		fmt.Sprintf("\t\tfor c := range %d {", s.C),
		"\t\t\tvar sum float32",
		"\t\t\tfor i := range k {",
		"\t\t\t\tsum += kernels.BF16ToF32(x[r*ldx+i]) * kernels.BF16ToF32(binary.LittleEndian.Uint16(w[2*(c*ldw+i):]))",
		"\t\t\t}",
		"\t\t\ty[r*ldy+c] = sum",
		"\t\t}",
		"\t}",
		"",
		"x rows are read in whole 32-column chunks: the caller pads them with",
		"zeros to ldx ≥ k rounded up to 32. The caller guarantees the bounds;",
		"nothing is checked. Denormal products and sums flush to zero.",
	)
	Pragma("noescape")

	yp, ldy, k, xp, wp := tileArgs(s.R, s.C, 2, 2)
	acc := func(u, r, c int) VecPhysical { return zmm((u*s.R+r)*s.C + c) }
	wv := func(u, c int) VecPhysical { return zmm(16 + u*s.C + c) }
	xv := func(u, r int) VecPhysical { return zmm(24 + u*s.R + r) }
	for i := range s.R * s.C * s.U {
		VPXORD(zmm(i), zmm(i), zmm(i))
	}

	// step multiplies 32 columns at i + 32u; mask, if not nil, zeroes
	// the weights past k.
	i := GP64()
	step := func(u int, mask Op) {
		for c := range s.C {
			m := Mem{Base: wp[c], Index: i, Scale: 2, Disp: 64 * u}
			if mask == nil {
				VMOVDQU16(m, wv(u, c))
			} else {
				VMOVDQU16_Z(m, mask, wv(u, c))
			}
		}
		for r := range s.R {
			VMOVDQU16(Mem{Base: xp[r], Index: i, Scale: 2, Disp: 64 * u}, xv(u, r))
			for c := range s.C {
				vdpbf16ps(xv(u, r), wv(u, c), acc(u, r, c))
			}
		}
	}

	kfull := GP64() // columns in whole 32-column chunks
	MOVQ(k, kfull)
	ANDQ(I8(-32), kfull)
	XORQ(i, i)
	columnLoops(name, i, kfull, 32, s.U, func(u int) { step(u, nil) }, name+"_tail")

	Label(name + "_tail")
	Comment("The last k%32 columns: weights under a mask of k%32 ones.")
	_, mask := tailMask32(k, name+"_reduce")
	step(0, mask)

	Label(name + "_reduce")
	for r := range s.R {
		for c := range s.C {
			for u := 1; u < s.U; u++ {
				VADDPS(acc(u, r, c), acc(0, r, c), acc(0, r, c))
			}
			// Fold to 8 lanes in the low ymm half.
			VEXTRACTF64X4(U8(1), acc(0, r, c), Y16)
			VADDPS(Y16, acc(0, r, c).AsY(), acc(0, r, c).AsY())
		}
	}
	yr := yp.(GPVirtual)
	for r := range s.R {
		if r > 0 {
			next := GP64()
			LEAQ(Mem{Base: yr, Index: ldy, Scale: 4}, next)
			yr = next
		}
		if s.C == 4 {
			// Transposing horizontal sum: lane c of X17 is row c's total.
			v0, v1, v2, v3 := acc(0, r, 0).AsY(), acc(0, r, 1).AsY(), acc(0, r, 2).AsY(), acc(0, r, 3).AsY()
			VHADDPS(v1, v0, v0)
			VHADDPS(v3, v2, v2)
			VHADDPS(v2, v0, v0)
			VEXTRACTF32X4(U8(1), v0, X17)
			VADDPS(X17, acc(0, r, 0).AsX(), X17)
			VMOVUPS(X17, Mem{Base: yr})
			continue
		}
		v := acc(0, r, 0)
		VEXTRACTF32X4(U8(1), v.AsY(), X17)
		VADDPS(X17, v.AsX(), v.AsX())
		VHADDPS(v.AsX(), v.AsX(), v.AsX())
		VHADDPS(v.AsX(), v.AsX(), v.AsX())
		VMOVSS(v.AsX(), Mem{Base: yr})
	}
	VZEROUPPER()
	RET()
}

// tailMask32 sets rem = k%32 and returns it with a mask of rem one bits,
// which loads the last, partial 32-column chunk of a BF16 row. With skip
// it first jumps there when rem is 0.
func tailMask32(k Register, skip string) (rem GPVirtual, mask OpmaskVirtual) {
	rem = GP64()
	MOVQ(k, rem)
	ANDQ(U8(31), rem)
	if skip != "" {
		JZ(LabelRef(skip))
	}
	bits := GP32()
	MOVL(U32(0xffffffff), bits)
	BZHIL(rem.As32(), bits, bits)
	mask = K()
	KMOVD(bits, mask)
	return rem, mask
}

// bf16Round rounds float32 to bfloat16 (ties to even, NaN kept NaN), the
// conversion the BF16×BF16 tiles need for x, 16 values a step.
func bf16Round() {
	TEXT("bf16Round", NOSPLIT, "func(dst []uint16, src []float32)")
	Doc(
		"bf16Round sets dst[i] = kernels.F32ToBF16(src[i]) for i < len(src)&^15",
		"(AVX-512 F and BW). The caller guarantees len(dst) ≥ len(src)&^15.",
	)
	Pragma("noescape")
	d := Load(Param("dst").Base(), GP64())
	p := Load(Param("src").Base(), GP64())
	n := Load(Param("src").Len(), GP64())
	ANDQ(I8(-16), n)
	one, bias, quiet, inf2 := ZMM(), ZMM(), ZMM(), ZMM()
	for _, c := range []struct {
		v VecVirtual
		c uint32
	}{{one, 1}, {bias, 0x7fff}, {quiet, 0x40}, {inf2, 0xff000000}} { // inf2: +Inf << 1
		t := GP32()
		MOVL(U32(c.c), t)
		VPBROADCASTD(t, c.v)
	}
	i := GP64()
	XORQ(i, i)
	Label("bf16Round_loop")
	CMPQ(i, n)
	JAE(LabelRef("bf16Round_done"))
	v, lsb, nan := ZMM(), ZMM(), ZMM()
	VMOVDQU32(Mem{Base: p, Index: i, Scale: 4}, v)
	// NaN lanes: the high half with the quiet bit set.
	VPSRLD(U8(16), v, nan)
	VPORD(quiet, nan, nan)
	isNaN := K()
	VPSLLD(U8(1), v, lsb)            // |v| << 1: compare the magnitudes unsigned
	VPCMPUD(U8(6), inf2, lsb, isNaN) // lsb > inf2: NaN
	// Others: (v + 0x7fff + bit 16 of v) >> 16.
	VPSRLD(U8(16), v, lsb)
	VPANDD(one, lsb, lsb)
	VPADDD(bias, v, v)
	VPADDD(lsb, v, v)
	VPSRLD(U8(16), v, v)
	VMOVDQA32(nan, isNaN, v)
	VPMOVDW(v, Mem{Base: d, Index: i, Scale: 2})
	ADDQ(U8(16), i)
	JMP(LabelRef("bf16Round_loop"))
	Label("bf16Round_done")
	VZEROUPPER()
	RET()
}

// The AMX tile (TDPBF16PS) is the bf16 path's prefill: a 32×32 block of
// y = x·wᵀ, weights as the A operand (16 rows × 32 columns a tile, loaded in
// place with the row stride), x as the B operand, which the caller has
// packed in the pairs layout TDPBF16PS wants: per 16 x rows and 32 columns,
// a 16×16 array of dwords whose row p holds each x row's columns 2p and
// 2p+1. Neither avo nor the Go assembler knows AMX, so every AMX
// instruction is emitted as bytes (VEX, with the general registers below 8
// that need no extension bits), and the function uses fixed registers.

// amxBytes emits a VEX-encoded AMX instruction: map 0F38, W0, L0, with
// prefix pp, vvvv (inverted in the encoding; 0 when unused), opcode op
// and the ModRM (and SIB) bytes.
func amxBytes(text string, pp, vvvv, op byte, rest ...byte) {
	Comment(text)
	for _, v := range append([]byte{0xc4, 0xe2, (^vvvv&15)<<3 | pp, op}, rest...) {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(v)}})
	}
}

// sib is the ModRM and SIB bytes of [base + index·1] with reg in ModRM.reg.
func sib(reg byte, base, index GPPhysical) []byte {
	return []byte{reg<<3 | 0b100, byte(index.PhysicalIndex())<<3 | byte(base.PhysicalIndex())}
}

func tileLoadD(t byte, base, index GPPhysical) {
	amxBytes(fmt.Sprintf("TILELOADD (%s)(%s*1), TMM%d", base.Asm(), index.Asm(), t), 0b11, 0, 0x4b, sib(t, base, index)...)
}

func tileStoreD(t byte, base, index GPPhysical) {
	amxBytes(fmt.Sprintf("TILESTORED TMM%d, (%s)(%s*1)", t, base.Asm(), index.Asm()), 0b10, 0, 0x4b, sib(t, base, index)...)
}

// tdpbf16ps: c += a·b, a of bf16 pairs along its rows, b in the pairs layout.
func tdpbf16ps(c, a, b byte) {
	amxBytes(fmt.Sprintf("TDPBF16PS TMM%d, TMM%d, TMM%d (c += a·b)", c, a, b), 0b10, b, 0x5c, 0b11<<6|c<<3|a)
}

func amxTile() {
	TEXT("amxBF16", NOSPLIT, "func(c []float32, w []byte, ldw int, x []uint32, xg int, nb int, k int, cfg *[64]byte)")
	Doc(
		"amxBF16 multiplies 32 weight rows by nb blocks of 32 x rows with AMX",
		"(TDPBF16PS), each block as four 16×16 tiles in c: for b < nb, and",
		"h, g < 2, wr, xr < 16,",
		"",
		"\tc[b*1024+(2*h+g)*256+wr*16+xr] = Σ over columns i < k of",
		"\t\tBF16 weight (16h+wr, i) · BF16 x (32b+16g+xr, i)",
		"",
		"where weight row r, column i is the bfloat16 at w[r*ldw+2*i:], and the",
		"columns 2p, 2p+1 of chunk q (32 columns) of x row 16j+xr are the two",
		"halves of x[j*xg+q*256+p*16+xr]. k is a positive multiple of 32, xg",
		"is k*8; cfg is the tile configuration (palette 1, every tile 16 rows",
		"of 64 bytes). The caller guarantees the bounds and the OS permission;",
		"nothing is checked.",
	)
	Pragma("noescape")
	Load(Param("cfg"), RAX)
	amxBytes("LDTILECFG (AX)", 0b00, 0, 0x49, 0x00)
	Load(Param("c").Base(), R12)
	Load(Param("w").Base(), R10)
	Load(Param("ldw"), RDI)
	Load(Param("x").Base(), RDX)
	Load(Param("xg"), R13)
	Load(Param("nb"), R14)
	Load(Param("k"), R8)
	LEAQ(Mem{Base: R10, Index: RDI, Scale: 8}, R11) // weight rows 16..31
	LEAQ(Mem{Base: R11, Index: RDI, Scale: 8}, R11)
	SHLQ(U8(2), R13) // x group stride in bytes
	SHRQ(U8(5), R8)  // chunks of 32 columns
	MOVQ(U32(64), RAX)

	Label("amxBF16_block")
	MOVQ(R10, RBX)
	MOVQ(R11, RCX)
	LEAQ(Mem{Base: RDX, Index: R13, Scale: 1}, RSI)
	MOVQ(R8, R9)
	for t := range byte(4) {
		amxBytes(fmt.Sprintf("TILEZERO TMM%d", t), 0b11, 0, 0x49, 0b11<<6|t<<3)
	}
	Label("amxBF16_loop")
	tileLoadD(4, RBX, RDI)
	tileLoadD(5, RCX, RDI)
	tileLoadD(6, RDX, RAX)
	tileLoadD(7, RSI, RAX)
	tdpbf16ps(0, 4, 6)
	tdpbf16ps(1, 4, 7)
	tdpbf16ps(2, 5, 6)
	tdpbf16ps(3, 5, 7)
	ADDQ(U8(64), RBX)
	ADDQ(U8(64), RCX)
	ADDQ(U32(1024), RDX)
	ADDQ(U32(1024), RSI)
	DECQ(R9)
	JNZ(LabelRef("amxBF16_loop"))
	Comment("DX is at group 1 of this block: the next block starts a group on.")
	ADDQ(R13, RDX)
	MOVQ(R12, RBX)
	for t := range byte(4) {
		tileStoreD(t, RBX, RAX)
		ADDQ(U32(1024), RBX)
	}
	ADDQ(U32(4096), R12)
	DECQ(R14)
	JNZ(LabelRef("amxBF16_block"))
	amxBytes("TILERELEASE", 0b00, 0, 0x49, 0xc0)
	RET()
}

// transpose16 transposes a 16×16 block of dwords: the AMX path packs x
// rows into TDPBF16PS's pairs layout with it, and turns the tiles' (weight
// row, x row) results into y's (x row, weight row) order.
func transpose16() {
	TEXT("transpose16", NOSPLIT, "func(dst []uint32, ldd int, src []uint32, lds int, n int)")
	Doc(
		"transpose16 sets dst[r*ldd+c] = src[c*lds+r] for r < n ≤ 16, c < 16",
		"(AVX-512 F). It reads all 16 rows of src. The caller guarantees the",
		"bounds; nothing is checked.",
	)
	Pragma("noescape")
	dp := Load(Param("dst").Base(), GP64())
	ldd := Load(Param("ldd"), GP64())
	sp := Load(Param("src").Base(), GP64())
	lds := Load(Param("lds"), GP64())
	n := Load(Param("n"), GP64())
	r := make([]VecVirtual, 16)
	for i := range r {
		r[i] = ZMM()
		VMOVDQU32(Mem{Base: sp}, r[i])
		if i < 15 {
			LEAQ(Mem{Base: sp, Index: lds, Scale: 4}, sp)
		}
	}
	t := make([]VecVirtual, 16)
	for i := 0; i < 16; i += 2 { // t = interleaved dwords of row pairs
		t[i], t[i+1] = ZMM(), ZMM()
		VPUNPCKLDQ(r[i+1], r[i], t[i])
		VPUNPCKHDQ(r[i+1], r[i], t[i+1])
	}
	for i := 0; i < 16; i += 4 { // r = interleaved qwords
		r[i], r[i+1], r[i+2], r[i+3] = ZMM(), ZMM(), ZMM(), ZMM()
		VPUNPCKLQDQ(t[i+2], t[i], r[i])
		VPUNPCKHQDQ(t[i+2], t[i], r[i+1])
		VPUNPCKLQDQ(t[i+3], t[i+1], r[i+2])
		VPUNPCKHQDQ(t[i+3], t[i+1], r[i+3])
	}
	for h := 0; h < 16; h += 8 { // t = 128-bit lanes gathered across row quads
		for i := range 4 {
			t[h+i], t[h+4+i] = ZMM(), ZMM()
			VSHUFI32X4(U8(0x88), r[h+4+i], r[h+i], t[h+i])
			VSHUFI32X4(U8(0xdd), r[h+4+i], r[h+i], t[h+4+i])
		}
	}
	for i := range 8 {
		r[i], r[8+i] = ZMM(), ZMM()
		VSHUFI32X4(U8(0x88), t[8+i], t[i], r[i])
		VSHUFI32X4(U8(0xdd), t[8+i], t[i], r[8+i])
	}
	for i := range 16 {
		CMPQ(n, U8(i+1))
		JB(LabelRef("transpose16_done"))
		VMOVDQU32(r[i], Mem{Base: dp})
		if i < 15 {
			LEAQ(Mem{Base: dp, Index: ldd, Scale: 4}, dp)
		}
	}
	Label("transpose16_done")
	VZEROUPPER()
	RET()
}
