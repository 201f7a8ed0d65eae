package gqa

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Ctx is what a block needs during one step: the device, the cache layers
// and the step's row maps, all on the device.
type Ctx struct {
	Dev   kernels.Device
	N     int // rows (tokens) in the step
	Paged kernels.Paged
	Cache func(layer int) (k, v kernels.Tensor)

	// Hybrid models: the device's linear-attention ops, the step's
	// sequence → state-slot map and state layer l's tensors (S, conv).
	Lin    kernels.LinearAttentionOps
	Rec    *kernels.Recurrent
	States func(l int) (s, conv kernels.Tensor)
}

// Mixer is a block's token mixer: GQA attention over the KV cache or
// linear attention over the recurrent state.
type Mixer interface {
	// Forward sets y (N, hidden) = Mixer(h (N, hidden)), storing the step's
	// keys and values or advancing each sequence's state.
	Forward(c *Ctx, y, h kernels.Tensor)
}

// Norm is an RMSNorm's weight on the device.
type Norm struct {
	W      kernels.Tensor // (1, dim) F32
	Eps    float32
	Offset bool
}

// Linear is a weight in its stored dtype and an optional bias.
type Linear struct {
	W *kernels.Mat   // (out, in)
	B kernels.Tensor // (1, out) F32; zero Tensor when absent
}

func (l *Linear) forward(dev kernels.Device, dst, x kernels.Tensor, acc bool) {
	dev.Linear(dst, x, l.W, kernels.Epilogue{Bias: l.B, Accumulate: acc})
}

// Attention is a GQA self-attention block: q/k/v projections, optional
// per-head QK norm, RoPE, paged causal attention, an optional output gate
// and the output projection.
type Attention struct {
	Layer        int // cache layer
	Q, K, V, O   Linear
	QNorm, KNorm *Norm // nil when absent
	Rope         *kernels.Rotary
	Shape        kernels.AttnShape

	// Gate, when set, gates the attention output per channel before O:
	// o ⊙= sigmoid(Gate(h)) (Qwen3-Next); (heads·headDim, hidden).
	Gate *Linear
}

// Forward sets y (N, hidden) = Attention(h (N, hidden)) and stores the
// step's keys and values in the cache.
func (a *Attention) Forward(c *Ctx, y, h kernels.Tensor) {
	dev, n, s := c.Dev, c.N, a.Shape
	q := dev.Scratch(kernels.F32, n, s.Heads*s.HeadDim)   // (N, heads·headDim)
	k := dev.Scratch(kernels.F32, n, s.KVHeads*s.HeadDim) // (N, kvHeads·headDim)
	v := dev.Scratch(kernels.F32, n, s.KVHeads*s.HeadDim) // (N, kvHeads·headDim)
	a.Q.forward(dev, q, h, false)
	a.K.forward(dev, k, h, false)
	a.V.forward(dev, v, h, false)
	if a.QNorm != nil {
		qh := q.Reshape(n*s.Heads, s.HeadDim)
		dev.RMSNorm(qh, qh, a.QNorm.W, a.QNorm.Eps, a.QNorm.Offset)
	}
	if a.KNorm != nil {
		kh := k.Reshape(n*s.KVHeads, s.HeadDim)
		dev.RMSNorm(kh, kh, a.KNorm.W, a.KNorm.Eps, a.KNorm.Offset)
	}
	if a.Rope != nil {
		dev.RoPE(q, s.Heads, s.HeadDim, c.Paged.Pos, a.Rope)
		dev.RoPE(k, s.KVHeads, s.HeadDim, c.Paged.Pos, a.Rope)
	}
	kc, vc := c.Cache(a.Layer)
	dev.StoreKV(kc, vc, k, v, &c.Paged)
	o := dev.Scratch(kernels.F32, n, s.Heads*s.HeadDim) // (N, heads·headDim)
	dev.Attention(o, q, kc, vc, &c.Paged, s)
	if a.Gate != nil {
		g := dev.Scratch(kernels.F32, n, s.Heads*s.HeadDim) // (N, heads·headDim)
		a.Gate.forward(dev, g, h, false)
		c.Lin.SigmoidGate(o, o, g, false)
	}
	a.O.forward(dev, y, o, false)
}

// FFN is a feed-forward block on the op set.
type FFN interface {
	// Forward sets y (N, hidden) = FFN(h (N, hidden)).
	Forward(c *Ctx, y, h kernels.Tensor)
}

// MLP is the SwiGLU feed-forward block: down(silu(gate(h)) ⊙ up(h)).
type MLP struct {
	Gate, Up, Down Linear
}

// forward sets y (N, hidden) = MLP(h), or adds it to y when acc (shared
// experts on top of routed ones).
func (m *MLP) forward(c *Ctx, y, h kernels.Tensor, acc bool) {
	inter := m.Gate.W.Rows
	g := c.Dev.Scratch(kernels.F32, c.N, inter) // (N, inter)
	u := c.Dev.Scratch(kernels.F32, c.N, inter) // (N, inter)
	m.Gate.forward(c.Dev, g, h, false)
	m.Up.forward(c.Dev, u, h, false)
	c.Dev.SwiGLU(g, g, u)
	m.Down.forward(c.Dev, y, g, acc)
}

// Forward implements FFN.
func (m *MLP) Forward(c *Ctx, y, h kernels.Tensor) { m.forward(c, y, h, false) }

// MoE is a routed mixture of SwiGLU experts plus optional shared experts:
// y = Σ_k w_k·Expert_k(h) + g·Shared(h), g = sigmoid(SharedGate(h)) for
// Qwen-style gated shared experts and 1 otherwise.
type MoE struct {
	Gate       *kernels.Mat // (experts, hidden) router
	Router     kernels.Router
	Experts    []kernels.Expert
	Shared     *MLP    // nil when absent
	SharedGate *Linear // (1, hidden); nil when ungated
}

// Forward implements FFN.
func (m *MoE) Forward(c *Ctx, y, h kernels.Tensor) {
	dev := c.Dev
	logits := dev.Scratch(kernels.F32, c.N, m.Gate.Rows) // (N, experts)
	dev.Linear(logits, h, m.Gate, kernels.Epilogue{})
	ids := dev.Scratch(kernels.I32, c.N, m.Router.TopK) // (N, topK)
	w := dev.Scratch(kernels.F32, c.N, m.Router.TopK)   // (N, topK)
	dev.Route(ids, w, logits, &m.Router)
	dev.Experts(y, h, ids, w, m.Experts)
	switch {
	case m.SharedGate != nil:
		sh := dev.Scratch(kernels.F32, c.N, h.Cols) // (N, hidden)
		m.Shared.forward(c, sh, h, false)
		g := dev.Scratch(kernels.F32, c.N, 1) // (N, 1)
		m.SharedGate.forward(dev, g, h, false)
		c.Lin.SigmoidGate(y, sh, g, true)
	case m.Shared != nil:
		m.Shared.forward(c, y, h, true)
	}
}

// Block is a pre-norm decoder layer, x += Mixer(AttnNorm(x)); x += FFN(FFNNorm(x)),
// run with the residual adds fused into the next norm (see Forward).
type Block struct {
	AttnNorm *Norm // input_layernorm
	Mixer    Mixer // *Attention or *LinearAttention
	FFNNorm  *Norm // post_attention_layernorm
	FFN      FFN
}

// Forward runs the block on the residual stream x (N, hidden). On entry h
// holds AttnNorm(x); on return x holds x + Attn, and y the FFN output still
// to be added to x, which the caller fuses with the next norm (AddRMSNorm).
func (b *Block) Forward(c *Ctx, x, h, y kernels.Tensor) {
	b.Mixer.Forward(c, y, h)
	c.Dev.AddRMSNorm(h, x, y, b.FFNNorm.W, b.FFNNorm.Eps, b.FFNNorm.Offset)
	b.FFN.Forward(c, y, h)
}

// Uploader moves a host-loaded model's small weights (norms, biases,
// frequencies, gate parameters) to the device, keeping the first error.
type Uploader struct {
	Dev kernels.Device
	Err error
}

// Vec uploads v as a (1, len(v)) F32 tensor; nil gives the zero Tensor.
func (u *Uploader) Vec(v []float32) kernels.Tensor {
	return u.Mat(v, 1, len(v))
}

// Mat uploads v as a (rows, cols) F32 tensor; nil gives the zero Tensor.
func (u *Uploader) Mat(v []float32, rows, cols int) kernels.Tensor {
	if v == nil || u.Err != nil {
		return kernels.Tensor{}
	}
	t, err := u.Dev.Alloc(kernels.F32, rows, cols)
	if err != nil {
		u.Err = err
		return t
	}
	u.Dev.WriteF32(t, v)
	return t
}

// Norm uploads an RMSNorm's weight; nil gives nil.
func (u *Uploader) Norm(n *nn.RMSNorm) *Norm {
	if n == nil {
		return nil
	}
	return &Norm{W: u.Vec(n.W), Eps: n.Eps, Offset: n.Offset}
}

// Linear keeps l's weight and uploads its bias.
func (u *Uploader) Linear(l *nn.Linear) Linear { return Linear{W: l.W, B: u.Vec(l.B)} }

func (u *Uploader) mlp(m *nn.MLP) *MLP {
	if m == nil {
		return nil
	}
	return &MLP{Gate: u.Linear(m.Gate), Up: u.Linear(m.Up), Down: u.Linear(m.Down)}
}

// Attention converts a loaded GQA attention block.
func (u *Uploader) Attention(a *nn.SelfAttention) *Attention {
	at := &Attention{
		Layer: a.Attn.Layer,
		Q:     u.Linear(a.Q), K: u.Linear(a.K), V: u.Linear(a.V), O: u.Linear(a.O),
		QNorm: u.Norm(a.QNorm), KNorm: u.Norm(a.KNorm),
		Shape: kernels.AttnShape{Heads: a.Attn.Heads, KVHeads: a.Attn.KVHeads, HeadDim: a.Attn.HeadDim, Scale: a.Attn.Scale},
	}
	at.Rope = u.Rotary(a.Rope)
	return at
}

// Rotary uploads a RoPE's inverse frequencies; nil gives nil.
func (u *Uploader) Rotary(r *nn.RoPE) *kernels.Rotary {
	if r == nil {
		return nil
	}
	return &kernels.Rotary{InvFreq: u.Vec(r.InvFreq()), Dim: r.Dim, Interleaved: r.Interleaved, Scale: r.Scale}
}

// FFN converts a loaded feed-forward block (*nn.MLP or *nn.MoE).
func (u *Uploader) FFN(f nn.FFN) (FFN, error) {
	switch f := f.(type) {
	case *nn.MLP:
		return u.mlp(f), u.Err
	case *nn.MoE:
		r := f.Router
		m := &MoE{
			Gate: r.W,
			Router: kernels.Router{
				Bias: u.Vec(r.Bias), Scoring: kernels.Scoring(r.Scoring), TopK: r.TopK, NormTopK: r.NormTopK,
				Scale: r.Scale, Groups: r.Groups, TopKGroups: r.TopKGroups,
			},
			Experts: f.Experts,
			Shared:  u.mlp(f.Shared),
		}
		if f.SharedGate != nil {
			g := u.Linear(f.SharedGate)
			m.SharedGate = &g
		}
		return m, u.Err
	}
	return nil, fmt.Errorf("gqa: feed-forward block %T is not on the op set", f)
}

// Block converts a loaded GQA block.
func (u *Uploader) Block(b *nn.Block) (*Block, error) {
	ffn, err := u.FFN(b.FFN)
	if err != nil {
		return nil, err
	}
	return &Block{AttnNorm: u.Norm(b.AttnNorm), Mixer: u.Attention(b.Attn), FFNNorm: u.Norm(b.FFNNorm), FFN: ffn}, u.Err
}
