package glm5next

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// kda loads a Kimi Delta Attention layer (self_attn.* of a
// linear_attention layer under pre, "model.language_model.layers.0.self_attn.")
// as engine/gqa's linear-attention mixer. With C = heads·dk channels (q, k
// and v all have `heads` heads of dk; no GQA):
//
//	[q|k|v] = silu(causal_conv([q_proj x | k_proj x | v_proj x]))   rolling conv state
//	g       = lower·sigmoid(exp(A_log)·(f_b(f_a(x)) + dt_bias))      per channel (softplus form without a bound)
//	β       = sigmoid(b_proj x)                                      per head
//	q̂, k̂   = L2-normalised (q̂ also × dk^-½)
//	o       = gated delta rule with per-channel decay, continuing from the slot's state
//	y       = o_proj( o_norm.w ⊙ rmsnorm(o) ⊙ sigmoid(g_b(g_a(x))) )   per head
//
// q_proj, k_proj and v_proj are stacked into one product; the gates, the
// L2 norms and the rule are one DeltaRule op. It accepts the checkpoint
// names (three {q,k,v}_conv1d tensors, the forget gate without a prefix)
// and transformers' in-memory names (one conv1d [3C, 1, K],
// forget_gate.*). state is the layer's index in StateLayout.
func (l *loader) kda(pre string, state int) *gqa.LinearAttention {
	p := l.p
	h, dk, K := p.linHeads, p.linDim, p.convK
	C := h * dk
	fg := pre
	if l.Has(pre + "forget_gate.f_a_proj.weight") {
		fg = pre + "forget_gate."
	}
	var w []float32 // (3C, 1, K)
	if l.Has(pre + "conv1d.weight") {
		w = l.Tensor(pre+"conv1d.weight", 3*C, 1, K)
	} else {
		for _, n := range []string{"q", "k", "v"} {
			w = append(w, l.Tensor(pre+n+"_conv1d.weight", C, 1, K)...)
		}
	}
	return &gqa.LinearAttention{
		Slot:  state,
		QKV:   gqa.Linear{W: l.qkv(pre, C)},
		Z:     gqa.Proj{l.linear(pre+"g_a_proj", dk, p.hidden), l.linear(pre+"g_b_proj", C, dk)},
		A:     gqa.Proj{l.linear(fg+"f_a_proj", dk, p.hidden), l.linear(fg+"f_b_proj", C, dk)},
		B:     l.linear(pre+"b_proj", h, p.hidden),
		Conv:  l.u.Tensor(w, 3*C),
		Width: K,
		Net: kernels.DeltaNet{
			Heads: h, KeyHeads: h, DK: dk, DV: dk, PerChannel: true,
			ALog:       l.u.Vec(l.Vec(fg+"A_log", h)),
			DtBias:     l.u.Vec(l.Vec(fg+"dt_bias", C)),
			LowerBound: p.lowerBound,
		},
		Norm: l.u.Norm(l.RMSNorm(pre+"o_norm", dk, p.eps, false)),
		Gate: kernels.GateSigmoid,
		Out:  l.linear(pre+"o_proj", p.hidden, C),
	}
}

// qkv loads q_proj, k_proj and v_proj (C, hidden) each under pre and
// stacks them by rows, recording an error when they cannot be.
func (l *loader) qkv(pre string, C int) *kernels.Mat {
	var ms []*kernels.Mat
	for _, n := range []string{"q_proj", "k_proj", "v_proj"} {
		m := l.Mat(pre+n+".weight", C, l.p.hidden)
		if m.Rows == 0 {
			return m // the loader has the error
		}
		ms = append(ms, m)
	}
	out, err := gqa.StackRows(ms...)
	if err != nil {
		l.Fail(fmt.Errorf("%s{q,k,v}_proj: %w", pre, err))
	}
	return out
}
