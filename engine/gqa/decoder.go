// Package gqa is the decoder on the op set (kernels.Device) of the
// grouped-query-attention architectures (llama, qwen3, qwen3_moe, mixtral,
// glm4_moe), of the hybrids that mix attention with linear attention
// (qwen3_next) and of every architecture that brings its own token mixer
// (engine/models/mla; glm5next uses its pieces): token embedding, pre-norm
// blocks (a Mixer — GQA attention, optionally gated, or a gated delta rule
// — then a SwiGLU MLP or routed MoE, optionally clamped) and one output
// head (final norm, logit-row gather, LM head), plus the DeepSeek/GLM NextN
// MTP layer (MTPDecoder). Activations, row maps, the KV cache and the
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
	in  Inputs
}

var (
	_ model.DeviceModel = (*Decoder)(nil)
	_ model.StateModel  = (*Decoder)(nil)
)

// New converts host-loaded blocks (nn.Block with nn.MLP or nn.MoE) into a
// Decoder on dev, uploading the small weights; the KV cache is BF16.
func New(dev kernels.Device, arch string, embed *kernels.Mat, blocks []*nn.Block, norm *nn.RMSNorm, lmHead *kernels.Mat, layout kvcache.Layout, maxContext int) (*Decoder, error) {
	u := NewUploader(dev)
	gb := make([]*Block, len(blocks))
	for i, b := range blocks {
		gb[i] = u.Block(b)
	}
	n := u.Norm(norm)
	if err := u.Err(); err != nil {
		return nil, err
	}
	return NewDecoder(dev, arch, embed, gb, n, lmHead, layout, maxContext)
}

// NewDecoder assembles blocks already on dev (any Mixer) between the
// embedding and the output head; the KV cache is BF16 (SetCacheDType).
// Blocks with linear attention need dev's LinearAttentionOps, as do gated
// attention and gated shared experts (a *model.OpsError without them).
func NewDecoder(dev kernels.Device, arch string, embed *kernels.Mat, blocks []*Block, norm *Norm, lmHead *kernels.Mat, layout kvcache.Layout, maxContext int) (*Decoder, error) {
	d := &Decoder{Arch: arch, Embed: embed, Blocks: blocks, Norm: norm, LMHead: lmHead, MaxContext: maxContext, Dev: dev, Layout: BF16Layout(layout)}
	d.lin, _ = dev.(kernels.LinearAttentionOps)
	for _, b := range blocks {
		if la, ok := b.Mixer.(*LinearAttention); ok {
			d.States = append(d.States, la.StateShape())
		}
		if err := d.checkLin(b); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// checkLin fails when b runs LinearAttentionOps and d's device lacks them.
func (d *Decoder) checkLin(b *Block) error {
	if d.lin == nil && needsLin(b) {
		return &model.OpsError{Backend: d.Dev.Name(), Missing: "the linear-attention ops (kernels.LinearAttentionOps) " + d.Arch + " needs"}
	}
	return nil
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

// BF16Layout is layout with every layer's storage BF16, the op set's
// default KV cache.
func BF16Layout(layout kvcache.Layout) kvcache.Layout {
	out := make(kvcache.Layout, len(layout))
	for i, w := range layout {
		w.DType = kernels.BF16
		out[i] = w
	}
	return out
}

// SetLayoutDType sets every layer of layout to dt, F32 or BF16
// (model.DeviceModel's SetCacheDType).
func SetLayoutDType(layout kvcache.Layout, dt kernels.DType) error {
	if dt != kernels.F32 && dt != kernels.BF16 {
		return fmt.Errorf("KV cache dtype %v (want F32 or BF16)", dt)
	}
	for i := range layout {
		layout[i].DType = dt
	}
	return nil
}

// SetCacheDType implements model.DeviceModel: F32 or BF16 KV storage for
// caches created afterwards.
func (d *Decoder) SetCacheDType(dt kernels.DType) error {
	if err := SetLayoutDType(d.Layout, dt); err != nil {
		return fmt.Errorf("gqa: %w", err)
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

// Inputs are a step's row maps, kept on the device between steps and grown
// when a step needs more.
type Inputs struct {
	// packed holds a step's ids, positions, sequences, slots, hidden and
	// logit rows and block table one after another, written with one
	// WriteI32 (one copy to the device, not seven).
	packed  kernels.Tensor // (cap, 1) I32
	rec     kernels.Tensor // (cap, 1) I32 hybrids: sequence starts, state rows, record rows (UploadStates)
	hPacked []int32

	hid kernels.Tensor // (cap, hidden) F32 the MTP layer's input hidden states

	// Host staging.
	hHid                                            []float32
	hIDs, hPos, hSeq, hSlot, hRows, hLRows, hBlocks []int32
	hRec                                            []int32
}

// Reserve sizes the step inputs for steps of at most tokens tokens over at
// most seqs sequences of at most blocks cache blocks each (see
// model.StepReserver); hybrid also sizes the recurrent-state rows. Outside
// a step only.
func (in *Inputs) Reserve(dev kernels.Device, tokens, seqs, blocks int, hybrid bool) error {
	// ids, positions, sequences, slots, hidden rows, logit rows: one each
	// per token; the block table: seqs rows of tableWidth(blocks).
	if err := ensure(dev, &in.packed, kernels.I32, 6*tokens+seqs*tableWidth(blocks), 1, 64); err != nil {
		return fmt.Errorf("step inputs: %w", err)
	}
	if !hybrid {
		return nil
	}
	// starts (seqs+1), state rows (seqs), record rows (tokens).
	if err := ensure(dev, &in.rec, kernels.I32, 2*seqs+1+tokens, 1, 64); err != nil {
		return fmt.Errorf("step inputs: %w", err)
	}
	return nil
}

// ReserveSteps implements model.StepReserver.
func (d *Decoder) ReserveSteps(tokens, seqs, blocks int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.in.Reserve(d.Dev, tokens, seqs, blocks, len(d.States) > 0)
}

// EnsureI32 returns an I32 (n, 1) view of *t, reallocating it (larger)
// when too small: a step input kept on the device between steps.
func EnsureI32(dev kernels.Device, t *kernels.Tensor, n int) (kernels.Tensor, error) {
	if err := ensure(dev, t, kernels.I32, n, 1, 64); err != nil {
		return kernels.Tensor{}, err
	}
	return t.Slice(0, n), nil
}

// ensure makes *t a (≥ n, cols) tensor of dt: when it is too small it is
// replaced by one of at least twice its rows (and least rows), and the old
// one is freed. Outside a step only.
func ensure(dev kernels.Device, t *kernels.Tensor, dt kernels.DType, n, cols, least int) error {
	if t.Valid() && t.Rows >= n {
		return nil
	}
	nt, err := dev.Alloc(dt, max(n, 2*t.Rows, least), cols)
	if err != nil {
		return err
	}
	if t.Valid() {
		dev.Free(*t)
	}
	*t = nt
	return nil
}

// check validates b for a head of vocab rows and checks its cache is in
// the model's device memory.
func (d *Decoder) check(b *model.Batch, vocab int) error {
	if err := CheckBatch(b, vocab, d.Layout, d.Dev); err != nil {
		return fmt.Errorf("gqa: %w", err)
	}
	return nil
}

// CheckBatch validates b for a head of vocab rows and a cache of layout,
// and checks its cache is in dev's memory.
func CheckBatch(b *model.Batch, vocab int, layout kvcache.Layout, dev kernels.Device) error {
	if err := b.Validate(vocab, layout); err != nil {
		return err
	}
	if b.Cache.Memory() != kernels.Memory(dev) {
		return fmt.Errorf("the cache is not in the model's device memory (create it with model.NewCache)")
	}
	return nil
}

// CheckStates validates a main-model batch's state slots against layout
// (none needed when it is empty) and checks the pool is in dev's memory.
func CheckStates(b *model.Batch, layout []linattn.LayerShape, dev kernels.Device) error {
	if len(layout) == 0 {
		return nil
	}
	if err := b.ValidateStates(layout); err != nil {
		return err
	}
	if b.States.Memory() != kernels.Memory(dev) {
		return fmt.Errorf("the state pool is not in the model's device memory (create it with model.NewStatePool)")
	}
	return nil
}

// Forward implements model.Model. A hybrid's sequences continue from their
// state slots (a sequence at Pos 0 from a zeroed one) and leave the state
// after their last token there.
func (d *Decoder) Forward(b *model.Batch) (*model.Output, error) {
	validate := func() error {
		if err := CheckStates(b, d.States, d.Dev); err != nil {
			return fmt.Errorf("gqa: %w", err)
		}
		return nil
	}
	return d.forward(b, d.LMHead.Rows, validate, func(st *Step) (*model.Output, error) {
		if len(d.States) > 0 {
			if err := d.in.UploadStates(d.Dev, b, st); err != nil {
				return nil, fmt.Errorf("gqa: %w", err)
			}
		}
		embed := func(c *Ctx, x kernels.Tensor) { c.Dev.Embed(x, d.Embed, st.IDs) }
		return d.run(b, st, embed, d.Blocks, d.Norm, d.LMHead), nil
	})
}

// forward checks b for a head of vocab rows (and with validate, when not
// nil), then, holding d.mu, uploads the step's inputs and runs body.
func (d *Decoder) forward(b *model.Batch, vocab int, validate func() error, body func(st *Step) (*model.Output, error)) (*model.Output, error) {
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
	st, err := d.in.Upload(d.Dev, b)
	if err != nil {
		return nil, fmt.Errorf("gqa: %w", err)
	}
	st.Top = b.Top
	return body(st)
}

// run is one step through blocks after embed has set the residual stream
// x (N, hidden): the output head norms every row with norm and runs head
// over the rows that want logits.
func (d *Decoder) run(b *model.Batch, st *Step, embed func(c *Ctx, x kernels.Tensor), blocks []*Block, norm *Norm, head *kernels.Mat) *model.Output {
	var logits, hid kernels.Tensor
	InStep(d.Dev, func() { logits, hid = d.launch(b, st, embed, blocks, norm, head) })
	return st.Outputs(d.Dev, b, logits, hid)
}

// launch queues run's pass inside a step and returns its logits and hidden
// rows (Head's), for Outputs after the step.
func (d *Decoder) launch(b *model.Batch, st *Step, embed func(c *Ctx, x kernels.Tensor), blocks []*Block, norm *Norm, head *kernels.Mat) (logits, hid kernels.Tensor) {
	dev := d.Dev
	hidden, n := d.Embed.Cols, b.Tokens()
	x := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) residual stream
	h := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) normed input of a sublayer
	y := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) sublayer output
	c := st.Ctx(dev, b)
	c.Lin = d.lin
	embed(c, x)
	alt := dev.Scratch(kernels.F32, n, hidden) // (N, hidden) the stream's other storage (Residual.Alt)
	r := &Residual{X: x, H: h, Y: y, Alt: alt}
	for _, blk := range blocks {
		blk.Forward(c, r)
	}
	return st.Head(dev, r.Norm(dev, norm), head)
}

// InStep runs fn between dev.BeginStep and dev.EndStep; a panic in fn
// still ends the step, so the device is ready for the next one.
func InStep(dev kernels.Device, fn func()) {
	dev.BeginStep()
	defer dev.EndStep()
	fn()
}

// Step is one step's device inputs.
type Step struct {
	Paged       kernels.Paged
	Rec         kernels.Recurrent // hybrids' main-model steps (UploadStates)
	Pos         []int32           // (N) host copy of Paged.Pos (Ctx.Pos)
	IDs         kernels.Tensor    // (N, 1) I32 token ids
	Rows, LRows kernels.Tensor    // (NH, 1), (NL, 1) I32 rows whose hidden states / logits are returned
	NH, NL      int

	// Top is the batch's model.Batch.Top: Head reduces every logit row to
	// its Top best entries when the device has kernels.SampleOps.
	Top int
	top kernels.Tensor // (NL, 2·Top) F32 Head's reduction; the zero Tensor for none

	// Exact is whether Upload put the backend in its row-exact mode (a
	// verification); a step of several passes sets it again before each
	// (kernels.SetRowExact).
	Exact bool
}

// Ctx is the step's block context on dev for batch b, with b's recurrent
// states when UploadStates wrote their map (Lin is the caller's to set).
func (st *Step) Ctx(dev kernels.Device, b *model.Batch) *Ctx {
	c := &Ctx{Dev: dev, N: len(st.Pos), Paged: st.Paged, Pos: st.Pos, Cache: b.Cache.Layer}
	if st.Rec.Slot.Valid() {
		c.Rec, c.States = &st.Rec, b.States.Tensors
	}
	return c
}

// Head is the output head: h (N, hidden) holds the final norm of every
// row; it gathers the rows that want logits and runs head over them only,
// and gathers the rows whose hidden states are returned. Either result is
// the zero Tensor when no row wants it. With st.Top and a device with
// kernels.SampleOps it also reduces every logit row to its best entries,
// which Outputs reads instead of the rows.
func (st *Step) Head(dev kernels.Device, h kernels.Tensor, head *kernels.Mat) (logits, hid kernels.Tensor) {
	st.top = kernels.Tensor{}
	if st.NL > 0 {
		lx := dev.Scratch(kernels.F32, st.NL, h.Cols) // (logit rows, hidden)
		dev.GatherRows(lx, h, st.LRows)
		logits = dev.Scratch(kernels.F32, st.NL, head.Rows) // (logit rows, vocab)
		dev.Linear(logits, lx, head, kernels.Epilogue{})
		if so, ok := dev.(kernels.SampleOps); ok && st.Top > 0 {
			k := min(st.Top, head.Rows)
			st.top = dev.Scratch(kernels.F32, st.NL, 2*k) // (logit rows, [values | ids]) best entries
			so.TopKRows(st.top, logits)
		}
	}
	if st.NH > 0 {
		hid = dev.Scratch(kernels.F32, st.NH, h.Cols) // (hidden rows, hidden)
		dev.GatherRows(hid, h, st.Rows)
	}
	return logits, hid
}

// exactRows is the most rows of a step that runs with the backend's
// row-exact linear ops when it verifies drafts: 8 sequences of up to 8
// tokens (beyond, speculation is off by default: runtime.DraftMaxSeqs).
const exactRows = 64

// Upload writes the batch's ids and row maps to dev (outside a step). A
// batch of at most exactRows tokens that verifies drafts (a model.AllLogits
// entry) runs with the backend's row-exact linear ops (kernels.RowExact),
// so that its rows get plain decoding's bits.
func (in *Inputs) Upload(dev kernels.Device, b *model.Batch) (*Step, error) {
	verify := false
	for i := range b.Seqs {
		verify = verify || b.Seqs[i].Logits == model.AllLogits
	}
	exact := verify && b.Tokens() <= exactRows
	kernels.SetRowExact(dev, exact)
	in.hIDs, in.hPos, in.hSeq, in.hSlot = in.hIDs[:0], in.hPos[:0], in.hSeq[:0], in.hSlot[:0]
	in.hRows, in.hLRows = in.hRows[:0], in.hLRows[:0]
	maxBlocks := 1
	for i := range b.Seqs {
		maxBlocks = max(maxBlocks, len(b.Seqs[i].KV.Blocks()))
	}
	maxBlocks = tableWidth(maxBlocks)
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
	st := &Step{Pos: in.hPos, NH: len(in.hRows), NL: len(in.hLRows), Exact: exact}
	st.Paged.BlockSize = b.Cache.BlockSize()
	parts := []struct {
		dst  *kernels.Tensor
		host []int32
	}{
		{&st.IDs, in.hIDs}, {&st.Paged.Pos, in.hPos}, {&st.Paged.Seq, in.hSeq}, {&st.Paged.Slot, in.hSlot},
		{&st.Rows, in.hRows}, {&st.LRows, in.hLRows}, {&st.Paged.Blocks, in.hBlocks},
	}
	in.hPacked = in.hPacked[:0]
	for _, f := range parts {
		in.hPacked = append(in.hPacked, f.host...)
	}
	all, err := EnsureI32(dev, &in.packed, len(in.hPacked))
	if err != nil {
		return nil, fmt.Errorf("step inputs: %w", err)
	}
	dev.WriteI32(all, in.hPacked)
	off := 0
	for _, f := range parts {
		*f.dst = all.Slice(off, off+len(f.host))
		off += len(f.host)
	}
	st.Paged.Blocks = st.Paged.Blocks.Reshape(len(b.Seqs), maxBlocks)
	return st, nil
}

// tableWidth is the block-table width of a step whose longest sequence
// holds n blocks: the next power of two (at least 4), so that the width
// (a launch parameter of attention) changes a few times over a long
// generation instead of every BlockSize tokens, and a device that replays
// repeated steps (CUDA graphs) keeps replaying. The extra columns are
// never read: a row reads only the blocks up to its position.
func tableWidth(n int) int {
	w := 4
	for w < n {
		w *= 2
	}
	return w
}

// UploadStates resets the state slots of b's sequences at position 0 (no
// history: a zero state) and writes the sequences' starts, state rows and
// record rows (model.Seq.Record) into st.Rec: a hybrid's main-model step.
func (in *Inputs) UploadStates(dev kernels.Device, b *model.Batch, st *Step) error {
	// One write: the starts (seqs+1), the slots' rows (seqs) and, when a
	// sequence records states (model.Seq.Record), each row's record row
	// or −1 (N).
	seqs, n, record := len(b.Seqs), 0, false
	for i := range b.Seqs {
		n += len(b.Seqs[i].Tokens)
		record = record || len(b.Seqs[i].Record) > 0
	}
	h := append(in.hRec[:0], 0)
	for i := range b.Seqs {
		s := &b.Seqs[i]
		if s.Pos == 0 {
			b.States.Reset(s.State)
		}
		h = append(h, h[i]+int32(len(s.Tokens)))
	}
	for i := range b.Seqs {
		h = append(h, int32(b.States.Row(b.Seqs[i].State)))
	}
	for i := 0; record && i < seqs; i++ {
		s := &b.Seqs[i]
		for j := range s.Tokens {
			row := int32(-1)
			if j < len(s.Record) && s.Record[j] != nil {
				row = int32(b.States.SnapshotRow(s.Record[j]))
			}
			h = append(h, row)
		}
	}
	in.hRec = h
	if record && !kernels.RecordsStates(dev) {
		return fmt.Errorf("step inputs: the %T backend does not record recurrent states (model.Seq.Record)", dev)
	}
	t, err := EnsureI32(dev, &in.rec, len(h))
	if err != nil {
		return fmt.Errorf("step inputs: %w", err)
	}
	dev.WriteI32(t, h)
	st.Rec.Start, st.Rec.Slot = t.Slice(0, seqs+1), t.Slice(seqs+1, 2*seqs+1)
	st.Rec.Record = kernels.Tensor{}
	if record {
		st.Rec.Record = t.Slice(2*seqs+1, 2*seqs+1+n)
	}
	return nil
}

// Outputs reads the logit and hidden rows that Head returned back (after
// the step) and splits them per sequence. When Head reduced the logit rows
// it reads their best entries, in one copy, and the whole rows of the
// sequences with model.Seq.Full only (one copy per run of such sequences);
// Output.Logits reads the others' on demand until the next step.
func (st *Step) Outputs(dev kernels.Device, b *model.Batch, logits, hid kernels.Tensor) *model.Output {
	var r Reads
	finish := st.OutputReads(&r, dev, b, logits, hid)
	r.Read(dev)
	return finish()
}

// Reads are the read-backs of one or more passes of a step, made in one
// wait where the device can (kernels.ReadF32s).
type Reads struct {
	dst [][]float32
	src []kernels.Tensor
}

// Read reads everything r holds.
func (r *Reads) Read(dev kernels.Device) { kernels.ReadF32s(dev, r.dst, r.src) }

// OutputReads is Outputs in two parts: it adds the reads of the pass to r
// and returns what builds its output once r was read.
func (st *Step) OutputReads(r *Reads, dev kernels.Device, b *model.Batch, logits, hid kernels.Tensor) (finish func() *model.Output) {
	var lg, hs, top []float32
	var vocab, hidden, k int
	if logits.Valid() {
		vocab = logits.Cols
		if st.top.Valid() {
			k = st.top.Cols / 2
			top = make([]float32, st.top.Elems())
			r.dst, r.src = append(r.dst, top), append(r.src, st.top)
		} else {
			lg = make([]float32, logits.Elems())
			r.dst, r.src = append(r.dst, lg), append(r.src, logits)
		}
	}
	if hid.Valid() {
		hs = make([]float32, hid.Elems())
		r.dst, r.src = append(r.dst, hs), append(r.src, hid)
		hidden = hid.Cols
	}
	return func() *model.Output { return st.split(dev, b, logits, lg, hs, top, vocab, hidden, k) }
}

// split builds a pass's output from what OutputReads read.
func (st *Step) split(dev kernels.Device, b *model.Batch, logits kernels.Tensor, lg, hs, top []float32, vocab, hidden, k int) *model.Output {
	n := len(b.Seqs)
	first := make([]int, n+1) // (seqs+1) first logit row of each sequence, then the total
	for i := range b.Seqs {
		first[i+1] = first[i] + b.Seqs[i].LogitRows()
	}
	out := &model.Output{Seqs: make([]model.SeqOutput, n)}
	if top != nil {
		st.fullRows(dev, b, out, logits, first)
	}
	hrow := 0
	for i := range b.Seqs {
		s, o := &b.Seqs[i], &out.Seqs[i]
		lo, hi := first[i], first[i+1]
		switch {
		case hi == lo || o.Logits != nil: // none, or read by fullRows
		case lg != nil:
			o.Logits = lg[lo*vocab : hi*vocab : hi*vocab]
		default:
			o.Top, o.TopVals, o.TopIDs = k, make([]float32, (hi-lo)*k), make([]int32, (hi-lo)*k)
			for r := range hi - lo {
				row := top[(lo+r)*2*k : (lo+r+1)*2*k]
				copy(o.TopVals[r*k:], row[:k])
				for j, id := range row[k:] {
					o.TopIDs[r*k+j] = int32(id) // exact: ids below 2^24
				}
			}
		}
		if s.Hidden {
			nh := len(s.Tokens)
			o.Hidden = hs[hrow*hidden : (hrow+nh)*hidden : (hrow+nh)*hidden]
			hrow += nh
		}
	}
	if top != nil {
		out.Logits = func(i int) []float32 {
			rows := make([]float32, (first[i+1]-first[i])*vocab)
			dev.ReadF32(rows, logits.Slice(first[i], first[i+1]))
			return rows
		}
	}
	return out
}

// fullRows reads the whole logit rows of b's model.Seq.Full sequences
// into out when Head reduced the rest: one copy per run of consecutive
// such sequences (those without logit rows do not break a run). first is
// each sequence's first logit row, then the total.
func (st *Step) fullRows(dev kernels.Device, b *model.Batch, out *model.Output, logits kernels.Tensor, first []int) {
	vocab, n := logits.Cols, len(b.Seqs)
	full := func(j int) bool { return b.Seqs[j].Full && first[j+1] > first[j] }
	for i := 0; i < n; {
		if !full(i) {
			i++
			continue
		}
		j := i + 1 // the run is [i, j)
		for j < n && (full(j) || first[j+1] == first[j]) {
			j++
		}
		base := first[i]
		run := make([]float32, (first[j]-base)*vocab)
		dev.ReadF32(run, logits.Slice(base, first[j]))
		for ; i < j; i++ {
			if full(i) {
				lo, hi := (first[i]-base)*vocab, (first[i+1]-base)*vocab
				out.Seqs[i].Logits = run[lo:hi:hi]
			}
		}
	}
}
