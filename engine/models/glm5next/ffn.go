package glm5next

import (
	"slices"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// mlp is the dense clamped-SwiGLU feed-forward block (also the shared
// expert): down(silu(min(gate(x), L)) ⊙ clamp(up(x), −L, L)).
type mlp struct {
	gate  *nn.Linear // (inter, hidden)
	up    *nn.Linear // (inter, hidden)
	down  *nn.Linear // (hidden, inter)
	limit float32    // swiglu_limit L
}

func loadMLP(l *nn.Loader, prefix string, hidden, inter int, limit float32) *mlp {
	return &mlp{
		gate:  l.Linear(prefix+".gate_proj", inter, hidden, false),
		up:    l.Linear(prefix+".up_proj", inter, hidden, false),
		down:  l.Linear(prefix+".down_proj", hidden, inter, false),
		limit: limit,
	}
}

// Forward implements nn.FFN: y (n, hidden) = MLP(x (n, hidden)).
func (m *mlp) Forward(be kernels.Backend, a *nn.Arena, y, x []float32, n int) {
	mark := a.Mark()
	inter := m.gate.Out()
	g := a.Get(n * inter) // (n, inter)
	u := a.Get(n * inter) // (n, inter)
	m.gate.Forward(be, g, x, n)
	m.up.Forward(be, u, x, n)
	ref.SwiGLUClamp(g, g, u, m.limit)
	m.down.Forward(be, y, g, n)
	a.Release(mark)
}

// moe is the sparse block: DeepSeek-V3 noaux_tc routing (nn.Router with
// sigmoid scores, e_score_correction_bias for selection only, −inf group
// masking, renormalised weights × routed_scaling_factor) over
// clamped-SwiGLU experts, plus the always-on shared expert.
type moe struct {
	router  nn.Router
	experts []nn.Expert // (experts) fused GateUp or separate Gate/Up, and Down
	shared  *mlp        // shared_experts, inter = moe_intermediate_size·n_shared_experts; nil when n_shared_experts is 0
	limit   float32     // swiglu_limit
}

func loadMoE(l *nn.Loader, p *params, prefix string) *moe {
	m := &moe{
		router: nn.Router{
			W:          l.Mat(prefix+".gate.weight", p.experts, p.hidden),        // (experts, hidden)
			Bias:       l.Vec(prefix+".gate.e_score_correction_bias", p.experts), // (experts)
			Scoring:    nn.SigmoidScoring,
			TopK:       p.topK,
			NormTopK:   p.normTopK,
			Scale:      p.scale,
			Groups:     p.groups,
			TopKGroups: p.topKGroups,
		},
		experts: l.Experts(prefix+".experts", nn.HFNames, p.experts, p.hidden, p.moeInter),
		limit:   p.limit,
	}
	if p.shared > 0 {
		m.shared = loadMLP(l, prefix+".shared_experts", p.hidden, p.moeInter*p.shared, p.limit)
	}
	return m
}

// Forward implements nn.FFN: y (n, hidden) = MoE(x (n, hidden)). Tokens are
// grouped by expert so each expert's weights are read once; a token's
// expert outputs are added in increasing expert order (as transformers'
// eager experts do), then the shared expert's.
func (m *moe) Forward(be kernels.Backend, a *nn.Arena, y, x []float32, n int) {
	mark := a.Mark()
	hidden, inter, k := m.experts[0].Down.Rows, m.experts[0].Down.Cols, m.router.TopK
	idx := make([]int32, n*k) // (n, k) chosen experts
	w := make([]float32, n*k) // (n, k) their weights
	m.router.Route(be, a, x, n, idx, w)

	// start[e] .. start[e+1] are expert e's (token, weight) pairs, tokens in order.
	ne := len(m.experts)
	start := make([]int, ne+1)
	for _, e := range idx {
		start[e+1]++
	}
	for e := range ne {
		start[e+1] += start[e]
	}
	tok := make([]int32, n*k)  // (n·k) token of each pair, grouped by expert
	tw := make([]float32, n*k) // (n·k) its routing weight
	fill := slices.Clone(start[:ne])
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
	for e := range ne {
		rows := start[e+1] - start[e]
		if rows == 0 {
			continue
		}
		ts := tok[start[e]:start[e+1]]
		for r, t := range ts {
			copy(xe[r*hidden:(r+1)*hidden], x[int(t)*hidden:(int(t)+1)*hidden])
		}
		ex := &m.experts[e]
		if ex.GateUp != nil {
			be.MatMul(gu, xe, ex.GateUp, rows)
			for r := range rows {
				row := gu[r*2*inter : (r+1)*2*inter]
				ref.SwiGLUClamp(h[r*inter:(r+1)*inter], row[:inter], row[inter:], m.limit)
			}
		} else {
			g, u := gu[:rows*inter], gu[rows*inter:2*rows*inter]
			be.MatMul(g, xe, ex.Gate, rows)
			be.MatMul(u, xe, ex.Up, rows)
			ref.SwiGLUClamp(h, g, u, m.limit)
		}
		be.MatMul(ye, h, ex.Down, rows)
		for r, t := range ts {
			nn.Axpy(y[int(t)*hidden:(int(t)+1)*hidden], tw[start[e]+r], ye[r*hidden:(r+1)*hidden])
		}
	}
	if m.shared != nil {
		ys := a.Get(n * hidden) // (n, hidden)
		m.shared.Forward(be, a, ys, x, n)
		for i, v := range ys {
			y[i] += v
		}
	}
	a.Release(mark)
}
