package mla

import (
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
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

// Model is an MLA decoder: model.Decoder's forward pass over Blocks.
type Model struct {
	*model.Decoder
	attn []*Attention // (layers [+ the NextN layer]) for inspection and tests
}

// Attention returns layer i's attention; i = Info().Layers is the NextN
// layer's when the model has one.
func (m *Model) Attention(i int) *Attention { return m.attn[i] }

// SetForm forces every layer's MLA form (FormAuto restores the default).
func (m *Model) SetForm(f Form) {
	for _, a := range m.attn {
		a.Form = f
	}
}

// mtpModel is a Model with its NextN layer.
type mtpModel struct {
	*Model
	mtp *NextN
}

// ForwardMTP implements model.MTPModel.
func (m *mtpModel) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	return m.mtp.Forward(m.Decoder, b, hidden)
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
	sparse                               []bool // (layers) MoE rather than dense MLP
	dsa                                  []bool // (layers) DSA attention
	shared                               []bool // (layers) DSA layer reusing an earlier selection
	rope                                 nn.RopeConfig
	scale                                float32
}

type dims struct{ qLora, kvLora, nope, rope, v int }

type moeParams struct {
	experts, topK, inter, shared, groups, topKGroups int
	scale                                            float64
	normTopK                                         bool
}

func readParams(cfg *config.Config, s Spec) (params, error) {
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
			experts:    cfg.IntOr("n_routed_experts", cfg.IntOr("num_experts", 0)),
			topK:       cfg.IntOr("num_experts_per_tok", 0),
			inter:      cfg.IntOr("moe_intermediate_size", 0),
			shared:     cfg.IntOr("n_shared_experts", 1),
			groups:     cfg.IntOr("n_group", 1),
			topKGroups: cfg.IntOr("topk_group", 1),
			scale:      cfg.FloatOr("routed_scaling_factor", 1),
			normTopK:   cfg.BoolOr("norm_topk_prob", true),
		},
		nextn: cfg.IntOr("num_nextn_predict_layers", 0),
	}
	if s.DSA {
		p.idxHeads = cfg.Int("index_n_heads")
		p.idxDim = cfg.Int("index_head_dim")
		p.idxTopK = cfg.Int("index_topk")
	}
	if act := cfg.StringOr("hidden_act", "silu"); act != "silu" {
		return p, fmt.Errorf("hidden_act %q: only silu is supported", act)
	}
	if f := cfg.StringOr("scoring_func", "sigmoid"); f != "sigmoid" {
		return p, fmt.Errorf("scoring_func %q: only sigmoid (noaux_tc) routing is supported", f)
	}
	var mlpTypes, layerTypes, idxTypes []string
	if cfg.Has("mlp_layer_types") {
		mlpTypes = cfg.Strings("mlp_layer_types")
	}
	if cfg.Has("layer_types") {
		layerTypes = cfg.Strings("layer_types")
	}
	firstDense := cfg.IntOr("first_k_dense_replace", s.FirstDense)
	if s.SharedIndexers {
		switch {
		case cfg.Has("indexer_types"):
			idxTypes = cfg.Strings("indexer_types")
		case cfg.Has("index_topk_pattern"):
			for _, r := range cfg.StringOr("index_topk_pattern", "") {
				switch r {
				case 'F':
					idxTypes = append(idxTypes, "full")
				case 'S':
					idxTypes = append(idxTypes, "shared")
				default:
					idxTypes = append(idxTypes, string(r))
				}
			}
		default:
			freq := max(cfg.IntOr("index_topk_freq", 1), 1)
			off := cfg.IntOr("index_skip_topk_offset", 2)
			for i := range max(p.layers, 0) {
				if max(i-off+1, 0)%freq == 0 {
					idxTypes = append(idxTypes, "full")
				} else {
					idxTypes = append(idxTypes, "shared")
				}
			}
		}
	}
	rp := cfg.Rope()
	if err := cfg.Err(); err != nil {
		return p, err
	}

	d := p.dims
	switch {
	case p.hidden <= 0 || p.layers <= 0 || p.heads <= 0 || p.vocab <= 0:
		return p, fmt.Errorf("non-positive dimension: hidden_size %d, num_hidden_layers %d, num_attention_heads %d, vocab_size %d",
			p.hidden, p.layers, p.heads, p.vocab)
	case d.kvLora <= 0 || d.nope < 0 || d.rope <= 0 || d.rope%2 != 0 || d.v <= 0 || d.qLora < 0:
		return p, fmt.Errorf("bad MLA shape: kv_lora_rank %d, qk_nope_head_dim %d, qk_rope_head_dim %d (even, > 0), v_head_dim %d, q_lora_rank %d",
			d.kvLora, d.nope, d.rope, d.v, d.qLora)
	case p.eps < 0 || math.IsNaN(float64(p.eps)):
		return p, fmt.Errorf("rms_norm_eps %g", p.eps)
	case mlpTypes != nil && len(mlpTypes) != p.layers:
		return p, fmt.Errorf("mlp_layer_types has %d entries for %d layers", len(mlpTypes), p.layers)
	case layerTypes != nil && len(layerTypes) != p.layers:
		return p, fmt.Errorf("layer_types has %d entries for %d layers", len(layerTypes), p.layers)
	case idxTypes != nil && len(idxTypes) != p.layers:
		return p, fmt.Errorf("indexer_types has %d entries for %d layers", len(idxTypes), p.layers)
	}

	p.sparse = make([]bool, p.layers)
	p.dsa = make([]bool, p.layers)
	p.shared = make([]bool, p.layers)
	anySparse, anyDSA := false, false
	for i := range p.layers {
		if mlpTypes != nil {
			switch mlpTypes[i] {
			case "dense":
			case "sparse":
				p.sparse[i] = true
			default:
				return p, fmt.Errorf("mlp_layer_types[%d] = %q, want dense or sparse", i, mlpTypes[i])
			}
		} else {
			p.sparse[i] = i >= firstDense
		}
		anySparse = anySparse || p.sparse[i]
		lt := "deepseek_sparse_attention"
		if !s.DSA {
			lt = "full_attention"
		}
		if layerTypes != nil {
			lt = layerTypes[i]
		}
		switch {
		case lt == "deepseek_sparse_attention" && s.DSA:
			p.dsa[i] = true
		case lt == "full_attention":
		default:
			return p, fmt.Errorf("layer_types[%d] = %q is not supported by %s", i, lt, s.Arch)
		}
		anyDSA = anyDSA || p.dsa[i]
		if idxTypes != nil && p.dsa[i] {
			switch idxTypes[i] {
			case "full":
			case "shared":
				if i == 0 || !p.dsa[i-1] {
					return p, fmt.Errorf("indexer_types[%d] is shared but layer %d has no DSA indexer to share", i, i-1)
				}
				p.shared[i] = true
			default:
				return p, fmt.Errorf("indexer_types[%d] = %q, want full or shared", i, idxTypes[i])
			}
		}
	}
	m := p.moe
	if anySparse || p.nextn > 0 {
		switch {
		case m.experts <= 0 || m.topK <= 0 || m.topK > m.experts || m.inter <= 0 || m.shared < 0:
			return p, fmt.Errorf("bad MoE shape: n_routed_experts %d, num_experts_per_tok %d, moe_intermediate_size %d, n_shared_experts %d",
				m.experts, m.topK, m.inter, m.shared)
		case m.groups <= 0 || m.experts%m.groups != 0 || m.topKGroups <= 0 || m.topKGroups > m.groups || (m.groups > 1 && m.experts/m.groups < 2):
			return p, fmt.Errorf("bad expert groups: n_group %d, topk_group %d for %d experts", m.groups, m.topKGroups, m.experts)
		}
	}
	if anyDSA {
		switch {
		case p.idxHeads <= 0 || p.idxDim < d.rope || p.idxTopK <= 0:
			return p, fmt.Errorf("bad indexer shape: index_n_heads %d, index_head_dim %d (≥ qk_rope_head_dim %d), index_topk %d",
				p.idxHeads, p.idxDim, d.rope, p.idxTopK)
		case d.qLora == 0:
			return p, fmt.Errorf("the DSA indexer needs q_lora_rank")
		}
	}

	p.rope = nn.RopeConfig{
		HeadDim:              d.rope, // transformers points head_dim at qk_rope_head_dim
		Theta:                rp.Theta,
		Type:                 rp.Type,
		Factor:               rp.Factor,
		OriginalMaxPositions: rp.OriginalMaxPos,
		MaxPositions:         p.maxCtx,
		LowFreqFactor:        rp.LowFreqFactor,
		HighFreqFactor:       rp.HighFreqFactor,
		BetaFast:             rp.BetaFast,
		BetaSlow:             rp.BetaSlow,
		Mscale:               rp.MScale,
		MscaleAllDim:         rp.MScaleAllDim,
		AttentionFactor:      rp.AttentionFactor,
		NoTruncate:           !rp.Truncate,
	}
	scale := 1 / math.Sqrt(float64(d.nope+d.rope))
	if rp.Type != "" && rp.Type != "default" && rp.MScaleAllDim != 0 {
		ms := nn.YarnMscale(rp.Factor, rp.MScaleAllDim)
		scale *= ms * ms
	}
	p.scale = float32(scale)
	return p, nil
}

// latentEps is the eps of q_a_layernorm and kv_a_layernorm: transformers
// builds them without an eps argument, so rms_norm_eps does not apply.
const latentEps = 1e-6

// New builds an MLA model from cfg as spec describes it.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend, spec Spec) (model.Model, error) {
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
	var idxRope *nn.RoPE
	if spec.DSA {
		ic := p.rope
		ic.Interleaved = spec.IndexerInterleaved
		if idxRope, err = nn.NewRoPE(ic); err != nil {
			return nil, err
		}
	}

	l := nn.NewLoader(w)
	m := &Model{}
	layers := make([]model.Layer, p.layers)
	layout := make(kvcache.Layout, p.layers, p.layers+1)
	var lastFull *Attention // the selection a shared layer reuses
	for i := range p.layers {
		blk := loadBlock(l, &p, i, rope, p.sparse[i])
		a := blk.Attn
		switch {
		case p.shared[i]:
			a.Share = lastFull
		case p.dsa[i]:
			a.Indexer = loadIndexer(l, &p, i, idxRope)
			lastFull = a
		}
		layout[i] = a.width()
		layers[i] = blk
		m.attn = append(m.attn, a)
	}

	d := &model.Decoder{
		Arch:       spec.Arch,
		Embed:      l.Mat("model.embed_tokens.weight", p.vocab, p.hidden),
		Layers:     layers,
		Norm:       l.RMSNorm("model.norm", p.hidden, p.eps, false),
		MaxContext: p.maxCtx,
		Backend:    be,
	}
	if p.tied {
		d.LMHead = d.Embed
	} else {
		d.LMHead = l.Mat("lm_head.weight", p.vocab, p.hidden)
	}
	m.Decoder = d

	var mtp *NextN
	if HasNextN(l, p.nextn, p.layers) {
		L := p.layers
		pre := fmt.Sprintf("model.layers.%d.", L)
		blk := loadBlock(l, &p, L, rope, l.Has(pre+"mlp.gate.weight"))
		if spec.DSA && l.Has(pre+"self_attn.indexer.wk.weight") {
			blk.Attn.Indexer = loadIndexer(l, &p, L, idxRope)
		}
		layout = append(layout, blk.Attn.width())
		m.attn = append(m.attn, blk.Attn)
		mtp = LoadNextN(l, L, p.hidden, p.eps, blk, d.LMHead)
	}
	d.Layout = layout
	if err := l.Err(); err != nil {
		return nil, err
	}
	for _, a := range m.attn {
		a.prepare()
	}
	if mtp != nil {
		return &mtpModel{Model: m, mtp: mtp}, nil
	}
	return m, nil
}

// width is the attention's cache slot: the latent and rope key, plus the
// index key when it has an indexer.
func (a *Attention) width() kvcache.LayerWidth {
	w := kvcache.LayerWidth{K: a.KVLora + a.Rope}
	if a.Indexer != nil {
		w.V = a.Indexer.Dim
	}
	return w
}

// loadBlock loads model.layers.{i}: MLA attention (without indexer) and a
// dense MLP or a noaux_tc MoE.
func loadBlock(l *nn.Loader, p *params, i int, rope *nn.RoPE, sparse bool) *Block {
	pre := fmt.Sprintf("model.layers.%d.", i)
	at := pre + "self_attn."
	d := p.dims
	qw := p.heads * (d.nope + d.rope)
	a := &Attention{
		Layer: i, Heads: p.heads, Nope: d.nope, Rope: d.rope, V: d.v, KVLora: d.kvLora, Scale: p.scale,
		KVA:     l.Linear(at+"kv_a_proj_with_mqa", d.kvLora+d.rope, p.hidden, p.bias),
		KVANorm: l.RMSNorm(at+"kv_a_layernorm", d.kvLora, latentEps, false),
		KVB:     l.Linear(at+"kv_b_proj", p.heads*(d.nope+d.v), d.kvLora, false),
		O:       l.Linear(at+"o_proj", p.hidden, p.heads*d.v, p.bias),
		RoPE:    rope,
	}
	if d.qLora > 0 {
		a.QA = l.Linear(at+"q_a_proj", d.qLora, p.hidden, p.bias)
		a.QANorm = l.RMSNorm(at+"q_a_layernorm", d.qLora, latentEps, false)
		a.QB = l.Linear(at+"q_b_proj", qw, d.qLora, false)
	} else {
		a.QB = l.Linear(at+"q_proj", qw, p.hidden, false)
	}
	mp := pre + "mlp"
	var ffn nn.FFN
	if sparse {
		mo := p.moe
		moe := &nn.MoE{
			Router: nn.Router{
				W:          l.Mat(mp+".gate.weight", mo.experts, p.hidden),
				Bias:       l.Vec(mp+".gate.e_score_correction_bias", mo.experts),
				Scoring:    nn.SigmoidScoring,
				TopK:       mo.topK,
				NormTopK:   mo.normTopK,
				Scale:      float32(mo.scale),
				Groups:     mo.groups,
				TopKGroups: mo.topKGroups,
			},
			Experts: l.Experts(mp+".experts", nn.HFNames, mo.experts, p.hidden, mo.inter),
		}
		if mo.shared > 0 {
			moe.Shared = l.MLP(mp+".shared_experts", nn.HFNames, p.hidden, mo.inter*mo.shared, false)
		}
		ffn = moe
	} else {
		if p.inter <= 0 {
			l.Failf("layer %d is dense but intermediate_size is %d", i, p.inter)
		}
		ffn = l.MLP(mp, nn.HFNames, p.hidden, max(p.inter, 1), false)
	}
	return &Block{
		AttnNorm: l.RMSNorm(pre+"input_layernorm", p.hidden, p.eps, false),
		Attn:     a,
		FFNNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.hidden, p.eps, false),
		FFN:      ffn,
	}
}

// loadIndexer loads model.layers.{i}.self_attn.indexer.
func loadIndexer(l *nn.Loader, p *params, i int, rope *nn.RoPE) *Indexer {
	pre := fmt.Sprintf("model.layers.%d.self_attn.indexer.", i)
	return &Indexer{
		Heads: p.idxHeads, Dim: p.idxDim, TopK: p.idxTopK,
		Scale: float32(1 / math.Sqrt(float64(p.idxDim))),
		WQ:    l.Linear(pre+"wq_b", p.idxHeads*p.idxDim, p.dims.qLora, false),
		WK:    l.Linear(pre+"wk", p.idxDim, p.hidden, false),
		KNorm: &nn.LayerNorm{W: l.Vec(pre+"k_norm.weight", p.idxDim), B: l.Vec(pre+"k_norm.bias", p.idxDim), Eps: 1e-6},
		W:     l.Linear(pre+"weights_proj", p.idxHeads, p.hidden, false),
		RoPE:  rope,
	}
}
