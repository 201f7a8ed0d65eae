package gqa

import (
	"fmt"

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
	ENorm, HNorm *Norm // (hidden) each
	EH, HH       Linear
	Block        *Block
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
	u := &uploader{dev: d.Dev}
	blk, err := u.block(block)
	if err != nil {
		return nil, err
	}
	if blk.Attn.Layer != len(d.Layout) {
		return nil, fmt.Errorf("gqa: NextN block at cache layer %d, want %d", blk.Attn.Layer, len(d.Layout))
	}
	e, h, err := splitCols(ehProj.W)
	if err != nil {
		return nil, err
	}
	m := &NextN{
		ENorm: u.norm(enorm), HNorm: u.norm(hnorm),
		EH: Linear{W: e, B: u.vec(ehProj.B)}, HH: Linear{W: h},
		Block: blk, Norm: u.norm(norm), Head: head,
	}
	if u.err != nil {
		return nil, u.err
	}
	d.Layout = append(d.Layout, d.Layout[0])
	return &MTPDecoder{Decoder: d, MTP: m}, nil
}

// splitCols copies the left and right column halves of w (rows, 2·k) into
// two (rows, k) matrices; a block-quantized w splits between its blocks.
func splitCols(w *kernels.Mat) (left, right *kernels.Mat, err error) {
	k := w.Cols / 2
	if w.Cols%2 != 0 || w.DType == kernels.F8E4M3 || k%w.DType.BlockElems() != 0 || w.DType.RowBytes(k) == 0 {
		return nil, nil, fmt.Errorf("gqa: eh_proj %v (%d, %d) cannot be split into column halves", w.DType, w.Rows, w.Cols)
	}
	rb, hb := w.DType.RowBytes(w.Cols), w.DType.RowBytes(k)
	left = &kernels.Mat{DType: w.DType, Rows: w.Rows, Cols: k, Data: make([]byte, w.Rows*hb)}
	right = &kernels.Mat{DType: w.DType, Rows: w.Rows, Cols: k, Data: make([]byte, w.Rows*hb)}
	for r := range w.Rows {
		copy(left.Data[r*hb:(r+1)*hb], w.Data[r*rb:r*rb+hb])
		copy(right.Data[r*hb:(r+1)*hb], w.Data[r*rb+hb:(r+1)*rb])
	}
	return left, right, nil
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
		dev.Embed(e, d.Embed, st.ids)
		dev.RMSNorm(e, e, nx.ENorm.W, nx.ENorm.Eps, nx.ENorm.Offset)
		hn := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
		dev.RMSNorm(hn, hid, nx.HNorm.W, nx.HNorm.Eps, nx.HNorm.Offset)
		nx.EH.forward(dev, x, e, false)
		nx.HH.forward(dev, x, hn, true)
	}
	return d.run(b, st, prologue, []*Block{nx.Block}, nx.Norm, nx.Head), nil
}
