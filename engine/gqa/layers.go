package gqa

import (
	"fmt"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Ctx is what a block needs during one step: the device, the cache layers
// and the step's row maps, all on the device.
type Ctx struct {
	Dev   kernels.Device
	N     int // rows (tokens) in the step
	Paged kernels.Paged
	// Pos is the host copy of Paged.Pos (N), for decisions about shapes
	// (how wide a row's scores are); never read back from the device.
	Pos   []int32
	Cache func(layer int) (k, v kernels.Tensor)

	// Hybrid models: the device's linear-attention ops, the step's
	// sequence → state-slot map and state layer l's tensors (S, conv).
	Lin    kernels.LinearAttentionOps
	Rec    *kernels.Recurrent
	States func(l int) (s, conv kernels.Tensor)
}

// Mixer is a block's token-mixing sublayer: GQA Attention (optionally
// gated) and LinearAttention here, MLA in engine/models/mla, glm5_next's
// DSA in engine/models/glm5next.
type Mixer interface {
	// Forward sets y (N, hidden) from h (N, hidden), the normed block
	// input, storing the step's keys in the cache.
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

// Forward sets dst (N, out) = x (N, in)·Wᵀ + B, or adds it to dst when acc.
func (l *Linear) Forward(dev kernels.Device, dst, x kernels.Tensor, acc bool) {
	dev.Linear(dst, x, l.W, kernels.Epilogue{Bias: l.B, Accumulate: acc})
}

// Apply is an RMSNorm over the rows of x into dst (dst may be x).
func (n *Norm) Apply(dev kernels.Device, dst, x kernels.Tensor) {
	dev.RMSNorm(dst, x, n.W, n.Eps, n.Offset)
}

// Attention is a GQA self-attention block: q/k/v projections (one
// product over the three weights), optional per-head QK norm, RoPE, the
// cache store and paged causal attention (one op, QKVAttention), an
// optional output gate and the output projection.
type Attention struct {
	Layer      int // cache layer
	Q, K, V, O Linear
	// QKVB is the q, k and v biases side by side, (1, (heads + 2·kvHeads)·
	// headDim) F32 (Uploader.CatVec); the zero Tensor when there are none.
	// Q.B, K.B and V.B stay empty.
	QKVB         kernels.Tensor
	QNorm, KNorm *Norm // nil when absent
	Rope         *kernels.Rotary
	Shape        kernels.AttnShape

	// Gate, when set, gates the attention output per channel before O:
	// o ⊙= sigmoid(Gate(h)) (Qwen3-Next); (heads·headDim, hidden).
	Gate *Linear
}

// headNorm is n as the ops take it; nil for nil.
func (n *Norm) headNorm() *kernels.HeadNorm {
	if n == nil {
		return nil
	}
	return &kernels.HeadNorm{W: n.W, Eps: n.Eps, Offset: n.Offset}
}

// Forward sets y (N, hidden) = Attention(h (N, hidden)) and stores the
// step's keys and values in the cache.
func (a *Attention) Forward(c *Ctx, y, h kernels.Tensor) { a.run(c, streamIn{H: h}, y, false) }

// addsToStream implements streamAdder: without the output gate, which
// reads the normed input too.
func (a *Attention) addsToStream() bool { return a.Gate == nil }

// addsPending implements streamAdder (AddNormLinearCat).
func (a *Attention) addsPending() bool { return true }

// addForward implements streamAdder.
func (a *Attention) addForward(c *Ctx, in streamIn) { a.run(c, in, in.stream(), true) }

// run sets dst (N, hidden) = Attention of in (streamIn), or adds it to
// dst when acc; the norm and a pending add fuse into the q/k/v product
// (NormLinearCat, AddNormLinearCat).
func (a *Attention) run(c *Ctx, in streamIn, dst kernels.Tensor, acc bool) {
	if a.Q.B.Valid() || a.K.B.Valid() || a.V.B.Valid() {
		panic("gqa: q/k/v biases belong in Attention.QKVB")
	}
	dev, rows, s := c.Dev, c.N, a.Shape
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	qkv := dev.Scratch(kernels.F32, rows, qw+2*kw) // (N, (heads + 2·kvHeads)·headDim) [q | k | v]
	ws, e := []*kernels.Mat{a.Q.W, a.K.W, a.V.W}, kernels.Epilogue{Bias: a.QKVB}
	h := in.H
	switch {
	case h.Valid():
		dev.LinearCat(qkv, h, ws, e)
	case in.Delta.Valid():
		dev.AddNormLinearCat(qkv, in.Sum, in.X, in.Delta, in.N.headNorm(), ws, e)
	default:
		dev.NormLinearCat(qkv, in.X, in.N.headNorm(), ws, e)
	}
	kc, vc := c.Cache(a.Layer)
	o := dev.Scratch(kernels.F32, rows, qw) // (N, heads·headDim)
	dev.QKVAttention(o, kc, vc, qkv, a.QNorm.headNorm(), a.KNorm.headNorm(), a.Rope, &c.Paged, s)
	if a.Gate != nil {
		g := dev.Scratch(kernels.F32, rows, qw) // (N, heads·headDim)
		a.Gate.Forward(dev, g, h, false)
		c.Lin.SigmoidGate(o, o, g, false)
	}
	a.O.Forward(dev, dst, o, acc)
}

// FFN is a feed-forward block on the op set.
type FFN interface {
	// Forward sets y (N, hidden) = FFN(h (N, hidden)).
	Forward(c *Ctx, y, h kernels.Tensor)
}

// MLP is the SwiGLU feed-forward block: down(silu(gate(h)) ⊙ up(h)), or
// with a clamp L down(silu(min(gate(h), L)) ⊙ clamp(up(h), −L, L)).
type MLP struct {
	Gate, Up, Down Linear
	Limit          float32 // the SwiGLU clamp (swiglu_limit; kernels.ClampOps), 0 for none
}

// forward sets y (N, hidden) = MLP(h), or adds it to y when acc (shared
// experts on top of routed ones).
// Without biases on gate and up their products and the SwiGLU are one op
// (SwiGLULinear), and with h the zero Tensor the input is n(y), the norm
// fused into that op too (NormSwiGLULinear).
func (m *MLP) forward(c *Ctx, y, h kernels.Tensor, acc bool, n *Norm) {
	inter := m.Gate.W.Rows
	g := c.Dev.Scratch(kernels.F32, c.N, inter) // (N, inter)
	switch {
	case !h.Valid():
		c.Dev.NormSwiGLULinear(g, y, n.headNorm(), m.Gate.W, m.Up.W, m.Limit)
	case m.addsToStream():
		c.Dev.SwiGLULinear(g, h, m.Gate.W, m.Up.W, m.Limit)
	default:
		u := c.Dev.Scratch(kernels.F32, c.N, inter) // (N, inter)
		m.Gate.Forward(c.Dev, g, h, false)
		m.Up.Forward(c.Dev, u, h, false)
		if m.Limit != 0 {
			clampOps(c.Dev).SwiGLUClamp(g, g, u, m.Limit)
		} else {
			c.Dev.SwiGLU(g, g, u)
		}
	}
	m.Down.Forward(c.Dev, y, g, acc)
}

// Forward implements FFN.
func (m *MLP) Forward(c *Ctx, y, h kernels.Tensor) { m.forward(c, y, h, false, nil) }

// addsToStream implements streamAdder: without biases on gate and up.
func (m *MLP) addsToStream() bool { return !m.Gate.B.Valid() && !m.Up.B.Valid() }

// addsPending implements streamAdder: a pending add goes through the norm
// (AddRMSNorm) first.
func (m *MLP) addsPending() bool { return false }

// addForward implements streamAdder.
func (m *MLP) addForward(c *Ctx, in streamIn) { m.forward(c, in.X, in.H, true, in.N) }

// MoE is a routed mixture of SwiGLU experts plus optional shared experts:
// y = Σ_k w_k·Expert_k(h) + g·Shared(h), g = sigmoid(SharedGate(h)) for
// Qwen-style gated shared experts and 1 otherwise. On a backend with
// kernels.SharedExperts an ungated shared expert of the routed experts'
// shape is folded in (foldShared): the last of Experts, Router.Shared 1.
type MoE struct {
	Gate       *kernels.Mat // (experts, hidden) router
	Router     kernels.Router
	Experts    []kernels.Expert // (experts + Router.Shared)
	Limit      float32          // the experts' SwiGLU clamp (kernels.ClampOps), 0 for none; Shared has its own
	Shared     *MLP             // nil when absent
	SharedGate *Linear          // (1, hidden); nil when ungated
}

// Forward implements FFN.
func (m *MoE) Forward(c *Ctx, y, h kernels.Tensor) {
	dev := c.Dev
	logits := dev.Scratch(kernels.F32, c.N, m.Gate.Rows) // (N, experts)
	dev.Linear(logits, h, m.Gate, kernels.Epilogue{})
	ids := dev.Scratch(kernels.I32, c.N, m.Router.Width()) // (N, topK + folded shared)
	w := dev.Scratch(kernels.F32, c.N, m.Router.Width())   // (N, topK + folded shared)
	dev.Route(ids, w, logits, &m.Router)
	if m.Limit != 0 {
		clampOps(dev).ExpertsClamp(y, h, ids, w, m.Experts, m.Limit)
	} else {
		dev.Experts(y, h, ids, w, m.Experts)
	}
	switch {
	case m.SharedGate != nil:
		sh := dev.Scratch(kernels.F32, c.N, h.Cols) // (N, hidden)
		m.Shared.forward(c, sh, h, false, nil)
		g := dev.Scratch(kernels.F32, c.N, 1) // (N, 1)
		m.SharedGate.Forward(dev, g, h, false)
		c.Lin.SigmoidGate(y, sh, g, true)
	case m.Shared != nil:
		m.Shared.forward(c, y, h, true, nil)
	}
}

// clampOps is dev's clamped SwiGLU; a model with a clamp checks for it at
// load.
func clampOps(dev kernels.Device) kernels.ClampOps {
	c, ok := dev.(kernels.ClampOps)
	if !ok {
		panic("gqa: a clamped SwiGLU on a device without kernels.ClampOps")
	}
	return c
}

// Block is a pre-norm decoder layer, x += Mixer(AttnNorm(x)); x += FFN(FFNNorm(x)),
// run on a Residual (see Forward).
type Block struct {
	AttnNorm *Norm // input_layernorm
	Mixer    Mixer
	FFNNorm  *Norm // post_attention_layernorm
	FFN      FFN
}

// Forward runs the block's two sublayers on the residual stream r.
func (b *Block) Forward(c *Ctx, r *Residual) {
	r.Run(c, b.AttnNorm, b.Mixer)
	r.Run(c, b.FFNNorm, b.FFN)
}

// Residual is a step's pre-norm residual stream X (N, hidden) with the
// scratch its sublayers need: H for a sublayer's normed input and Y for
// its output. While Pending, Y holds a sublayer output still to be added
// to X, which the next norm does (AddRMSNorm) or, with Alt (N, hidden)
// set, the next attention's q/k/v product (AddNormLinearCat, writing X +
// Y to Alt, which becomes X).
type Residual struct {
	X, H, Y, Alt kernels.Tensor
	Pending      bool
}

// Sublayer is a block's Mixer or FFN: Forward sets y (N, hidden) from the
// normed input h (N, hidden).
type Sublayer interface {
	Forward(c *Ctx, y, h kernels.Tensor)
}

// streamAdder is a Sublayer that can add its output to the stream itself
// (the residual add in its last linear op's epilogue) and, given the
// un-normed stream, fuse the norm into its first linear op (NormLinearCat,
// NormSwiGLULinear): a decode step then runs no norm or add kernels.
type streamAdder interface {
	// addsToStream reports whether addForward applies to this sublayer.
	addsToStream() bool
	// addsPending reports whether it also takes a pending add (Delta).
	addsPending() bool
	// addForward adds the sublayer's output of in to in.stream().
	addForward(c *Ctx, in streamIn)
}

// streamIn is a streamAdder's input: S(H) when H is valid (normed
// already); else S(N(X)), or with Delta valid S(N(X + Delta)), X + Delta
// written to Sum. The output goes to the stream, X or (with Delta) Sum.
type streamIn struct {
	H, X, Delta, Sum kernels.Tensor
	N                *Norm
}

// stream is where the sublayer's output is added.
func (in streamIn) stream() kernels.Tensor {
	if in.Delta.Valid() {
		return in.Sum
	}
	return in.X
}

// Run sets X += s(n(X)): a streamAdder adds its output itself (fusing the
// norm, and a pending output if it takes one, else adding that through
// the norm first); any other sublayer gets H = n(X) and leaves its output
// in Y, pending.
func (r *Residual) Run(c *Ctx, n *Norm, s Sublayer) {
	if a, ok := s.(streamAdder); ok && a.addsToStream() {
		in := streamIn{X: r.X, N: n}
		switch {
		case r.Pending && a.addsPending() && r.Alt.Valid():
			in.Delta, in.Sum = r.Y, r.Alt
			r.X, r.Alt, r.Pending = r.Alt, r.X, false
		case r.Pending:
			in.H = r.Norm(c.Dev, n)
		}
		a.addForward(c, in)
		return
	}
	s.Forward(c, r.Y, r.Norm(c.Dev, n))
	r.Pending = true
}

// Norm sets H = n(X), first adding a pending Y to X (one AddRMSNorm), and
// returns H.
func (r *Residual) Norm(dev kernels.Device, n *Norm) kernels.Tensor {
	if r.Pending {
		dev.AddRMSNorm(r.H, r.X, r.Y, n.W, n.Eps, n.Offset)
		r.Pending = false
	} else {
		n.Apply(dev, r.H, r.X)
	}
	return r.H
}

// Uploader moves a host-loaded model's small weights (norms, biases,
// rotary frequencies) to the device and converts its blocks, keeping the
// first error (Err).
type Uploader struct {
	dev kernels.Device
	err error
}

// NewUploader returns an Uploader to dev.
func NewUploader(dev kernels.Device) *Uploader { return &Uploader{dev: dev} }

// Err is the first allocation error, or a block that is not on the op set.
func (u *Uploader) Err() error { return u.err }

// Vec uploads v as a (1, len(v)) F32 tensor; nil gives the zero Tensor.
func (u *Uploader) Vec(v []float32) kernels.Tensor { return u.Tensor(v, 1) }

// Tensor uploads v as a (rows, len(v)/rows) F32 tensor; nil gives the zero
// Tensor.
func (u *Uploader) Tensor(v []float32, rows int) kernels.Tensor {
	if v == nil || u.err != nil || rows <= 0 {
		return kernels.Tensor{}
	}
	t, err := u.dev.Alloc(kernels.F32, rows, len(v)/rows)
	if err != nil {
		u.err = err
		return t
	}
	u.dev.WriteF32(t, v)
	return t
}

// CatVec uploads vectors of the given widths side by side as one (1, Σ
// widths) F32 tensor, zeros for nil ones; all nil gives the zero Tensor
// (stacked biases, Attention.QKVB).
func (u *Uploader) CatVec(widths []int, vs ...[]float32) kernels.Tensor {
	if !slices.ContainsFunc(vs, func(v []float32) bool { return v != nil }) {
		return kernels.Tensor{}
	}
	var out []float32
	for i, v := range vs {
		if v == nil {
			v = make([]float32, widths[i])
		}
		out = append(out, v...)
	}
	return u.Vec(out)
}

// Norm uploads an RMSNorm's weight; nil gives nil.
func (u *Uploader) Norm(n *nn.RMSNorm) *Norm {
	if n == nil {
		return nil
	}
	return &Norm{W: u.Vec(n.W), Eps: n.Eps, Offset: n.Offset}
}

// Linear keeps the weight and uploads the bias.
func (u *Uploader) Linear(l *nn.Linear) Linear { return Linear{W: l.W, B: u.Vec(l.B)} }

// Rotary uploads a RoPE's inverse frequencies; nil gives nil.
func (u *Uploader) Rotary(r *nn.RoPE) *kernels.Rotary {
	if r == nil {
		return nil
	}
	return &kernels.Rotary{InvFreq: u.Vec(r.InvFreq()), Dim: r.Dim, Interleaved: r.Interleaved, Scale: r.Scale}
}

// MLP uploads a SwiGLU MLP's biases; nil gives nil.
func (u *Uploader) MLP(m *nn.MLP) *MLP {
	if m == nil {
		return nil
	}
	return &MLP{Gate: u.Linear(m.Gate), Up: u.Linear(m.Up), Down: u.Linear(m.Down)}
}

// FFN converts a dense SwiGLU MLP or a routed MoE (softmax or grouped
// noaux_tc routing, optional shared experts, gated or not).
func (u *Uploader) FFN(f nn.FFN) FFN {
	switch f := f.(type) {
	case *nn.MLP:
		return u.MLP(f)
	case *nn.MoE:
		r := f.Router
		m := &MoE{
			Gate: r.W,
			Router: kernels.Router{
				Bias: u.Vec(r.Bias), Scoring: kernels.Scoring(r.Scoring), TopK: r.TopK, NormTopK: r.NormTopK,
				Scale: r.Scale, Groups: r.Groups, TopKGroups: r.TopKGroups,
			},
			Experts: f.Experts,
			Shared:  u.MLP(f.Shared),
		}
		if f.SharedGate != nil {
			g := u.Linear(f.SharedGate)
			m.SharedGate = &g
		}
		if fs, ok := u.dev.(kernels.SharedExperts); ok && fs.FoldsSharedExperts() {
			foldShared(m, f.Shared)
		}
		return m
	}
	u.Fail(fmt.Errorf("gqa: feed-forward block %T is not on the op set", f))
	return nil
}

// foldShared makes m's shared expert sh the last of its experts, chosen by
// every token with weight 1 (kernels.Router.Shared), when it is ungated,
// without biases, of the routed experts' shape and clamp: y is then the
// same sum, the shared expert added after the routed ones as before.
func foldShared(m *MoE, sh *nn.MLP) {
	if sh == nil || m.SharedGate != nil || m.Shared == nil || m.Shared.Limit != m.Limit || len(m.Experts) == 0 ||
		sh.Gate.B != nil || sh.Up.B != nil || sh.Down.B != nil {
		return
	}
	e := m.Experts[0]
	if sh.Gate.W.Rows != e.Down.Cols || sh.Up.W.Rows != e.Down.Cols || sh.Down.W.Rows != e.Down.Rows ||
		sh.Gate.W.Cols != e.Down.Rows || sh.Up.W.Cols != e.Down.Rows {
		return
	}
	m.Experts = append(slices.Clip(m.Experts), kernels.Expert{Gate: sh.Gate.W, Up: sh.Up.W, Down: sh.Down.W, Shared: true})
	m.Router.Shared = 1
	m.Shared = nil
}

// Fail records err (the first one is kept).
func (u *Uploader) Fail(err error) {
	if u.err == nil {
		u.err = err
	}
}

// Attention converts a loaded GQA attention block.
func (u *Uploader) Attention(a *nn.SelfAttention) *Attention {
	return &Attention{
		Layer: a.Attn.Layer,
		Q:     Linear{W: a.Q.W}, K: Linear{W: a.K.W}, V: Linear{W: a.V.W}, O: u.Linear(a.O),
		QKVB:  u.CatVec([]int{a.Q.W.Rows, a.K.W.Rows, a.V.W.Rows}, a.Q.B, a.K.B, a.V.B),
		QNorm: u.Norm(a.QNorm), KNorm: u.Norm(a.KNorm),
		Shape: kernels.AttnShape{Heads: a.Attn.Heads, KVHeads: a.Attn.KVHeads, HeadDim: a.Attn.HeadDim, Scale: a.Attn.Scale},
		Rope:  u.Rotary(a.Rope),
	}
}

// Block converts a loaded host GQA block.
func (u *Uploader) Block(b *nn.Block) *Block {
	return &Block{AttnNorm: u.Norm(b.AttnNorm), Mixer: u.Attention(b.Attn), FFNNorm: u.Norm(b.FFNNorm), FFN: u.FFN(b.FFN)}
}
