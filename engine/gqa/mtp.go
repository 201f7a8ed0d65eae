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
	Block        *Block       // at cache layer len(Layout) of the decoder
	Norm         *Norm        // shared_head.norm (hidden)
	Head         *kernels.Mat // (vocab, hidden)
}

// MTPDecoder is a Decoder with a NextN layer; it implements model.MTPModel.
type MTPDecoder struct {
	*Decoder
	MTP *NextN

	spec specInputs // SpecDrafts' device inputs
}

// ReserveSteps implements model.StepReserver: the decoder's step inputs
// and the NextN layer's (tokens, hidden) input hidden states.
func (m *MTPDecoder) ReserveSteps(tokens, seqs, blocks int) error {
	if err := m.Decoder.ReserveSteps(tokens, seqs, blocks); err != nil {
		return err
	}
	d := m.Decoder
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ensure(d.Dev, &d.in.hid, kernels.F32, tokens, m.Embed.Cols, 16); err != nil {
		return fmt.Errorf("mtp: step inputs: %w", err)
	}
	return nil
}

// HasNextN reports whether the config declares a NextN layer
// (num_nextn_predict_layers ≥ 1) and the checkpoint holds it, as
// model.layers.{layers}.
func HasNextN(l *nn.Loader, nextn, layers int) bool {
	return nextn > 0 && l.Has(fmt.Sprintf("model.layers.%d.eh_proj.weight", layers))
}

// LoadNextN loads the prologue (enorm, hnorm, eh_proj) and the head
// (shared_head.norm, shared_head.head, lmHead when the checkpoint omits
// it: released checkpoints hold a copy of lm_head) of the NextN layer
// model.layers.{layer} around block, which the caller loaded and which
// caches in layer `layer`. Errors are the loader's and the uploader's.
func LoadNextN(l *nn.Loader, u *Uploader, layer, hidden int, eps float32, block *Block, lmHead *kernels.Mat) (*NextN, error) {
	return LoadNextNAt(l, u, fmt.Sprintf("model.layers.%d.", layer), hidden, eps, block, lmHead)
}

// LoadNextNAt is LoadNextN for a NextN layer under the tensor prefix pre
// (a vision-language checkpoint's "model.language_model.layers.N.").
func LoadNextNAt(l *nn.Loader, u *Uploader, pre string, hidden int, eps float32, block *Block, lmHead *kernels.Mat) (*NextN, error) {
	eh := l.Linear(pre+"eh_proj", hidden, 2*hidden, false)
	m := &NextN{
		ENorm: u.Norm(l.RMSNorm(pre+"enorm", hidden, eps, false)),
		HNorm: u.Norm(l.RMSNorm(pre+"hnorm", hidden, eps, false)),
		Block: block,
		Norm:  u.Norm(l.RMSNorm(pre+"shared_head.norm", hidden, eps, false)),
		Head:  lmHead,
	}
	if l.Has(pre + "shared_head.head.weight") {
		m.Head = l.Mat(pre+"shared_head.head.weight", lmHead.Rows, hidden)
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	e, h, err := SplitCols(eh.W)
	if err != nil {
		return nil, err
	}
	m.EH, m.HH = Linear{W: e, B: u.Vec(eh.B)}, Linear{W: h}
	return m, u.Err()
}

// WithNextN returns d with the NextN layer m, whose block caches in the
// layer it appends to d's layout (width, in d's cache dtype).
func (d *Decoder) WithNextN(m *NextN, width kvcache.LayerWidth) (*MTPDecoder, error) {
	if err := d.checkLin(m.Block); err != nil {
		return nil, err
	}
	width.DType = d.Layout[0].DType
	d.Layout = append(d.Layout, width)
	return &MTPDecoder{Decoder: d, MTP: m}, nil
}

// ForwardMTP implements model.MTPModel. hidden, the main model's rows
// handed over at the step boundary, is uploaded with the step's inputs.
func (m *MTPDecoder) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	d, hs := m.Decoder, m.Embed.Cols
	validate := func() error { return b.ValidateHidden(hidden, hs) }
	return d.forward(b, m.MTP.Head.Rows, validate, func(st *Step) (*model.Output, error) { return m.mtp(b, st, hidden) })
}

// mtp runs the NextN layer; d.mu is held. hidden is host memory only up to
// its upload with the step inputs, before the step begins.
func (m *MTPDecoder) mtp(b *model.Batch, st *Step, hidden [][]float32) (*model.Output, error) {
	d := m.Decoder
	hid, err := d.in.uploadHidden(d.Dev, hidden, b.Tokens(), m.Embed.Cols)
	if err != nil {
		return nil, fmt.Errorf("mtp: step inputs: %w", err)
	}
	var logits, hout kernels.Tensor
	InStep(d.Dev, func() { logits, hout = m.launchMTP(b, st, hid) })
	return st.Outputs(d.Dev, b, logits, hout), nil
}

// uploadHidden writes the MTP layer's input hidden states (n rows of
// width w) into in's buffer and returns them (n, w).
func (in *Inputs) uploadHidden(dev kernels.Device, hidden [][]float32, n, w int) (kernels.Tensor, error) {
	if err := ensure(dev, &in.hid, kernels.F32, n, w, 16); err != nil {
		return kernels.Tensor{}, err
	}
	hid := in.hid.Slice(0, n) // (N, hidden) the main model's hidden states
	in.hHid = in.hHid[:0]
	for _, h := range hidden {
		in.hHid = append(in.hHid, h...)
	}
	dev.WriteF32(hid, in.hHid)
	return hid, nil
}

// launchMTP queues the NextN layer's pass inside a step over the ids of st
// and the hidden states hid (N, hidden), and returns Head's logits and
// hidden rows.
func (m *MTPDecoder) launchMTP(b *model.Batch, st *Step, hid kernels.Tensor) (logits, hout kernels.Tensor) {
	d, hs, n := m.Decoder, m.Embed.Cols, b.Tokens()
	nx := m.MTP
	prologue := func(c *Ctx, x kernels.Tensor) {
		dev := c.Dev
		e := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
		embed := nx.Embed
		if embed == nil {
			embed = d.Embed
		}
		dev.Embed(e, embed, st.IDs)
		dev.RMSNorm(e, e, nx.ENorm.W, nx.ENorm.Eps, nx.ENorm.Offset)
		hn := dev.Scratch(kernels.F32, n, hs) // (N, hidden)
		dev.RMSNorm(hn, hid, nx.HNorm.W, nx.HNorm.Eps, nx.HNorm.Offset)
		nx.EH.Forward(dev, x, e, false)
		nx.HH.Forward(dev, x, hn, true)
	}
	return d.launch(b, st, prologue, []*Block{nx.Block}, nx.Norm, nx.Head)
}
