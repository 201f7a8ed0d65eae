package nn

import "math"

// LayerNorm is y = (x − mean(x)) / sqrt(var(x) + eps) ⊙ W + B, the biased
// variance computed in fp32 (float64 sums), as torch.nn.LayerNorm.
type LayerNorm struct {
	W   []float32 // (dim)
	B   []float32 // (dim)
	Eps float32
}

// Forward normalises n rows: y (n, dim) from x (n, dim); y may be x.
func (l *LayerNorm) Forward(y, x []float32, n int) {
	d := len(l.W)
	for i := range n {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		var s float64
		for _, v := range xr {
			s += float64(v)
		}
		mean := float32(s / float64(d))
		var ss float64
		for _, v := range xr {
			c := float64(v - mean)
			ss += c * c
		}
		inv := float32(1 / math.Sqrt(float64(float32(ss/float64(d))+l.Eps)))
		for j, v := range xr {
			yr[j] = (v-mean)*inv*l.W[j] + l.B[j]
		}
	}
}
