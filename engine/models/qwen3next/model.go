package qwen3next

import (
	"fmt"
	"slices"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

func init() { model.Register("qwen3_next", New) }

// Layer types as config.json's layer_types spells them.
const (
	linearAttention = "linear_attention"
	fullAttention   = "full_attention"
)

// params are the hyperparameters beyond transformer.Params.
type params struct {
	transformer.Params
	types []string // (layers) linearAttention or fullAttention

	// Gated DeltaNet.
	keyHeads, valueHeads int // linear_num_key_heads Hk, linear_num_value_heads Hv
	keyDim, valueDim     int // linear_key_head_dim dk, linear_value_head_dim dv
	convK                int // linear_conv_kernel_dim

	// MoE.
	experts, topK int
	moeInter      int // moe_intermediate_size
	sharedInter   int // shared_expert_intermediate_size (0: no shared expert)
	normTopK      bool
	sparseStep    int
	mlpOnly       []int
	attnBias      bool
	mtpLayers     int  // mtp_num_hidden_layers
	mtpOwnEmbed   bool // mtp_use_dedicated_embeddings
}

// readParams reads config.json with Qwen3NextConfig's defaults for the keys
// a checkpoint may leave out.
func readParams(cfg *config.Config) (params, error) {
	tp, err := transformer.Read(cfg, false)
	if err != nil {
		return params{}, err
	}
	p := params{Params: tp}
	if !cfg.Has("head_dim") {
		p.HeadDim, p.Rope.HeadDim = 256, 256 // Qwen3NextConfig's default, not hidden/heads
	}
	if !cfg.Has("partial_rotary_factor") && !cfg.Sub("rope_parameters").Has("partial_rotary_factor") &&
		!cfg.Sub("rope_scaling").Has("partial_rotary_factor") {
		p.Rope.PartialRotaryFactor = 0.25
	}
	p.keyHeads = cfg.IntOr("linear_num_key_heads", 16)
	p.valueHeads = cfg.IntOr("linear_num_value_heads", 32)
	p.keyDim = cfg.IntOr("linear_key_head_dim", 128)
	p.valueDim = cfg.IntOr("linear_value_head_dim", 128)
	p.convK = cfg.IntOr("linear_conv_kernel_dim", 4)
	p.experts = cfg.IntOr("num_experts", 512)
	p.topK = cfg.IntOr("num_experts_per_tok", 10)
	p.moeInter = cfg.IntOr("moe_intermediate_size", 512)
	p.sharedInter = cfg.IntOr("shared_expert_intermediate_size", 512)
	p.normTopK = cfg.BoolOr("norm_topk_prob", true)
	p.sparseStep = cfg.IntOr("decoder_sparse_step", 1)
	if cfg.Has("mlp_only_layers") {
		p.mlpOnly = cfg.Ints("mlp_only_layers")
	}
	p.attnBias = cfg.BoolOr("attention_bias", false)
	p.mtpLayers = cfg.IntOr("mtp_num_hidden_layers", 1)
	p.mtpOwnEmbed = cfg.BoolOr("mtp_use_dedicated_embeddings", false)
	act := cfg.StringOr("hidden_act", "silu")
	if cfg.Has("layer_types") {
		p.types = cfg.Strings("layer_types")
	} else {
		interval := cfg.IntOr("full_attention_interval", 4)
		if interval <= 0 {
			return p, fmt.Errorf("full_attention_interval %d must be positive", interval)
		}
		p.types = make([]string, p.Layers)
		for i := range p.types {
			p.types[i] = linearAttention
			if (i+1)%interval == 0 {
				p.types[i] = fullAttention
			}
		}
	}
	if err := cfg.Err(); err != nil {
		return p, err
	}
	switch {
	case act != "silu":
		return p, fmt.Errorf("hidden_act %q: only silu is supported", act)
	case len(p.types) != p.Layers:
		return p, fmt.Errorf("layer_types has %d entries for %d layers", len(p.types), p.Layers)
	case p.keyHeads <= 0 || p.valueHeads <= 0 || p.keyDim <= 0 || p.valueDim <= 0 || p.convK <= 0:
		return p, fmt.Errorf("bad linear attention shape: linear_num_key_heads %d, linear_num_value_heads %d, linear_key_head_dim %d, linear_value_head_dim %d, linear_conv_kernel_dim %d",
			p.keyHeads, p.valueHeads, p.keyDim, p.valueDim, p.convK)
	case p.valueHeads%p.keyHeads != 0:
		return p, fmt.Errorf("linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", p.valueHeads, p.keyHeads)
	case p.experts > 0 && (p.topK <= 0 || p.topK > p.experts || p.moeInter <= 0 || p.sharedInter < 0 || p.sparseStep <= 0):
		return p, fmt.Errorf("bad MoE shape: num_experts %d, num_experts_per_tok %d, moe_intermediate_size %d, shared_expert_intermediate_size %d, decoder_sparse_step %d",
			p.experts, p.topK, p.moeInter, p.sharedInter, p.sparseStep)
	case p.mtpLayers < 0:
		return p, fmt.Errorf("mtp_num_hidden_layers %d", p.mtpLayers)
	}
	for i, t := range p.types {
		if t != linearAttention && t != fullAttention {
			return p, fmt.Errorf("layer_types[%d] = %q: want %q or %q", i, t, linearAttention, fullAttention)
		}
	}
	return p, nil
}

// sparse reports whether layer i's FFN is the MoE block.
func (p *params) sparse(i int) bool {
	return !slices.Contains(p.mlpOnly, i) && p.experts > 0 && (i+1)%p.sparseStep == 0
}

// Model is a loaded Qwen3-Next. It implements model.StateModel; a model
// loaded with its MTP head is wrapped in a type that also implements
// model.MTPModel.
type Model struct {
	embed  *kernels.Mat // (vocab, hidden) token embedding
	layers []*layer     // (num_hidden_layers)
	norm   *nn.RMSNorm  // (hidden) model.norm, 1+w
	lmHead *kernels.Mat // (vocab, hidden); embed when tied
	mtp    *mtp         // nil without an MTP head

	layout      kvcache.Layout       // (layers [+1 MTP]) zero width for linear layers
	stateLayout []linattn.LayerShape // (linear layers) one sequence's slot
	stateBytes  int64                // Σ stateLayout[i].Bytes()
	info        model.Info           // what Info returns
	vocab       int                  // logits per row
	hidden      int                  // hidden size
	be          kernels.Backend      // runs the matrix products and parallel loops

	mu   sync.Mutex // one pass at a time
	pass pass       // reused between passes (scratch, row maps)
	rows []int      // (logit rows) scratch of output
}

// withMTP is a Model with its MTP head: the model.MTPModel implementation.
type withMTP struct{ *Model }

// New builds a Qwen3-Next model.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := readParams(cfg)
	if err != nil {
		return nil, err
	}
	rope, err := transformer.NewRoPE(p.Params)
	if err != nil {
		return nil, err
	}
	l := nn.NewLoader(w)
	m := &Model{be: be, vocab: p.Vocab, hidden: p.Hidden}
	kvw := p.KVHeads * p.HeadDim
	for i, t := range p.types {
		pre := fmt.Sprintf("model.layers.%d.", i)
		ly := &layer{
			attnNorm: l.RMSNorm(pre+"input_layernorm", p.Hidden, p.Eps, true),
			ffnNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.Hidden, p.Eps, true),
			ffn:      loadFFN(l, &p, pre+"mlp", p.sparse(i)),
		}
		if t == linearAttention {
			g := loadGDN(l, &p, pre+"linear_attn.", len(m.stateLayout), be)
			ly.mix = g
			m.stateLayout = append(m.stateLayout, g.shape())
			m.layout = append(m.layout, kvcache.LayerWidth{})
		} else {
			ly.mix = loadAttention(l, &p, pre+"self_attn.", i, rope)
			m.layout = append(m.layout, kvcache.LayerWidth{K: kvw, V: kvw})
		}
		m.layers = append(m.layers, ly)
	}
	m.embed = l.Mat("model.embed_tokens.weight", p.Vocab, p.Hidden)
	m.norm = l.RMSNorm("model.norm", p.Hidden, p.Eps, true)
	if p.Tied {
		m.lmHead = m.embed
	} else {
		m.lmHead = l.Mat("lm_head.weight", p.Vocab, p.Hidden)
	}
	if p.mtpLayers > 0 && l.Has("mtp.fc.weight") {
		m.mtp = loadMTP(l, &p, m.embed, p.Layers, rope)
		m.layout = append(m.layout, kvcache.LayerWidth{K: kvw, V: kvw})
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	for _, s := range m.stateLayout {
		m.stateBytes += s.Bytes()
	}
	m.info = model.Info{
		Arch:             "qwen3_next",
		Vocab:            p.Vocab,
		Hidden:           p.Hidden,
		Layers:           p.Layers,
		MaxContext:       p.MaxContext,
		KVBytesPerToken:  m.layout.BytesPerToken(),
		StateBytesPerSeq: m.stateBytes,
	}
	if m.mtp != nil {
		return withMTP{m}, nil
	}
	return m, nil
}

// loadFFN loads the MoE block (sparse) or the dense MLP under prefix.
func loadFFN(l *nn.Loader, p *params, prefix string, sparse bool) nn.FFN {
	if !sparse {
		if p.Inter <= 0 {
			l.Failf("%s is a dense MLP but intermediate_size is %d", prefix, p.Inter)
			return &nn.MLP{}
		}
		return l.MLP(prefix, nn.HFNames, p.Hidden, p.Inter, false)
	}
	moe := &nn.MoE{
		Router: nn.Router{
			W:        l.Mat(prefix+".gate.weight", p.experts, p.Hidden), // (experts, hidden)
			Scoring:  nn.SoftmaxScoring,
			TopK:     p.topK,
			NormTopK: p.normTopK,
			Scale:    1,
		},
		Experts: l.Experts(prefix+".experts", nn.HFNames, p.experts, p.Hidden, p.moeInter),
	}
	if p.sharedInter > 0 {
		moe.Shared = l.MLP(prefix+".shared_expert", nn.HFNames, p.Hidden, p.sharedInter, false)
		moe.SharedGate = l.Linear(prefix+".shared_expert_gate", 1, p.Hidden, false) // (1, hidden)
	}
	return moe
}

// Info implements model.Model.
func (m *Model) Info() model.Info { return m.info }

// CacheLayout implements model.Model: one entry per decoder layer (zero
// width for linear-attention layers), plus the MTP layer last when loaded.
func (m *Model) CacheLayout() kvcache.Layout { return slices.Clone(m.layout) }

// StateLayout implements model.StateModel: one entry per linear-attention
// layer, in layer order.
func (m *Model) StateLayout() []linattn.LayerShape { return slices.Clone(m.stateLayout) }

// layer is one pre-norm decoder layer.
type layer struct {
	attnNorm *nn.RMSNorm // (hidden) input_layernorm, 1+w
	mix      mixer       // *gdn or *gatedAttention
	ffnNorm  *nn.RMSNorm // (hidden) post_attention_layernorm, 1+w
	ffn      nn.FFN      // *nn.MoE or *nn.MLP
}

// mixer is a layer's token mixer.
type mixer interface {
	// forward sets y (N, hidden) = Mixer(x (N, hidden)), updating the
	// batch's cache slots or recurrent state.
	forward(p *pass, y, x []float32)
}

// forward updates the residual stream x (N, hidden) in place.
func (l *layer) forward(p *pass, x []float32) {
	a, n := &p.Arena, p.N()
	mark := a.Mark()
	h := a.Get(len(x)) // (N, hidden)
	y := a.Get(len(x)) // (N, hidden)
	l.attnNorm.Forward(h, x, n)
	l.mix.forward(p, y, h)
	for i, v := range y {
		x[i] += v
	}
	l.ffnNorm.Forward(h, x, n)
	l.ffn.Forward(p.Backend, a, y, h, n)
	for i, v := range y {
		x[i] += v
	}
	a.Release(mark)
}

// pass is what the layers of one forward pass share.
type pass struct {
	nn.Ctx
	states *linattn.StatePool // the batch's state pool; nil for an MTP pass
	slots  []*linattn.Slot    // (sequences) each sequence's state slot
	start  []int              // (sequences+1) first row of each sequence; start[len] = N
}

// seqRows returns the row range [lo, hi) of sequence s.
func (p *pass) seqRows(s int) (lo, hi int) { return p.start[s], p.start[s+1] }

// begin prepares m.pass for batch b: row maps, cache and scratch.
func (m *Model) begin(b *model.Batch) *pass {
	p := &m.pass
	p.Backend, p.Cache = m.be, b.Cache
	p.Arena.Reset()
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
	if err := b.Validate(m.vocab, m.layout); err != nil {
		return err
	}
	return b.ValidateStates(m.stateLayout)
}

// Forward implements model.Model. Each sequence's linear-attention state is
// read from and written back to Seq.State; a sequence at Pos 0 starts from
// a zeroed state.
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
				b.States.Reset(b.Seqs[i].State) // no history: a zero state
			}
		}
	}
	n, hidden := p.N(), m.hidden
	x := p.Arena.Get(n * hidden) // (N, hidden) residual stream
	for r := range n {
		s := &b.Seqs[p.Tok.Seq[r]]
		m.embed.RowF32(x[r*hidden:(r+1)*hidden], int(s.Tokens[int(p.Tok.Pos[r])-s.Pos]))
	}
	for _, l := range m.layers {
		l.forward(p, x)
	}
	return m.output(p, b.Seqs, x, m.norm), nil
}

// output applies the final norm to x (N, hidden) in place, then the LM head
// to the rows each sequence wants logits for.
func (m *Model) output(p *pass, seqs []model.Seq, x []float32, norm *nn.RMSNorm) *model.Output {
	hidden, vocab := m.hidden, m.vocab
	norm.Forward(x, x, p.N())
	rows := m.rows[:0]
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
	m.rows = rows
	lx := p.Arena.Get(len(rows) * hidden) // (logit rows, hidden)
	for k, r := range rows {
		copy(lx[k*hidden:(k+1)*hidden], x[r*hidden:(r+1)*hidden])
	}
	logits := make([]float32, len(rows)*vocab) // (logit rows, vocab)
	if len(rows) > 0 {
		p.Backend.MatMul(logits, lx, m.lmHead, len(rows))
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
		out.Seqs[i].Logits = logits[k*vocab : (k+nl)*vocab : (k+nl)*vocab]
		k += nl
		if seqs[i].Hidden {
			out.Seqs[i].Hidden = slices.Clone(x[lo*hidden : hi*hidden])
		}
	}
	return out
}
