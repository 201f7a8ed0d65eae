//go:build !amd64 || amd64.v3

package cpu

func gemmP(m, k, n4 int, a []float64, lda int, b [][4]float64, bps int, c [][4]float64, cps int, tri, set bool) {
	for i := 0; i < m; i += 2 {
		kk := k
		if tri && i+2 < kk {
			kk = i + 2
		}
		if m-i == 1 {
			if tri && i+1 < kk {
				kk = i + 1
			}
			gemmRow1(n4, a[i*lda:i*lda+kk], b, bps, c[i:], cps, set)
			continue
		}
		a0 := a[i*lda : i*lda+kk]
		a1 := a[(i+1)*lda : (i+1)*lda+kk]
		a1 = a1[:len(a0)]
		for jp := 0; jp < n4; jp++ {
			bp := b[jp*bps : jp*bps+kk]
			bp = bp[:len(a0)]
			var c00, c01, c02, c03, c10, c11, c12, c13 float64
			for p, x0 := range a0 {
				x1 := a1[p]
				bq := &bp[p]
				b0 := bq[0]
				c00 += x0 * b0
				c10 += x1 * b0
				b1 := bq[1]
				c01 += x0 * b1
				c11 += x1 * b1
				b2 := bq[2]
				c02 += x0 * b2
				c12 += x1 * b2
				b3 := bq[3]
				c03 += x0 * b3
				c13 += x1 * b3
			}
			cc := c[jp*cps+i : jp*cps+i+2]
			if set {
				cc[0] = [4]float64{c00, c01, c02, c03}
				cc[1] = [4]float64{c10, c11, c12, c13}
			} else {
				cc[0][0] += c00
				cc[0][1] += c01
				cc[0][2] += c02
				cc[0][3] += c03
				cc[1][0] += c10
				cc[1][1] += c11
				cc[1][2] += c12
				cc[1][3] += c13
			}
		}
	}
}
