// Package transformer holds the loading code shared by the decoder-only
// GQA architectures (llama, qwen3, qwen3_moe, mixtral, glm4_moe): reading
// the common hyperparameters from config.json (the rotary embedding also
// for engine/models/mla), loading an attention block and dense MLPs
// (DenseMLP), and wrapping blocks with the embedding, final norm and LM
// head into a gqa.Decoder on the op set (NewModel). Each architecture
// package keeps what differs: its MoE FFN (through nn.Loader's MoE
// loaders), its optional tensors and its config quirks.
package transformer

import (
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Params are the hyperparameters every GQA decoder reads from config.json.
type Params struct {
	Hidden     int     // hidden_size
	Layers     int     // num_hidden_layers
	Heads      int     // num_attention_heads
	KVHeads    int     // num_key_value_heads (default: Heads)
	HeadDim    int     // head_dim (default: hidden_size / num_attention_heads)
	Inter      int     // intermediate_size of dense MLPs (0 when absent)
	Vocab      int     // vocab_size
	MaxContext int     // max_position_embeddings
	Eps        float32 // rms_norm_eps
	Tied       bool    // tie_word_embeddings: the LM head is the embedding
	Rope       nn.RopeConfig
}

// Read reads the common hyperparameters. Missing or mistyped keys are
// recorded in cfg.Err(); Read returns that error (if any) after checking
// the values are consistent.
func Read(cfg *config.Config, tiedDefault bool) (Params, error) {
	p := Params{
		Hidden:     cfg.Int("hidden_size"),
		Layers:     cfg.Int("num_hidden_layers"),
		Heads:      cfg.Int("num_attention_heads"),
		Inter:      cfg.IntOr("intermediate_size", 0),
		Vocab:      cfg.Int("vocab_size"),
		MaxContext: cfg.IntOr("max_position_embeddings", 0),
		Eps:        float32(cfg.FloatOr("rms_norm_eps", 1e-6)),
		Tied:       cfg.BoolOr("tie_word_embeddings", tiedDefault),
	}
	p.KVHeads = cfg.IntOr("num_key_value_heads", p.Heads)
	if p.Heads > 0 {
		p.HeadDim = cfg.IntOr("head_dim", p.Hidden/p.Heads)
	}
	p.Rope = RopeConfig(cfg.Rope(), p.HeadDim, p.MaxContext)
	if err := cfg.Err(); err != nil {
		return p, err
	}
	switch {
	case p.Hidden <= 0 || p.Layers <= 0 || p.Heads <= 0 || p.KVHeads <= 0 || p.HeadDim <= 0 || p.Vocab <= 0:
		return p, fmt.Errorf("non-positive dimension: hidden_size %d, num_hidden_layers %d, num_attention_heads %d, num_key_value_heads %d, head_dim %d, vocab_size %d",
			p.Hidden, p.Layers, p.Heads, p.KVHeads, p.HeadDim, p.Vocab)
	case p.Heads%p.KVHeads != 0:
		return p, fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", p.Heads, p.KVHeads)
	case p.Eps < 0 || math.IsNaN(float64(p.Eps)):
		return p, fmt.Errorf("rms_norm_eps %g", p.Eps)
	}
	return p, nil
}

// RopeConfig is the rotary embedding of rp (config.json's rope
// parameters) over heads of headDim dims, for up to maxPos positions.
func RopeConfig(rp config.RopeParams, headDim, maxPos int) nn.RopeConfig {
	return nn.RopeConfig{
		HeadDim:              headDim,
		PartialRotaryFactor:  rp.PartialRotaryFactor,
		Theta:                rp.Theta,
		Type:                 rp.Type,
		Factor:               rp.Factor,
		OriginalMaxPositions: rp.OriginalMaxPos,
		MaxPositions:         maxPos,
		LowFreqFactor:        rp.LowFreqFactor,
		HighFreqFactor:       rp.HighFreqFactor,
		BetaFast:             rp.BetaFast,
		BetaSlow:             rp.BetaSlow,
		Mscale:               rp.MScale,
		MscaleAllDim:         rp.MScaleAllDim,
		AttentionFactor:      rp.AttentionFactor,
		NoTruncate:           !rp.Truncate,
		FreqFactors:          rp.FreqFactors,
	}
}

// Layout is the cache layout of Layers uniform GQA layers.
func (p Params) Layout() kvcache.Layout {
	l := make(kvcache.Layout, p.Layers)
	for i := range l {
		l[i] = kvcache.LayerWidth{K: p.KVHeads * p.HeadDim, V: p.KVHeads * p.HeadDim}
	}
	return l
}

// AttnOptions select an attention block's optional parts.
type AttnOptions struct {
	QKVBias bool // q_proj/k_proj/v_proj have biases
	OBias   bool // o_proj has a bias
	QKNorm  bool // q_norm/k_norm (RMSNorm over head_dim) before RoPE
}

// LoadAttention loads model.layers.{layer}.self_attn.
func LoadAttention(l *nn.Loader, p Params, layer int, rope *nn.RoPE, o AttnOptions) *nn.SelfAttention {
	pre := fmt.Sprintf("model.layers.%d.self_attn.", layer)
	q, kv := p.Heads*p.HeadDim, p.KVHeads*p.HeadDim
	a := &nn.SelfAttention{
		Q:    l.Linear(pre+"q_proj", q, p.Hidden, o.QKVBias),
		K:    l.Linear(pre+"k_proj", kv, p.Hidden, o.QKVBias),
		V:    l.Linear(pre+"v_proj", kv, p.Hidden, o.QKVBias),
		O:    l.Linear(pre+"o_proj", p.Hidden, q, o.OBias),
		Rope: rope,
		Attn: nn.NewAttention(layer, p.Heads, p.KVHeads, p.HeadDim),
	}
	if o.QKNorm {
		a.QNorm = l.RMSNorm(pre+"q_norm", p.HeadDim, p.Eps, false)
		a.KNorm = l.RMSNorm(pre+"k_norm", p.HeadDim, p.Eps, false)
	}
	return a
}

// LoadBlock loads the norms of model.layers.{layer} around attn and ffn.
func LoadBlock(l *nn.Loader, p Params, layer int, attn *nn.SelfAttention, ffn nn.FFN) *nn.Block {
	pre := fmt.Sprintf("model.layers.%d.", layer)
	return &nn.Block{
		AttnNorm: l.RMSNorm(pre+"input_layernorm", p.Hidden, p.Eps, false),
		Attn:     attn,
		FFNNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.Hidden, p.Eps, false),
		FFN:      ffn,
	}
}

// NewModel loads the embedding, final norm and LM head (the embedding when
// tied) and assembles the blocks into a gqa.Decoder on the op set; be must
// be a kernels.Device. It returns the loader's errors, if any.
func NewModel(l *nn.Loader, p Params, arch string, blocks []*nn.Block, be kernels.Backend) (*gqa.Decoder, error) {
	dev, ok := be.(kernels.Device)
	if !ok {
		return nil, &model.OpsError{Backend: be.Name(), Missing: "the op set (kernels.Device)"}
	}
	embed := l.Mat("model.embed_tokens.weight", p.Vocab, p.Hidden)
	norm := l.RMSNorm("model.norm", p.Hidden, p.Eps, false)
	head := embed
	if !p.Tied {
		head = l.Mat("lm_head.weight", p.Vocab, p.Hidden)
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	return gqa.New(dev, arch, embed, blocks, norm, head, p.Layout(), p.MaxContext)
}

// FFNLoader loads layer i's FFN with l (under FFNPrefix(i), or where the
// checkpoint names it).
type FFNLoader func(l *nn.Loader, i int) nn.FFN

// FFNPrefix is where layer i's FFN is: "model.layers.{i}.mlp".
func FFNPrefix(i int) string { return fmt.Sprintf("model.layers.%d.mlp", i) }

// DenseMLP loads every layer's FFN as a SwiGLU MLP of p.Inter under
// FFNPrefix(i), with biases when bias (Llama's mlp_bias).
func DenseMLP(p Params, bias bool) FFNLoader {
	return func(l *nn.Loader, i int) nn.FFN {
		return l.MLP(FFNPrefix(i), nn.HFNames, p.Hidden, p.Inter, bias)
	}
}

// RequireInter records intermediate_size as missing in cfg when Read found
// none (Read leaves Inter 0 then), for the architectures whose every layer
// needs it.
func RequireInter(cfg *config.Config, p Params) {
	if p.Inter <= 0 {
		cfg.Int("intermediate_size")
	}
}

// Blocks returns a loader over w and block, which loads model.layers.{i}:
// the attention with o, ffn's FFN and the block's two norms. An MTP layer
// (i = p.Layers) loads the same way.
func Blocks(w model.WeightSource, p Params, o AttnOptions, ffn FFNLoader) (*nn.Loader, func(i int) *nn.Block, error) {
	rope, err := NewRoPE(p)
	if err != nil {
		return nil, nil, err
	}
	l := nn.NewLoader(w)
	block := func(i int) *nn.Block {
		attn := LoadAttention(l, p, i, rope, o)
		return LoadBlock(l, p, i, attn, ffn(l, i))
	}
	return l, block, nil
}

// Build loads the p.Layers blocks of Blocks and assembles them with
// NewModel: the whole of a uniform GQA architecture but its FFN.
func Build(w model.WeightSource, p Params, arch string, o AttnOptions, ffn FFNLoader, be kernels.Backend) (*gqa.Decoder, error) {
	l, block, err := Blocks(w, p, o, ffn)
	if err != nil {
		return nil, err
	}
	layers := make([]*nn.Block, p.Layers)
	for i := range layers {
		layers[i] = block(i)
	}
	return NewModel(l, p, arch, layers, be)
}

// NewRoPE builds the rotary embedding for p (NeoX half-split pairing).
func NewRoPE(p Params) (*nn.RoPE, error) { return nn.NewRoPE(p.Rope) }
