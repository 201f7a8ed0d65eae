package glm5next

import (
	"fmt"
	"slices"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// arch is the model_type the model reports in Info.
const arch = "glm5_next"

func init() {
	// "glm5_next" is the vision-language wrapper's (and a flat config's)
	// model_type; engine/config takes the text model's "glm5_next_text" from
	// text_config when the config is nested.
	model.Register(arch, New)
	model.Register("glm5_next_text", New)
}

// Model is a loaded GLM-5.3-Flash text model. It implements
// model.StateModel; a model loaded with its MTP layer is wrapped in a type
// that also implements model.MTPModel.
type Model struct {
	p      params
	embed  *kernels.Mat // (vocab, hidden) embed_tokens
	layers []*layer     // (num_hidden_layers)
	norm   *nn.RMSNorm  // (hidden) final norm, after the mean over streams
	lmHead *kernels.Mat // (vocab, hidden); embed when tied
	mtp    *mtp         // nil without an MTP layer

	layout      kvcache.Layout       // (layers [+1 MTP]) zero width for KDA layers
	stateLayout []linattn.LayerShape // (KDA layers) one sequence's slot
	stateBytes  int64                // Σ stateLayout[i].Bytes()
	info        model.Info
	be          kernels.Backend

	// trace, when set (tests), receives the residual streams (N, hc, hidden)
	// after each layer of a Forward.
	trace func(layer int, streams []float32)
	// traceSel, when set (tests), receives each DSA layer's selection after
	// its indexer ran: per row, the kept pools (p.sel/p.nsel).
	traceSel func(layer int, p *pass)

	mu   sync.Mutex // one pass at a time
	pass pass       // reused between passes
}

// withMTP is a Model with its NextN layer: the model.MTPModel implementation.
type withMTP struct{ *Model }

// layer is one decoder layer: two hyper-connection sites around the token
// mixer (KDA or DSA) and the FFN.
type layer struct {
	attnHC   *hyper      // hc_attn_{fn,base,scale}
	attnNorm *nn.RMSNorm // (hidden) input_layernorm
	kda      *kda        // set on linear_attention layers
	dsa      *dsa        // set on deepseek_sparse_attention layers
	ffnHC    *hyper      // hc_ffn_{fn,base,scale}
	ffnNorm  *nn.RMSNorm // (hidden) post_attention_layernorm
	ffn      nn.FFN      // *mlp (dense) or *moe (sparse)
}

// New builds a glm5_next model from a flat text config or the
// vision-language wrapper's text_config (engine/config merges it), with
// the text weights under "model.language_model." or "model.". The vision
// tower (model.visual.*) is not loaded.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := readParams(cfg)
	if err != nil {
		return nil, err
	}
	l := nn.NewLoader(w)
	root := "model."
	if l.Has("model.language_model.embed_tokens.weight") {
		root = "model.language_model."
	}
	m := &Model{p: p, be: be}
	for i := range p.layers {
		pre := fmt.Sprintf("%slayers.%d.", root, i)
		ly := &layer{
			attnHC:   loadHyper(l, pre+"hc_attn", &p),
			attnNorm: l.RMSNorm(pre+"input_layernorm", p.hidden, p.eps, false),
			ffnHC:    loadHyper(l, pre+"hc_ffn", &p),
			ffnNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.hidden, p.eps, false),
		}
		if p.types[i] == linearAttention {
			ly.kda = loadKDA(l, &p, pre+"self_attn.", len(m.stateLayout), be)
			m.stateLayout = append(m.stateLayout, ly.kda.shape())
			m.layout = append(m.layout, kvcache.LayerWidth{})
		} else {
			own := p.idxTypes[i] == fullIndexer
			ly.dsa = loadDSA(l, &p, pre+"self_attn.", i, own)
			width := kvcache.LayerWidth{K: p.kvLora}
			if own {
				width.V = 2 * p.idxDim
			}
			m.layout = append(m.layout, width)
		}
		if p.mlpTypes[i] == sparseFFN {
			ly.ffn = loadMoE(l, &p, pre+"mlp")
		} else {
			ly.ffn = loadMLP(l, pre+"mlp", p.hidden, p.inter, p.limit)
		}
		m.layers = append(m.layers, ly)
	}
	m.embed = l.Mat(root+"embed_tokens.weight", p.vocab, p.hidden)
	m.norm = l.RMSNorm(root+"norm", p.hidden, p.eps, false)
	if p.tied {
		m.lmHead = m.embed
	} else {
		m.lmHead = l.Mat("lm_head.weight", p.vocab, p.hidden)
	}
	mtpPre := fmt.Sprintf("%slayers.%d.", root, p.layers)
	if p.nextn > 0 && l.Has(mtpPre+"eh_proj.weight") {
		m.mtp = loadMTP(l, &p, mtpPre, p.layers, m.lmHead)
		m.layout = append(m.layout, kvcache.LayerWidth{K: p.kvLora, V: 2 * p.idxDim})
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	for _, s := range m.stateLayout {
		m.stateBytes += s.Bytes()
	}
	m.info = model.Info{
		Arch:             arch,
		Vocab:            p.vocab,
		Hidden:           p.hidden,
		Layers:           p.layers,
		MaxContext:       p.maxContext,
		KVBytesPerToken:  m.layout.BytesPerToken(),
		StateBytesPerSeq: m.stateBytes,
	}
	if m.mtp != nil {
		return withMTP{m}, nil
	}
	return m, nil
}

// Info implements model.Model.
func (m *Model) Info() model.Info { return m.info }

// CacheLayout implements model.Model: per decoder layer, zero width for a
// KDA layer, and K = kv_lora_rank (the normed latent c_t) with V =
// 2·index_head_dim (the indexer's k_t and γ_t; the last token of a complete
// pool holds the pool's key instead) for a DSA layer (V = 0 when it shares
// the previous layer's selection); then the MTP layer, laid out as a DSA
// layer, when loaded.
func (m *Model) CacheLayout() kvcache.Layout { return slices.Clone(m.layout) }

// StateLayout implements model.StateModel: one entry per KDA layer, in layer
// order: S [heads, dk, dk] and the conv state [K−1, 3·heads·dk].
func (m *Model) StateLayout() []linattn.LayerShape { return slices.Clone(m.stateLayout) }

// pass is what the layers of one forward pass share.
type pass struct {
	nn.Ctx
	states *linattn.StatePool // the batch's state pool; nil for an MTP pass
	slots  []*linattn.Slot    // (sequences) each sequence's state slot
	start  []int              // (sequences+1) first row of each sequence; start[len] = N
	kpool  int                // index_kpool
	tail   bool               // index_kpool_always_select_tail
	pools  int                // index_topk / index_kpool: room per row in sel
	sel    []int32            // (N, pools) kept pools of each row, increasing (first nsel[r] valid)
	nsel   []int32            // (N)
}

// seqRows returns the row range [lo, hi) of sequence s.
func (p *pass) seqRows(s int) (lo, hi int) { return p.start[s], p.start[s+1] }

// ensureSel sizes the selection for n rows of k pools.
func (p *pass) ensureSel(n, k int) {
	if cap(p.sel) < n*k {
		p.sel = make([]int32, n*k)
	}
	if cap(p.nsel) < n {
		p.nsel = make([]int32, n)
	}
	p.sel, p.nsel, p.pools = p.sel[:n*k], p.nsel[:n], k
}

// tokens appends to dst the positions row r attends to: every token of
// its kept pools, then (with the tail option) the incomplete tail pool
// [t+1 − (t+1) mod kpool, t], all increasing.
func (p *pass) tokens(dst []int32, r, kpool int) []int32 {
	for _, P := range p.sel[r*p.pools : r*p.pools+int(p.nsel[r])] {
		for j := range kpool {
			dst = append(dst, P*int32(kpool)+int32(j))
		}
	}
	if p.tail {
		t := p.Tok.Pos[r]
		for s := t + 1 - (t+1)%int32(kpool); s <= t; s++ {
			dst = append(dst, s)
		}
	}
	return dst
}

// begin prepares m.pass for batch b.
func (m *Model) begin(b *model.Batch) *pass {
	p := &m.pass
	p.Backend, p.Cache = m.be, b.Cache
	p.Arena.Reset()
	p.kpool, p.tail = m.p.kpool, m.p.tail
	b.FillTokens(&p.Tok)
	p.start = append(p.start[:0], 0)
	p.slots = p.slots[:0]
	p.states = b.States
	for i := range b.Seqs {
		p.start = append(p.start, p.start[i]+len(b.Seqs[i].Tokens))
		p.slots = append(p.slots, b.Seqs[i].State)
	}
	return p
}

// end drops the pass's references to the batch.
func (m *Model) end() {
	p := &m.pass
	p.Cache, p.states = nil, nil
	clear(p.Tok.KV)
	clear(p.slots)
}

// validate checks b for a main-model pass: Batch.Validate plus the
// recurrent-state slots.
func (m *Model) validate(b *model.Batch) error {
	if err := b.Validate(m.p.vocab, m.layout); err != nil {
		return err
	}
	return b.ValidateStates(m.stateLayout)
}

// Forward implements model.Model. Each sequence's KDA state is read from
// and written back to Seq.State; a sequence at Pos 0 starts from a zeroed
// state. Hidden returns the post-final-norm hidden states (the mean of the
// streams after the final norm), the input of the MTP layer.
func (m *Model) Forward(b *model.Batch) (*model.Output, error) {
	if err := m.validate(b); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.begin(b)
	defer m.end()
	if len(m.stateLayout) > 0 {
		for i := range b.Seqs {
			if b.Seqs[i].Pos == 0 {
				b.States.Reset(b.Seqs[i].State)
			}
		}
	}
	n, H, hc := p.N(), m.p.hidden, m.p.hc
	X := p.Arena.Get(n * hc * H) // (N, hc, hidden) residual streams
	for r := range n {
		s := &b.Seqs[p.Tok.Seq[r]]
		row := X[r*hc*H : (r+1)*hc*H]
		m.embed.RowF32(row[:H], int(s.Tokens[int(p.Tok.Pos[r])-s.Pos]))
		for j := 1; j < hc; j++ {
			copy(row[j*H:(j+1)*H], row[:H])
		}
	}
	for i, l := range m.layers {
		m.layerForward(l, i, p, X)
		if m.trace != nil {
			m.trace(i, X)
		}
	}
	// Final collapse: the unweighted mean of the streams.
	x := p.Arena.Get(n * H) // (N, hidden)
	inv := 1 / float64(hc)
	for r := range n {
		for d := range H {
			var s float64
			for j := range hc {
				s += float64(X[r*hc*H+j*H+d])
			}
			x[r*H+d] = float32(s * inv)
		}
	}
	return m.output(p, b.Seqs, x, m.norm, m.lmHead), nil
}

// layerForward runs decoder layer l (index i) on the streams X (N, hc, hidden).
func (m *Model) layerForward(l *layer, i int, p *pass, X []float32) {
	a, n := &p.Arena, p.N()
	H, hc := m.p.hidden, m.p.hc
	mark := a.Mark()
	y := a.Get(n * H)               // (N, hidden) collapsed input, then normed
	o := a.Get(n * H)               // (N, hidden) sublayer output
	coef := a.Get(n * (hc + hc*hc)) // (N, hc+hc·hc) [post | comb]

	l.attnHC.pre(p.Backend, a, X, y, coef, n)
	l.attnNorm.Forward(y, y, n)
	if l.kda != nil {
		l.kda.forward(p, o, y)
	} else {
		l.dsa.forward(p, o, y)
		if m.traceSel != nil && l.dsa.idx != nil {
			m.traceSel(i, p)
		}
	}
	ref.HyperPost(X, o, coef, hc, n)

	l.ffnHC.pre(p.Backend, a, X, y, coef, n)
	l.ffnNorm.Forward(y, y, n)
	l.ffn.Forward(p.Backend, a, o, y, n)
	ref.HyperPost(X, o, coef, hc, n)
	a.Release(mark)
}

// output applies norm to x (N, hidden) in place, then head to the rows
// each sequence wants logits for.
func (m *Model) output(p *pass, seqs []model.Seq, x []float32, norm *nn.RMSNorm, head *kernels.Mat) *model.Output {
	H, V := m.p.hidden, m.p.vocab
	norm.Forward(x, x, p.N())
	var rows []int
	for i := range seqs {
		lo, hi := p.seqRows(i)
		switch seqs[i].Logits {
		case model.LastLogits:
			rows = append(rows, hi-1)
		case model.AllLogits:
			for r := lo; r < hi; r++ {
				rows = append(rows, r)
			}
		}
	}
	lx := p.Arena.Get(len(rows) * H) // (logit rows, hidden)
	for k, r := range rows {
		copy(lx[k*H:(k+1)*H], x[r*H:(r+1)*H])
	}
	logits := make([]float32, len(rows)*V) // (logit rows, vocab)
	if len(rows) > 0 {
		p.Backend.MatMul(logits, lx, head, len(rows))
	}
	out := &model.Output{Seqs: make([]model.SeqOutput, len(seqs))}
	k := 0
	for i := range seqs {
		lo, hi := p.seqRows(i)
		nl := 0
		switch seqs[i].Logits {
		case model.LastLogits:
			nl = 1
		case model.AllLogits:
			nl = hi - lo
		}
		out.Seqs[i].Logits = logits[k*V : (k+nl)*V : (k+nl)*V]
		k += nl
		if seqs[i].Hidden {
			out.Seqs[i].Hidden = slices.Clone(x[lo*H : hi*H])
		}
	}
	return out
}
