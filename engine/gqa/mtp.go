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
	u := &Uploader{Dev: d.Dev}
	blk, err := u.block(block)
	if err != nil {
		return nil, err
	}
	if l := blk.Attn.(*Attention).Layer; l != len(d.Layout) {
		return nil, fmt.Errorf("gqa: NextN block at cache layer %d, want %d", l, len(d.Layout))
	}
	m, err := u.NextN(enorm, hnorm, ehProj, blk, norm, head)
	if err != nil {
		return nil, err
	}
	d.Layout = append(d.Layout, d.Layout[0])
	return &MTPDecoder{Decoder: d, MTP: m}, nil
}

// NextN uploads a NextN layer around block (already on the device).
func (u *Uploader) NextN(enorm, hnorm *nn.RMSNorm, ehProj *nn.Linear, block *Block, norm *nn.RMSNorm, head *kernels.Mat) (*NextN, error) {
	e, h, err := splitCols(ehProj.W)
	if err != nil {
		return nil, err
	}
	m := &NextN{
		ENorm: u.Norm(enorm), HNorm: u.Norm(hnorm),
		EH: Linear{W: e, B: u.Vec(ehProj.B)}, HH: Linear{W: h},
		Block: block, Norm: u.Norm(norm), Head: head,
	}
	return m, u.Err
}

// Input sets x (N, hidden) = eh_proj([enorm(embed(ids)) | hnorm(hid)]), the
// NextN layer's residual stream, for ids (N, 1) and the main model's
// hidden states hid (N, hidden).
func (m *NextN) Input(c *Ctx, x, ids, hid kernels.Tensor, embed *kernels.Mat) {
	dev, n, hs := c.Dev, c.N, x.Cols
	e := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
	dev.Embed(e, embed, ids)
	dev.RMSNorm(e, e, m.ENorm.W, m.ENorm.Eps, m.ENorm.Offset)
	hn := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
	dev.RMSNorm(hn, hid, m.HNorm.W, m.HNorm.Eps, m.HNorm.Offset)
	m.EH.Forward(dev, x, e, false)
	m.HH.Forward(dev, x, hn, true)
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
	return d.forward(b, m.MTP.Head.Rows, validate, func(st *Step) (*model.Output, error) { return m.mtp(b, st, hidden) })
}

// mtp runs the NextN layer; d.mu is held.
func (m *MTPDecoder) mtp(b *model.Batch, st *Step, hidden [][]float32) (*model.Output, error) {
	d := m.Decoder
	hid, err := d.in.UploadHidden(d.Dev, hidden, m.Embed.Cols)
	if err != nil {
		return nil, fmt.Errorf("mtp: %w", err)
	}
	prologue := func(c *Ctx, x kernels.Tensor) { m.MTP.Input(c, x, st.IDs, hid, d.Embed) }
	return d.run(b, st, prologue, []*Block{m.MTP.Block}, m.MTP.Norm, m.MTP.Head), nil
}

// UploadHidden writes the main model's hidden states (one slice per
// sequence, tokens × width) to dev for a NextN layer's step and returns
// them as (N, width).
func (in *Inputs) UploadHidden(dev kernels.Device, hidden [][]float32, width int) (kernels.Tensor, error) {
	in.hHid = in.hHid[:0]
	for _, h := range hidden {
		in.hHid = append(in.hHid, h...)
	}
	n := len(in.hHid) / width
	if !in.hid.Valid() || in.hid.Rows < n || in.hid.Cols != width {
		t, err := dev.Alloc(kernels.F32, max(n, 2*in.hid.Rows, 16), width)
		if err != nil {
			return t, fmt.Errorf("step inputs: %w", err)
		}
		in.hid = t
	}
	hid := in.hid.Slice(0, n) // (N, width)
	dev.WriteF32(hid, in.hHid)
	return hid, nil
}
