package gqa

import (
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Proj is a projection applied as a chain of linears, x·W₀ᵀ·W₁ᵀ…: one
// matrix, or a low-rank pair (KDA's f_a/f_b and g_a/g_b).
type Proj []Linear

// Out is the chain's output width.
func (p Proj) Out() int { return p[len(p)-1].W.Rows }

// forward sets dst (N, Out()) = p(x).
func (p Proj) forward(c *Ctx, dst, x kernels.Tensor) {
	for i := range p {
		if i == len(p)-1 {
			p[i].Forward(c.Dev, dst, x, false)
			break
		}
		t := c.Dev.Scratch(kernels.F32, c.N, p[i].W.Rows) // (N, rank)
		p[i].Forward(c.Dev, t, x, false)
		x = t
	}
}

// LinearAttention is a gated-delta-rule mixer (Gated DeltaNet, KDA) on the
// op set, with Hk = Net.KeyHeads, Hv = Net.Heads:
//
//	[q|k|v] = silu(conv(QKV(h)))                      continuing the conv state
//	o       = DeltaRule([q|k|v], A(h), B(h))          continuing the state S
//	y       = Out(Norm.W ⊙ rmsnorm(o) ⊙ gate(Z(h)))   per value head
//
// The rule L2-normalises q and k and forms the gates from A's and B's raw
// outputs (kernels.DeltaNet). Its two states live in the batch's state pool
// at entry Slot of StateLayout.
type LinearAttention struct {
	Slot  int            // this layer's index in the state layout
	QKV   Linear         // (2·Hk·DK + Hv·DV, hidden) rows in [q | k | v] order
	Z     Proj           // → (Hv·DV) output-gate input
	A     Proj           // → (Hv) or (Hv·DK) raw decay input
	B     Linear         // (Hv, hidden) raw write strength
	Conv  kernels.Tensor // (2·Hk·DK + Hv·DV, K) F32 depthwise conv weights
	Net   kernels.DeltaNet
	Norm  *Norm        // (1, DV) gated RMSNorm weight (plain w)
	Gate  kernels.Gate // the output gate: SiLU (GDN) or sigmoid (KDA)
	Out   Linear       // (hidden, Hv·DV)
	Width int          // conv kernel width K
}

// StateShape is the layer's per-sequence state.
func (m *LinearAttention) StateShape() linattn.LayerShape {
	return linattn.LayerShape{Heads: m.Net.Heads, DK: m.Net.DK, DV: m.Net.DV, ConvK: m.Width, ConvChannels: m.Net.QKVWidth()}
}

// Forward implements Mixer.
func (m *LinearAttention) Forward(c *Ctx, y, h kernels.Tensor) {
	dev, n, net := c.Dev, c.N, &m.Net
	s, conv := c.States(m.Slot)
	raw := dev.Scratch(kernels.F32, n, net.QKVWidth()) // (N, 2·Hk·DK + Hv·DV) [q | k | v] before the convolution
	m.QKV.Forward(dev, raw, h, false)
	// Out of place: a GPU convolves a prompt's rows all at once, which in
	// place would need a copy of them (kernels/cuda's ShortConv).
	qkv := dev.Scratch(kernels.F32, n, net.QKVWidth()) // (N, 2·Hk·DK + Hv·DV) convolved
	c.Lin.ShortConv(qkv, raw, m.Conv, conv, c.Rec)
	a := dev.Scratch(kernels.F32, n, m.A.Out()) // (N, Hv) or (N, Hv·DK)
	m.A.forward(c, a, h)
	b := dev.Scratch(kernels.F32, n, net.Heads) // (N, Hv)
	m.B.Forward(dev, b, h, false)
	o := dev.Scratch(kernels.F32, n, net.Heads*net.DV) // (N, Hv·DV)
	c.Lin.DeltaRule(o, qkv, a, b, s, c.Rec, net)
	z := dev.Scratch(kernels.F32, n, net.Heads*net.DV) // (N, Hv·DV)
	m.Z.forward(c, z, h)
	oh, zh := o.Reshape(n*net.Heads, net.DV), z.Reshape(n*net.Heads, net.DV)
	c.Lin.GatedRMSNorm(oh, oh, zh, m.Norm.W, m.Norm.Eps, m.Gate)
	m.Out.Forward(dev, y, o, false)
}
