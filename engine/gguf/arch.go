package gguf

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ferrite-llm/ferrite/engine/config"
)

// arch is how one llama.cpp architecture maps onto a ferrite one.
type arch struct {
	// permuteQK: the converter permuted attn_q / attn_k rows for GGML's
	// adjacent-pair rotation (convert_hf_to_gguf's LlamaModel.permute),
	// which Weights undoes.
	permuteQK bool
	// mla: multi-head latent attention, whose key_length / value_length
	// describe the compressed cache rather than a head.
	mla bool
	// config fills the architecture's own keys of config.json and returns
	// its model_type.
	config func(b *cfgBuilder) string
}

// archs are the llama.cpp architectures (general.architecture) ferrite runs.
var archs = map[string]arch{
	"llama":      {permuteQK: true, config: llamaConfig},
	"qwen3":      {config: func(*cfgBuilder) string { return "qwen3" }},
	"qwen3moe":   {config: qwen3MoEConfig},
	"glm4moe":    {config: glm4MoEConfig},
	"deepseek2":  {mla: true, config: deepseek2Config},
	"deepseek32": {mla: true, config: deepseek32Config},
	"glm-dsa":    {mla: true, config: glmDSAConfig},
	"qwen3next":  {config: qwen3NextConfig},
}

// knownUnsupported are architectures that get a reason of their own: GGUF
// files that are not language models.
var knownUnsupported = map[string]string{
	"clip": "a vision projector (mmproj), not a language model",
}

// SupportedArchs lists the GGUF architectures Config accepts, sorted.
func SupportedArchs() []string { return slices.Sorted(maps.Keys(archs)) }

// Unsupported returns why ferrite cannot run a GGUF file of architecture a,
// or "" when it can.
func Unsupported(a string) string {
	if _, ok := archs[a]; ok {
		return ""
	}
	if why, ok := knownUnsupported[a]; ok {
		return why
	}
	if a == "" {
		return "no general.architecture"
	}
	return fmt.Sprintf("architecture %q is not supported (GGUF architectures ferrite runs: %s)", a, strings.Join(SupportedArchs(), ", "))
}

// Config builds the config.json of the model from the file's metadata and
// tensor shapes, as ferrite's architectures read it. Its Path names the
// GGUF file; a missing or mistyped metadata key is an error naming the key.
func (m *Model) Config() (*config.Config, error) {
	name := m.Meta.Arch()
	a, ok := archs[name]
	if !ok {
		return nil, fmt.Errorf("%s: %s", m.Path, Unsupported(name))
	}
	b := &cfgBuilder{m: m, prefix: name + ".", out: map[string]any{}}
	b.common(a.mla)
	mt := a.config(b)
	if b.err != nil {
		return nil, b.err
	}
	b.out["model_type"] = mt
	data, err := json.Marshal(b.out)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", m.Path, err)
	}
	return config.Parse(m.Path, data)
}

// maxBlocks bounds block_count, which the mapping loops over (the largest
// models have about a hundred).
const maxBlocks = 1 << 12

// cfgBuilder collects config.json keys, keeping the first error.
type cfgBuilder struct {
	m      *Model
	prefix string // "<arch>."
	out    map[string]any
	err    error
}

func (b *cfgBuilder) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// uint reads "<arch>.key": def when absent unless required.
func (b *cfgBuilder) uint(key string, required bool, def int) int {
	u, ok, err := b.m.Meta.uintKey(b.m.Path, b.prefix+key)
	switch {
	case err != nil:
		b.fail(err)
	case !ok && required:
		b.fail(fmt.Errorf("%s: missing metadata %s%s", b.m.Path, b.prefix, key))
	case ok && u > 1<<40:
		b.fail(fmt.Errorf("%s: metadata %s%s = %d is out of range", b.m.Path, b.prefix, key, u))
	case ok:
		return int(u)
	}
	return def
}

func (b *cfgBuilder) float(key string, required bool, def float64) float64 {
	f, ok, err := b.m.Meta.floatKey(b.m.Path, b.prefix+key)
	switch {
	case err != nil:
		b.fail(err)
	case !ok && required:
		b.fail(fmt.Errorf("%s: missing metadata %s%s", b.m.Path, b.prefix, key))
	case ok:
		return f
	}
	return def
}

func (b *cfgBuilder) bool(key string, def bool) bool {
	v, ok, err := b.m.Meta.boolKey(b.m.Path, b.prefix+key)
	if err != nil {
		b.fail(err)
	}
	if !ok {
		return def
	}
	return v
}

func (b *cfgBuilder) has(tensor string) bool {
	_, ok := b.m.tensors[tensor]
	return ok
}

// common sets the keys every decoder reads; mla skips the head geometry,
// which MLA architectures describe with their own keys.
func (b *cfgBuilder) common(mla bool) {
	o := b.out
	hidden := b.uint("embedding_length", true, 0)
	heads := b.uint("attention.head_count", true, 0)
	o["hidden_size"] = hidden
	blocks := b.uint("block_count", true, 0)
	if blocks > maxBlocks {
		b.fail(fmt.Errorf("%s: %sblock_count %d is more than %d", b.m.Path, b.prefix, blocks, maxBlocks))
		blocks = 0
	}
	o["num_hidden_layers"] = blocks
	o["num_attention_heads"] = heads
	o["num_key_value_heads"] = b.uint("attention.head_count_kv", false, heads)
	o["max_position_embeddings"] = b.uint("context_length", true, 0)
	o["rms_norm_eps"] = b.float("attention.layer_norm_rms_epsilon", true, 0)
	if ff := b.uint("feed_forward_length", false, 0); ff > 0 {
		o["intermediate_size"] = ff
	}
	b.vocab()
	if mla {
		b.rope(0)
		return
	}
	headDim := 0
	if heads > 0 {
		headDim = hidden / heads
	}
	headDim = b.uint("attention.key_length", false, headDim)
	if v := b.uint("attention.value_length", false, headDim); v != headDim {
		b.fail(fmt.Errorf("%s: attention.key_length %d differs from attention.value_length %d, which %s models do not have", b.m.Path, headDim, v, strings.TrimSuffix(b.prefix, ".")))
	}
	o["head_dim"] = headDim
	o["attention_bias"] = b.has("blk.0.attn_q.bias")
	b.rope(headDim)
}

// vocab sets the vocabulary size and tying from the embedding tensors.
func (b *cfgBuilder) vocab() {
	if emb, ok := b.m.tensors["token_embd.weight"]; ok && len(emb.Dims) == 2 {
		b.out["vocab_size"] = int(emb.Dims[1])
	} else {
		b.fail(fmt.Errorf("%s: missing tensor token_embd.weight (or it is not 2-D)", b.m.Path))
	}
	b.out["tie_word_embeddings"] = !b.has("output.weight")
}

// rope sets rope_parameters from rope.* metadata and the rope_freqs tensor.
func (b *cfgBuilder) rope(headDim int) {
	rp := map[string]any{"rope_theta": b.float("rope.freq_base", false, 10000), "rope_type": "default"}
	if headDim > 0 { // always set: GLM-4-MoE's default is 0.5, not 1 (MLA passes 0: its own keys)
		rp["partial_rotary_factor"] = float64(b.uint("rope.dimension_count", false, headDim)) / float64(headDim)
	}
	st := b.m.Meta.String(b.prefix + "rope.scaling.type")
	switch st {
	case "", "none":
	case "linear":
		rp["rope_type"] = "linear"
		rp["factor"] = b.float("rope.scaling.factor", true, 1)
	case "yarn":
		rp["rope_type"] = "yarn"
		rp["factor"] = b.float("rope.scaling.factor", true, 1)
		rp["original_max_position_embeddings"] = b.uint("rope.scaling.original_context_length", true, 0)
		if f := b.float("rope.scaling.yarn_beta_fast", false, 0); f > 0 {
			rp["beta_fast"] = f
		}
		if f := b.float("rope.scaling.yarn_beta_slow", false, 0); f > 0 {
			rp["beta_slow"] = f
		}
		if f := b.float("rope.scaling.yarn_attn_factor", false, 0); f > 0 {
			rp["attention_factor"] = f
		}
	default:
		b.fail(fmt.Errorf("%s: %srope.scaling.type %q is not supported (none, linear, yarn)", b.m.Path, b.prefix, st))
	}
	if t, ok := b.m.tensors["rope_freqs.weight"]; ok {
		if t.Type != TypeF32 || len(t.Dims) != 1 {
			b.fail(fmt.Errorf("%s: tensor rope_freqs.weight is %s %v, want a 1-D F32 tensor", b.m.Path, t.Type, t.Shape()))
		} else {
			ff := make([]float64, t.Numel())
			for i := range ff {
				ff[i] = float64(f32At(t.Data, i))
			}
			rp["freq_factors"] = ff
		}
	}
	b.out["rope_parameters"] = rp
}

// moeCommon sets the routed-expert keys shared by the MoE architectures and
// returns the expert count.
func (b *cfgBuilder) moeCommon(countKey string) int {
	n := b.uint("expert_count", true, 0)
	b.out[countKey] = n
	b.out["num_experts_per_tok"] = b.uint("expert_used_count", true, 0)
	b.out["moe_intermediate_size"] = b.uint("expert_feed_forward_length", true, 0)
	return n
}

// gating checks expert_gating_func (llama_expert_gating_func_type: 1
// softmax, 2 sigmoid) against what the architecture computes.
func (b *cfgBuilder) gating(want int, name string) {
	if g := b.uint("expert_gating_func", false, want); g != want {
		b.fail(fmt.Errorf("%s: %sexpert_gating_func is %d, but ferrite's %s routes with %s", b.m.Path, b.prefix, g, strings.TrimSuffix(b.prefix, "."), name))
	}
}

func llamaConfig(b *cfgBuilder) string {
	if b.uint("expert_count", false, 0) == 0 {
		return "llama"
	}
	b.moeCommonMixtral()
	return "mixtral"
}

// moeCommonMixtral sets Mixtral's keys: llama.cpp stores Mixtral as a llama
// with experts (whose size is feed_forward_length).
func (b *cfgBuilder) moeCommonMixtral() {
	b.out["num_local_experts"] = b.uint("expert_count", true, 0)
	b.out["num_experts_per_tok"] = b.uint("expert_used_count", true, 0)
	if _, ok := b.out["intermediate_size"]; !ok {
		b.fail(fmt.Errorf("%s: missing metadata %sfeed_forward_length", b.m.Path, b.prefix))
	}
}

func qwen3MoEConfig(b *cfgBuilder) string {
	b.qwenMoE()
	return "qwen3_moe"
}

// qwenMoE sets the Qwen MoE keys: softmax routing, and dense layers among
// the MoE ones (mlp_only_layers) where a block has no router.
func (b *cfgBuilder) qwenMoE() {
	b.moeCommon("num_experts")
	b.out["norm_topk_prob"] = b.bool("expert_weights_norm", true)
	b.out["decoder_sparse_step"] = 1
	dense := []int{}
	for l := range b.out["num_hidden_layers"].(int) {
		if !b.has(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)) {
			dense = append(dense, l)
		}
	}
	b.out["mlp_only_layers"] = dense
	if len(dense) > 0 && b.out["intermediate_size"] == nil {
		b.fail(fmt.Errorf("%s: dense layers %v but no %sfeed_forward_length", b.m.Path, dense, b.prefix))
	}
	b.gating(1, "softmax")
}

// qwen3NextConfig maps Qwen3-Next: Gated DeltaNet sizes from ssm.*, the
// layer types from which blocks hold attention, and the MTP block that
// GGUF counts after the last layer.
func qwen3NextConfig(b *cfgBuilder) string {
	o := b.out
	nextn := b.uint("nextn_predict_layers", false, 0)
	layers := o["num_hidden_layers"].(int) - nextn
	if layers <= 0 {
		b.fail(fmt.Errorf("%s: %snextn_predict_layers %d leaves no layers", b.m.Path, b.prefix, nextn))
		return "qwen3_next"
	}
	o["num_hidden_layers"] = layers
	o["mtp_num_hidden_layers"] = nextn
	b.qwenMoE()
	o["shared_expert_intermediate_size"] = b.uint("expert_shared_feed_forward_length", false, 0)
	o["linear_conv_kernel_dim"] = b.uint("ssm.conv_kernel", true, 0)
	o["linear_key_head_dim"] = b.uint("ssm.state_size", true, 0)
	o["linear_num_key_heads"] = b.uint("ssm.group_count", true, 0)
	nv := b.uint("ssm.time_step_rank", true, 0)
	o["linear_num_value_heads"] = nv
	if inner := b.uint("ssm.inner_size", true, 0); nv > 0 && inner%nv == 0 {
		o["linear_value_head_dim"] = inner / nv
	} else {
		b.fail(fmt.Errorf("%s: %sssm.inner_size %d is not a multiple of ssm.time_step_rank %d", b.m.Path, b.prefix, inner, nv))
	}
	types := make([]string, layers)
	for l := range types {
		types[l] = "linear_attention"
		if b.has(fmt.Sprintf("blk.%d.attn_q.weight", l)) {
			types[l] = "full_attention"
		}
	}
	o["layer_types"] = types
	return "qwen3_next"
}

func glm4MoEConfig(b *cfgBuilder) string {
	b.sigmoidMoE(true)
	b.out["use_qk_norm"] = b.has("blk.0.attn_q_norm.weight")
	return "glm4_moe"
}

// sigmoidMoE sets the keys of DeepSeek-V3-style routing (sigmoid scores,
// a correction bias, groups, shared experts, leading dense layers) and of
// the NextN (MTP) layers, which GGUF counts as blocks. normDefault is
// norm_topk_prob when expert_weights_norm is absent.
func (b *cfgBuilder) sigmoidMoE(normDefault bool) {
	b.moeCommon("n_routed_experts")
	nextn := b.uint("nextn_predict_layers", false, 0)
	if layers := b.out["num_hidden_layers"].(int); nextn >= layers {
		b.fail(fmt.Errorf("%s: %snextn_predict_layers %d leaves no layers of %d", b.m.Path, b.prefix, nextn, layers))
	} else {
		b.out["num_hidden_layers"] = layers - nextn
	}
	b.out["num_nextn_predict_layers"] = nextn
	b.out["n_shared_experts"] = b.uint("expert_shared_count", false, 0)
	b.out["first_k_dense_replace"] = b.uint("leading_dense_block_count", false, 0)
	b.out["routed_scaling_factor"] = b.float("expert_weights_scale", false, 1)
	b.out["norm_topk_prob"] = b.bool("expert_weights_norm", normDefault)
	b.out["n_group"] = b.uint("expert_group_count", false, 1)
	b.out["topk_group"] = b.uint("expert_group_used_count", false, 1)
	b.gating(2, "sigmoid")
}

// deepseek2Config maps llama.cpp's MLA architecture (DeepSeek-V2/V3,
// GLM-4.7-Flash) onto ferrite's MLA model. key_length_mla and
// value_length_mla are the per-head sizes (older files give them as
// key_length and value_length); the latent cache is kv_lora_rank wide.
func deepseek2Config(b *cfgBuilder) string {
	o := b.out
	o["num_key_value_heads"] = o["num_attention_heads"]
	if q := b.uint("attention.q_lora_rank", false, 0); q > 0 {
		o["q_lora_rank"] = q
	}
	o["kv_lora_rank"] = b.uint("attention.kv_lora_rank", true, 0)
	rope := b.uint("rope.dimension_count", true, 0)
	key, value := "attention.key_length_mla", "attention.value_length_mla"
	if _, ok := b.m.Meta.Get(b.prefix + key); !ok {
		key, value = "attention.key_length", "attention.value_length"
	}
	kl, vl := b.uint(key, true, 0), b.uint(value, true, 0)
	if kl <= rope {
		b.fail(fmt.Errorf("%s: %s%s %d is not above rope.dimension_count %d", b.m.Path, b.prefix, key, kl, rope))
	}
	o["qk_rope_head_dim"], o["qk_nope_head_dim"], o["v_head_dim"] = rope, kl-rope, vl
	o["head_dim"] = rope        // as transformers' DeepseekV3Config sets it
	o["rope_interleave"] = true // GGML's adjacent-pair rotation, as the checkpoints store it
	if mul := b.float("rope.scaling.yarn_log_multiplier", false, 0); mul > 0 {
		// convert_hf_to_gguf writes 0.1·mscale_all_dim as a float32.
		ms := float64(float32(mul / 0.1))
		rp := o["rope_parameters"].(map[string]any)
		rp["mscale"], rp["mscale_all_dim"] = ms, ms
	}
	b.sigmoidMoE(false)
	return "glm4_moe_lite"
}

// deepseek32Config maps DeepSeek-V3.2: MLA with the DSA indexer.
func deepseek32Config(b *cfgBuilder) string {
	deepseek2Config(b)
	b.indexer()
	return "deepseek_v32"
}

// glmDSAConfig maps GLM-5 (glm_moe_dsa): MLA with DSA indexers, some
// layers sharing the previous indexer's selection (attention.indexer.types:
// true for a layer with its own indexer).
func glmDSAConfig(b *cfgBuilder) string {
	deepseek2Config(b)
	b.indexer()
	if v, ok := b.m.Meta.Get(b.prefix + "attention.indexer.types"); ok {
		full, ok := v.Bools()
		if !ok || len(full) < b.out["num_hidden_layers"].(int) {
			b.fail(b.m.Meta.metaErr(b.m.Path, b.prefix+"attention.indexer.types", v, "one bool per layer"))
			return "glm_moe_dsa"
		}
		types := make([]string, b.out["num_hidden_layers"].(int))
		for i := range types {
			types[i] = "shared"
			if full[i] {
				types[i] = "full"
			}
		}
		b.out["indexer_types"] = types
	}
	return "glm_moe_dsa"
}

// indexer sets the DSA indexer's sizes.
func (b *cfgBuilder) indexer() {
	b.out["index_n_heads"] = b.uint("attention.indexer.head_count", true, 0)
	b.out["index_head_dim"] = b.uint("attention.indexer.key_length", true, 0)
	b.out["index_topk"] = b.uint("attention.indexer.top_k", true, 0)
}

// Problem says why ferrite cannot run the model, or "" when it can: an
// unsupported architecture, metadata the config cannot be built from, an
// unsupported tokenizer or tensor type. It reads only the header (for
// listing models).
func (m *Model) Problem() string {
	if why := Unsupported(m.Meta.Arch()); why != "" {
		return why
	}
	if _, err := m.Config(); err != nil {
		return strings.TrimPrefix(err.Error(), m.Path+": ")
	}
	if _, err := m.preTokenizer(); err != nil {
		return err.Error()
	}
	for _, name := range m.names {
		if t := m.tensors[name]; len(t.Dims) >= 2 {
			if _, ok := t.Type.DType(); !ok {
				return fmt.Sprintf("tensor %s has type %s, which ferrite does not support (supported: %s)", name, t.Type, supportedTypes)
			}
		}
	}
	return ""
}
