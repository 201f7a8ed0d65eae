package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The x8 kernels (qx8*R1AVX2, qx8*R4AVX2) multiply Q8_0 or Q4_0 weights
// repacked into groups of eight rows (kernels/cpu/x8.go): per group and
// 32-column block, the eight float16 scales (16 bytes), then the quants
// with row r's four bytes of each 4-column chunk in dword lane r (Q8_0:
// eight chunks of 32 bytes; Q4_0: four of the packed nibble bytes, whose
// low nibbles are columns 4c..4c+3 and high nibbles 16+4c..16+4c+3). So
// a VPMADDUBSW of one such vector against x's four bytes broadcast to all
// lanes, then a VPMADDWD against ones, leaves the dot of each of the eight
// rows with those four columns in its own int32 lane: no horizontal sums,
// one conversion and one multiply-add per block for eight rows, the eight
// results of a group stored with one VMOVUPS. Each weight vector is loaded
// (and, Q8_0, made absolute) once for the R x rows.
//
//   - Q8_0 takes the sign trick (|w| against x with w's sign).
//   - Q4_0 multiplies the unsigned nibbles and sums the eight int16 pair
//     sums of a block in int16 (each ≤ 2·15·127, eight ≤ 30480), one
//     VPMADDWD a block; the −8 comes off as dw·(d·Σn·q − 8·s), s = d·Σq.
//
// Per (weight row, x row) the R = 1 and R = 4 kernels do the same
// operations in the same order, so they give the same bits.
//
//   - Q4_K (x8BlockQ4K) sums each sub-block's nibble products in int16
//     the same way and applies its 6-bit scale with one VPMADDWD.
//
// Signature: func(y []float32, ldy int, q []int8, ds []float32, bs
// []int16, ldq int, w []byte, k, groups int); y[r·ldy + 8g + l] for r < R,
// g < groups, l < 8 is row 8g + l of the packed w (k columns) against x
// row r (q[r·ldq:], its (d, d·Σq) pairs at ds[2·r·ldq/32:], its Σq per 16
// columns at bs[r·ldq/16:], read by Q4_K only).

// x8Kernel is one dtype's x8 kernel.
type x8Kernel struct {
	name  string
	elems int // columns per block: 32, or 256 (Q4_K)
	bytes int // per group and block: the 8 rows' scales and quants
	block func(c x8Consts, p x8Ptrs, acc []VecVirtual)
	vnni  func(c x8Consts, p x8Ptrs, acc []VecVirtual) // the same with VPDPBUSD (AVX-512 VNNI, ymm)
}

// x8Consts are the broadcast constants: int16 ones, bytes 0x0f; for the
// VNNI kernels bytes 0x80 and, in ones, int16 −128s (Q8_0).
type x8Consts struct{ ones, low4, x80 VecVirtual }

// x8Ptrs address the current block: weights, and the x rows' quants and
// (d, s) pairs.
type x8Ptrs struct {
	wp, qp, dsp GPVirtual
	bsp         GPVirtual // Q4_K: x's Σq per 16 columns
	ldb, ldb3   GPVirtual // bs row strides (R > 1)
	ldq, ldq3   GPVirtual // x row strides of q (R > 1): 1 and 3 rows
	ldd, ldd3   GPVirtual // of ds
	rows        int
	// g is the rows per group: 8 (ymm), or 16 for the x16 kernels (zmm,
	// VNNI only), whose group block is two x8 group blocks interleaved
	// (kernels/cpu/x8.go); vec makes a register of that width.
	g   int
	vec func() VecVirtual
}

// chunk is the byte offset of 4-column chunk (Q8_0) or nibble vector
// (Q4_0) c in a group block: after the g float16 scales, g·4 bytes each.
func (p x8Ptrs) chunk(c int) int { return 2*p.g + 4*p.g*c }

func (p x8Ptrs) q(r, off int) Mem  { return stridedRow(p.qp, p.ldq, p.ldq3, r, off) }
func (p x8Ptrs) ds(r, off int) Mem { return stridedRow(p.dsp, p.ldd, p.ldd3, r, off) }
func (p x8Ptrs) bs(r, off int) Mem { return stridedRow(p.bsp, p.ldb, p.ldb3, r, off) }

var x8Kernels = []x8Kernel{
	{name: "Q8_0", elems: 32, bytes: 16 + 256, block: x8BlockQ8_0, vnni: x8VNNIQ8_0},
	{name: "Q4_0", elems: 32, bytes: 16 + 128, block: x8BlockQ4_0, vnni: x8VNNIQ4_0},
	{name: "Q4K", elems: 256, bytes: 32 + 256 + 256 + 1024, block: x8BlockQ4K, vnni: x8VNNIQ4K},
}

// x8Four8 is eight float32 8s: Q4_0's offset times s.
var x8Four8 Mem

// x8BlockQ8_0: per chunk c, |w| against x's bytes 4c..4c+3 with w's sign.
func x8BlockQ8_0(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	isum := make([]VecVirtual, p.rows)
	for ch := range 8 {
		w, aw := YMM(), YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 16 + 32*ch}, w)
		VPABSB(w, aw)
		for r := range p.rows {
			x := YMM()
			VPBROADCASTD(p.q(r, 4*ch), x)
			VPSIGNB(w, x, x)
			VPMADDUBSW(x, aw, x)
			sumInto(&isum[r], ch == 0, x, VPADDD, func(d VecVirtual) { VPMADDWD(c.ones, x, d) })
		}
	}
	x8Q8Scale(p, isum, acc)
}

// x8BlockQ4_0: per vector v of nibbles, the low ones against x's bytes
// 4v..4v+3, the high ones against 16+4v..16+4v+3, summed in int16.
func x8BlockQ4_0(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	s16 := make([]VecVirtual, p.rows)
	for v := range 4 {
		lo, hi := YMM(), YMM()
		VMOVDQU(Mem{Base: p.wp, Disp: 16 + 32*v}, lo)
		VPSRLW(U8(4), lo, hi)
		VPAND(c.low4, lo, lo)
		VPAND(c.low4, hi, hi)
		for r := range p.rows {
			x, t := YMM(), YMM()
			VPBROADCASTD(p.q(r, 4*v), x)
			sumInto(&s16[r], v == 0, x, VPADDW, func(d VecVirtual) { VPMADDUBSW(x, lo, d) })
			VPBROADCASTD(p.q(r, 16+4*v), t)
			VPMADDUBSW(t, hi, t)
			VPADDW(t, s16[r], s16[r])
		}
	}
	x8Q40Scale(p, acc, func(r int) VecVirtual {
		i := YMM()
		VPMADDWD(c.ones, s16[r], i)
		return i
	})
}

// x8BlockQ4K is one Q4_K super-block of eight rows, packed as d and
// dmin (8 float16 each), the sub-block scales and mins widened to int16
// (per sub-block j, each row's value twice: a VPMADDWD multiplies a row's
// two int16 lanes by it), then the nibbles (per pair p of sub-blocks, 8
// vectors v: row r's qs[32p+4v ..] in lane r; low nibbles sub-block 2p,
// high 2p+1), against x quantized with one scale per 256 columns: per
// sub-block, the eight int16 pair sums (each ≤ 2·15·127) summed in int16
// (≤ 30480), times the scales into int32; the mins times x's Σq per 16
// columns (bs) likewise; then one conversion and multiply-add each.
func x8BlockQ4K(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	isum := make([]VecVirtual, p.rows)
	for j := range 8 {
		s16 := make([]VecVirtual, p.rows)
		for v := range 8 {
			w := YMM()
			VMOVDQU(Mem{Base: p.wp, Disp: 544 + 256*(j/2) + 32*v}, w)
			if j%2 == 1 {
				VPSRLW(U8(4), w, w)
			}
			VPAND(c.low4, w, w)
			for r := range p.rows {
				x := YMM()
				VPBROADCASTD(p.q(r, 32*j+4*v), x)
				sumInto(&s16[r], v == 0, x, VPADDW, func(d VecVirtual) { VPMADDUBSW(x, w, d) })
			}
		}
		sc := Mem{Base: p.wp, Disp: 32 + 32*j} // sub-block j's scales
		for r := range p.rows {
			sumInto(&isum[r], j == 0, s16[r], VPADDD, func(d VecVirtual) { VPMADDWD(sc, s16[r], d) })
		}
	}
	x8Q4KMins(p, isum, acc)
}

// The VNNI x8 kernels (qx8*R1VNNI, qx8*R4VNNI) read the same layout and
// compute the same integer sums as the AVX2 ones, with VPDPBUSD (u8 × s8,
// four products summed into each int32 lane) in place of VPMADDUBSW and
// VPMADDWD, then the same float operations in the same order: they give
// the AVX2 kernels' bits. The registers are ymm, the instructions all
// with EVEX forms (the allocator may take Y16–Y31), x's four bytes
// broadcast by VPDPBUSD itself ({1to8}). Each x row sums into two
// registers, even and odd vectors, added at the end of the (sub-)block:
// one chain of VPDPBUSD per row would wait on its latency.
//
//   - Q8_0 makes the weights unsigned, w + 128 (w XOR 0x80, once per vector
//     for the R x rows), and starts each block's sum at −128·Σq (x's Σq
//     per 16 columns, bs, times −128 pairs with one VPMADDWD).
//   - Q4_0 multiplies the nibbles directly, summed in int32.
//   - Q4_K sums each sub-block in int32 (up to 32·15·127, past int16) and
//     applies its scale with VPMULLD (the packed (sc, sc) int16 pair
//     shifted to the int32 sc).

// x8VNNIQ8_0 is x8BlockQ8_0 with VPDPBUSD.
func x8VNNIQ8_0(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	const chains = x8Chains
	isum := make([][]VecVirtual, p.rows)
	for r := range p.rows {
		b := p.vec()
		VPBROADCASTD(p.bs(r, 0), b)
		isum[r] = make([]VecVirtual, chains)
		for i := range chains {
			isum[r][i] = p.vec()
			if i == 0 {
				VPMADDWD(c.ones, b, isum[r][0]) // −128·Σq
			} else {
				VPSUBD(isum[r][i], isum[r][i], isum[r][i])
			}
		}
	}
	for ch := range 8 {
		w := p.vec()
		VPXORD(Mem{Base: p.wp, Disp: p.chunk(ch)}, c.x80, w)
		for r := range p.rows {
			VPDPBUSD_BCST(p.q(r, 4*ch), w, isum[r][ch%chains])
		}
	}
	sum := make([]VecVirtual, p.rows)
	for r := range p.rows {
		for i := 1; i < chains; i++ {
			VPADDD(isum[r][i], isum[r][0], isum[r][0])
		}
		sum[r] = isum[r][0]
	}
	x8Q8Scale(p, sum, acc)
}

// x8Q8Scale ends a Q8_0 block: per x row r, acc[r] += dw·d·isum[r], dw
// the eight (or sixteen) weight rows' scales and d x row r's.
func x8Q8Scale(p x8Ptrs, isum, acc []VecVirtual) {
	dw := p.vec()
	VCVTPH2PS(Mem{Base: p.wp}, dw)
	for r := range p.rows {
		d := p.vec()
		VBROADCASTSS(p.ds(r, 0), d)
		VMULPS(dw, d, d)
		VCVTDQ2PS(isum[r], isum[r])
		VFMADD231PS(isum[r], d, acc[r])
	}
}

// x8Chains is how many registers each x row's Q8_0 VPDPBUSD sums go to.
const x8Chains = 4

// x8VNNIQ4_0 is x8BlockQ4_0 with VPDPBUSD.
func x8VNNIQ4_0(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	isum, odd := make([]VecVirtual, p.rows), make([]VecVirtual, p.rows)
	for r := range p.rows {
		isum[r], odd[r] = p.vec(), p.vec()
		VPSUBD(isum[r], isum[r], isum[r])
		VPSUBD(odd[r], odd[r], odd[r])
	}
	for v := range 4 {
		lo, hi := p.vec(), p.vec()
		VMOVDQU32(Mem{Base: p.wp, Disp: p.chunk(v)}, lo)
		VPSRLW(U8(4), lo, hi)
		VPANDD(c.low4, lo, lo)
		VPANDD(c.low4, hi, hi)
		for r := range p.rows {
			VPDPBUSD_BCST(p.q(r, 4*v), lo, isum[r])
			VPDPBUSD_BCST(p.q(r, 16+4*v), hi, odd[r])
		}
	}
	for r := range p.rows {
		VPADDD(odd[r], isum[r], isum[r])
	}
	x8Q40Scale(p, acc, func(r int) VecVirtual { return isum[r] })
}

// x8Q40Scale ends a Q4_0 block: per x row r, isum(r) emits (or returns)
// the row's int32 sums Σn·q, and acc[r] += dw·(d·Σn·q − 8·s).
func x8Q40Scale(p x8Ptrs, acc []VecVirtual, isum func(r int) VecVirtual) {
	dw := p.vec()
	VCVTPH2PS(Mem{Base: p.wp}, dw)
	for r := range p.rows {
		i := isum(r)
		d, s := p.vec(), p.vec()
		VCVTDQ2PS(i, i)
		VBROADCASTSS(p.ds(r, 0), d)
		VBROADCASTSS(p.ds(r, 4), s)
		if p.g == 16 {
			VMULPS_BCST(x8Four8, s, s)
		} else {
			VMULPS(x8Four8, s, s)
		}
		VFMSUB213PS(s, d, i)       // d·Σn·q − 8·s in each row's lane
		VFMADD231PS(i, dw, acc[r]) // acc += dw·that
	}
}

// x8VNNIQ4K is x8BlockQ4K with VPDPBUSD.
func x8VNNIQ4K(c x8Consts, p x8Ptrs, acc []VecVirtual) {
	isum := make([]VecVirtual, p.rows)
	for j := range 8 {
		sj, odd := make([]VecVirtual, p.rows), make([]VecVirtual, p.rows)
		for r := range p.rows {
			sj[r], odd[r] = YMM(), YMM()
			VPSUBD(sj[r], sj[r], sj[r])
			VPSUBD(odd[r], odd[r], odd[r])
		}
		for v := range 8 {
			w := YMM()
			m := Mem{Base: p.wp, Disp: 544 + 256*(j/2) + 32*v}
			if j%2 == 1 {
				VPSRLW(U8(4), m, w)
				VPANDD(c.low4, w, w)
			} else {
				VPANDD(m, c.low4, w)
			}
			for r := range p.rows {
				VPDPBUSD_BCST(p.q(r, 32*j+4*v), w, []VecVirtual{sj[r], odd[r]}[v%2])
			}
		}
		for r := range p.rows {
			VPADDD(odd[r], sj[r], sj[r])
		}
		sc := YMM()
		VPSRLD(U8(16), Mem{Base: p.wp, Disp: 32 + 32*j}, sc) // (sc, sc) → sc
		for r := range p.rows {
			sumInto(&isum[r], j == 0, sj[r], VPADDD, func(d VecVirtual) { VPMULLD(sc, sj[r], d) })
		}
	}
	x8Q4KMins(p, isum, acc)
}

// x8Q4KMins ends a Q4_K block: the mins times x's Σq per 16 columns (bs)
// summed like the scales, then per x row acc += d·dx·isum − dmin·dx·msum.
func x8Q4KMins(p x8Ptrs, isum, acc []VecVirtual) {
	msum := make([]VecVirtual, p.rows)
	for j := range 8 {
		mn := Mem{Base: p.wp, Disp: 288 + 32*j} // sub-block j's mins
		for r := range p.rows {
			b := YMM()
			VPBROADCASTD(p.bs(r, 4*j), b) // Σq of the sub-block's two halves
			sumInto(&msum[r], j == 0, b, VPADDD, func(d VecVirtual) { VPMADDWD(mn, b, d) })
		}
	}
	for r := range p.rows { // the scales widened per x row: no register is free for them
		d, e := YMM(), YMM()
		VBROADCASTSS(p.ds(r, 0), d)
		VCVTPH2PS(Mem{Base: p.wp}, e)
		VMULPS(d, e, e)
		VCVTDQ2PS(isum[r], isum[r])
		VFMADD231PS(isum[r], e, acc[r])
		VCVTPH2PS(Mem{Base: p.wp, Disp: 16}, e)
		VMULPS(d, e, e)
		VCVTDQ2PS(msum[r], msum[r])
		VFNMADD231PS(msum[r], e, acc[r])
	}
}

// x8PrefetchAhead is how far ahead of the block the R = 1 kernels
// prefetch the packed weights (a decode step streams them from memory).
const x8PrefetchAhead = 4096

func x8Consts8() {
	x8Four8 = GLOBL("x8eight", RODATA|NOPTR)
	for l := range 8 {
		DATA(4*l, U32(0x41000000)) // 8.0
	}
}

// qx8 writes kernel k's AVX2 x8 function for R x rows, or with vnni its
// VNNI one; with wide (VNNI, Q8_0 and Q4_0) the x16 one: sixteen rows a
// group on zmm registers (AVX-512 VNNI and BW).
func qx8(k x8Kernel, R int, vnni, wide bool) {
	isa, block := "AVX2", k.block
	if vnni {
		isa, block = "VNNI", k.vnni
	}
	G, vec, fam := 8, YMM, "x8"
	if wide {
		G, vec, fam, isa = 16, ZMM, "x16", "VNNI512"
	}
	bytes := k.bytes * G / 8
	name := fmt.Sprintf("q%s%sR%d%s", fam, k.name, R, isa)
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, q []int8, ds []float32, bs []int16, ldq int, w []byte, k, groups int)")
	Doc(
		fmt.Sprintf("%s sets y[r·ldy + %dg + l] for r < %d, g < groups, l < %d to the dot", name, G, R, G),
		fmt.Sprintf("product of row %dg + l of the %s weights w repacked in groups of %d", G, k.name, G),
		"rows (kernels/cpu/x8.go; k columns) with x row r quantized to int8 (q[r·ldq:];",
		"ds, its (d, d·Σq) pairs per 32 columns; bs, its Σq per 16 columns). k is a",
		fmt.Sprintf("multiple of %d and groups > 0.", k.elems),
		"The caller guarantees the bounds; nothing is checked.")
	Pragma("noescape")
	p := x8Ptrs{
		wp:   Load(Param("w").Base(), GP64()).(GPVirtual),
		qp:   Load(Param("q").Base(), GP64()).(GPVirtual),
		dsp:  Load(Param("ds").Base(), GP64()).(GPVirtual),
		rows: R,
		g:    G,
		vec:  vec,
	}
	useBs := k.elems == 256 || vnni && k.name == "Q8_0"
	if useBs {
		p.bsp = Load(Param("bs").Base(), GP64()).(GPVirtual)
	}
	yp := Load(Param("y").Base(), GP64())
	ldy := AllocLocal(8) // bytes
	{
		t := Load(Param("ldy"), GP64())
		SHLQ(U8(2), t)
		MOVQ(t, ldy)
	}
	if R > 1 {
		p.ldq, p.ldq3 = Load(Param("ldq"), GP64()).(GPVirtual), GP64()
		LEAQ(Mem{Base: p.ldq, Index: p.ldq, Scale: 2}, p.ldq3)
		// Row strides in bytes: ds, ldq/32 pairs of 8 bytes; bs, ldq/16 int16s.
		p.ldd, p.ldd3 = shrStrides(p.ldq, p.ldq3, 2)
		if useBs {
			p.ldb, p.ldb3 = shrStrides(p.ldd, p.ldd3, 1)
		}
	}
	// After a group the x pointers go back k bytes (q), k/4 (ds) and k/8
	// (bs).
	back := xRewind()
	groups := AllocLocal(8)
	{
		t := Load(Param("groups"), GP64())
		MOVQ(t, groups)
	}
	var c x8Consts
	bc := bcastD
	if wide {
		bc = bcastZ
	}
	switch {
	case !vnni:
		c = x8Consts{ones: bcastD(0x00010001), low4: bcastB(0x0f)}
	case k.name == "Q8_0":
		c = x8Consts{ones: bc(0xff80ff80), x80: bc(0x80808080)}
	default:
		c = x8Consts{low4: bc(0x0f0f0f0f)}
	}

	Label(name + "_group")
	zero := zeros
	if vnni {
		zero = zerosInt
	}
	acc := zero(R, vec)
	n := Load(Param("k"), GP64())
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), n) // blocks
	Label(name + "_blk")
	if R == 1 {
		for i := range (bytes + 63) / 64 {
			PREFETCHT0(Mem{Base: p.wp, Disp: x8PrefetchAhead + 64*i})
		}
	}
	block(c, p, acc)
	ADDQ(U32(bytes), p.wp)
	ADDQ(U32(k.elems), p.qp)
	ADDQ(U32(k.elems/4), p.dsp)
	if useBs {
		ADDQ(U32(k.elems/8), p.bsp)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_blk"))

	t := GP64()
	MOVQ(yp, t)
	for r := range R {
		if r > 0 {
			ADDQ(ldy, t)
		}
		VMOVUPS(acc[r], Mem{Base: t})
	}
	ADDQ(U8(4*G), yp)
	SUBQ(back, p.qp)
	SUBQ(back.Offset(8), p.dsp)
	if useBs {
		SUBQ(back.Offset(16), p.bsp)
	}
	DECQ(groups)
	JNZ(LabelRef(name + "_group"))
	VZEROUPPER()
	RET()
}

// transpose8x8 returns the dword transpose of the eight vectors R (row r
// in R[r]): out[c] holds dword c of every row, row r in lane r.
func transpose8x8(R []VecVirtual) []VecVirtual {
	t := make([]VecVirtual, 8)
	for i := range 4 {
		t[2*i], t[2*i+1] = YMM(), YMM()
		VPUNPCKLDQ(R[2*i+1], R[2*i], t[2*i])
		VPUNPCKHDQ(R[2*i+1], R[2*i], t[2*i+1])
	}
	u := make([]VecVirtual, 8) // u[c], c < 4: dwords c and c+4 of rows 0-3; u[4+c] of rows 4-7
	for h := range 2 {
		a, b, c, d := t[4*h], t[4*h+1], t[4*h+2], t[4*h+3]
		u[4*h], u[4*h+1], u[4*h+2], u[4*h+3] = YMM(), YMM(), YMM(), YMM()
		VPUNPCKLQDQ(c, a, u[4*h])
		VPUNPCKHQDQ(c, a, u[4*h+1])
		VPUNPCKLQDQ(d, b, u[4*h+2])
		VPUNPCKHQDQ(d, b, u[4*h+3])
	}
	out := make([]VecVirtual, 8)
	for c := range 4 {
		out[c], out[c+4] = YMM(), YMM()
		VPERM2I128(U8(0x20), u[4+c], u[c], out[c])
		VPERM2I128(U8(0x31), u[4+c], u[c], out[c+4])
	}
	return out
}

// packX8 writes packX8<dtype>AVX2, kernels/cpu's packX8 for Q8_0 or
// Q4_0: per group block, the eight rows' scales with scalar moves and
// their quants transposed as dwords (8×8 for Q8_0's 32 bytes a row, 8×4
// for Q4_0's 16) with unpacks.
//
// With G = 16 (Q8_0 and Q4_0) it writes packX16<dtype>AVX2, the x16
// layout: rows 0-7 and 8-15 of a group packed the same way, their scales
// at 0 and 16 and their 32-byte vectors interleaved (at 32 + 64v and
// 64 + 64v).
func packX8(k x8Kernel, G int) {
	q8, q4k := k.name == "Q8_0", k.name == "Q4K"
	sb := map[string]int{"Q8_0": 34, "Q4_0": 18, "Q4K": 144}[k.name] // stored bytes per block
	name := fmt.Sprintf("packX%d%sAVX2", G, k.name)
	TEXT(name, NOSPLIT, "func(dst, w []byte, k, groups int)")
	Doc(fmt.Sprintf("%s writes groups groups of %d rows of the %s weights w (k columns,", name, G, k.name),
		fmt.Sprintf("a multiple of 32, and groups > 0) to dst in the x%d layout (kernels/cpu/x8.go).", G),
		"The caller guarantees the bounds; nothing is checked.")
	Pragma("noescape")
	dp := Load(Param("dst").Base(), GP64())
	gp := Load(Param("w").Base(), GP64()) // the group's first row
	nbk := Load(Param("k"), GP64())
	SHRQ(U8(map[int]uint8{32: 5, 256: 8}[k.elems]), nbk) // blocks per row
	rb := GP64()                                         // bytes per row: blocks·sb
	IMUL3Q(U32(sb), nbk, rb)
	rb3, rb5, rb7 := GP64(), GP64(), GP64()
	LEAQ(Mem{Base: rb, Index: rb, Scale: 2}, rb3)
	LEAQ(Mem{Base: rb, Index: rb, Scale: 4}, rb5)
	LEAQ(Mem{Base: rb3, Index: rb, Scale: 4}, rb7)
	groups := Load(Param("groups"), GP64())
	row := func(s GPVirtual, r, off int) Mem {
		switch r {
		case 0:
			return Mem{Base: s, Disp: off}
		case 1, 2, 4:
			return Mem{Base: s, Index: rb, Scale: uint8(r), Disp: off}
		case 3:
			return Mem{Base: s, Index: rb3, Scale: 1, Disp: off}
		case 5:
			return Mem{Base: s, Index: rb5, Scale: 1, Disp: off}
		case 6:
			return Mem{Base: s, Index: rb3, Scale: 2, Disp: off}
		}
		return Mem{Base: s, Index: rb7, Scale: 1, Disp: off}
	}

	Label(name + "_group")
	s, n := GP64(), GP64()
	MOVQ(gp, s)
	MOVQ(nbk, n)
	Label(name + "_blk")
	// vec is where 32-byte vector v of the half h (rows 8h..8h+7) goes.
	vec := func(h, v int) Mem {
		if G == 8 {
			return Mem{Base: dp, Disp: 16 + 32*v}
		}
		return Mem{Base: dp, Disp: 32 + 64*v + 32*h}
	}
	for h := range G / 8 {
		if h == 1 {
			LEAQ(Mem{Base: s, Index: rb, Scale: 8}, s) // rows 8-15
		}
		packX8Half(k, q8, q4k, h, s, dp.(GPVirtual), row, vec)
		if h == 1 {
			t := GP64()
			MOVQ(rb, t)
			SHLQ(U8(3), t)
			SUBQ(t, s)
		}
	}
	ADDQ(U32(sb), s)
	ADDQ(U32(k.bytes*G/8), dp)
	DECQ(n)
	JNZ(LabelRef(name + "_blk"))
	LEAQ(Mem{Base: gp, Index: rb, Scale: 8}, gp)
	if G == 16 {
		LEAQ(Mem{Base: gp, Index: rb, Scale: 8}, gp)
	}
	DECQ(groups)
	JNZ(LabelRef(name + "_group"))
	VZEROUPPER()
	RET()
}

// packX8Half packs one block of the eight rows at s (row(s, r, off)) of
// group half h: their scales at dp + 16h + 2r, their vectors at vec(h, v).
func packX8Half(k x8Kernel, q8, q4k bool, h int, s, dp GPVirtual, row func(GPVirtual, int, int) Mem, vec func(h, v int) Mem) {
	for r := range 8 {
		t := GP32()
		MOVWLZX(row(s, r, 0), t)
		MOVW(t.As16(), Mem{Base: dp, Disp: 16*h + 2*r})
		if q4k {
			MOVWLZX(row(s, r, 2), t)
			MOVW(t.As16(), Mem{Base: dp, Disp: 16 + 2*r})
		}
	}
	switch {
	case q4k:
		// Scales and mins: per row the eight 6-bit values (kScaleBytes)
		// widened to dwords holding each twice as int16, transposed.
		for i := range 2 { // scales, then mins (unpacked again: 16 vectors do not fit)
			var R []VecVirtual
			for r := range 8 {
				b := GP64()
				LEAQ(row(s, r, 0), b)
				sc, mn := kScaleBytes(b)
				g := []GPVirtual{sc, mn}[i]
				v, t := YMM(), YMM()
				VMOVQ(g, v.AsX())
				VPMOVZXBD(v.AsX(), v)
				VPSLLD(U8(16), v, t)
				VPOR(t, v, v)
				R = append(R, v)
			}
			for j, v := range transpose8x8(R) {
				VMOVDQU(v, Mem{Base: dp, Disp: 32 + 256*i + 32*j})
			}
		}
		for p := range 4 {
			R := make([]VecVirtual, 8)
			for r := range R {
				R[r] = YMM()
				VMOVDQU(row(s, r, 16+32*p), R[r])
			}
			for c, v := range transpose8x8(R) {
				VMOVDQU(v, Mem{Base: dp, Disp: 544 + 256*p + 32*c})
			}
		}
	case q8:
		R := make([]VecVirtual, 8)
		for r := range R {
			R[r] = YMM()
			VMOVDQU(row(s, r, 2), R[r])
		}
		for c, v := range transpose8x8(R) {
			VMOVDQU(v, vec(h, c))
		}
	default:
		Y := make([]VecVirtual, 4) // rows r and r+4
		for r := range Y {
			Y[r] = YMM()
			VMOVDQU(row(s, r, 2), Y[r].AsX())
			VINSERTI128(U8(1), row(s, r+4, 2), Y[r], Y[r])
		}
		t := make([]VecVirtual, 4)
		for i := range 2 {
			t[2*i], t[2*i+1] = YMM(), YMM()
			VPUNPCKLDQ(Y[2*i+1], Y[2*i], t[2*i])
			VPUNPCKHDQ(Y[2*i+1], Y[2*i], t[2*i+1])
		}
		for v := range 4 {
			o := YMM()
			a, c := t[v/2], t[2+v/2]
			if v%2 == 0 {
				VPUNPCKLQDQ(c, a, o)
			} else {
				VPUNPCKHQDQ(c, a, o)
			}
			VMOVDQU(o, vec(h, v))
		}
	}
}
