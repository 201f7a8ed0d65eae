package mla

import (
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Attention is one layer's multi-head latent attention on the op set
// (a gqa.Mixer), optionally restricted by a DSA selection. Its cache layer
// holds, per token, K = [latent (KVLora) | rotated k_pe (Rope)] and, when the
// layer has an Indexer, V = the index key (Indexer.Shape.Dim); otherwise V
// is empty.
type Attention struct {
	Layer int              // cache layer index
	Shape kernels.MLAShape // Form is MLAAuto unless forced (tests, benchmarks)

	QA      *gqa.Linear     // q_a_proj (q_lora_rank, hidden); nil without q-LoRA
	QANorm  *gqa.Norm       // q_a_layernorm (q_lora_rank), eps 1e-6; nil without q-LoRA
	QB      gqa.Linear      // q_b_proj (Heads·(Nope+Rope), q_lora_rank), or q_proj (…, hidden) without q-LoRA
	KVA     gqa.Linear      // kv_a_proj_with_mqa (KVLora+Rope, hidden)
	KVANorm *gqa.Norm       // kv_a_layernorm (KVLora), eps 1e-6
	KVB     *kernels.Mat    // kv_b_proj (Heads·(Nope+V), KVLora), no bias: per head [W_UK (Nope rows) | W_UV (V rows)]
	O       gqa.Linear      // o_proj (hidden, Heads·V)
	Rope    *kernels.Rotary // rotates q_pe and k_pe (Dim = Rope)

	// Indexer is the layer's DSA lightning indexer; nil for dense MLA and
	// for shared DSA layers.
	Indexer *Indexer
	// Share, for a shared DSA layer (no indexer of its own), is the earlier
	// layer whose selection this layer reuses in the same forward pass.
	Share *Attention

	ops ops
	sel kernels.Tensor // (N, TopK) I32 the last pass's selection; zero when it attended densely
}

var _ gqa.Mixer = (*Attention)(nil)

// Forward implements gqa.Mixer: y (N, hidden) = MLA(h (N, hidden)) for the
// normed layer input h, after storing the step's latents (and index keys).
func (a *Attention) Forward(c *gqa.Ctx, y, h kernels.Tensor) {
	dev, n, s := c.Dev, c.N, a.Shape
	q := dev.Scratch(kernels.F32, n, s.Heads*(s.Nope+s.Rope)) // (N, Heads·(Nope+Rope))
	var qr kernels.Tensor                                     // (N, q_lora_rank) normed q latent; zero without q-LoRA
	if a.QA != nil {
		qr = dev.Scratch(kernels.F32, n, a.QA.W.Rows)
		a.QA.Forward(dev, qr, h, false)
		a.QANorm.Apply(dev, qr, qr)
		a.QB.Forward(dev, q, qr, false)
	} else {
		a.QB.Forward(dev, q, h, false)
	}
	kv := dev.Scratch(kernels.F32, n, s.KVLora+s.Rope) // (N, KVLora+Rope): [c̃ | k_pe]
	a.KVA.Forward(dev, kv, h, false)
	kc, ic := c.Cache(a.Layer)
	a.ops.mla.StoreLatent(kc, kv, a.KVANorm.W, a.KVANorm.Eps, a.Rope, &c.Paged)

	switch {
	case a.Indexer != nil:
		a.sel = a.Indexer.Forward(c, ic, h, qr)
	case a.Share != nil:
		a.sel = a.Share.sel
	}
	o := dev.Scratch(kernels.F32, n, s.Heads*s.V) // (N, Heads·V)
	a.ops.mla.AttentionMLA(o, q, kc, a.KVB, a.Rope, &c.Paged, s, a.sel)
	a.O.Forward(dev, y, o, false)
}

// TopK is the DSA selection size of the layer (0 for dense MLA).
func (a *Attention) TopK() int {
	switch {
	case a.Indexer != nil:
		return a.Indexer.Shape.TopK
	case a.Share != nil:
		return a.Share.TopK()
	}
	return 0
}

// Selection reads back the positions every row of the last forward pass
// attended to in this layer: the layer's own selection (Indexer), the
// shared source's (Share), or nil (dense: every visible position; also
// when every row of the pass saw at most TopK positions). Outside a step
// only; for tests and inspection.
func (a *Attention) Selection() [][]int32 {
	if !a.sel.Valid() {
		return nil
	}
	flat := make([]int32, a.sel.Elems())
	a.ops.sp.ReadI32(flat, a.sel)
	rows := make([][]int32, a.sel.Rows)
	k := a.sel.Cols
	for i := range rows {
		row := flat[i*k : (i+1)*k]
		n := 0
		for n < k && row[n] >= 0 {
			n++
		}
		rows[i] = row[:n]
	}
	return rows
}
