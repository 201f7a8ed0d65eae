package glm5next

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// kda is a Kimi Delta Attention layer (self_attn.* of a linear_attention
// layer) on the linear-attention ops. With C = heads·dk channels (q, k and
// v all have `heads` heads of dk; no GQA):
//
//	[q|k|v] = silu(causal_conv([q_proj x | k_proj x | v_proj x]))   rolling conv state
//	g       = lower·sigmoid(exp(A_log)·(f_b(f_a(x)) + dt_bias))      per channel (softplus form without a bound)
//	β       = sigmoid(b_proj x)                                      per head
//	q̂, k̂   = L2-normalised (q̂ also × dk^-½)
//	o       = gated delta rule with per-channel decay, continuing from the slot's state
//	y       = o_proj( o_norm.w ⊙ rmsnorm(o) ⊙ sigmoid(g_b(g_a(x))) )   per head
//
// The gates, the L2 norms and the rule are one DeltaRule op.
type kda struct {
	dev   device
	qkv   gqa.Linear       // (3C, hidden) q_proj, k_proj and v_proj stacked
	conv  kernels.Tensor   // (3C, K) F32 the three depthwise convolutions, [q|k|v]
	fa    gqa.Linear       // (dk, hidden) f_a_proj
	fb    gqa.Linear       // (C, dk) f_b_proj
	b     gqa.Linear       // (heads, hidden) b_proj
	ga    gqa.Linear       // (dk, hidden) g_a_proj
	gb    gqa.Linear       // (C, dk) g_b_proj
	oNorm *gqa.Norm        // (dk) o_norm (rms_norm_eps)
	o     gqa.Linear       // (hidden, C) o_proj
	net   kernels.DeltaNet // heads, dk, A_log (1, heads), dt_bias (1, C), linear_lower_bound
	state int              // index of this layer in StateLayout
	convK int
}

// kda loads a KDA layer under pre ("model.language_model.layers.0.self_attn.").
// It accepts the checkpoint names (three {q,k,v}_conv1d tensors, the forget
// gate without a prefix) and transformers' in-memory names (one conv1d
// [3C, 1, K], forget_gate.*).
func (l *loader) kda(pre string, state int) *kda {
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
	q, k, v := l.Mat(pre+"q_proj.weight", C, p.hidden), l.Mat(pre+"k_proj.weight", C, p.hidden), l.Mat(pre+"v_proj.weight", C, p.hidden)
	m := &kda{
		dev:   l.dev,
		qkv:   gqa.Linear{W: l.stack(pre+"{q,k,v}_proj", q, k, v)},
		conv:  l.u.Tensor(w, 3*C),
		fa:    l.linear(fg+"f_a_proj", dk, p.hidden),
		fb:    l.linear(fg+"f_b_proj", C, dk),
		b:     l.linear(pre+"b_proj", h, p.hidden),
		ga:    l.linear(pre+"g_a_proj", dk, p.hidden),
		gb:    l.linear(pre+"g_b_proj", C, dk),
		oNorm: l.u.Norm(l.RMSNorm(pre+"o_norm", dk, p.eps, false)),
		o:     l.linear(pre+"o_proj", p.hidden, C),
		net: kernels.DeltaNet{
			Heads: h, KeyHeads: h, DK: dk, DV: dk, PerChannel: true,
			ALog:       l.u.Vec(l.Vec(fg+"A_log", h)),
			DtBias:     l.u.Vec(l.Vec(fg+"dt_bias", C)),
			LowerBound: p.lowerBound,
		},
		state: state, convK: K,
	}
	return m
}

// stack concatenates matrices of one dtype and width by rows (q_proj,
// k_proj and v_proj into one product), recording an error under name when
// they cannot be.
func (l *loader) stack(name string, ms ...*kernels.Mat) *kernels.Mat {
	for _, m := range ms {
		if m == nil || m.Rows == 0 {
			return nil // the loader has the error
		}
	}
	out, err := stackRows(ms...)
	if err != nil {
		l.Fail(fmt.Errorf("%s: %w", name, err))
	}
	return out
}

// stackRows concatenates matrices by rows. Every dtype stores rows
// independently, except F8E4M3 with block scales, whose row blocks must not
// straddle two matrices.
func stackRows(ms ...*kernels.Mat) (*kernels.Mat, error) {
	first := ms[0]
	out := &kernels.Mat{DType: first.DType, Cols: first.Cols, BlockRows: first.BlockRows, BlockCols: first.BlockCols}
	for _, m := range ms {
		if m.DType != first.DType || m.Cols != first.Cols || m.BlockRows != first.BlockRows || m.BlockCols != first.BlockCols {
			return nil, fmt.Errorf("cannot stack %v (%d, %d) onto %v (%d, %d)", m.DType, m.Rows, m.Cols, first.DType, first.Rows, first.Cols)
		}
		if m.DType == kernels.F8E4M3 && m.BlockRows > 0 && m.Rows%m.BlockRows != 0 {
			return nil, fmt.Errorf("cannot stack F8E4M3 rows (%d) that do not fill their scale blocks (%d)", m.Rows, m.BlockRows)
		}
		out.Rows += m.Rows
		out.Data = append(out.Data, m.Data[:m.DType.RowBytes(m.Cols)*m.Rows]...)
		out.Scale = append(out.Scale, m.Scale...)
	}
	return out, nil
}

// shape is the layer's entry in StateLayout.
func (m *kda) shape() linattn.LayerShape {
	return linattn.LayerShape{Heads: m.net.Heads, DK: m.net.DK, DV: m.net.DV, ConvK: m.convK, ConvChannels: m.net.QKVWidth()}
}

// forward sets y (N, hidden) = KDA(x (N, hidden)) for every sequence of
// the pass, reading and updating each sequence's state slot.
func (m *kda) forward(c *pass, y, x kernels.Tensor) {
	dev, n := m.dev, c.N
	h, dk := m.net.Heads, m.net.DK
	C := h * dk
	S, conv := c.states.Tensors(m.state)
	qkv := dev.Scratch(kernels.F32, n, 3*C) // (N, 3C) [q | k | v], then the conv output in place
	m.qkv.Forward(dev, qkv, x, false)
	dev.ShortConv(qkv, qkv, m.conv, conv, c.rec)
	t := dev.Scratch(kernels.F32, n, dk) // (N, dk) f_a / g_a output
	a := dev.Scratch(kernels.F32, n, C)  // (N, C) the forget gate's input
	m.fa.Forward(dev, t, x, false)
	m.fb.Forward(dev, a, t, false)
	beta := dev.Scratch(kernels.F32, n, h) // (N, heads) β before its sigmoid
	m.b.Forward(dev, beta, x, false)
	core := dev.Scratch(kernels.F32, n, C) // (N, C) delta-rule output
	dev.DeltaRule(core, qkv, a, beta, S, c.rec, &m.net)

	z := dev.Scratch(kernels.F32, n, C) // (N, C) output gate
	m.ga.Forward(dev, t, x, false)
	m.gb.Forward(dev, z, t, false)
	ch, zh := core.Reshape(n*h, dk), z.Reshape(n*h, dk)
	dev.GatedRMSNorm(ch, ch, zh, m.oNorm.W, m.oNorm.Eps, kernels.GateSigmoid)
	m.o.Forward(dev, y, core, false)
}
