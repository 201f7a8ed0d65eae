package main

// The AVX2/FMA kernels of CPU attention and the elementwise ops
// (attn_amd64.s, attn_stub_amd64.go; `-set attn`): a vectorised float32 exp
// (Cephes expf, the polynomial of kernels/cpu's expf), the softmax of one
// score row and its two halves for split decode attention (the scaled
// maximum; the exponentials and their sum), SwiGLU, and the P·V
// accumulation of one or two probability rows over value rows found
// through a table of element offsets (the paged cache's slots), read in
// F32 or BF16 and widened in registers (P·V also in AVX-512).
//
// Loop tails run as masked vectors (VMASKMOVPS with a mask read from
// tailMask at an offset of the remaining count), so no kernel has scalar
// code and a row of any length is one call.

import (
	"fmt"
	"math"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The 8-lane constants of attnConsts, by index (32 bytes each).
const (
	cLog2e = iota
	cLn2hi
	cLn2lo
	cP0
	cP1
	cP2
	cP3
	cP4
	cP5
	cOne
	cLo // clamp and cut-off: exp(x) = 0 below it where asked
	cHi // clamp above: exp stays finite
	cBias
	cNegInf
	cSign
	nConsts
)

var (
	attnConsts Mem // nConsts vectors of 8 equal lanes
	tailMask   Mem // 8 int32 −1, then 8 zeros
)

// constVec is constant i as a 32-byte memory operand.
func constVec(i int) Mem { return attnConsts.Offset(32 * i) }

func attnData() {
	attnConsts = GLOBL("attnconsts", RODATA|NOPTR)
	f := func(v float32) U32 { return U32(math.Float32bits(v)) }
	vals := [nConsts]U32{
		cLog2e:  f(1.44269504088896341),
		cLn2hi:  f(0.693359375),
		cLn2lo:  f(-2.12194440e-4),
		cP0:     f(1.9875691500e-4),
		cP1:     f(1.3981999507e-3),
		cP2:     f(8.3334519073e-3),
		cP3:     f(4.1665795894e-2),
		cP4:     f(1.6666665459e-1),
		cP5:     f(5.0000001201e-1),
		cOne:    f(1),
		cLo:     f(-87),
		cHi:     f(88),
		cBias:   U32(127),
		cNegInf: U32(0xff800000),
		cSign:   U32(0x80000000),
	}
	for i, v := range vals {
		for l := range 8 {
			DATA(32*i+4*l, v)
		}
	}
	tailMask = GLOBL("tailmask", RODATA|NOPTR)
	for l := range 16 {
		v := U32(0)
		if l < 8 {
			v = U32(0xffffffff)
		}
		DATA(4*l, v)
	}
}

// loadTailMask sets mask to the lanes < n%8 of a masked tail.
func loadTailMask(n Register, mask VecVirtual) {
	rem, tp := GP64(), GP64()
	MOVQ(n, rem)
	ANDQ(U8(7), rem)
	NEGQ(rem)
	LEAQ(tailMask, tp)
	VMOVDQU(Mem{Base: tp, Index: rem, Scale: 4, Disp: 32}, mask)
}

// lanes walks a kernel's float32 rows of n elements 8 lanes at a time,
// then once more over the masked tail (VMASKMOVPS with the lanes < n%8; an
// empty tail reads and writes nothing): i is the element index.
type lanes struct {
	i, n8 Register
	mask  VecVirtual
	tail  bool // emitting the masked tail
}

func newLanes(n Register) *lanes {
	l := &lanes{i: GP64(), n8: GP64(), mask: YMM()}
	loadTailMask(n, l.mask)
	MOVQ(n, l.n8)
	ANDQ(I8(-8), l.n8)
	return l
}

// at is element i of the float32 row at b.
func (l *lanes) at(b Register) Mem { return Mem{Base: b, Index: l.i, Scale: 4} }

func (l *lanes) load(m Mem, v VecVirtual) {
	if l.tail {
		VMASKMOVPS(m, l.mask, v)
	} else {
		VMOVUPS(m, v)
	}
}

func (l *lanes) store(v VecVirtual, m Mem) {
	if l.tail {
		VMASKMOVPS(v, l.mask, m)
	} else {
		VMOVUPS(v, m)
	}
}

// loop emits body for every 8 lanes, then for the tail.
func (l *lanes) loop(name string, body func()) {
	XORQ(l.i, l.i)
	Label(name)
	CMPQ(l.i, l.n8)
	JAE(LabelRef(name + "_tail"))
	body()
	ADDQ(U8(8), l.i)
	JMP(LabelRef(name))
	Label(name + "_tail")
	l.tail = true
	body()
	l.tail = false
}

// expPS sets e = exp(x) lane by lane (x kept): Cephes expf on x clamped to
// [−87, 88], x = k·ln2 + r, |r| ≤ ln2/2, a degree-5 polynomial in r, 2^k
// built in the exponent bits; lanes with x < −87 are 0 when cut.
func expPS(x, e VecVirtual, cut bool) {
	t, k, p, r2 := YMM(), YMM(), YMM(), YMM()
	VMAXPS(constVec(cLo), x, t)
	VMINPS(constVec(cHi), t, t)
	VMULPS(constVec(cLog2e), t, k)
	VROUNDPS(U8(0), k, k) // nearest
	VFNMADD231PS(constVec(cLn2hi), k, t)
	VFNMADD231PS(constVec(cLn2lo), k, t) // t = r
	VMOVUPS(constVec(cP0), p)
	for c := cP1; c <= cP5; c++ {
		VFMADD213PS(constVec(c), t, p) // p = p·r + c
	}
	VMULPS(t, t, r2)
	VFMADD213PS(t, r2, p) // p·r² + r
	VADDPS(constVec(cOne), p, p)
	VCVTPS2DQ(k, k)
	VPADDD(constVec(cBias), k, k)
	VPSLLD(U8(23), k, k)
	VMULPS(k, p, e)
	if cut {
		m := YMM()
		VCMPPS(U8(0x1d), constVec(cLo), x, m) // x ≥ −87
		VANDPS(m, e, e)
	}
}

// hmaxPS sets every lane of v to the largest lane of v.
func hmaxPS(v VecVirtual) {
	h, h2 := XMM(), XMM()
	VEXTRACTF128(U8(1), v, h)
	VMAXPS(h, v.AsX(), h)
	VPERMILPS(U8(0x4e), h, h2)
	VMAXPS(h2, h, h)
	VPERMILPS(U8(0xb1), h, h2)
	VMAXPS(h2, h, h)
	VBROADCASTSS(h, v)
}

// addPD widens the 8 float32 lanes of e to float64 and adds them to s0, s1.
func addPD(e VecVirtual, s0, s1 VecVirtual) {
	d, h := YMM(), XMM()
	VCVTPS2PD(e.AsX(), d)
	VADDPD(d, s0, s0)
	VEXTRACTF128(U8(1), e, h)
	VCVTPS2PD(h, d)
	VADDPD(d, s1, s1)
}

// sumPD returns the sum of the float64 lanes of s0 and s1 in the low lane
// of an xmm register (s0 is overwritten).
func sumPD(s0, s1 VecVirtual) VecVirtual {
	VADDPD(s1, s0, s0)
	h := XMM()
	VEXTRACTF128(U8(1), s0, h)
	VADDPD(h, s0.AsX(), h)
	VHADDPD(h, h, h)
	return h
}

func softmaxKernel() {
	TEXT("softmaxF32", NOSPLIT, "func(x []float32, scale float32)")
	Doc(
		"softmaxF32 replaces x with softmax(scale·x), as softmax (attention.go)",
		"computes it: max-subtracted, exp in float32 (expPS, lanes below −87",
		"are 0), the sum in float64 (eight lanes, in some order), then x times",
		"float32(1/sum). x·scale − max is one fused multiply-subtract.",
	)
	Pragma("noescape")
	x, n, sv := rowArgs()
	l := newLanes(n)
	m := scaledMax(l, x, sv, "softmax_max")
	h := expSum(l, x, sv, m, "softmax_exp")

	Comment("inv = float32(1/sum); x *= inv.")
	one := XMM()
	VCVTSS2SD(constVec(cOne), one, one)
	VDIVSD(h, one, h)
	VCVTSD2SS(h, h, h)
	inv, t := YMM(), YMM()
	VBROADCASTSS(h, inv)
	l.loop("softmax_scale", func() {
		l.load(l.at(x), t)
		VMULPS(t, inv, t)
		l.store(t, l.at(x))
	})
	VZEROUPPER()
	RET()
}

// rowArgs loads a row kernel's x (its base and length) and its scale,
// broadcast to every lane.
func rowArgs() (x, n Register, sv VecVirtual) {
	x = Load(Param("x").Base(), GP64())
	n = Load(Param("x").Len(), GP64())
	sx := Load(Param("scale"), XMM())
	sv = YMM()
	VBROADCASTSS(sx, sv)
	return x, n, sv
}

// scaledMax emits the largest x·scale of the row at x (sv: scale in every
// lane) into every lane of the returned vector; −inf for an empty row.
func scaledMax(l *lanes, x Register, sv VecVirtual, name string) VecVirtual {
	Comment("The largest x·scale.")
	m, t, ninf := YMM(), YMM(), YMM()
	VMOVUPS(constVec(cNegInf), ninf)
	VMOVUPS(ninf, m)
	l.loop(name, func() {
		l.load(l.at(x), t)
		VMULPS(t, sv, t)
		if l.tail {
			VBLENDVPS(l.mask, t, ninf, t)
		}
		VMAXPS(t, m, m)
	})
	hmaxPS(m)
	return m
}

// expSum emits x = exp(x·scale − m) over the row at x (sv, m: scale and
// the subtrahend in every lane), lanes below −87 0, and returns their sum
// in float64 (low lane of the returned register).
func expSum(l *lanes, x Register, sv, m VecVirtual, name string) VecVirtual {
	Comment("x = exp(x·scale − m), summed in float64.")
	s0, s1, e, t := YMM(), YMM(), YMM(), YMM()
	VXORPD(s0, s0, s0)
	VXORPD(s1, s1, s1)
	l.loop(name, func() {
		l.load(l.at(x), t)
		VFMSUB213PS(m, sv, t)
		expPS(t, e, true)
		if l.tail {
			VANDPS(l.mask, e, e)
		}
		l.store(e, l.at(x))
		addPD(e, s0, s1)
	})
	return sumPD(s0, s1)
}

// scaledMaxKernel is scaledMax as a function.
func scaledMaxKernel() {
	TEXT("scaledMaxF32", NOSPLIT, "func(x []float32, scale float32) float32")
	Doc(
		"scaledMaxF32 returns the largest x[i]·scale (each product rounded to",
		"float32), −inf for an empty x: scaledMax (attention.go).",
	)
	Pragma("noescape")
	x, n, sv := rowArgs()
	m := scaledMax(newLanes(n), x, sv, "smax")
	Store(m.AsX(), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// expSumKernel is expSum as a function.
func expSumKernel() {
	TEXT("expSumF32", NOSPLIT, "func(x []float32, scale, m float32) float64")
	Doc(
		"expSumF32 sets x[i] = exp(x[i]·scale − m) (one fused multiply-subtract,",
		"then expPS; lanes below −87 are 0) and returns their sum in float64",
		"(eight lanes, in some order): expSum (attention.go).",
	)
	Pragma("noescape")
	x := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	sx := Load(Param("scale"), XMM())
	mx := Load(Param("m"), XMM())
	sv, mv := YMM(), YMM()
	VBROADCASTSS(sx, sv)
	VBROADCASTSS(mx, mv)
	h := expSum(newLanes(n), x, sv, mv, "expsum")
	Store(h, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func swigluKernel() {
	TEXT("swigluF32", NOSPLIT, "func(y, g, u []float32)")
	Doc(
		"swigluF32 sets y[i] = silu(g[i])·u[i] = g[i]·u[i] / (1 + exp(−g[i])) for",
		"i < len(g), exp as expPS (its argument clamped to [−87, 88]). y may be g.",
		"",
		"The caller guarantees len(y), len(u) ≥ len(g).",
	)
	Pragma("noescape")
	y := Load(Param("y").Base(), GP64())
	g := Load(Param("g").Base(), GP64())
	u := Load(Param("u").Base(), GP64())
	n := Load(Param("g").Len(), GP64())
	l := newLanes(n)
	l.loop("swiglu", func() {
		gv, uv, t, e := YMM(), YMM(), YMM(), YMM()
		l.load(l.at(g), gv)
		l.load(l.at(u), uv)
		VXORPS(constVec(cSign), gv, t) // −g
		expPS(t, e, false)
		VADDPS(constVec(cOne), e, e)
		VMULPS(uv, gv, t)
		VDIVPS(e, t, t)
		l.store(t, l.at(y))
	})
	VZEROUPPER()
	RET()
}

// pvWidth is the columns one pass of attnPV<dt>R<rows><suffix> accumulates:
// 8 ymm accumulators in all for AVX2, 8 zmm a row for AVX-512 (a head of
// 128 in one pass).
func pvWidth(rows int, a isa) int {
	if a.lanes == 16 {
		return 128
	}
	return 64 / rows
}

func pvKernel(d dtype, rows int, a isa) {
	name := fmt.Sprintf("attnPV%sR%d%s", d.name, rows, a.suffix)
	W := pvWidth(rows, a)
	L := a.lanes
	TEXT(name, NOSPLIT, "func(o []float32, ldo int, p []float32, ldp int, v []byte, offs []int, hd int)")
	Doc(
		fmt.Sprintf("%s adds P·V to o for %d probability rows of P over the value rows", name, rows),
		"at element offsets offs of v, in "+d.name+":",
		"",
		fmt.Sprintf("\tfor r := range %d {", rows),
		"\t\tfor c := range hd {",
		"\t\t\tsum := o[r*ldo+c]",
		"\t\t\tfor i, e := range offs {",
		"\t\t\t\tj := e + c",
		"\t\t\t\tsum += p[r*ldp+i] * "+strings.ReplaceAll(d.doc, "w[", "v["),
		"\t\t\t}",
		"\t\t\to[r*ldo+c] = sum",
		"\t\t}",
		"\t}",
		"",
		fmt.Sprintf("hd is a multiple of %d; the caller guarantees the bounds.", W),
	)
	Pragma("noescape")
	ob := Load(Param("o").Base(), GP64())
	ldo := Load(Param("ldo"), GP64())
	pb := Load(Param("p").Base(), GP64())
	ldp := Load(Param("ldp"), GP64())
	vb := Load(Param("v").Base(), GP64())
	offs := Load(Param("offs").Base(), GP64())
	n := Load(Param("offs").Len(), GP64())
	hd := Load(Param("hd"), GP64())
	op := []Register{ob}
	pp := []Register{pb}
	if rows == 2 {
		o1, p1 := GP64(), GP64()
		LEAQ(Mem{Base: ob, Index: ldo, Scale: 4}, o1)
		LEAQ(Mem{Base: pb, Index: ldp, Scale: 4}, p1)
		op, pp = append(op, o1), append(pp, p1)
	}
	c, j, e, vc := GP64(), GP64(), GP64(), GP64()
	c8 := &consts{isa: a}
	acc := make([][]VecVirtual, rows)
	for r := range acc {
		for range W / L {
			acc[r] = append(acc[r], a.vec())
		}
	}
	XORQ(c, c)
	Label(name + "_chunk")
	for r := range acc {
		for q, v := range acc[r] {
			VMOVUPS(Mem{Base: op[r], Index: c, Scale: 4, Disp: 4 * L * q}, v)
		}
	}
	LEAQ(Mem{Base: vb, Index: c, Scale: uint8(d.size)}, vc)
	XORQ(j, j)
	Label(name + "_key")
	CMPQ(j, n)
	JAE(LabelRef(name + "_store"))
	MOVQ(Mem{Base: offs, Index: j, Scale: 8}, e)
	bc := make([]VecVirtual, rows)
	for r := range bc {
		bc[r] = a.vec()
		VBROADCASTSS(Mem{Base: pp[r], Index: j, Scale: 4}, bc[r])
	}
	for q := range W / L {
		t := a.vec()
		d.vec(Mem{Base: vc, Index: e, Scale: uint8(d.size), Disp: L * d.size * q}, t, c8)
		for r := range rows {
			VFMADD231PS(t, bc[r], acc[r][q])
		}
	}
	INCQ(j)
	JMP(LabelRef(name + "_key"))
	Label(name + "_store")
	for r := range acc {
		for q, v := range acc[r] {
			VMOVUPS(v, Mem{Base: op[r], Index: c, Scale: 4, Disp: 4 * L * q})
		}
	}
	ADDQ(U8(W), c)
	CMPQ(c, hd)
	JB(LabelRef(name + "_chunk"))
	VZEROUPPER()
	RET()
}

func prefetchKernel(d dtype) {
	name := "prefetchRows" + d.name
	TEXT(name, NOSPLIT, "func(b []byte, offs []int, n int)")
	Doc(
		name+" asks for the cache lines of the "+d.name+" elements [e, e+n) of b",
		"into L1 for every e in offs (PREFETCHT0 every 64 bytes); it reads",
		"nothing and cannot fault.",
	)
	Pragma("noescape")
	bb := Load(Param("b").Base(), GP64())
	offs := Load(Param("offs").Base(), GP64())
	k := Load(Param("offs").Len(), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(map[int]uint8{2: 1, 4: 2}[d.size]), n) // bytes
	p, c := GP64(), GP64()
	Label(name + "_row")
	SUBQ(U8(1), k)
	JB(LabelRef(name + "_done"))
	MOVQ(Mem{Base: offs, Index: k, Scale: 8}, p)
	LEAQ(Mem{Base: bb, Index: p, Scale: uint8(d.size)}, p)
	XORQ(c, c)
	Label(name + "_line")
	PREFETCHT0(Mem{Base: p, Index: c, Scale: 1})
	ADDQ(U8(64), c)
	CMPQ(c, n)
	JB(LabelRef(name + "_line"))
	JMP(LabelRef(name + "_row"))
	Label(name + "_done")
	RET()
}

func sumSquaresKernel() {
	TEXT("sumSquaresF64", NOSPLIT, "func(x []float32) float64")
	Doc(
		"sumSquaresF64 returns Σ x[i]² in float64 (each square exact), in some order:",
		"ref.RMSNorm's sum of squares.",
	)
	Pragma("noescape")
	x := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	l := newLanes(n)
	s0, s1, v := YMM(), YMM(), YMM()
	VXORPD(s0, s0, s0)
	VXORPD(s1, s1, s1)
	l.loop("sumsq", func() {
		l.load(l.at(x), v)
		d, h := YMM(), XMM()
		VCVTPS2PD(v.AsX(), d)
		VFMADD231PD(d, d, s0)
		VEXTRACTF128(U8(1), v, h)
		VCVTPS2PD(h, d)
		VFMADD231PD(d, d, s1)
	})
	h := sumPD(s0, s1)
	Store(h, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func normScaleKernel(offset bool) {
	name, w := "normScaleF32", "w[i]"
	if offset {
		name, w = "normScaleOffsetF32", "(1 + w[i])"
	}
	TEXT(name, NOSPLIT, "func(y, x, w []float32, inv float32)")
	Doc(
		name+" sets y[i] = "+w+" * (x[i] * inv) for i < len(x): ref.RMSNorm's scaling.",
		"y may be x. The caller guarantees len(y), len(w) ≥ len(x).",
	)
	Pragma("noescape")
	y := Load(Param("y").Base(), GP64())
	x := Load(Param("x").Base(), GP64())
	wb := Load(Param("w").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	ix := Load(Param("inv"), XMM())
	iv := YMM()
	VBROADCASTSS(ix, iv)
	l := newLanes(n)
	l.loop(name+"_loop", func() {
		xv, wv := YMM(), YMM()
		l.load(l.at(x), xv)
		l.load(l.at(wb), wv)
		if offset {
			VADDPS(constVec(cOne), wv, wv)
		}
		VMULPS(iv, xv, xv)
		VMULPS(wv, xv, xv)
		l.store(xv, l.at(y))
	})
	VZEROUPPER()
	RET()
}

// attnKernels generates the `-set attn` file.
func attnKernels() {
	attnData()
	softmaxKernel()
	scaledMaxKernel()
	expSumKernel()
	swigluKernel()
	sumSquaresKernel()
	normScaleKernel(false)
	normScaleKernel(true)
	for _, d := range dtypes[:2] { // F32 and BF16: the KV cache's dtypes
		for _, a := range isas {
			for _, r := range []int{1, 2} {
				pvKernel(d, r, a)
			}
		}
		prefetchKernel(d)
	}
}
