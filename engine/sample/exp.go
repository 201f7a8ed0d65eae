package sample

import "math"

// exp32 returns e**x in float32, within 2 ulp of math.Exp for normal
// results (checked in exp_test.go). It is the Cephes expf: x = n·ln2 + r
// with |r| ≤ ln2/2, a degree-6 polynomial for e**r, and n put into the
// exponent bits. It is about 1.5× faster than math.Exp through float64, and
// softmax runs it over the whole vocabulary every token.
func exp32(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 88.72284:
		return float32(math.Inf(1))
	case x < -103.97208:
		return 0
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	fn := x * log2e
	if fn < 0 {
		fn -= 0.5
	} else {
		fn += 0.5
	}
	n := int32(fn) // round to nearest
	r := x - float32(n)*ln2hi - float32(n)*ln2lo
	z := r * r
	y := ((((((1.9875691500e-4*r+1.3981999507e-3)*r+8.3334519073e-3)*r+4.1665795894e-2)*r+
		1.6666665459e-1)*r+5.0000001201e-1)*z + r) + 1
	switch {
	case n > 127: // x just below the overflow bound
		return y * 2 * math.Float32frombits(uint32(254)<<23)
	case n >= -126:
		return y * math.Float32frombits(uint32(n+127)<<23)
	}
	// Subnormal result: scale in two steps so the exponent bits stay valid.
	return y * math.Float32frombits(uint32(n+127+64)<<23) * (1.0 / (1 << 64))
}
