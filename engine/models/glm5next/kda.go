package glm5next

import (
	"math"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// kda is a Kimi Delta Attention layer (self_attn.* of a linear_attention
// layer). With C = heads·dk channels (q, k and v all have `heads` heads of
// dk; no GQA):
//
//	[q|k|v] = silu(causal_conv([q_proj x | k_proj x | v_proj x]))   rolling conv state
//	g       = lower·sigmoid(exp(A_log)·(f_b(f_a(x)) + dt_bias))      per channel (softplus form without a bound)
//	β       = sigmoid(b_proj x)                                      per head
//	q̂, k̂   = L2-normalised (q̂ also × dk^-½)
//	o       = gated delta rule with per-channel decay (linattn), continuing from the slot's state
//	y       = o_proj( o_norm.w ⊙ rmsnorm(o) ⊙ sigmoid(g_b(g_a(x))) )   per head
type kda struct {
	q, k, v *nn.Linear   // (C, hidden) each
	conv    linattn.Conv // Channels 3C, Weight [3C, 1, K] in [q|k|v] order, no bias
	fa      *nn.Linear   // (dk, hidden) f_a_proj
	fb      *nn.Linear   // (C, dk) f_b_proj
	dtBias  []float32    // (C) per channel
	aLog    []float32    // (heads)
	b       *nn.Linear   // (heads, hidden) b_proj
	ga      *nn.Linear   // (dk, hidden) g_a_proj
	gb      *nn.Linear   // (C, dk) g_b_proj
	oNorm   []float32    // (dk) o_norm.weight
	o       *nn.Linear   // (hidden, C) o_proj
	rule    linattn.DeltaRule

	slot       int     // index of this layer in the state slot (StateLayout)
	heads, dk  int     // linear_num_heads, linear_head_dim
	lowerBound float32 // linear_lower_bound, 0 for none
	eps        float32 // o_norm eps (rms_norm_eps)
}

// loadKDA loads a KDA layer under pre ("model.language_model.layers.0.self_attn.").
// It accepts the checkpoint names (three {q,k,v}_conv1d tensors, the forget
// gate without a prefix) and transformers' in-memory names (one conv1d
// [3C, 1, K], forget_gate.*).
func loadKDA(l *nn.Loader, p *params, pre string, slot int, be kernels.Backend) *kda {
	h, dk, K := p.linHeads, p.linDim, p.convK
	C := h * dk
	fg := pre
	if l.Has(pre + "forget_gate.f_a_proj.weight") {
		fg = pre + "forget_gate."
	}
	var w []float32 // [3C, 1, K]
	if l.Has(pre + "conv1d.weight") {
		w = l.Tensor(pre+"conv1d.weight", 3*C, 1, K)
	} else {
		for _, n := range []string{"q", "k", "v"} {
			w = append(w, l.Tensor(pre+n+"_conv1d.weight", C, 1, K)...)
		}
	}
	return &kda{
		q:      l.Linear(pre+"q_proj", C, p.hidden, false),
		k:      l.Linear(pre+"k_proj", C, p.hidden, false),
		v:      l.Linear(pre+"v_proj", C, p.hidden, false),
		conv:   linattn.Conv{Channels: 3 * C, K: K, Weight: w, Parallel: be.Parallel},
		fa:     l.Linear(fg+"f_a_proj", dk, p.hidden, false),
		fb:     l.Linear(fg+"f_b_proj", C, dk, false),
		dtBias: l.Vec(fg+"dt_bias", C),
		aLog:   l.Vec(fg+"A_log", h),
		b:      l.Linear(pre+"b_proj", h, p.hidden, false),
		ga:     l.Linear(pre+"g_a_proj", dk, p.hidden, false),
		gb:     l.Linear(pre+"g_b_proj", C, dk, false),
		oNorm:  l.Vec(pre+"o_norm.weight", dk),
		o:      l.Linear(pre+"o_proj", p.hidden, C, false),
		rule: linattn.DeltaRule{
			Heads: h, DK: dk, DV: dk, PerChannel: true, Parallel: be.Parallel,
		},
		slot: slot, heads: h, dk: dk, lowerBound: p.lowerBound, eps: p.eps,
	}
}

// shape is the layer's entry in StateLayout.
func (m *kda) shape() linattn.LayerShape {
	return linattn.LayerShape{Heads: m.heads, DK: m.dk, DV: m.dk, ConvK: m.conv.K, ConvChannels: m.conv.Channels}
}

// forward sets y (N, hidden) = KDA(x (N, hidden)) for every sequence of
// the pass, reading and updating each sequence's state slot.
func (m *kda) forward(p *pass, y, x []float32) {
	be, a, n := p.Backend, &p.Arena, p.N()
	mark := a.Mark()
	h, dk := m.heads, m.dk
	C := h * dk
	qkv := a.Get(n * 3 * C) // (N, 3C) [q | k | v], then the conv output in place
	t := a.Get(n * C)       // (N, C) projection scratch, later the gate z
	for i, proj := range []*nn.Linear{m.q, m.k, m.v} {
		proj.Forward(be, t, x, n)
		for r := range n {
			copy(qkv[r*3*C+i*C:r*3*C+(i+1)*C], t[r*C:(r+1)*C])
		}
	}
	fa := a.Get(n * dk) // (N, dk) f_a / g_a output
	g := a.Get(n * C)   // (N, C) log-decay
	m.fa.Forward(be, fa, x, n)
	m.fb.Forward(be, g, fa, n)
	linattn.KDAGates(g, g, m.aLog, m.dtBias, n, h, dk, m.lowerBound)
	beta := a.Get(n * h) // (N, heads)
	m.b.Forward(be, beta, x, n)
	linattn.Sigmoid(beta, beta)

	core := a.Get(n * C) // (N, C) delta-rule output
	for s := range len(p.slots) {
		lo, hi := p.seqRows(s)
		T := hi - lo
		if T == 0 {
			continue
		}
		rows := qkv[lo*3*C : hi*3*C] // (T, 3C)
		m.conv.Forward(rows, rows, T, p.states.Conv(p.slots[s], m.slot), linattn.ActSiLU)
		linattn.L2Norm(rows, T, h, dk, 3*C, float32(1/math.Sqrt(float64(dk))))
		linattn.L2Norm(rows[C:], T, h, dk, 3*C, 1)
		m.rule.Forward(&linattn.Seq{
			T: T,
			Q: rows, K: rows[C:], V: rows[2*C:],
			QStride: 3 * C, KStride: 3 * C, VStride: 3 * C,
			Beta:  beta[lo*h : hi*h],
			G:     g[lo*C : hi*C],
			Out:   core[lo*C : hi*C],
			State: p.states.S(p.slots[s], m.slot),
		})
	}

	m.ga.Forward(be, fa, x, n)
	m.gb.Forward(be, t, fa, n)
	linattn.GatedRMSNorm(core, core, t, m.oNorm, dk, m.eps, linattn.GateSigmoid)
	m.o.Forward(be, y, core, n)
	a.Release(mark)
}
