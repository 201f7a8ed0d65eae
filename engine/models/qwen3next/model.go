package qwen3next

import (
	"fmt"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
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
	if !cfg.RopeHas("partial_rotary_factor") {
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

// loader is what the layer loaders share: the checkpoint's tensors and the
// device the small weights go to.
type loader struct {
	*nn.Loader
	u *gqa.Uploader
	p *params
}

// selectRows is gqa.SelectRows, recording its error; a matrix that failed
// to load (already reported) stays empty.
func (l *loader) selectRows(w *kernels.Mat, idx []int) *kernels.Mat {
	if w.Rows == 0 {
		return w
	}
	m, err := gqa.SelectRows(w, idx)
	if err != nil {
		l.Fail(err)
		return &kernels.Mat{}
	}
	return m
}

// New builds a Qwen3-Next model on the op set: a gqa.Decoder whose blocks
// mix Gated DeltaNet and gated attention, with the MTP layer as a
// gqa.NextN when the checkpoint has one.
func New(cfg *config.Config, w model.WeightSource, be kernels.Backend) (model.Model, error) {
	p, err := readParams(cfg)
	if err != nil {
		return nil, err
	}
	dev, ok := be.(kernels.Device)
	if !ok {
		return nil, &model.OpsError{Backend: be.Name(), Missing: "the op set (kernels.Device)"}
	}
	rope, err := transformer.NewRoPE(p.Params)
	if err != nil {
		return nil, err
	}
	l := &loader{Loader: nn.NewLoader(w), u: gqa.NewUploader(dev), p: &p}
	rot := l.u.Rotary(rope) // uploaded once, shared by the attention layers
	var blocks []*gqa.Block
	var layout kvcache.Layout // (layers [+1 MTP]) zero width for linear layers
	kvw := p.KVHeads * p.HeadDim
	linear := 0
	for i, t := range p.types {
		pre := fmt.Sprintf("model.layers.%d.", i)
		var mix gqa.Mixer
		if t == linearAttention {
			mix = l.gdn(pre+"linear_attn.", linear)
			linear++
			layout = append(layout, kvcache.LayerWidth{})
		} else {
			mix = l.attention(pre+"self_attn.", i, rot)
			layout = append(layout, kvcache.LayerWidth{K: kvw, V: kvw})
		}
		blocks = append(blocks, l.block(pre, mix, p.sparse(i)))
	}
	embed := l.Mat("model.embed_tokens.weight", p.Vocab, p.Hidden)
	norm := l.u.Norm(l.RMSNorm("model.norm", p.Hidden, p.Eps, true))
	head := embed
	if !p.Tied {
		head = l.Mat("lm_head.weight", p.Vocab, p.Hidden)
	}
	var nx *gqa.NextN
	if p.mtpLayers > 0 && l.Has("mtp.fc.weight") {
		nx = l.mtp(embed, head, p.Layers, rot)
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	if err := l.u.Err(); err != nil {
		return nil, err
	}
	d, err := gqa.NewDecoder(dev, "qwen3_next", embed, blocks, norm, head, layout, p.MaxContext)
	if err != nil || nx == nil {
		return d, err
	}
	return d.WithNextN(nx, kvcache.LayerWidth{K: kvw, V: kvw})
}

// block loads the norms and FFN of the pre-norm layer under pre around mix.
func (l *loader) block(pre string, mix gqa.Mixer, sparse bool) *gqa.Block {
	p := l.p
	ffn := l.u.FFN(loadFFN(l.Loader, p, pre+"mlp", sparse))
	return &gqa.Block{
		AttnNorm: l.u.Norm(l.RMSNorm(pre+"input_layernorm", p.Hidden, p.Eps, true)),
		Mixer:    mix,
		FFNNorm:  l.u.Norm(l.RMSNorm(pre+"post_attention_layernorm", p.Hidden, p.Eps, true)),
		FFN:      ffn,
	}
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
	moe := l.SoftmaxMoE(prefix, nn.HFNames, p.experts, p.topK, p.normTopK, p.Hidden, p.moeInter)
	if p.sharedInter > 0 {
		moe.Shared = l.MLP(prefix+".shared_expert", nn.HFNames, p.Hidden, p.sharedInter, false)
		moe.SharedGate = l.Linear(prefix+".shared_expert_gate", 1, p.Hidden, false) // (1, hidden)
	}
	return moe
}
