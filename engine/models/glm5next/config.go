package glm5next

import (
	"fmt"
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/nn"
)

// Layer kinds of layer_types, mlp_layer_types and indexer_types.
const (
	linearAttention = "linear_attention"          // KDA
	sparseAttention = "deepseek_sparse_attention" // NoPE MLA + k-pool DSA indexer
	fullAttention   = "full_attention"            // an alias of sparseAttention (Glm5NextTextConfig)
	denseFFN        = "dense"
	sparseFFN       = "sparse"
	fullIndexer     = config.FullIndexer   // the layer runs its own indexer
	sharedIndexer   = config.SharedIndexer // the layer reuses the previous layer's selection
)

// params are the hyperparameters read from config.json (the text config of
// the vision-language wrapper, or a flat text config). Defaults are those
// of transformers' Glm5NextTextConfig.
type params struct {
	hidden     int     // hidden_size
	layers     int     // num_hidden_layers
	vocab      int     // vocab_size
	maxContext int     // max_position_embeddings
	eps        float32 // rms_norm_eps: every RMSNorm, the gated KDA norm and the mHC input norm
	tied       bool    // tie_word_embeddings
	inter      int     // intermediate_size of the dense MLPs

	types    []string // (layers) linearAttention or sparseAttention
	mlpTypes []string // (layers) denseFFN or sparseFFN
	idxTypes []string // (layers) fullIndexer or sharedIndexer (only read on DSA layers)

	// KDA (linear_attn_config / linear_*).
	linHeads   int     // linear_num_heads
	linDim     int     // linear_head_dim (dk = dv)
	convK      int     // linear_conv_kernel_dim
	lowerBound float32 // linear_lower_bound (< 0), or 0 for none (Kimi's softplus gate)

	// MLA.
	heads    int  // num_attention_heads (= num_key_value_heads)
	qLora    int  // q_lora_rank
	kvLora   int  // kv_lora_rank
	nope     int  // qk_nope_head_dim (= qk_head_dim: no RoPE part)
	vDim     int  // v_head_dim
	attnBias bool // attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj biases

	// k-pool DSA indexer.
	idxHeads int  // index_n_heads
	idxDim   int  // index_head_dim
	idxTopK  int  // index_topk (tokens; index_topk/index_kpool pools)
	kpool    int  // index_kpool
	tail     bool // index_kpool_always_select_tail

	// mHC.
	hc      int     // hc_mult streams
	hcIters int     // hc_sinkhorn_iters
	hcEps   float32 // hc_eps

	// FFN.
	experts    int     // n_routed_experts (num_local_experts)
	shared     int     // n_shared_experts
	topK       int     // num_experts_per_tok
	moeInter   int     // moe_intermediate_size
	groups     int     // n_group
	topKGroups int     // topk_group
	scale      float32 // routed_scaling_factor
	normTopK   bool    // norm_topk_prob
	limit      float32 // swiglu_limit; +Inf when null

	nextn int // num_nextn_predict_layers

	// Read only to be validated.
	kvHeads  int    // num_key_value_heads (must equal heads)
	ropeDim  int    // qk_rope_head_dim (must be 0)
	hasQLora bool   // q_lora_rank is not null
	act      string // hidden_act (must be silu)
}

// readParams reads and checks cfg: the hyperparameters with their
// defaults, then the layer schedule, then the validation of both.
func readParams(cfg *config.Config) (params, error) {
	p := readDefaults(cfg)
	p.readSchedule(cfg)
	if err := cfg.Err(); err != nil {
		return p, err
	}
	return p, p.validate()
}

// readDefaults reads the scalar hyperparameters, defaulting each to
// transformers' Glm5NextTextConfig value.
func readDefaults(cfg *config.Config) params {
	p := params{
		hidden:     cfg.Int("hidden_size"),
		layers:     cfg.Int("num_hidden_layers"),
		vocab:      cfg.Int("vocab_size"),
		maxContext: cfg.IntOr("max_position_embeddings", 1048576),
		eps:        float32(cfg.FloatOr("rms_norm_eps", 1e-5)),
		tied:       cfg.BoolOr("tie_word_embeddings", false),
		inter:      cfg.IntOr("intermediate_size", 12288),

		linHeads: cfg.IntOr("linear_num_heads", 64),
		linDim:   cfg.IntOr("linear_head_dim", 128),
		convK:    cfg.IntOr("linear_conv_kernel_dim", 4),

		heads:    cfg.IntOr("num_attention_heads", 64),
		qLora:    cfg.IntOr("q_lora_rank", 1536),
		kvLora:   cfg.IntOr("kv_lora_rank", 512),
		nope:     cfg.IntOr("qk_nope_head_dim", 256),
		vDim:     cfg.IntOr("v_head_dim", 256),
		attnBias: cfg.BoolOr("attention_bias", false),

		idxHeads: cfg.IntOr("index_n_heads", 32),
		idxDim:   cfg.IntOr("index_head_dim", 128),
		idxTopK:  cfg.IntOr("index_topk", 2048),
		kpool:    cfg.IntOr("index_kpool", 16),
		tail:     cfg.BoolOr("index_kpool_always_select_tail", true),

		hc:      cfg.IntOr("hc_mult", 4),
		hcIters: cfg.IntOr("hc_sinkhorn_iters", 20),
		hcEps:   float32(cfg.FloatOr("hc_eps", 1e-6)),

		shared:     cfg.IntOr("n_shared_experts", 1),
		topK:       cfg.IntOr("num_experts_per_tok", 8),
		moeInter:   cfg.IntOr("moe_intermediate_size", 2048),
		groups:     cfg.IntOr("n_group", 1),
		topKGroups: cfg.IntOr("topk_group", 1),
		scale:      float32(cfg.FloatOr("routed_scaling_factor", 2.5)),
		normTopK:   cfg.BoolOr("norm_topk_prob", true),

		nextn: cfg.IntOr("num_nextn_predict_layers", 0),
	}
	p.experts = cfg.IntOr("n_routed_experts", cfg.IntOr("num_local_experts", 288))
	p.kvHeads = cfg.IntOr("num_key_value_heads", p.heads)
	p.ropeDim = cfg.IntOr("qk_rope_head_dim", 0)
	p.hasQLora = cfg.Has("q_lora_rank") || !slices.Contains(cfg.Keys(), "q_lora_rank")
	p.act = cfg.StringOr("hidden_act", "silu")

	// swiglu_limit: absent means 10, null means no clamp.
	p.limit = float32(cfg.FloatOr("swiglu_limit", 10))
	if slices.Contains(cfg.Keys(), "swiglu_limit") && !cfg.Has("swiglu_limit") {
		p.limit = float32(math.Inf(1))
	}
	// linear_lower_bound: absent means −5, null means none; a
	// linear_attn_config object overrides the flat keys as transformers does.
	p.lowerBound = -5
	if slices.Contains(cfg.Keys(), "linear_lower_bound") {
		p.lowerBound = float32(cfg.FloatOr("linear_lower_bound", 0))
	}
	if cfg.Has("linear_attn_config") {
		la := cfg.Sub("linear_attn_config")
		p.linDim = la.IntOr("head_dim", p.linDim)
		p.linHeads = la.IntOr("num_heads", p.linHeads)
		p.convK = la.IntOr("short_conv_kernel_size", p.convK)
		if slices.Contains(la.Keys(), "gate_lower_bound") {
			p.lowerBound = float32(la.FloatOr("gate_lower_bound", 0))
		}
		if la.BoolOr("safe_gate", true) && p.lowerBound == 0 {
			p.lowerBound = -5
		}
	}
	return p
}

// readSchedule reads the per-layer schedules (layer_types, mlp_layer_types,
// indexer_types or its older encodings), defaulting to transformers'
// patterns.
func (p *params) readSchedule(cfg *config.Config) {
	if cfg.Has("layer_types") {
		p.types = cfg.Strings("layer_types")
	} else {
		for i := range max(p.layers, 0) {
			t := linearAttention
			if i%4 == 3 {
				t = sparseAttention
			}
			p.types = append(p.types, t)
		}
	}
	for i, t := range p.types {
		if t == fullAttention {
			p.types[i] = sparseAttention
		}
	}
	if cfg.Has("mlp_layer_types") {
		p.mlpTypes = cfg.Strings("mlp_layer_types")
	} else {
		for i := range max(p.layers, 0) {
			t := sparseFFN
			if i < 3 {
				t = denseFFN
			}
			p.mlpTypes = append(p.mlpTypes, t)
		}
	}
	p.idxTypes = cfg.IndexerTypes(p.layers)
}

// validate checks the hyperparameters and the schedule against each other
// and against what the engine supports.
func (p *params) validate() error {
	if err := p.checkShapes(); err != nil {
		return err
	}
	return p.checkSchedule()
}

// checkShapes checks the scalar hyperparameters.
func (p *params) checkShapes() error {
	switch {
	case p.hidden <= 0 || p.layers <= 0 || p.vocab <= 0:
		return fmt.Errorf("non-positive dimension: hidden_size %d, num_hidden_layers %d, vocab_size %d", p.hidden, p.layers, p.vocab)
	case p.act != "silu":
		return fmt.Errorf("hidden_act %q: only silu is supported", p.act)
	case p.eps < 0 || math.IsNaN(float64(p.eps)):
		return fmt.Errorf("rms_norm_eps %g", p.eps)
	case len(p.types) != p.layers || len(p.mlpTypes) != p.layers || len(p.idxTypes) != p.layers:
		return fmt.Errorf("layer_types (%d), mlp_layer_types (%d) and indexer_types (%d) need %d entries each",
			len(p.types), len(p.mlpTypes), len(p.idxTypes), p.layers)
	case p.linHeads <= 0 || p.linDim <= 0 || p.convK <= 0:
		return fmt.Errorf("bad KDA shape: linear_num_heads %d, linear_head_dim %d, linear_conv_kernel_dim %d", p.linHeads, p.linDim, p.convK)
	case p.lowerBound > 0 || math.IsNaN(float64(p.lowerBound)):
		return fmt.Errorf("linear_lower_bound %g: want a negative bound or null", p.lowerBound)
	case !p.hasQLora || p.qLora <= 0:
		return fmt.Errorf("q_lora_rank must be set (glm5_next attention always uses the q LoRA)")
	case p.ropeDim != 0:
		return fmt.Errorf("qk_rope_head_dim %d: glm5_next attention has no RoPE (NoPE MLA), want 0", p.ropeDim)
	case p.heads <= 0 || p.kvHeads != p.heads || p.kvLora <= 0 || p.nope <= 0 || p.vDim <= 0:
		return fmt.Errorf("bad MLA shape: num_attention_heads %d, num_key_value_heads %d, kv_lora_rank %d, qk_nope_head_dim %d, v_head_dim %d",
			p.heads, p.kvHeads, p.kvLora, p.nope, p.vDim)
	case p.idxHeads <= 0 || p.idxDim <= 0 || p.kpool <= 0 || p.idxTopK < p.kpool || p.idxTopK%p.kpool != 0:
		return fmt.Errorf("bad indexer: index_n_heads %d, index_head_dim %d, index_topk %d, index_kpool %d (index_topk must be a positive multiple of index_kpool)",
			p.idxHeads, p.idxDim, p.idxTopK, p.kpool)
	case p.hc <= 0 || p.hcIters <= 0 || p.hcEps < 0:
		return fmt.Errorf("bad mHC: hc_mult %d, hc_sinkhorn_iters %d, hc_eps %g", p.hc, p.hcIters, p.hcEps)
	case p.limit <= 0 || math.IsNaN(float64(p.limit)):
		return fmt.Errorf("swiglu_limit %g", p.limit)
	case p.nextn < 0:
		return fmt.Errorf("num_nextn_predict_layers %d", p.nextn)
	}
	return nil
}

// checkSchedule checks every layer's kinds, and the MoE shape when a layer
// (or the MTP layer) has one.
func (p *params) checkSchedule() error {
	anySparse := false
	for i := range p.layers {
		switch p.types[i] {
		case linearAttention:
		case sparseAttention:
			switch p.idxTypes[i] {
			case fullIndexer:
			case sharedIndexer:
				// transformers hands a layer's selection only to the very next
				// layer, and only from a DSA layer with its own indexer.
				if i == 0 || p.types[i-1] != sparseAttention || p.idxTypes[i-1] != fullIndexer {
					return fmt.Errorf("indexer_types[%d] = %q: a shared DSA layer must follow a DSA layer with its own indexer", i, sharedIndexer)
				}
			default:
				return fmt.Errorf("indexer_types[%d] = %q: want %q or %q", i, p.idxTypes[i], fullIndexer, sharedIndexer)
			}
		default:
			return fmt.Errorf("layer_types[%d] = %q: want %q or %q", i, p.types[i], linearAttention, sparseAttention)
		}
		switch p.mlpTypes[i] {
		case denseFFN:
			if p.inter <= 0 {
				return fmt.Errorf("layer %d has a dense MLP but intermediate_size is %d", i, p.inter)
			}
		case sparseFFN:
			anySparse = true
		default:
			return fmt.Errorf("mlp_layer_types[%d] = %q: want %q or %q", i, p.mlpTypes[i], denseFFN, sparseFFN)
		}
	}
	if anySparse || p.nextn > 0 {
		shape := nn.GroupedMoEShape{Experts: p.experts, TopK: p.topK, Inter: p.moeInter, Shared: p.shared, Groups: p.groups, TopKGroups: p.topKGroups}
		if err := shape.Check(); err != nil {
			return err
		}
	}
	return nil
}

// poolsPerQuery is the number of complete pools the indexer keeps per query.
func (p *params) poolsPerQuery() int { return p.idxTopK / p.kpool }
