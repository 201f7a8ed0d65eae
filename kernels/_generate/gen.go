// Command gen writes the AVX2/FMA matmul tiles of package kernels/cpu
// (tile_amd64.s and its Go stubs, tile_stub_amd64.go) with avo: the float
// tiles here, the integer tiles for GGML-quantized weights in quant.go.
//
// It is its own module so that avo never becomes a dependency of ferrite.
// Regenerate from kernels/cpu with `go generate` (see tile_amd64.go), or here:
//
//	go run . -out ../cpu/tile_amd64.s -stubs ../cpu/tile_stub_amd64.go -pkg cpu
//
// Every tile computes an (R, C) block of y = x·wᵀ: R rows of x (float32)
// against C rows of w (stored dtype, decoded in registers), over k columns.
// The k%8 leftover columns are done first with scalar instructions while the
// accumulators are still xmm-sized, then the main loop runs 8 columns a step.
package main

import (
	"flag"
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// dtype describes how one weight dtype is loaded and widened to float32.
type dtype struct {
	name string
	size int // bytes per element
	doc  string

	// vec loads one register's worth of elements at m and widens them into v.
	vec func(m Mem, v VecVirtual, c *consts)
	// scalar loads 1 element at m and widens it into the low lane of the xmm v.
	scalar func(m Mem, v VecVirtual, c *consts)
}

// consts holds the broadcast constants a tile needs (F8 only).
type consts struct {
	isa           isa
	f8mask, f8mul VecVirtual
}

var (
	f8maskData Mem // 0x87f00000: sign bit and the 7 exponent/mantissa bits
	f8mulData  Mem // 2^120 = 2^(127-7): rebias e4m3 to float32
)

var dtypes = []dtype{
	{
		name: "F32", size: 4,
		doc: "math.Float32frombits(binary.LittleEndian.Uint32(w[4*j:]))",
		vec: func(m Mem, v VecVirtual, _ *consts) { VMOVUPS(m, v) },
		scalar: func(m Mem, v VecVirtual, _ *consts) {
			VMOVSS(m, v.AsX())
		},
	},
	{
		name: "BF16", size: 2,
		doc: "kernels.BF16ToF32(binary.LittleEndian.Uint16(w[2*j:]))",
		vec: func(m Mem, v VecVirtual, _ *consts) {
			VPMOVZXWD(m, v)
			VPSLLD(U8(16), v, v)
		},
		scalar: func(m Mem, v VecVirtual, _ *consts) {
			t := GP32()
			MOVWLZX(m, t)
			SHLL(U8(16), t)
			VMOVD(t, v.AsX())
		},
	},
	{
		name: "F16", size: 2,
		doc: "kernels.F16ToF32(binary.LittleEndian.Uint16(w[2*j:]))",
		vec: func(m Mem, v VecVirtual, _ *consts) { VCVTPH2PS(m, v) },
		scalar: func(m Mem, v VecVirtual, _ *consts) {
			t := GP32()
			MOVWLZX(m, t)
			VMOVD(t, v.AsX())
			VCVTPH2PS(v.AsX(), v.AsX())
		},
	},
	{
		// e4m3fn → float32 without a table: sign-extend the byte, shift the
		// 7 exponent/mantissa bits to float32's position (the sign lands on
		// bit 31 thanks to the sign extension), then multiply by 2^120 to
		// rebias the exponent; e4m3 subnormals become float32 subnormals
		// first and come out exact. The NaN codes 0x7f/0xff decode as ±480.
		name: "F8", size: 1,
		doc: "kernels.F8E4M3ToF32(w[j]) (unscaled; NaN codes read as ±480)",
		vec: func(m Mem, v VecVirtual, c *consts) {
			VPMOVSXBD(m, v)
			VPSLLD(U8(20), v, v)
			c.isa.and(c.f8mask, v, v)
			VMULPS(c.f8mul, v, v)
		},
		scalar: func(m Mem, v VecVirtual, c *consts) {
			t := GP32()
			MOVBLSX(m, t)
			SHLL(U8(20), t)
			ANDL(U32(0x87f00000), t)
			VMOVD(t, v.AsX())
			VMULSS(c.f8mul.AsX(), v.AsX(), v.AsX())
		},
	},
}

// isa is a vector instruction set a tile family is generated for.
type isa struct {
	suffix string // appended to the function names
	lanes  int    // float32 lanes per vector register
	vec    func() VecVirtual
	and    func(mxy, xy, xy1 Op) // bitwise and of that width
	shapes []shape
}

var isas = []isa{
	{suffix: "", lanes: 8, vec: YMM, and: func(a, b, c Op) { VPAND(a, b, c) }, shapes: shapes},
	{suffix: "AVX512", lanes: 16, vec: ZMM, and: func(a, b, c Op) { VPANDD(a, b, c) },
		shapes: append(shapes, shape{R: 4, C: 4, U: 1})},
}

// shape is one tile shape: R x rows, C w rows, main loop unrolled U times.
type shape struct{ R, C, U int }

// shapes are the tiles generated. One x row (decode) walks the weight rows
// one at a time, so the weights stream from memory strictly sequentially,
// which the hardware prefetchers serve up to twice as fast as four
// interleaved rows (measured on Zen 5); x is in L1 anyway. Two x rows
// (prefill) use 4-row tiles, so each decoded weight vector feeds two FMAs
// and each x load four.
var shapes = []shape{
	{R: 1, C: 1, U: 8},
	{R: 2, C: 1, U: 4},
	{R: 2, C: 4, U: 1},
}

// set picks the file to generate: tiles (tile_amd64.s), attn
// (attn_amd64.s, attn.go) or bf16 (bf16gemm_amd64.s, bf16gemm.go).
var set = flag.String("set", "tiles", "kernel set: tiles, attn or bf16")

func main() {
	ConstraintExpr("!noasm")
	flag.Parse()
	if *set == "attn" {
		attnKernels()
		Generate()
		return
	}
	if *set == "bf16" {
		gemmKernels()
		Generate()
		return
	}

	f8maskData = GLOBL("f8mask", RODATA|NOPTR)
	DATA(0, U32(0x87f00000))
	f8mulData = GLOBL("f8mul", RODATA|NOPTR)
	DATA(0, U32(0x7b800000))

	for _, a := range isas {
		for _, d := range dtypes {
			for _, s := range a.shapes {
				tile(a, d, s)
			}
		}
	}
	for _, d := range dtypes[:3] { // F8's constants leave no register free
		// The 4×3 tile and, for the weight rows it leaves over, a 4×1 one
		// that sums each element in the same order (U = 1), so a row's
		// result does not depend on which of the two took it.
		tile(isas[0], d, shape{R: 4, C: 3, U: 1})
		tile(isas[0], d, shape{R: 4, C: 1, U: 1})
	}
	for _, a := range qisas {
		for _, k := range qkernels {
			for _, r := range k.rows {
				qtile(a, k, r)
			}
		}
	}
	gemvConsts()
	quantX()
	for _, k := range gemvKernels {
		for _, r := range []int{1, 4} {
			qgemv(k, r)
		}
	}
	q6kConsts512Gemv()
	q4kConsts512Gemv()
	for _, r := range []int{1, 4} {
		qgemv(q6kGemv512, r)
		qgemv(q4kGemv512, r)
	}
	x8Consts8()
	for _, k := range x8Kernels {
		for _, r := range []int{1, 4} {
			qx8(k, r, false, false)
			qx8(k, r, true, false)
			if k.name != "Q4K" {
				qx8(k, r, true, true)
			}
		}
		packX8(k, 8)
		if k.name != "Q4K" {
			packX8(k, 16)
		}
	}
	q4kConsts512()
	q8Consts512()
	q40Consts512()
	q6kConsts512()
	qtileQ6K512(1)
	qtileQ6K512(4)
	for _, r := range []int{1, 4} {
		qtileQ4K512(r)
	}
	for _, bt := range biasedTypes {
		// One row on zmm is no faster than the ymm sign-trick tile.
		qtileBiased512(bt, 4)
	}
	for _, s := range bf16Shapes {
		bf16Tile(s)
	}
	bf16Round()
	amxTile()
	transpose16()
	sum()
	scale()
	for _, d := range dtypes[:2] { // F32 and BF16: the KV cache's dtypes
		axpy(d)
	}
	Generate()
}

func tile(a isa, d dtype, s shape) {
	name := fmt.Sprintf("tile%sR%dC%d%s", d.name, s.R, s.C, a.suffix)
	L := a.lanes
	TEXT(name, NOSPLIT, "func(y []float32, ldy int, x []float32, ldx int, w []byte, ldw int, k int)")
	Doc(
		fmt.Sprintf("%s sets an (%d, %d) tile of y = x·wᵀ, w in %s:", name, s.R, s.C, d.name),
		"",
		fmt.Sprintf("\tfor r := range %d {", s.R),
		fmt.Sprintf("\t\tfor c := range %d {", s.C),
		"\t\t\tvar sum float32",
		"\t\t\tfor i := range k {",
		"\t\t\t\tj := c*ldw + i",
		"\t\t\t\tsum += x[r*ldx+i] * "+d.doc,
		"\t\t\t}",
		"\t\t\ty[r*ldy+c] = sum",
		"\t\t}",
		"\t}",
		"",
		"The caller guarantees the bounds; nothing is checked.",
	)
	Pragma("noescape")

	yp, ldy, k, xp, wp := tileArgs(s.R, s.C, 4, uint8(d.size))

	acc := make([][][]VecVirtual, s.R)
	for r := range acc {
		acc[r] = make([][]VecVirtual, s.C)
		for c := range acc[r] {
			acc[r][c] = zeros(s.U, a.vec)
		}
	}
	// The constants come after the accumulators so that those get the
	// low registers (see the reduction).
	cs := consts{isa: a}
	if d.name == "F8" {
		cs.f8mask, cs.f8mul = a.vec(), a.vec()
		VPBROADCASTD(f8maskData, cs.f8mask)
		VPBROADCASTD(f8mulData, cs.f8mul)
	}

	wv := make([]VecVirtual, s.C)
	for c := range wv {
		wv[c] = a.vec()
	}

	Comment(fmt.Sprintf("Scalar columns k&^%d .. k-1 first, into the low lanes.", L-1))
	k8 := GP64() // columns done by the vector loops
	MOVQ(k, k8)
	ANDQ(I8(int8(-L)), k8)
	i := GP64()
	MOVQ(k8, i)
	Label(name + "_tail")
	CMPQ(i, k)
	JAE(LabelRef(name + "_main"))
	for c := range s.C {
		d.scalar(Mem{Base: wp[c], Index: i, Scale: uint8(d.size)}, wv[c], &cs)
	}
	for r := range s.R {
		xt := XMM()
		VMOVSS(Mem{Base: xp[r], Index: i, Scale: 4}, xt)
		for c := range s.C {
			VFMADD231SS(wv[c].AsX(), xt, acc[r][c][0].AsX())
		}
	}
	INCQ(i)
	JMP(LabelRef(name + "_tail"))

	// step does L columns at i + L·u into the u-th accumulators.
	step := func(u int) {
		for c := range s.C {
			d.vec(Mem{Base: wp[c], Index: i, Scale: uint8(d.size), Disp: L * u * d.size}, wv[c], &cs)
		}
		for r := range s.R {
			xm := Mem{Base: xp[r], Index: i, Scale: 4, Disp: 4 * L * u}
			if s.C == 1 {
				VFMADD231PS(xm, wv[0], acc[r][0][u])
				continue
			}
			xv := a.vec()
			VMOVUPS(xm, xv)
			for c := range s.C {
				VFMADD231PS(wv[c], xv, acc[r][c][u])
			}
		}
	}

	Label(name + "_main")
	XORQ(i, i)
	columnLoops(name, i, k8, L, s.U, step, name+"_reduce")

	Label(name + "_reduce")
	for r := range s.R {
		for c := range s.C {
			for u := 1; u < s.U; u++ {
				VADDPS(acc[r][c][u], acc[r][c][0], acc[r][c][0])
			}
		}
	}
	// sums[r][c] holds tile element (r, c) spread over 8 ymm lanes.
	sums := make([][]VecVirtual, s.R)
	for r := range s.R {
		for c := range s.C {
			v := acc[r][c][0]
			if L == 16 {
				// Fold in place: the accumulators were allocated first, so
				// they sit in registers 0-15, which VHADDPS (VEX only) can
				// reach; the temporary may be 16-31 (EVEX, AVX512VL). The
				// assembler rejects the file if this ever stops holding.
				h := YMM()
				VEXTRACTF64X4(U8(1), v, h)
				VADDPS(h, v.AsY(), v.AsY())
			}
			sums[r] = append(sums[r], v)
		}
	}
	yr := yp.(GPVirtual)
	for r := range s.R {
		if r > 0 {
			next := GP64()
			LEAQ(Mem{Base: yr, Index: ldy, Scale: 4}, next)
			yr = next
		}
		t := XMM()
		if s.C == 4 {
			// Transposing horizontal sum: lane c of t ends up as row c's total.
			v0, v1, v2, v3 := sums[r][0].AsY(), sums[r][1].AsY(), sums[r][2].AsY(), sums[r][3].AsY()
			VHADDPS(v1, v0, v0)
			VHADDPS(v3, v2, v2)
			VHADDPS(v2, v0, v0)
			VEXTRACTF128(U8(1), v0, t)
			VADDPS(t, sums[r][0].AsX(), t)
			VMOVUPS(t, Mem{Base: yr})
			continue
		}
		for c, v := range sums[r] {
			if c > 0 {
				t = XMM()
			}
			VEXTRACTF128(U8(1), v.AsY(), t)
			VADDPS(t, v.AsX(), t)
			VHADDPS(t, t, t)
			VHADDPS(t, t, t)
			VMOVSS(t, Mem{Base: yr, Disp: 4 * c})
		}
	}
	VZEROUPPER()
	RET()
}

// tileArgs loads the arguments of a tile's signature (y []float32, ldy int,
// x []T, ldx int, w []byte, ldw int, k int): y's base, ldy and k, and the
// addresses of the R x rows (xSize bytes an element) and the C weight rows
// (wSize bytes an element).
func tileArgs(R, C int, xSize, wSize uint8) (yp, ldy, k Register, xp, wp []GPVirtual) {
	yp = Load(Param("y").Base(), GP64())
	ldy = Load(Param("ldy"), GP64())
	xb := Load(Param("x").Base(), GP64())
	ldx := Load(Param("ldx"), GP64())
	wb := Load(Param("w").Base(), GP64())
	ldw := Load(Param("ldw"), GP64())
	k = Load(Param("k"), GP64())

	xp = []GPVirtual{xb.(GPVirtual)}
	for r := 1; r < R; r++ {
		p := GP64()
		LEAQ(Mem{Base: xp[r-1], Index: ldx, Scale: xSize}, p)
		xp = append(xp, p)
	}
	wp = []GPVirtual{wb.(GPVirtual)}
	for c := 1; c < C; c++ {
		p := GP64()
		LEAQ(Mem{Base: wp[c-1], Index: ldw, Scale: wSize}, p)
		wp = append(wp, p)
	}
	return
}

// columnLoops emits a tile's main loops over the columns i < kfull (a
// multiple of L; i starts at 0): unrolled U times while U·L columns are
// left, then L columns a step, and then jumps to label done. step(u)
// emits the L columns at i + L·u.
func columnLoops(name string, i, kfull GPVirtual, L, U int, step func(u int), done string) {
	if U > 1 {
		Comment(fmt.Sprintf("Main loop, %d columns a step.", L*U))
		lim := GP64()
		MOVQ(kfull, lim)
		SUBQ(U32(L*U), lim)
		Label(name + "_loopU")
		CMPQ(i, lim)
		JG(LabelRef(name + "_loop1"))
		for u := range U {
			step(u)
		}
		ADDQ(U32(L*U), i)
		JMP(LabelRef(name + "_loopU"))
	}
	Comment(fmt.Sprintf("%d columns a step.", L))
	Label(name + "_loop1")
	CMPQ(i, kfull)
	JAE(LabelRef(done))
	step(0)
	ADDQ(U8(L), i)
	JMP(LabelRef(name + "_loop1"))
}

// sum is a streaming read: BenchmarkStreamRead measures the memory bandwidth
// with it, which the Go compiler's scalar adds cannot saturate.
func sum() {
	TEXT("sumF32", NOSPLIT, "func(x []float32) float32")
	Doc(
		"sumF32 returns the sum of x in some order:",
		"",
		"\tfor _, v := range x {",
		"\t\tsum += v",
		"\t}",
	)
	Pragma("noescape")
	p := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	acc := zeros(8, YMM)
	Label("sum_loop")
	CMPQ(n, U8(64))
	JB(LabelRef("sum_tail"))
	for j := range acc {
		VADDPS(Mem{Base: p, Disp: 32 * j}, acc[j], acc[j])
	}
	ADDQ(U32(256), p)
	SUBQ(U8(64), n)
	JMP(LabelRef("sum_loop"))
	Label("sum_tail")
	t := XMM()
	VXORPS(t, t, t)
	Label("sum_tail1")
	TESTQ(n, n)
	JZ(LabelRef("sum_reduce"))
	VADDSS(Mem{Base: p}, t, t)
	ADDQ(U8(4), p)
	DECQ(n)
	JMP(LabelRef("sum_tail1"))
	Label("sum_reduce")
	for j := 1; j < len(acc); j++ {
		VADDPS(acc[j], acc[0], acc[0])
	}
	h := XMM()
	VEXTRACTF128(U8(1), acc[0], h)
	VADDPS(h, acc[0].AsX(), h)
	VADDPS(h, t, t) // t's upper lanes are zero
	VHADDPS(t, t, t)
	VHADDPS(t, t, t)
	Store(t, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// scale multiplies a vector by a scalar: the F8 path folds block scales into
// x with it.
func scale() {
	TEXT("scaleF32", NOSPLIT, "func(dst, src []float32, s float32)")
	Doc(
		"scaleF32 sets dst[i] = src[i] * s for i < len(src):",
		"",
		"\tfor i, v := range src {",
		"\t\tdst[i] = v * s",
		"\t}",
		"",
		"The caller guarantees len(dst) ≥ len(src).",
	)
	Pragma("noescape")
	d := Load(Param("dst").Base(), GP64())
	p := Load(Param("src").Base(), GP64())
	n := Load(Param("src").Len(), GP64())
	sx := Load(Param("s"), XMM())
	sv := YMM()
	VBROADCASTSS(sx, sv)
	i := GP64()
	XORQ(i, i)
	n32 := GP64()
	MOVQ(n, n32)
	ANDQ(I8(-32), n32)
	Label("scale_loop32")
	CMPQ(i, n32)
	JAE(LabelRef("scale_tail"))
	for j := range 4 {
		v := YMM()
		VMULPS(Mem{Base: p, Index: i, Scale: 4, Disp: 32 * j}, sv, v)
		VMOVUPS(v, Mem{Base: d, Index: i, Scale: 4, Disp: 32 * j})
	}
	ADDQ(U8(32), i)
	JMP(LabelRef("scale_loop32"))
	Label("scale_tail")
	CMPQ(i, n)
	JAE(LabelRef("scale_done"))
	t := XMM()
	VMULSS(Mem{Base: p, Index: i, Scale: 4}, sx, t)
	VMOVSS(t, Mem{Base: d, Index: i, Scale: 4})
	INCQ(i)
	JMP(LabelRef("scale_tail"))
	Label("scale_done")
	VZEROUPPER()
	RET()
}

// axpy accumulates a scaled row of a stored dtype into float32: paged
// attention adds each cached value row, weighted by its probability, to the
// output with it.
func axpy(d dtype) {
	name := "axpy" + d.name
	TEXT(name, NOSPLIT, "func(y []float32, a float32, w []byte)")
	Doc(
		name+" sets y[i] += a * w[i] for i < len(y), w in "+d.name+":",
		"",
		"\tfor i := range y {",
		"\t\tj := i",
		"\t\ty[i] += a * "+d.doc,
		"\t}",
		"",
		"The caller guarantees len(w) ≥ len(y) elements.",
	)
	Pragma("noescape")
	y := Load(Param("y").Base(), GP64())
	n := Load(Param("y").Len(), GP64())
	w := Load(Param("w").Base(), GP64())
	ax := Load(Param("a"), XMM())
	av := YMM()
	VBROADCASTSS(ax, av)
	i := GP64()
	XORQ(i, i)
	n32 := GP64()
	MOVQ(n, n32)
	ANDQ(I8(-32), n32)
	c := &consts{isa: isas[0]}
	Label(name + "_loop32")
	CMPQ(i, n32)
	JAE(LabelRef(name + "_tail"))
	for j := range 4 {
		v, acc := YMM(), YMM()
		d.vec(Mem{Base: w, Index: i, Scale: uint8(d.size), Disp: 8 * d.size * j}, v, c)
		VMOVUPS(Mem{Base: y, Index: i, Scale: 4, Disp: 32 * j}, acc)
		VFMADD231PS(v, av, acc)
		VMOVUPS(acc, Mem{Base: y, Index: i, Scale: 4, Disp: 32 * j})
	}
	ADDQ(U8(32), i)
	JMP(LabelRef(name + "_loop32"))
	Label(name + "_tail")
	CMPQ(i, n)
	JAE(LabelRef(name + "_done"))
	v, acc := XMM(), XMM()
	d.scalar(Mem{Base: w, Index: i, Scale: uint8(d.size)}, v, c)
	VMOVSS(Mem{Base: y, Index: i, Scale: 4}, acc)
	VFMADD231SS(v, ax, acc)
	VMOVSS(acc, Mem{Base: y, Index: i, Scale: 4})
	INCQ(i)
	JMP(LabelRef(name + "_tail"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
