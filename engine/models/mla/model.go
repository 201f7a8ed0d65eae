package mla

import (
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/models/internal/transformer"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Spec is what an MLA architecture fixes in code rather than in
// config.json.
type Spec struct {
	Arch string // model_type, for Info and errors

	// DSA: layers typed "deepseek_sparse_attention" in layer_types (every
	// layer when the key is absent) have a lightning indexer.
	DSA bool
	// IndexerInterleaved: the indexer rotates interleaved pairs (GLM-5)
	// rather than half-split ones (DeepSeek-V3.2).
	IndexerInterleaved bool
	// SharedIndexers: read GLM-5's IndexCache schedule (indexer_types, or
	// index_topk_pattern, or index_topk_freq / index_skip_topk_offset).
	SharedIndexers bool
	// RopeInterleaveKey: the MLA RoPE pairing follows config rope_interleave
	// (default true; glm4_moe_lite). Otherwise it is always interleaved.
	RopeInterleaveKey bool
	// FirstDense is first_k_dense_replace when neither it nor
	// mlp_layer_types is in the config.
	FirstDense int
}

// Model is an MLA decoder: a gqa.Decoder (embedding, pre-norm blocks,
// output head on the op set) whose blocks mix tokens with MLA Attention.
type Model struct {
	*gqa.Decoder
	attn []*Attention // (layers [+ the NextN layer]) for inspection and tests
}

// Attention returns layer i's attention; i = Info().Layers is the NextN
// layer's when the model has one.
func (m *Model) Attention(i int) *Attention { return m.attn[i] }

// SetForm forces every layer's MLA form (kernels.MLAAuto restores the
// default).
func (m *Model) SetForm(f kernels.MLAForm) {
	for _, a := range m.attn {
		a.Shape.Form = f
	}
}

// mtpModel is a Model with its NextN layer.
type mtpModel struct {
	*Model
	mtp *gqa.MTPDecoder
}

// ForwardMTP implements model.MTPModel.
func (m *mtpModel) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	return m.mtp.ForwardMTP(b, hidden)
}

// params are the hyperparameters New reads from config.json.
type params struct {
	hidden, layers, heads, vocab, maxCtx int
	eps                                  float32
	tied, bias                           bool
	dims                                 dims
	inter                                int
	moe                                  moeParams
	idxHeads, idxDim, idxTopK            int
	nextn                                int
	schedule
	rope  nn.RopeConfig
	scale float32
}

type dims struct{ qLora, kvLora, nope, rope, v int }

type moeParams struct {
	nn.GroupedMoEShape
	scale    float64 // routed_scaling_factor
	normTopK bool
}

// schedule is what each layer is.
type schedule struct {
	sparse []bool // (layers) MoE rather than dense MLP
	dsa    []bool // (layers) DSA attention
	shared []bool // (layers) DSA layer reusing an earlier selection
}

// readParams reads the hyperparameters: the defaults, the layer schedule,
// then the checks that tie them together.
func readParams(cfg *config.Config, s Spec) (params, error) {
	p := readDefaults(cfg, s)
	types, err := readTypes(cfg, s, p.layers)
	rp := cfg.Rope()
	if cerr := cfg.Err(); cerr != nil {
		return p, cerr
	}
	if err != nil {
		return p, err
	}
	if err := p.validate(); err != nil {
		return p, err
	}
	if p.schedule, err = types.schedule(s, p.layers); err != nil {
		return p, err
	}
	if err := p.validateSchedule(); err != nil {
		return p, err
	}
	// transformers points head_dim at qk_rope_head_dim; MLA rotates all of
	// it and has no per-frequency factors.
	p.rope = transformer.RopeConfig(rp, p.dims.rope, p.maxCtx)
	p.rope.PartialRotaryFactor, p.rope.FreqFactors = 0, nil
	scale := 1 / math.Sqrt(float64(p.dims.nope+p.dims.rope))
	if rp.Type != "" && rp.Type != "default" && rp.MScaleAllDim != 0 {
		ms := nn.YarnMscale(rp.Factor, rp.MScaleAllDim)
		scale *= ms * ms
	}
	p.scale = float32(scale)
	return p, nil
}

// readDefaults reads every dimension, with the architectures' defaults.
func readDefaults(cfg *config.Config, s Spec) params {
	p := params{
		hidden: cfg.Int("hidden_size"),
		layers: cfg.Int("num_hidden_layers"),
		heads:  cfg.Int("num_attention_heads"),
		vocab:  cfg.Int("vocab_size"),
		maxCtx: cfg.IntOr("max_position_embeddings", 0),
		eps:    float32(cfg.FloatOr("rms_norm_eps", 1e-6)),
		tied:   cfg.BoolOr("tie_word_embeddings", false),
		bias:   cfg.BoolOr("attention_bias", false),
		inter:  cfg.IntOr("intermediate_size", 0),
		dims: dims{
			qLora:  cfg.IntOr("q_lora_rank", 0),
			kvLora: cfg.Int("kv_lora_rank"),
			nope:   cfg.Int("qk_nope_head_dim"),
			rope:   cfg.Int("qk_rope_head_dim"),
			v:      cfg.Int("v_head_dim"),
		},
		moe: moeParams{
			GroupedMoEShape: nn.GroupedMoEShape{
				Experts:    cfg.IntOr("n_routed_experts", cfg.IntOr("num_experts", 0)),
				TopK:       cfg.IntOr("num_experts_per_tok", 0),
				Inter:      cfg.IntOr("moe_intermediate_size", 0),
				Shared:     cfg.IntOr("n_shared_experts", 1),
				Groups:     cfg.IntOr("n_group", 1),
				TopKGroups: cfg.IntOr("topk_group", 1),
			},
			scale:    cfg.FloatOr("routed_scaling_factor", 1),
			normTopK: cfg.BoolOr("norm_topk_prob", true),
		},
		nextn: cfg.IntOr("num_nextn_predict_layers", 0),
	}
	if s.DSA {
		p.idxHeads = cfg.Int("index_n_heads")
		p.idxDim = cfg.Int("index_head_dim")
		p.idxTopK = cfg.Int("index_topk")
	}
	return p
}

// layerTypes are the config's per-layer type lists (nil when absent) and
// first_k_dense_replace.
type layerTypes struct {
	mlp, attn, indexer []string
	firstDense         int
}

// readTypes reads the per-layer type lists, GLM-5's IndexCache schedule
// (indexer_types, else index_topk_pattern, else index_topk_freq /
// index_skip_topk_offset) turned into one, and the activation and scoring
// the model must use.
func readTypes(cfg *config.Config, s Spec, layers int) (layerTypes, error) {
	var t layerTypes
	if act := cfg.StringOr("hidden_act", "silu"); act != "silu" {
		return t, fmt.Errorf("hidden_act %q: only silu is supported", act)
	}
	if f := cfg.StringOr("scoring_func", "sigmoid"); f != "sigmoid" {
		return t, fmt.Errorf("scoring_func %q: only sigmoid (noaux_tc) routing is supported", f)
	}
	if cfg.Has("mlp_layer_types") {
		t.mlp = cfg.Strings("mlp_layer_types")
	}
	if cfg.Has("layer_types") {
		t.attn = cfg.Strings("layer_types")
	}
	t.firstDense = cfg.IntOr("first_k_dense_replace", s.FirstDense)
	if !s.SharedIndexers {
		return t, nil
	}
	t.indexer = cfg.IndexerTypes(layers)
	return t, nil
}

// validate checks the dimensions.
func (p *params) validate() error {
	d := p.dims
	switch {
	case p.hidden <= 0 || p.layers <= 0 || p.heads <= 0 || p.vocab <= 0:
		return fmt.Errorf("non-positive dimension: hidden_size %d, num_hidden_layers %d, num_attention_heads %d, vocab_size %d",
			p.hidden, p.layers, p.heads, p.vocab)
	case d.kvLora <= 0 || d.nope < 0 || d.rope <= 0 || d.rope%2 != 0 || d.v <= 0 || d.qLora < 0:
		return fmt.Errorf("bad MLA shape: kv_lora_rank %d, qk_nope_head_dim %d, qk_rope_head_dim %d (even, > 0), v_head_dim %d, q_lora_rank %d",
			d.kvLora, d.nope, d.rope, d.v, d.qLora)
	case p.eps < 0 || math.IsNaN(float64(p.eps)):
		return fmt.Errorf("rms_norm_eps %g", p.eps)
	}
	return nil
}

// schedule turns the type lists into per-layer flags.
func (t layerTypes) schedule(s Spec, layers int) (schedule, error) {
	var sc schedule
	for _, l := range []struct {
		name string
		list []string
	}{{"mlp_layer_types", t.mlp}, {"layer_types", t.attn}, {"indexer_types", t.indexer}} {
		if l.list != nil && len(l.list) != layers {
			return sc, fmt.Errorf("%s has %d entries for %d layers", l.name, len(l.list), layers)
		}
	}
	sc.sparse, sc.dsa, sc.shared = make([]bool, layers), make([]bool, layers), make([]bool, layers)
	for i := range layers {
		if t.mlp != nil {
			switch t.mlp[i] {
			case "dense":
			case "sparse":
				sc.sparse[i] = true
			default:
				return sc, fmt.Errorf("mlp_layer_types[%d] = %q, want dense or sparse", i, t.mlp[i])
			}
		} else {
			sc.sparse[i] = i >= t.firstDense
		}
		lt := "full_attention"
		if s.DSA {
			lt = "deepseek_sparse_attention"
		}
		if t.attn != nil {
			lt = t.attn[i]
		}
		switch {
		case lt == "deepseek_sparse_attention" && s.DSA:
			sc.dsa[i] = true
		case lt == "full_attention":
		default:
			return sc, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, lt, s.Arch)
		}
		if t.indexer != nil && sc.dsa[i] {
			switch t.indexer[i] {
			case config.FullIndexer:
			case config.SharedIndexer:
				if i == 0 || !sc.dsa[i-1] {
					return sc, fmt.Errorf("indexer_types[%d] is shared but layer %d has no DSA indexer to share", i, i-1)
				}
				sc.shared[i] = true
			default:
				return sc, fmt.Errorf("indexer_types[%d] = %q, want full or shared", i, t.indexer[i])
			}
		}
	}
	return sc, nil
}

// validateSchedule checks the MoE and indexer shapes the schedule uses.
func (p *params) validateSchedule() error {
	anySparse, anyDSA := false, false
	for i := range p.layers {
		anySparse = anySparse || p.sparse[i]
		anyDSA = anyDSA || p.dsa[i]
	}
	if anySparse || p.nextn > 0 {
		if err := p.moe.Check(); err != nil {
			return err
		}
	}
	if anyDSA {
		switch {
		case p.idxHeads <= 0 || p.idxDim < p.dims.rope || p.idxTopK <= 0:
			return fmt.Errorf("bad indexer shape: index_n_heads %d, index_head_dim %d (≥ qk_rope_head_dim %d), index_topk %d",
				p.idxHeads, p.idxDim, p.dims.rope, p.idxTopK)
		case p.dims.qLora == 0:
			return fmt.Errorf("the DSA indexer needs q_lora_rank")
		}
	}
	return nil
}

// latentEps is the eps of q_a_layernorm and kv_a_layernorm: transformers
// builds them without an eps argument, so rms_norm_eps does not apply.
const latentEps = 1e-6

// ops are the device and the MLA capabilities a model runs on.
type ops struct {
	dev kernels.Device
	mla kernels.MLAOps
	sp  kernels.SparseOps
}

// Register registers spec's architecture under its model_type (spec.Arch):
// an MLA architecture's package is its Spec and an init calling Register.
func Register(spec Spec) {
	model.Register(spec.Arch, func(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
		return New(cfg, w, be, spec)
	})
}

// New builds an MLA model from cfg as spec describes it, on be, which must
// implement the op set with kernels.MLAOps and kernels.SparseOps.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend, spec Spec) (model.Model, error) {
	dev, ok := be.(kernels.Device)
	if !ok {
		return nil, &model.OpsError{Backend: be.Name(), Missing: "the op set (kernels.Device)"}
	}
	mo, ok1 := be.(kernels.MLAOps)
	sp, ok2 := be.(kernels.SparseOps)
	if !ok1 || !ok2 {
		return nil, &model.OpsError{Backend: be.Name(), Missing: "the op set's MLA and DSA ops (kernels.MLAOps, kernels.SparseOps)"}
	}
	p, err := readParams(cfg, spec)
	if err != nil {
		return nil, err
	}
	mlaRope := p.rope
	mlaRope.Interleaved = !spec.RopeInterleaveKey || cfg.BoolOr("rope_interleave", true)
	rope, err := nn.NewRoPE(mlaRope)
	if err != nil {
		return nil, err
	}
	idxRope := p.rope
	idxRope.Interleaved = spec.IndexerInterleaved

	b := &builder{l: nn.NewLoader(w), u: gqa.NewUploader(dev), p: &p, ops: ops{dev: dev, mla: mo, sp: sp}}
	b.rope = b.u.Rotary(rope)
	if spec.DSA {
		r, err := nn.NewRoPE(idxRope)
		if err != nil {
			return nil, err
		}
		b.idxRope = b.u.Rotary(r)
	}
	m := &Model{}
	blocks := make([]*gqa.Block, p.layers)
	layout := make(kvcache.Layout, p.layers)
	var lastFull *Attention // the selection a shared layer reuses
	for i := range p.layers {
		blk, a := b.block(i, p.sparse[i])
		switch {
		case p.shared[i]:
			a.Share = lastFull
		case p.dsa[i]:
			a.Indexer = b.indexer(i)
			lastFull = a
		}
		blocks[i], layout[i] = blk, a.width()
		m.attn = append(m.attn, a)
	}
	l := b.l
	embed := l.Mat("model.embed_tokens.weight", p.vocab, p.hidden)
	head := embed
	if !p.tied {
		head = l.Mat("lm_head.weight", p.vocab, p.hidden)
	}
	norm := b.u.Norm(l.RMSNorm("model.norm", p.hidden, p.eps, false))
	if err := b.err(); err != nil {
		return nil, err
	}
	if m.Decoder, err = gqa.NewDecoder(dev, spec.Arch, embed, blocks, norm, head, layout, p.maxCtx); err != nil {
		return nil, err
	}
	if !gqa.HasNextN(l, p.nextn, p.layers) {
		return m, nil
	}
	L := p.layers
	pre := fmt.Sprintf("model.layers.%d.", L)
	blk, a := b.block(L, l.Has(pre+"mlp.gate.weight"))
	if spec.DSA && l.Has(pre+"self_attn.indexer.wk.weight") {
		a.Indexer = b.indexer(L)
	}
	m.attn = append(m.attn, a)
	if err := b.err(); err != nil {
		return nil, err
	}
	nx, err := gqa.LoadNextN(l, b.u, L, p.hidden, p.eps, blk, head)
	if err != nil {
		return nil, err
	}
	mtp, err := m.WithNextN(nx, a.width())
	if err != nil {
		return nil, err
	}
	return &mtpModel{Model: m, mtp: mtp}, nil
}

// builder loads layers and converts them onto the device.
type builder struct {
	l             *nn.Loader
	u             *gqa.Uploader
	p             *params
	ops           ops
	rope, idxRope *kernels.Rotary // MLA's (Dim = qk_rope_head_dim) and the indexer's
}

// err is the first loading or upload error.
func (b *builder) err() error {
	if err := b.l.Err(); err != nil {
		return err
	}
	return b.u.Err()
}

// width is the attention's cache row: K the latent and rope key, V the
// index key when it has an indexer.
func (a *Attention) width() kvcache.LayerWidth {
	w := kvcache.LayerWidth{K: a.Shape.KVLora + a.Shape.Rope}
	if a.Indexer != nil {
		w.V = a.Indexer.Shape.Dim
	}
	return w
}

// block loads model.layers.{i}: MLA attention (without indexer) and a
// dense MLP or a noaux_tc MoE.
func (b *builder) block(i int, sparse bool) (*gqa.Block, *Attention) {
	l, u, p := b.l, b.u, b.p
	pre := fmt.Sprintf("model.layers.%d.", i)
	at := pre + "self_attn."
	d := p.dims
	qw := p.heads * (d.nope + d.rope)
	a := &Attention{
		Layer: i, ops: b.ops, Rope: b.rope,
		Shape:   kernels.MLAShape{Heads: p.heads, Nope: d.nope, Rope: d.rope, V: d.v, KVLora: d.kvLora, Scale: p.scale},
		KVA:     u.Linear(l.Linear(at+"kv_a_proj_with_mqa", d.kvLora+d.rope, p.hidden, p.bias)),
		KVANorm: u.Norm(l.RMSNorm(at+"kv_a_layernorm", d.kvLora, latentEps, false)),
		KVB:     l.Mat(at+"kv_b_proj.weight", p.heads*(d.nope+d.v), d.kvLora),
		O:       u.Linear(l.Linear(at+"o_proj", p.hidden, p.heads*d.v, p.bias)),
	}
	kernels.DeclareKVB(b.ops.mla, a.KVB, a.Shape) // its per-head split is then made after the load
	if d.qLora > 0 {
		qa := u.Linear(l.Linear(at+"q_a_proj", d.qLora, p.hidden, p.bias))
		a.QA = &qa
		a.QANorm = u.Norm(l.RMSNorm(at+"q_a_layernorm", d.qLora, latentEps, false))
		a.QB = u.Linear(l.Linear(at+"q_b_proj", qw, d.qLora, false))
	} else {
		a.QB = u.Linear(l.Linear(at+"q_proj", qw, p.hidden, false))
	}
	mp := pre + "mlp"
	var ffn nn.FFN
	if sparse {
		ffn = l.GroupedMoE(mp, p.moe.GroupedMoEShape, p.hidden, p.moe.normTopK, float32(p.moe.scale))
	} else {
		if p.inter <= 0 {
			l.Failf("layer %d is dense but intermediate_size is %d", i, p.inter)
		}
		ffn = l.MLP(mp, nn.HFNames, p.hidden, max(p.inter, 1), false)
	}
	blk := &gqa.Block{
		AttnNorm: u.Norm(l.RMSNorm(pre+"input_layernorm", p.hidden, p.eps, false)),
		Mixer:    a,
		FFNNorm:  u.Norm(l.RMSNorm(pre+"post_attention_layernorm", p.hidden, p.eps, false)),
	}
	if l.Err() == nil {
		blk.FFN = u.FFN(ffn)
	}
	return blk, a
}

// indexer loads model.layers.{i}.self_attn.indexer.
func (b *builder) indexer(i int) *Indexer {
	l, u, p := b.l, b.u, b.p
	pre := fmt.Sprintf("model.layers.%d.self_attn.indexer.", i)
	return &Indexer{
		// The head weights' index_n_heads^-½ is folded into Scale.
		Shape: kernels.IndexerShape{Heads: p.idxHeads, Dim: p.idxDim, TopK: p.idxTopK,
			Scale: float32(1 / math.Sqrt(float64(p.idxDim)*float64(p.idxHeads)))},
		WQ:     u.Linear(l.Linear(pre+"wq_b", p.idxHeads*p.idxDim, p.dims.qLora, false)),
		WK:     u.Linear(l.Linear(pre+"wk", p.idxDim, p.hidden, false)),
		KNormW: u.Vec(l.Vec(pre+"k_norm.weight", p.idxDim)),
		KNormB: u.Vec(l.Vec(pre+"k_norm.bias", p.idxDim)),
		W:      u.Linear(l.Linear(pre+"weights_proj", p.idxHeads, p.hidden, false)),
		Rope:   b.idxRope,
		ops:    b.ops,
	}
}
