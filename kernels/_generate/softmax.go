package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// softmax is attention's softmax on zmm registers (AVX-512 F): three
// passes over the row, the last k%16 elements under a mask. The exponential
// is kernels/cpu's expf, vectorised: x = k·ln2 + r with k rounded to the
// nearest integer, Cephes' degree-6 polynomial in r, and VSCALEFPS for the
// 2^k. Sums are float32 in 16 lanes.
func softmax() {
	TEXT("softmaxF32", NOSPLIT, "func(x []float32, scale float32)")
	Doc(
		"softmaxF32 replaces x with softmax(scale·x): max-subtracted, a float32",
		"exp (within a few ulp of e^x; underflow gives subnormals or 0), float32",
		"sums in 16 lanes (AVX-512 F, BMI2). The pure-Go softmax is its twin.",
	)
	Pragma("noescape")
	p := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	sx := Load(Param("scale"), XMM())
	bcast := func(f float32) VecVirtual {
		t, v := GP32(), ZMM()
		MOVL(U32(math.Float32bits(f)), t)
		VPBROADCASTD(t, v)
		return v
	}
	sc := ZMM()
	VBROADCASTSS(sx, sc)
	n16, rem := GP64(), GP64()
	MOVQ(n, n16)
	ANDQ(I8(-16), n16)
	MOVQ(n, rem)
	ANDQ(U8(15), rem)
	bits := GP32()
	MOVL(U32(0xffff), bits)
	BZHIL(rem.As32(), bits, bits)
	mask := K()
	KMOVW(bits, mask)
	i := GP64()

	// loop runs body over the whole vectors, then (if any) the tail with
	// tail = true.
	loop := func(name string, body func(m Mem, tail bool)) {
		XORQ(i, i)
		Label(name)
		CMPQ(i, n16)
		JAE(LabelRef(name + "_tail"))
		body(Mem{Base: p, Index: i, Scale: 4}, false)
		ADDQ(U8(16), i)
		JMP(LabelRef(name))
		Label(name + "_tail")
		TESTQ(rem, rem)
		JZ(LabelRef(name + "_done"))
		body(Mem{Base: p, Index: i, Scale: 4}, true)
		Label(name + "_done")
	}
	// hreduce folds the 16 lanes of v with op into a scalar broadcast to
	// every lane of v.
	hreduce := func(v VecVirtual, op func(a, b, dst Op)) {
		y, x := YMM(), XMM()
		VEXTRACTF32X8(U8(1), v, y)
		op(y, v.AsY(), v.AsY())
		VEXTRACTF128(U8(1), v.AsY(), x)
		op(x, v.AsX(), v.AsX())
		VPERMILPS(U8(0x4e), v.AsX(), x)
		op(x, v.AsX(), v.AsX())
		VPERMILPS(U8(0xb1), v.AsX(), x)
		op(x, v.AsX(), v.AsX())
		VBROADCASTSS(v.AsX(), v)
	}

	Comment("Pass 1: x *= scale, and the maximum.")
	mx := bcast(float32(math.Inf(-1)))
	loop("softmax_max", func(m Mem, tail bool) {
		v := ZMM()
		if tail {
			VMOVUPS_Z(m, mask, v)
			VMULPS(sc, v, v)
			VMOVUPS(v, mask, m)
			VMAXPS(v, mx, mask, mx)
			return
		}
		VMULPS(m, sc, v)
		VMOVUPS(v, m)
		VMAXPS(v, mx, mx)
	})
	hreduce(mx, func(a, b, dst Op) { VMAXPS(a, b, dst) })

	Comment("Pass 2: x = exp(x − max), and the sum.")
	log2e, half := bcast(1.44269504088896341), bcast(0.5)
	ln2hi, ln2lo := bcast(0.693359375), bcast(-2.12194440e-4)
	poly := []float32{1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1}
	cs := make([]VecVirtual, len(poly))
	for j, c := range poly {
		cs[j] = bcast(c)
	}
	one := bcast(1)
	sum := ZMM()
	VXORPS(sum, sum, sum)
	loop("softmax_exp", func(m Mem, tail bool) {
		v, k, r, e, rr := ZMM(), ZMM(), ZMM(), ZMM(), ZMM()
		if tail {
			VMOVUPS_Z(m, mask, v)
		} else {
			VMOVUPS(m, v)
		}
		VSUBPS(mx, v, v)
		VMULPS(log2e, v, k)
		VADDPS(half, k, k)
		VRNDSCALEPS(U8(1), k, k) // floor
		VMOVAPS(v, r)
		VFNMADD231PS(ln2hi, k, r)
		VFNMADD231PS(ln2lo, k, r)
		VMOVAPS(cs[0], e)
		for _, c := range cs[1:] {
			VFMADD213PS(c, r, e) // e = e·r + c
		}
		VMULPS(r, r, rr)
		VFMADD213PS(r, rr, e) // e·r² + r
		VADDPS(one, e, e)
		VSCALEFPS(k, e, e)
		if tail {
			VMOVUPS(e, mask, m)
			VADDPS(e, sum, mask, sum)
			return
		}
		VMOVUPS(e, m)
		VADDPS(e, sum, sum)
	})
	hreduce(sum, func(a, b, dst Op) { VADDPS(a, b, dst) })
	inv := ZMM()
	VDIVPS(sum, one, inv)

	Comment("Pass 3: x /= sum.")
	loop("softmax_norm", func(m Mem, tail bool) {
		v := ZMM()
		if tail {
			VMOVUPS_Z(m, mask, v)
			VMULPS(inv, v, v)
			VMOVUPS(v, mask, m)
			return
		}
		VMULPS(m, inv, v)
		VMOVUPS(v, m)
	})
	VZEROUPPER()
	RET()
}
