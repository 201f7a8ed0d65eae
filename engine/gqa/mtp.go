package gqa

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// NextN is the DeepSeek/GLM multi-token-prediction layer on the op set:
//
//	x      = eh_proj([enorm(embed(tok_{p+1})) | hnorm(h_p)])
//	x      = Block(x)                        at position p, its own cache layer
//	logits = head(norm(x))
//
// eh_proj is kept as its two column halves, so the concatenation is two
// products into one accumulator.
type NextN struct {
	Embed        *kernels.Mat // (vocab, hidden) its own embedding; nil: the decoder's
	ENorm, HNorm *Norm        // (hidden) each
	EH, HH       Linear
	Block        *Block       // GQA attention at cache layer len(Layout) of the decoder
	Norm         *Norm        // shared_head.norm (hidden)
	Head         *kernels.Mat // (vocab, hidden)
}

// MTPDecoder is a Decoder with a NextN layer; it implements model.MTPModel.
type MTPDecoder struct {
	*Decoder
	MTP *NextN
}

// AddNextN converts a host-loaded NextN layer (block at cache layer
// len(d.Layout), which it appends) and returns the model with it.
func (d *Decoder) AddNextN(enorm, hnorm *nn.RMSNorm, ehProj *nn.Linear, block *nn.Block, norm *nn.RMSNorm, head *kernels.Mat) (*MTPDecoder, error) {
	u := &Uploader{Dev: d.Dev}
	blk, err := u.Block(block)
	if err != nil {
		return nil, err
	}
	e, h, err := SplitCols(ehProj.W)
	if err != nil {
		return nil, err
	}
	m := &NextN{
		ENorm: u.Norm(enorm), HNorm: u.Norm(hnorm),
		EH: Linear{W: e, B: u.Vec(ehProj.B)}, HH: Linear{W: h},
		Block: blk, Norm: u.Norm(norm), Head: head,
	}
	if u.Err != nil {
		return nil, u.Err
	}
	return d.WithNextN(m)
}

// WithNextN returns d with the NextN layer m, whose block's attention
// takes the cache layer it appends to d.Layout.
func (d *Decoder) WithNextN(m *NextN) (*MTPDecoder, error) {
	at, ok := m.Block.Mixer.(*Attention)
	if !ok {
		return nil, fmt.Errorf("gqa: NextN block mixer %T, want attention", m.Block.Mixer)
	}
	if at.Layer != len(d.Layout) {
		return nil, fmt.Errorf("gqa: NextN block at cache layer %d, want %d", at.Layer, len(d.Layout))
	}
	if needsLin(m.Block) && d.lin == nil {
		return nil, fmt.Errorf("%w: backend %s lacks the linear-attention ops the MTP layer needs", model.ErrOpSet, d.Dev.Name())
	}
	kv := at.Shape.KVHeads * at.Shape.HeadDim
	d.Layout = append(d.Layout, kvcache.LayerWidth{K: kv, V: kv, DType: d.Layout[0].DType})
	return &MTPDecoder{Decoder: d, MTP: m}, nil
}

// ForwardMTP implements model.MTPModel.
func (m *MTPDecoder) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	d, hs := m.Decoder, m.Embed.Cols
	validate := func() error { return b.ValidateHidden(hidden, hs) }
	return d.forward(b, m.MTP.Head.Rows, validate, func(st *step) (*model.Output, error) { return m.mtp(b, st, hidden) })
}

// mtp runs the NextN layer; d.mu is held.
func (m *MTPDecoder) mtp(b *model.Batch, st *step, hidden [][]float32) (*model.Output, error) {
	d, hs := m.Decoder, m.Embed.Cols
	var err error
	n := b.Tokens()
	if !d.in.hid.Valid() || d.in.hid.Rows < n {
		if d.in.hid, err = d.Dev.Alloc(kernels.F32, max(n, 2*d.in.hid.Rows, 16), hs); err != nil {
			return nil, fmt.Errorf("mtp: step inputs: %w", err)
		}
	}
	hid := d.in.hid.Slice(0, n) // (N, hidden) the main model's hidden states
	d.in.hHid = d.in.hHid[:0]
	for _, h := range hidden {
		d.in.hHid = append(d.in.hHid, h...)
	}
	d.Dev.WriteF32(hid, d.in.hHid)
	nx := m.MTP
	prologue := func(c *Ctx, x kernels.Tensor) {
		dev := c.Dev
		e := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
		embed := nx.Embed
		if embed == nil {
			embed = d.Embed
		}
		dev.Embed(e, embed, st.ids)
		dev.RMSNorm(e, e, nx.ENorm.W, nx.ENorm.Eps, nx.ENorm.Offset)
		hn := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
		dev.RMSNorm(hn, hid, nx.HNorm.W, nx.HNorm.Eps, nx.HNorm.Offset)
		nx.EH.forward(dev, x, e, false)
		nx.HH.forward(dev, x, hn, true)
	}
	return d.run(b, st, prologue, []*Block{nx.Block}, nx.Norm, nx.Head), nil
}
