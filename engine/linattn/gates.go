package linattn

import (
	"fmt"
	"math"
)

// KDAGates computes glm5_next's per-channel log-decay for T tokens: gpre
// ([T, heads·dk], the forget gate's f_b output) plus dtBias ([heads·dk],
// per channel, rounded to float32 as in HF), then with a = exp(A_log[h]):
//
//	g = lowerBound · sigmoid(a · (gpre + dt_bias))   if lowerBound < 0 (linear_lower_bound set; −5 for GLM-5.3-Flash)
//	g = −a · softplus(gpre + dt_bias)               if lowerBound == 0 (unset: Kimi-Linear's form)
//
// g ([T, heads·dk]) may alias gpre. A positive lowerBound panics.
func KDAGates(g, gpre, aLog, dtBias []float32, T, heads, dk int, lowerBound float32) {
	n := T * heads * dk
	if len(gpre) < n || len(g) < n || len(aLog) < heads || len(dtBias) < heads*dk {
		panic(fmt.Sprintf("linattn: KDAGates: bad sizes for T=%d heads=%d dk=%d", T, heads, dk))
	}
	if lowerBound > 0 {
		panic(fmt.Sprintf("linattn: KDAGates: lower bound %g must be negative (or 0 for none)", lowerBound))
	}
	lb := float64(lowerBound)
	for h := 0; h < heads; h++ {
		a := math.Exp(float64(aLog[h]))
		for t := 0; t < T; t++ {
			row := t*heads*dk + h*dk
			for c := 0; c < dk; c++ {
				x := float64(gpre[row+c] + dtBias[h*dk+c]) // float32 sum, as HF
				if lb < 0 {
					g[row+c] = float32(lb * sigmoid64(a*x))
				} else {
					g[row+c] = float32(-a * softplus64(x))
				}
			}
		}
	}
}
