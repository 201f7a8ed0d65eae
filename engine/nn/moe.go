package nn

import (
	"slices"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// Scoring is how a router turns logits into expert scores (see
// kernels.Scoring).
type Scoring = kernels.Scoring

// The scorings, as in package kernels.
const (
	SoftmaxScoring = kernels.SoftmaxScoring
	SigmoidScoring = kernels.SigmoidScoring
)

// Router picks TopK experts per token and their weights from the logits
// x·Wᵀ, as kernels.Router describes (grouped top-k masks the groups left
// out with −inf, as DeepSeek's reference does; Hugging Face fills 0, which
// differs only when biased scores are negative).
type Router struct {
	W          *kernels.Mat // (experts, hidden)
	Bias       []float32    // (experts) e_score_correction_bias, selection only; nil if none
	Scoring    Scoring
	TopK       int
	NormTopK   bool
	Scale      float32 // routed_scaling_factor; 1 for none
	Groups     int     // n_group; ≤ 1 disables grouped selection
	TopKGroups int     // topk_group
}

// Route fills idx and w, each (n, TopK), with the chosen experts of every
// row of x (n, hidden) and their weights (ref.Route on each row's logits).
func (r *Router) Route(be kernels.Backend, a *Arena, x []float32, n int, idx []int32, w []float32) {
	mark := a.Mark()
	e := r.W.Rows
	logits := a.Get(n * e) // (n, experts)
	be.MatMul(logits, x, r.W, n)
	spec := kernels.Router{Scoring: r.Scoring, TopK: r.TopK, NormTopK: r.NormTopK, Scale: r.Scale, Groups: r.Groups, TopKGroups: r.TopKGroups}
	for i := range n {
		k := r.TopK
		ref.Route(idx[i*k:(i+1)*k], w[i*k:(i+1)*k], logits[i*e:(i+1)*e], &spec, r.Bias)
	}
	a.Release(mark)
}

// Expert is one routed expert's SwiGLU weights, stored either fused
// (GateUp) or as separate Gate and Up matrices.
type Expert = kernels.Expert

// MoE is a routed mixture of SwiGLU experts with optional shared experts:
// y = Σ_k w_k·Expert_k(x) + g·Shared(x), where g = sigmoid(x·SharedGateᵀ)
// for Qwen-style gated shared experts and 1 otherwise. The gated form runs
// on the op set only (gqa.MoE); Forward panics on it.
type MoE struct {
	Router     Router
	Experts    []Expert // (experts)
	Shared     *MLP     // shared experts (DeepSeek/GLM n_shared_experts fused into one MLP); nil if none
	SharedGate *Linear  // (1, hidden) Qwen-style sigmoid gate on Shared; nil if ungated
}

// Forward sets y (n, hidden) = MoE(x (n, hidden)). Tokens are grouped by
// expert so each expert's weights are read once per call; a token's expert
// outputs are summed in increasing expert order, independent of the other
// tokens in the batch.
func (m *MoE) Forward(be kernels.Backend, a *Arena, y, x []float32, n int) {
	if m.SharedGate != nil {
		panic("nn: a gated shared expert runs on the op set (gqa.MoE), not on host slices")
	}
	mark := a.Mark()
	hidden, inter, k := m.Experts[0].Down.Rows, m.Experts[0].Down.Cols, m.Router.TopK
	idx := make([]int32, n*k)
	w := make([]float32, n*k)
	m.Router.Route(be, a, x, n, idx, w)

	// Bucket (token, weight) pairs by expert, tokens in order.
	count := make([]int, len(m.Experts)+1)
	for _, e := range idx {
		count[e+1]++
	}
	for e := range m.Experts {
		count[e+1] += count[e]
	}
	tok := make([]int32, n*k)
	tw := make([]float32, n*k)
	fill := slices.Clone(count[:len(m.Experts)])
	for i := range n {
		for j := range k {
			e := idx[i*k+j]
			tok[fill[e]], tw[fill[e]] = int32(i), w[i*k+j]
			fill[e]++
		}
	}

	clear(y[:n*hidden])
	xe := a.Get(n * hidden)    // (rows, hidden) gathered inputs
	gu := a.Get(n * 2 * inter) // (rows, 2·inter) gate|up
	h := a.Get(n * inter)      // (rows, inter)
	ye := a.Get(n * hidden)    // (rows, hidden) expert outputs
	for e := range m.Experts {
		lo, hi := count[e], count[e+1]
		rows := hi - lo
		if rows == 0 {
			continue
		}
		ex := &m.Experts[e]
		for r, t := range tok[lo:hi] {
			copy(xe[r*hidden:(r+1)*hidden], x[int(t)*hidden:(int(t)+1)*hidden])
		}
		if ex.GateUp != nil {
			be.MatMul(gu, xe, ex.GateUp, rows)
			for r := range rows {
				row := gu[r*2*inter : (r+1)*2*inter]
				for j := range inter {
					h[r*inter+j] = Silu(row[j]) * row[inter+j]
				}
			}
		} else {
			g, u := gu[:rows*inter], gu[rows*inter:2*rows*inter]
			be.MatMul(g, xe, ex.Gate, rows)
			be.MatMul(u, xe, ex.Up, rows)
			for j := range rows * inter {
				h[j] = Silu(g[j]) * u[j]
			}
		}
		be.MatMul(ye, h, ex.Down, rows)
		for r, t := range tok[lo:hi] {
			Axpy(y[int(t)*hidden:(int(t)+1)*hidden], tw[lo+r], ye[r*hidden:(r+1)*hidden])
		}
	}

	if m.Shared != nil {
		ys := a.Get(n * hidden) // (n, hidden)
		m.Shared.Forward(be, a, ys, x, n)
		for i, v := range ys {
			y[i] += v
		}
	}
	a.Release(mark)
}
