// Package gqa is the decoder of the grouped-query-attention architectures
// (llama, qwen3, qwen3_moe, mixtral, glm4_moe) and of the hybrids that mix
// GQA with linear attention (qwen3_next) on the op set (kernels.Device):
// token embedding, pre-norm blocks (a mixer — GQA attention, optionally
// gated, or a gated delta rule — then a SwiGLU MLP or routed MoE) and one
// output head (final norm, logit-row gather, LM head), plus the NextN MTP
// layer (MTPDecoder). Activations, row maps, the KV cache and the
// recurrent states live on the device; the host writes the step's ids,
// positions, slots, block tables and state slots before it and reads the
// logit and hidden rows after it.
package gqa

import (
	"fmt"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Decoder is a decoder-only GQA transformer on a kernels.Device.
type Decoder struct {
	Arch       string
	Embed      *kernels.Mat // (vocab, hidden) token embedding
	Blocks     []*Block     // (layers)
	Norm       *Norm        // (hidden) final norm
	LMHead     *kernels.Mat // (vocab, hidden); Embed itself when tied
	Layout     kvcache.Layout
	MaxContext int
	Dev        kernels.Device

	// States is the recurrent state of the linear-attention blocks, one
	// entry per *LinearAttention in block order (empty for pure attention
	// models); a hybrid's batches carry a state pool of this layout in
	// Dev's memory (model.NewStatePool).
	States []linattn.LayerShape

	lin kernels.LinearAttentionOps // Dev's linear-attention ops; nil without them
	mu  sync.Mutex
	in  inputs
}

var _ model.DeviceModel = (*Decoder)(nil)
var _ model.StateModel = (*Decoder)(nil)

// New converts host-loaded blocks (nn.Block with nn.MLP or nn.MoE) into a
// Decoder on dev, uploading the small weights; the KV cache is BF16.
func New(dev kernels.Device, arch string, embed *kernels.Mat, blocks []*nn.Block, norm *nn.RMSNorm, lmHead *kernels.Mat, layout kvcache.Layout, maxContext int) (*Decoder, error) {
	u := &Uploader{Dev: dev}
	var gb []*Block
	for _, hb := range blocks {
		b, err := u.Block(hb)
		if err != nil {
			return nil, err
		}
		gb = append(gb, b)
	}
	n := u.Norm(norm)
	if u.Err != nil {
		return nil, u.Err
	}
	return Assemble(dev, arch, embed, gb, n, lmHead, layout, maxContext)
}

// Assemble makes a Decoder of blocks already on dev; the KV cache is
// BF16. Blocks with linear attention need dev's LinearAttentionOps, as do
// gated attention and gated shared experts.
func Assemble(dev kernels.Device, arch string, embed *kernels.Mat, blocks []*Block, norm *Norm, lmHead *kernels.Mat, layout kvcache.Layout, maxContext int) (*Decoder, error) {
	d := &Decoder{Arch: arch, Embed: embed, Blocks: blocks, LMHead: lmHead, MaxContext: maxContext, Dev: dev, Norm: norm}
	d.lin, _ = dev.(kernels.LinearAttentionOps)
	for _, b := range blocks {
		if la, ok := b.Mixer.(*LinearAttention); ok {
			d.States = append(d.States, la.StateShape())
		}
		if needsLin(b) && d.lin == nil {
			return nil, fmt.Errorf("%w: backend %s lacks the linear-attention ops (kernels.LinearAttentionOps) %s needs", model.ErrOpSet, dev.Name(), arch)
		}
	}
	d.Layout = make(kvcache.Layout, len(layout))
	for i, w := range layout {
		w.DType = kernels.BF16
		d.Layout[i] = w
	}
	return d, nil
}

// needsLin reports whether b runs any of the LinearAttentionOps.
func needsLin(b *Block) bool {
	switch m := b.Mixer.(type) {
	case *LinearAttention:
		return true
	case *Attention:
		if m.Gate != nil {
			return true
		}
	}
	moe, ok := b.FFN.(*MoE)
	return ok && moe.SharedGate != nil
}

// StateLayout implements model.StateModel: d.States.
func (d *Decoder) StateLayout() []linattn.LayerShape {
	return append([]linattn.LayerShape(nil), d.States...)
}

// SetCacheDType implements model.DeviceModel: F32 or BF16 KV storage for
// caches created afterwards.
func (d *Decoder) SetCacheDType(dt kernels.DType) error {
	if dt != kernels.F32 && dt != kernels.BF16 {
		return fmt.Errorf("gqa: KV cache dtype %v (want F32 or BF16)", dt)
	}
	for i := range d.Layout {
		d.Layout[i].DType = dt
	}
	return nil
}

// Device implements model.DeviceModel.
func (d *Decoder) Device() kernels.Device { return d.Dev }

// Info implements model.Model.
func (d *Decoder) Info() model.Info {
	var state int64
	for _, s := range d.States {
		state += s.Bytes()
	}
	return model.Info{
		Arch: d.Arch, Vocab: d.LMHead.Rows, Hidden: d.Embed.Cols, Layers: len(d.Blocks),
		MaxContext: d.MaxContext, KVBytesPerToken: d.Layout.BytesPerToken(), StateBytesPerSeq: state,
	}
}

// CacheLayout implements model.Model.
func (d *Decoder) CacheLayout() kvcache.Layout { return append(kvcache.Layout(nil), d.Layout...) }

// inputs are the step's row maps, kept on the device between steps and
// grown when a step needs more.
type inputs struct {
	ids, pos, seq, slot, rows, lrows kernels.Tensor // (cap, 1) I32
	blocks                           kernels.Tensor // (cap, 1) I32, viewed as (seqs, maxBlocks)
	start, state                     kernels.Tensor // (cap, 1) I32 hybrids: sequence starts, state rows

	hid kernels.Tensor // (cap, hidden) F32 the MTP layer's input hidden states

	// Host staging.
	hHid                                            []float32
	hIDs, hPos, hSeq, hSlot, hRows, hLRows, hBlocks []int32
	hStart, hState                                  []int32
}

// ensure returns an I32 (n, 1) view of *t, reallocating it when too small.
func ensure(dev kernels.Device, t *kernels.Tensor, n int) (kernels.Tensor, error) {
	if !t.Valid() || t.Rows < n {
		nt, err := dev.Alloc(kernels.I32, max(n, 2*t.Rows, 64), 1)
		if err != nil {
			return nt, err
		}
		*t = nt
	}
	return t.Slice(0, n), nil
}

// check validates b for a head of vocab rows and checks its cache is in
// the model's device memory.
func (d *Decoder) check(b *model.Batch, vocab int) error {
	if err := b.Validate(vocab, d.Layout); err != nil {
		return err
	}
	if b.Cache.Memory() != kernels.Memory(d.Dev) {
		return fmt.Errorf("gqa: the cache is not in the model's device memory (create it with model.NewCache)")
	}
	return nil
}

// checkStates validates a main-model batch's state slots (hybrids).
func (d *Decoder) checkStates(b *model.Batch) error {
	if len(d.States) == 0 {
		return nil
	}
	if err := b.ValidateStates(d.States); err != nil {
		return err
	}
	if b.States.Memory() != kernels.Memory(d.Dev) {
		return fmt.Errorf("gqa: the state pool is not in the model's device memory (create it with model.NewStatePool)")
	}
	return nil
}

// Forward implements model.Model. A hybrid's sequences continue from their
// state slots (a sequence at Pos 0 from a zeroed one) and leave the state
// after their last token there.
func (d *Decoder) Forward(b *model.Batch) (*model.Output, error) {
	validate := func() error { return d.checkStates(b) }
	return d.forward(b, d.LMHead.Rows, validate, func(st *step) (*model.Output, error) {
		if len(d.States) > 0 {
			for i := range b.Seqs {
				if b.Seqs[i].Pos == 0 {
					b.States.Reset(b.Seqs[i].State) // no history: a zero state
				}
			}
			if err := d.uploadStates(b, st); err != nil {
				return nil, err
			}
		}
		embed := func(c *Ctx, x kernels.Tensor) { c.Dev.Embed(x, d.Embed, st.ids) }
		return d.run(b, st, embed, d.Blocks, d.Norm, d.LMHead), nil
	})
}

// forward checks b for a head of vocab rows (and with validate, when not
// nil), then, holding d.mu, uploads the step's inputs and runs body.
func (d *Decoder) forward(b *model.Batch, vocab int, validate func() error, body func(st *step) (*model.Output, error)) (*model.Output, error) {
	if err := d.check(b, vocab); err != nil {
		return nil, err
	}
	if validate != nil {
		if err := validate(); err != nil {
			return nil, err
		}
	}
	if len(b.Seqs) == 0 {
		return &model.Output{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.upload(b)
	if err != nil {
		return nil, err
	}
	return body(st)
}

// run is one step through blocks after embed has set the residual stream
// x (N, hidden): the output head norms every row with norm and runs head
// over the rows that want logits.
func (d *Decoder) run(b *model.Batch, st *step, embed func(c *Ctx, x kernels.Tensor), blocks []*Block, norm *Norm, head *kernels.Mat) *model.Output {
	dev := d.Dev
	hidden, vocab, n := d.Embed.Cols, head.Rows, b.Tokens()
	dev.BeginStep()
	inStep := true
	defer func() {
		if inStep { // an op panicked: leave the device ready for the next step
			dev.EndStep()
		}
	}()
	x := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) residual stream
	h := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) normed input of a sublayer
	y := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) sublayer output
	c := &Ctx{Dev: dev, N: n, Paged: st.paged, Cache: b.Cache.Layer, Lin: d.lin}
	if st.rec.Slot.Valid() {
		c.Rec, c.States = &st.rec, b.States.Tensors
	}
	embed(c, x)
	first := blocks[0].AttnNorm
	dev.RMSNorm(h, x, first.W, first.Eps, first.Offset)
	for i, blk := range blocks {
		blk.Forward(c, x, h, y)
		next := norm
		if i+1 < len(blocks) {
			next = blocks[i+1].AttnNorm
		}
		dev.AddRMSNorm(h, x, y, next.W, next.Eps, next.Offset)
	}
	// The output head: h holds the final norm of every row; gather the
	// rows that want logits and run the LM head over them only.
	var logits, hid kernels.Tensor
	if st.nl > 0 {
		lx := dev.Scratch(kernels.F32, st.nl, hidden) // (logit rows, hidden)
		dev.GatherRows(lx, h, st.lrows)
		logits = dev.Scratch(kernels.F32, st.nl, vocab) // (logit rows, vocab)
		dev.Linear(logits, lx, head, kernels.Epilogue{})
	}
	if st.nh > 0 {
		hid = dev.Scratch(kernels.F32, st.nh, hidden) // (hidden rows, hidden)
		dev.GatherRows(hid, h, st.rows)
	}
	dev.EndStep()
	inStep = false
	return d.outputs(b, logits, hid, vocab)
}

// step is one step's device inputs.
type step struct {
	paged       kernels.Paged
	rec         kernels.Recurrent // hybrids' main-model steps
	ids         kernels.Tensor
	rows, lrows kernels.Tensor // rows whose hidden states / logits are returned
	nh, nl      int
}

// upload writes the batch's ids and row maps to the device.
func (d *Decoder) upload(b *model.Batch) (*step, error) {
	in := &d.in
	in.hIDs, in.hPos, in.hSeq, in.hSlot = in.hIDs[:0], in.hPos[:0], in.hSeq[:0], in.hSlot[:0]
	in.hRows, in.hLRows = in.hRows[:0], in.hLRows[:0]
	maxBlocks := 1
	for i := range b.Seqs {
		maxBlocks = max(maxBlocks, len(b.Seqs[i].KV.Blocks()))
	}
	in.hBlocks = append(in.hBlocks[:0], make([]int32, len(b.Seqs)*maxBlocks)...)
	row := 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		copy(in.hBlocks[i*maxBlocks:], s.KV.Blocks())
		for j, t := range s.Tokens {
			p := s.Pos + j
			in.hIDs = append(in.hIDs, t)
			in.hPos = append(in.hPos, int32(p))
			in.hSeq = append(in.hSeq, int32(i))
			in.hSlot = append(in.hSlot, b.Cache.Slot(s.KV, p))
			if s.Hidden {
				in.hRows = append(in.hRows, int32(row))
			}
			if s.Logits == model.AllLogits || (s.Logits == model.LastLogits && j == len(s.Tokens)-1) {
				in.hLRows = append(in.hLRows, int32(row))
			}
			row++
		}
	}
	st := &step{nh: len(in.hRows), nl: len(in.hLRows)}
	st.paged.BlockSize = b.Cache.BlockSize()
	var err error
	for _, f := range []struct {
		dst  *kernels.Tensor
		buf  *kernels.Tensor
		host []int32
	}{
		{&st.ids, &in.ids, in.hIDs}, {&st.paged.Pos, &in.pos, in.hPos}, {&st.paged.Seq, &in.seq, in.hSeq},
		{&st.paged.Slot, &in.slot, in.hSlot}, {&st.rows, &in.rows, in.hRows}, {&st.lrows, &in.lrows, in.hLRows},
		{&st.paged.Blocks, &in.blocks, in.hBlocks},
	} {
		if *f.dst, err = ensure(d.Dev, f.buf, len(f.host)); err != nil {
			return nil, fmt.Errorf("gqa: step inputs: %w", err)
		}
		d.Dev.WriteI32(*f.dst, f.host)
	}
	st.paged.Blocks = st.paged.Blocks.Reshape(len(b.Seqs), maxBlocks)
	return st, nil
}

// uploadStates writes the batch's sequence starts and state rows (a
// hybrid's main-model step).
func (d *Decoder) uploadStates(b *model.Batch, st *step) error {
	in := &d.in
	in.hStart, in.hState = append(in.hStart[:0], 0), in.hState[:0]
	for i := range b.Seqs {
		s := &b.Seqs[i]
		in.hStart = append(in.hStart, in.hStart[i]+int32(len(s.Tokens)))
		in.hState = append(in.hState, int32(b.States.Row(s.State)))
	}
	var err error
	if st.rec.Start, err = ensure(d.Dev, &in.start, len(in.hStart)); err != nil {
		return fmt.Errorf("gqa: step inputs: %w", err)
	}
	if st.rec.Slot, err = ensure(d.Dev, &in.state, len(in.hState)); err != nil {
		return fmt.Errorf("gqa: step inputs: %w", err)
	}
	d.Dev.WriteI32(st.rec.Start, in.hStart)
	d.Dev.WriteI32(st.rec.Slot, in.hState)
	return nil
}

// outputs reads the logit and hidden rows back and splits them per
// sequence.
func (d *Decoder) outputs(b *model.Batch, logits, hid kernels.Tensor, vocab int) *model.Output {
	hidden := d.Embed.Cols
	var lg, hs []float32
	if logits.Valid() {
		lg = make([]float32, logits.Elems())
		d.Dev.ReadF32(lg, logits)
	}
	if hid.Valid() {
		hs = make([]float32, hid.Elems())
		d.Dev.ReadF32(hs, hid)
	}
	out := &model.Output{Seqs: make([]model.SeqOutput, len(b.Seqs))}
	lrow, hrow := 0, 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		if nl := s.LogitRows(); nl > 0 {
			out.Seqs[i].Logits = lg[lrow*vocab : (lrow+nl)*vocab : (lrow+nl)*vocab]
			lrow += nl
		}
		if s.Hidden {
			nh := len(s.Tokens)
			out.Seqs[i].Hidden = hs[hrow*hidden : (hrow+nh)*hidden : (hrow+nh)*hidden]
			hrow += nh
		}
	}
	return out
}
