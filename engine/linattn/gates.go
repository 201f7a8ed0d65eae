package linattn

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// KDAGates computes glm5_next's per-channel log-decay for T tokens
// (ref.DeltaGates): gpre ([T, heads·dk], the forget gate's f_b output) plus dtBias ([heads·dk],
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
	net := &kernels.DeltaNet{Heads: heads, KeyHeads: heads, DK: dk, PerChannel: true, LowerBound: lowerBound}
	beta, b := make([]float32, heads), make([]float32, heads) // ref.DeltaGates' β, unused here
	w := heads * dk
	for t := range T {
		ref.DeltaGates(g[t*w:(t+1)*w], beta, gpre[t*w:(t+1)*w], b, net, aLog, dtBias)
	}
}
