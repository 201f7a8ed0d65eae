package ref

import (
	"math"
	"testing"
)

func TestLayerNorm(t *testing.T) {
	x := []float32{1, 2, 3, 4, -1, 0.5, 0.25, 8}
	w, b := []float32{1, 2, 0.5, -1}, []float32{0.1, 0, -0.2, 0.3}
	y := make([]float32, len(x))
	LayerNorm(y, x, w, b, 1e-6, 2)
	for r := range 2 {
		row := x[r*4 : (r+1)*4]
		var mean, v float64
		for _, e := range row {
			mean += float64(e) / 4
		}
		for _, e := range row {
			v += (float64(e) - mean) * (float64(e) - mean) / 4
		}
		for j, e := range row {
			want := (float64(e)-mean)/math.Sqrt(v+1e-6)*float64(w[j]) + float64(b[j])
			if d := math.Abs(float64(y[r*4+j]) - want); d > 1e-6 {
				t.Errorf("row %d col %d: %g, want %g", r, j, y[r*4+j], want)
			}
		}
	}
}
