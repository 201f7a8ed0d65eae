//go:build amd64 && !amd64.v3

package cpu

func gemmP(m, k, n4 int, a []float64, lda int, b [][4]float64, bps int, c [][4]float64, cps int, tri, set bool) {
	for i := 0; i < m; i++ {
		kk := k
		if tri && i+1 < kk {
			kk = i + 1
		}
		gemmRow1(n4, a[i*lda:i*lda+kk], b, bps, c[i:], cps, set)
	}
}
