package cpu

// Small float64 matrix products for the chunk form.
//
// "Panel layout" stores a matrix of rows×cols elements as ⌈cols/4⌉ column
// panels of rows quads: element (i, j) is p[(j/4)·ps + i][j%4], where the
// panel stride ps ≥ rows. A register tile then reads one or two values of a
// row-major A and one contiguous quad of B per step.
//
// gemmP (one file per tile shape, chosen by build tags: 1×4 for baseline
// amd64, whose two-operand SSE spills a 2×4 tile; 2×4 elsewhere) computes
// C = A·B (set) or C += A·B (!set) for m rows and n4 column panels, with A
// row-major (row i at a[i*lda:], k columns) and B, C in panel layout with
// panel strides bps and cps. If tri, A is lower triangular including the
// diagonal and only columns p ≤ i of row i are read (a 2×4 tile also reads
// A[i][i+1], which must then be 0).

// dot2 returns (x·z, y·z) over len(z) elements.
func dot2(x, y, z []float64) (float64, float64) {
	x, y = x[:len(z)], y[:len(z)]
	var a0, a1, b0, b1 float64
	i := 0
	for ; i+2 <= len(z); i += 2 {
		z0, z1 := z[i], z[i+1]
		a0 += x[i] * z0
		a1 += x[i+1] * z1
		b0 += y[i] * z0
		b1 += y[i+1] * z1
	}
	if i < len(z) {
		a0 += x[i] * z[i]
		b0 += y[i] * z[i]
	}
	return a0 + a1, b0 + b1
}

// gemmRow1 is one row of gemmP: c[jp*cps] (+)= a·B for every panel jp.
func gemmRow1(n4 int, a []float64, b [][4]float64, bps int, c [][4]float64, cps int, set bool) {
	for jp := 0; jp < n4; jp++ {
		bp := b[jp*bps : jp*bps+len(a)]
		var c0, c1, c2, c3 float64
		for p, x := range a {
			bq := &bp[p]
			c0 += x * bq[0]
			c1 += x * bq[1]
			c2 += x * bq[2]
			c3 += x * bq[3]
		}
		cc := &c[jp*cps]
		if set {
			*cc = [4]float64{c0, c1, c2, c3}
		} else {
			cc[0] += c0
			cc[1] += c1
			cc[2] += c2
			cc[3] += c3
		}
	}
}
