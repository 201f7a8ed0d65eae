package ggufwrite

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/kernels"
)

// hfConfig is the part of a fixture's config.json the converter reads.
type hfConfig struct {
	ModelType        string   `json:"model_type"`
	Hidden           int      `json:"hidden_size"`
	Layers           int      `json:"num_hidden_layers"`
	Heads            int      `json:"num_attention_heads"`
	KVHeads          int      `json:"num_key_value_heads"`
	HeadDim          int      `json:"head_dim"`
	Inter            int      `json:"intermediate_size"`
	MoEInter         int      `json:"moe_intermediate_size"`
	MaxPos           int      `json:"max_position_embeddings"`
	Eps              float64  `json:"rms_norm_eps"`
	LocalExperts     int      `json:"num_local_experts"`
	NumExperts       int      `json:"num_experts"`
	RoutedExperts    int      `json:"n_routed_experts"`
	SharedExperts    int      `json:"n_shared_experts"`
	TopK             int      `json:"num_experts_per_tok"`
	NormTopK         *bool    `json:"norm_topk_prob"`
	FirstDense       int      `json:"first_k_dense_replace"`
	ScalingFactor    float64  `json:"routed_scaling_factor"`
	NGroup           int      `json:"n_group"`
	TopKGroup        int      `json:"topk_group"`
	NextN            int      `json:"num_nextn_predict_layers"`
	RopeParameters   rope     `json:"rope_parameters"`
	QLora            int      `json:"q_lora_rank"`
	KVLora           int      `json:"kv_lora_rank"`
	Nope             int      `json:"qk_nope_head_dim"`
	RopeDim          int      `json:"qk_rope_head_dim"`
	VDim             int      `json:"v_head_dim"`
	MLPLayerTypes    []string `json:"mlp_layer_types"`
	IndexHeads       int      `json:"index_n_heads"`
	IndexDim         int      `json:"index_head_dim"`
	IndexTopK        int      `json:"index_topk"`
	IndexerTypes     []string `json:"indexer_types"`
	ConvK            int      `json:"linear_conv_kernel_dim"`
	LinKDim          int      `json:"linear_key_head_dim"`
	LinVDim          int      `json:"linear_value_head_dim"`
	LinKHeads        int      `json:"linear_num_key_heads"`
	LinVHeads        int      `json:"linear_num_value_heads"`
	SharedInter      int      `json:"shared_expert_intermediate_size"`
	MTPLayers        int      `json:"mtp_num_hidden_layers"`
	PartialRotary    float64  `json:"partial_rotary_factor"`
	TieWordEmbedding bool     `json:"tie_word_embeddings"`
}

type rope struct {
	Theta         float64 `json:"rope_theta"`
	Type          string  `json:"rope_type"`
	Factor        float64 `json:"factor"`
	Low           float64 `json:"low_freq_factor"`
	High          float64 `json:"high_freq_factor"`
	OrigMax       int     `json:"original_max_position_embeddings"`
	PartialRotary float64 `json:"partial_rotary_factor"`
	BetaFast      float64 `json:"beta_fast"`
	BetaSlow      float64 `json:"beta_slow"`
	MScaleAllDim  float64 `json:"mscale_all_dim"`
}

// ggufArch is llama.cpp's architecture for a model_type.
var ggufArch = map[string]string{"llama": "llama", "mixtral": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "glm4_moe": "glm4moe",
	"glm4_moe_lite": "deepseek2", "qwen3_next": "qwen3next", "deepseek_v32": "deepseek32", "glm_moe_dsa": "glm-dsa"}

// Convert turns the Hugging Face checkpoint in dir (config.json and
// model.safetensors with F32 or BF16 weights) into a GGUF file whose matrices
// are of type typ (F32, F16, BF16, or Q8_0 for those whose rows are whole blocks; norms,
// biases and routers stay F32, as llama.cpp converts them), without a
// tokenizer (see AddTokenizer).
func Convert(dir string, typ uint32) (*Writer, error) {
	set, err := weights.Open(dir)
	if err != nil {
		return nil, err
	}
	defer set.Close()
	return ConvertFrom(dir, set, typ)
}

// Source is what ConvertFrom reads a checkpoint's tensors from, by their
// Hugging Face names: a weights.Set, or invented tensors (tools/randgguf).
type Source interface {
	Names() []string
	Tensor(name string) (*weights.Tensor, error) // its DType and Shape
	Float32(name string, shape ...int) ([]float32, error)
}

// ConvertFrom is Convert with the tensors read from src, and only
// config.json from dir.
func ConvertFrom(dir string, src Source, typ uint32) (*Writer, error) {
	return convertFrom(dir, src, typ, false)
}

// ConvertLazy is ConvertFrom with each stacked expert tensor read from src
// and encoded only when the file is written (Tensor.Lazy), one at a time:
// a real-size MoE model's experts do not fit in memory in float32.
func ConvertLazy(dir string, src Source, typ uint32) (*Writer, error) {
	return convertFrom(dir, src, typ, true)
}

func convertFrom(dir string, src Source, typ uint32, lazy bool) (*Writer, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var c hfConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	arch, ok := ggufArch[c.ModelType]
	if !ok {
		return nil, fmt.Errorf("ggufwrite: no conversion for %q", c.ModelType)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	w := &Writer{}
	p := arch + "."
	w.Add("general.architecture", arch)
	w.Add("general.name", filepath.Base(dir))
	w.Add("general.file_type", map[uint32]uint32{F32: 0, F16: 1, Q8_0: 7, BF16: 32}[typ])
	if c.ModelType == "qwen3_next" {
		c.NextN = c.MTPLayers // _QwenMtpMixin: the MTP block follows the last layer
	}
	blocks := c.Layers + c.NextN
	w.Add(p+"block_count", uint32(blocks))
	w.Add(p+"context_length", uint32(c.MaxPos))
	w.Add(p+"embedding_length", uint32(c.Hidden))
	w.Add(p+"feed_forward_length", uint32(c.Inter))
	w.Add(p+"attention.head_count", uint32(c.Heads))
	w.Add(p+"attention.head_count_kv", uint32(c.KVHeads))
	mla := arch == "deepseek2" || arch == "deepseek32" || arch == "glm-dsa"
	if mla { // DeepseekV2Model.set_gguf_parameters: MLA as MQA over the latent
		w.Set(p+"attention.head_count_kv", uint32(1))
		w.Add(p+"attention.q_lora_rank", uint32(c.QLora))
		w.Add(p+"attention.kv_lora_rank", uint32(c.KVLora))
		w.Add(p+"attention.key_length", uint32(c.KVLora+c.RopeDim))
		w.Add(p+"attention.value_length", uint32(c.KVLora))
		w.Add(p+"attention.key_length_mla", uint32(c.Nope+c.RopeDim))
		w.Add(p+"attention.value_length_mla", uint32(c.VDim))
		c.HeadDim, c.PartialRotary = c.RopeDim, 1 // rope.dimension_count is qk_rope_head_dim
	} else {
		w.Add(p+"attention.key_length", uint32(c.HeadDim))
		w.Add(p+"attention.value_length", uint32(c.HeadDim))
	}
	w.Add(p+"attention.layer_norm_rms_epsilon", float32(c.Eps))
	w.Add(p+"rope.freq_base", float32(c.RopeParameters.Theta))
	if r := c.RopeParameters; r.Type == "yarn" { // TextModel.set_gguf_parameters
		w.Add(p+"rope.scaling.type", "yarn")
		w.Add(p+"rope.scaling.factor", float32(r.Factor))
		w.Add(p+"rope.scaling.original_context_length", uint32(r.OrigMax))
		if r.BetaFast != 0 {
			w.Add(p+"rope.scaling.yarn_beta_fast", float32(r.BetaFast))
		}
		if r.BetaSlow != 0 {
			w.Add(p+"rope.scaling.yarn_beta_slow", float32(r.BetaSlow))
		}
		if r.MScaleAllDim != 0 {
			w.Add(p+"rope.scaling.yarn_log_multiplier", float32(0.1*r.MScaleAllDim))
		}
	}
	rotary := c.RopeParameters.PartialRotary
	if rotary == 0 {
		rotary = c.PartialRotary
	}
	if rotary == 0 {
		rotary = 1
	}
	w.Add(p+"rope.dimension_count", uint32(float64(c.HeadDim)*rotary))
	experts := max(c.LocalExperts, c.NumExperts, c.RoutedExperts)
	if experts > 0 {
		w.Add(p+"expert_count", uint32(experts))
		w.Add(p+"expert_used_count", uint32(c.TopK))
	}
	switch c.ModelType {
	case "qwen3_moe":
		w.Add(p+"expert_feed_forward_length", uint32(c.MoEInter))
	case "qwen3_next":
		w.Add(p+"expert_feed_forward_length", uint32(c.MoEInter))
		w.Add(p+"expert_shared_feed_forward_length", uint32(c.SharedInter))
		w.Add(p+"ssm.conv_kernel", uint32(c.ConvK))
		w.Add(p+"ssm.state_size", uint32(c.LinKDim))
		w.Add(p+"ssm.group_count", uint32(c.LinKHeads))
		w.Add(p+"ssm.time_step_rank", uint32(c.LinVHeads))
		w.Add(p+"ssm.inner_size", uint32(c.LinVDim*c.LinVHeads))
		w.Add(p+"full_attention_interval", uint32(4))
		w.Add(p+"nextn_predict_layers", uint32(c.NextN))
	case "glm4_moe", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa":
		if c.IndexHeads > 0 {
			w.Add(p+"attention.indexer.head_count", uint32(c.IndexHeads))
			w.Add(p+"attention.indexer.key_length", uint32(c.IndexDim))
			w.Add(p+"attention.indexer.top_k", uint32(c.IndexTopK))
		}
		if c.IndexerTypes != nil {
			full := make([]bool, len(c.IndexerTypes))
			for i, t := range c.IndexerTypes {
				full[i] = t == "full"
			}
			w.Add(p+"attention.indexer.types", full)
		}
		if c.MLPLayerTypes != nil {
			c.FirstDense = 0
			for c.FirstDense < len(c.MLPLayerTypes) && c.MLPLayerTypes[c.FirstDense] == "dense" {
				c.FirstDense++
			}
		}
		w.Add(p+"expert_feed_forward_length", uint32(c.MoEInter))
		w.Add(p+"expert_shared_count", uint32(c.SharedExperts))
		w.Add(p+"leading_dense_block_count", uint32(c.FirstDense))
		w.Add(p+"expert_gating_func", uint32(2))
		w.Add(p+"expert_weights_scale", float32(c.ScalingFactor))
		w.Add(p+"expert_weights_norm", c.NormTopK == nil || *c.NormTopK)
		w.Add(p+"expert_group_count", uint32(max(c.NGroup, 1)))
		w.Add(p+"expert_group_used_count", uint32(max(c.TopKGroup, 1)))
		w.Add(p+"nextn_predict_layers", uint32(c.NextN))
	}

	cv := converter{w: w, set: src, typ: typ, c: &c, permute: arch == "llama", lazy: lazy}
	if err := cv.tensors(); err != nil {
		return nil, err
	}
	if c.RopeParameters.Type == "llama3" {
		w.Tensors = append(w.Tensors, Tensor{Name: "rope_freqs.weight", Type: F32,
			Dims: []uint64{uint64(c.HeadDim / 2)}, Data: EncodeF32(llama3Factors(c.RopeParameters, c.HeadDim))})
	}
	return w, nil
}

// llama3Factors are the rope_freqs convert_hf_to_gguf computes for Llama 3
// scaling (in float32, as torch does).
func llama3Factors(r rope, dim int) []float32 {
	out := make([]float32, dim/2)
	old := float32(r.OrigMax)
	lowWave, highWave := old/float32(r.Low), old/float32(r.High)
	for i := range out {
		freq := 1 / float32(math.Pow(r.Theta, float64(float32(2*i)/float32(dim))))
		wave := 2 * math.Pi / float64(freq)
		switch {
		case wave < float64(highWave):
			out[i] = 1
		case wave > float64(lowWave):
			out[i] = float32(r.Factor)
		default:
			smooth := (old/float32(wave) - float32(r.Low)) / (float32(r.High) - float32(r.Low))
			out[i] = 1 / ((1-smooth)/float32(r.Factor) + smooth)
		}
	}
	return out
}

type converter struct {
	w       *Writer
	set     Source
	typ     uint32
	c       *hfConfig
	permute bool
	lazy    bool // experts as lazy tensors
}

// names as in llama.cpp's gguf-py tensor_mapping.py.
var (
	hfLayer  = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)$`)
	hfExpert = regexp.MustCompile(`^(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$`)
	hfBlock  = map[string]string{
		"input_layernorm.weight":                "attn_norm.weight",
		"post_attention_layernorm.weight":       "ffn_norm.weight",
		"self_attn.q_proj.weight":               "attn_q.weight",
		"self_attn.q_proj.bias":                 "attn_q.bias",
		"self_attn.k_proj.weight":               "attn_k.weight",
		"self_attn.k_proj.bias":                 "attn_k.bias",
		"self_attn.v_proj.weight":               "attn_v.weight",
		"self_attn.v_proj.bias":                 "attn_v.bias",
		"self_attn.o_proj.weight":               "attn_output.weight",
		"self_attn.q_norm.weight":               "attn_q_norm.weight",
		"self_attn.k_norm.weight":               "attn_k_norm.weight",
		"mlp.gate_proj.weight":                  "ffn_gate.weight",
		"mlp.up_proj.weight":                    "ffn_up.weight",
		"mlp.down_proj.weight":                  "ffn_down.weight",
		"mlp.gate.weight":                       "ffn_gate_inp.weight",
		"block_sparse_moe.gate.weight":          "ffn_gate_inp.weight",
		"mlp.gate.e_score_correction_bias":      "exp_probs_b.bias",
		"mlp.shared_experts.gate_proj.weight":   "ffn_gate_shexp.weight",
		"mlp.shared_experts.up_proj.weight":     "ffn_up_shexp.weight",
		"mlp.shared_experts.down_proj.weight":   "ffn_down_shexp.weight",
		"eh_proj.weight":                        "nextn.eh_proj.weight",
		"enorm.weight":                          "nextn.enorm.weight",
		"hnorm.weight":                          "nextn.hnorm.weight",
		"shared_head.head.weight":               "nextn.shared_head_head.weight",
		"shared_head.norm.weight":               "nextn.shared_head_norm.weight",
		"linear_attn.A_log":                     "ssm_a",
		"linear_attn.dt_proj.bias":              "ssm_dt.bias",
		"linear_attn.conv1d.weight":             "ssm_conv1d.weight",
		"linear_attn.in_proj_ba.weight":         "ssm_ba.weight",
		"linear_attn.norm.weight":               "ssm_norm.weight",
		"linear_attn.out_proj.weight":           "ssm_out.weight",
		"mlp.shared_expert.gate_proj.weight":    "ffn_gate_shexp.weight",
		"mlp.shared_expert.up_proj.weight":      "ffn_up_shexp.weight",
		"mlp.shared_expert.down_proj.weight":    "ffn_down_shexp.weight",
		"mlp.shared_expert_gate.weight":         "ffn_gate_inp_shexp.weight",
		"self_attn.indexer.k_norm.weight":       "indexer.k_norm.weight",
		"self_attn.indexer.k_norm.bias":         "indexer.k_norm.bias",
		"self_attn.indexer.weights_proj.weight": "indexer.proj.weight",
		"self_attn.indexer.wk.weight":           "indexer.attn_k.weight",
		"self_attn.indexer.wq_b.weight":         "indexer.attn_q_b.weight",
		"self_attn.q_a_proj.weight":             "attn_q_a.weight",
		"self_attn.q_a_layernorm.weight":        "attn_q_a_norm.weight",
		"self_attn.q_b_proj.weight":             "attn_q_b.weight",
		"self_attn.kv_a_proj_with_mqa.weight":   "attn_kv_a_mqa.weight",
		"self_attn.kv_a_layernorm.weight":       "attn_kv_a_norm.weight",
	}
	expertProj = map[string]string{"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
)

// tensors converts every tensor of the checkpoint.
func (cv *converter) tensors() error {
	experts := map[string]map[int][]float32{}  // GGUF stacked name -> expert -> values
	expertNames := map[string]map[int]string{} // the same -> expert -> source name (lazy)
	shapes := map[string][]int{}
	for _, name := range cv.set.Names() {
		t, err := cv.set.Tensor(name)
		if err != nil {
			return err
		}
		if t.DType != kernels.F32 && t.DType != kernels.BF16 {
			return fmt.Errorf("ggufwrite: %s is %s, want F32 or BF16", name, t.Dtype)
		}
		if m := hfLayer.FindStringSubmatch(name); cv.lazy && m != nil {
			if e := hfExpert.FindStringSubmatch(m[2]); e != nil {
				g := "blk." + m[1] + ".ffn_" + expertProj[e[3]] + "_exps.weight"
				x, _ := strconv.Atoi(e[2])
				if expertNames[g] == nil {
					expertNames[g] = map[int]string{}
				}
				expertNames[g][x] = name
				shapes[g] = t.Shape
				continue
			}
		}
		vals, err := cv.set.Float32(name, t.Shape...)
		if err != nil {
			return err
		}
		shape := t.Shape
		if cv.c.ModelType == "qwen3_next" {
			name, shape = cv.qwen3Next(name, shape, vals)
		}
		t.Shape = shape
		switch name {
		case "model.embed_tokens.weight":
			cv.add("token_embd.weight", t.Shape, vals)
			continue
		case "model.norm.weight":
			cv.add("output_norm.weight", t.Shape, vals)
			continue
		case "lm_head.weight":
			cv.add("output.weight", t.Shape, vals)
			continue
		}
		m := hfLayer.FindStringSubmatch(name)
		if m == nil {
			return fmt.Errorf("ggufwrite: no GGUF name for %s", name)
		}
		blk := "blk." + m[1] + "."
		if e := hfExpert.FindStringSubmatch(m[2]); e != nil {
			g := blk + "ffn_" + expertProj[e[3]] + "_exps.weight"
			x, _ := strconv.Atoi(e[2])
			if experts[g] == nil {
				experts[g] = map[int][]float32{}
			}
			experts[g][x] = vals
			shapes[g] = t.Shape
			continue
		}
		if m[2] == "linear_attn.in_proj_qkvz.weight" {
			cv.splitQKVZ(blk, vals)
			continue
		}
		if m[2] == "self_attn.kv_b_proj.weight" {
			cv.splitKVB(blk, vals)
			continue
		}
		g, ok := hfBlock[m[2]]
		if !ok {
			return fmt.Errorf("ggufwrite: no GGUF name for %s", name)
		}
		if cv.permute && strings.HasPrefix(m[2], "self_attn.q_proj.") {
			vals = permute(vals, t.Shape, cv.c.Heads)
		}
		if cv.permute && strings.HasPrefix(m[2], "self_attn.k_proj.") {
			vals = permute(vals, t.Shape, cv.c.KVHeads)
		}
		cv.add(blk+g, t.Shape, vals)
	}
	names := make([]string, 0, len(experts)+len(expertNames))
	for g := range experts {
		names = append(names, g)
	}
	for g := range expertNames {
		names = append(names, g)
	}
	slices.Sort(names)
	for _, g := range names {
		if srcs := expertNames[g]; srcs != nil {
			cv.addLazy(g, shapes[g], srcs)
			continue
		}
		var all []float32
		for x := range len(experts[g]) {
			all = append(all, experts[g][x]...)
		}
		cv.add(g, append([]int{len(experts[g])}, shapes[g]...), all)
	}
	return nil
}

// addLazy appends the stacked experts srcs[0], srcs[1], ... (each of
// PyTorch shape one) as a lazy tensor: each expert is read and encoded
// when the file is written (an expert's rows are whole blocks, so the
// stacked encoding is the experts' encodings one after the other).
func (cv *converter) addLazy(name string, one []int, srcs map[int]string) {
	shape := append([]int{len(srcs)}, one...)
	typ := cv.typeFor(name, shape)
	per := encodedSize(typ, one)
	cv.w.Tensors = append(cv.w.Tensors, Tensor{Name: name, Type: typ, Dims: ggmlDims(shape), Size: len(srcs) * per,
		Lazy: func() ([]byte, error) {
			out := make([]byte, 0, len(srcs)*per)
			for x := range len(srcs) {
				vals, err := cv.set.Float32(srcs[x], one...)
				if err != nil {
					return nil, err
				}
				out = append(out, encode(typ, one, vals)...)
			}
			return out, nil
		}})
}

// qwen3Next applies Qwen3NextModel's renames and value changes in place:
// MTP tensors moved to the block after the last layer, A_log stored as
// −exp(A_log), dt_bias renamed, conv1d squeezed, and the zero-centred norms
// stored as 1+w. It returns the new name and shape.
func (cv *converter) qwen3Next(name string, shape []int, vals []float32) (string, []int) {
	remap := map[string]string{"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head.norm"}
	if rest, ok := strings.CutPrefix(name, "mtp."); ok {
		parts := strings.SplitN(rest, ".", 3)
		if parts[0] == "layers" {
			k, _ := strconv.Atoi(parts[1])
			name = fmt.Sprintf("model.layers.%d.%s", cv.c.Layers+k, parts[2])
		} else {
			name = fmt.Sprintf("model.layers.%d.%s.%s", cv.c.Layers, remap[parts[0]], parts[1])
		}
	}
	switch {
	case strings.HasSuffix(name, ".A_log"):
		for i, v := range vals {
			vals[i] = float32(-math.Exp(float64(v)))
		}
	case strings.HasSuffix(name, ".dt_bias"):
		name = strings.TrimSuffix(name, ".dt_bias") + ".dt_proj.bias"
	case strings.Contains(name, "conv1d"):
		shape = []int{shape[0], shape[2]}
	case strings.HasSuffix(name, "norm.weight") && !strings.HasSuffix(name, "linear_attn.norm.weight"):
		for i, v := range vals {
			vals[i] = v + 1
		}
	}
	return name, shape
}

// splitQKVZ is Qwen3NextModel's split of in_proj_qkvz (per key head: q, k,
// v, z) into attn_qkv (all q, all k, all v) and attn_gate (all z).
func (cv *converter) splitQKVZ(blk string, vals []float32) {
	c := cv.c
	cols := c.Hidden
	nk, dk, dvr := c.LinKHeads, c.LinKDim, c.LinVHeads/c.LinKHeads*c.LinVDim
	row := func(r int) []float32 { return vals[r*cols : (r+1)*cols] }
	var q, k, v, z []float32
	for g := range nk {
		base := g * (2*dk + 2*dvr)
		for r := range dk {
			q = append(q, row(base+r)...)
			k = append(k, row(base+dk+r)...)
		}
		for r := range dvr {
			v = append(v, row(base+2*dk+r)...)
			z = append(z, row(base+2*dk+dvr+r)...)
		}
	}
	qkv := append(append(q, k...), v...)
	cv.add(blk+"attn_qkv.weight", []int{len(qkv) / cols, cols}, qkv)
	cv.add(blk+"attn_gate.weight", []int{len(z) / cols, cols}, z)
}

// splitKVB is DeepseekV2Model.modify_tensors' split of kv_b_proj (heads,
// nope+v, kv_lora) into attn_k_b (heads, kv_lora, nope: transposed) and
// attn_v_b (heads, v, kv_lora).
func (cv *converter) splitKVB(blk string, vals []float32) {
	c := cv.c
	heads, nope, v, lora := c.Heads, c.Nope, c.VDim, c.KVLora
	kb := make([]float32, heads*lora*nope)
	vb := make([]float32, heads*v*lora)
	for h := range heads {
		for r := range nope + v {
			for j := range lora {
				x := vals[(h*(nope+v)+r)*lora+j]
				if r < nope {
					kb[(h*lora+j)*nope+r] = x
				} else {
					vb[(h*v+r-nope)*lora+j] = x
				}
			}
		}
	}
	cv.add(blk+"attn_k_b.weight", []int{heads, lora, nope}, kb)
	cv.add(blk+"attn_v_b.weight", []int{heads, v, lora}, vb)
}

// add appends a tensor of PyTorch shape (outermost first).
func (cv *converter) add(name string, shape []int, vals []float32) {
	typ := cv.typeFor(name, shape)
	cv.w.Tensors = append(cv.w.Tensors, Tensor{Name: name, Type: typ, Dims: ggmlDims(shape), Data: encode(typ, shape, vals)})
}

// ggmlDims is GGML's ne (innermost first) of a PyTorch shape.
func ggmlDims(shape []int) []uint64 {
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		dims[len(shape)-1-i] = uint64(d)
	}
	return dims
}

// typeFor is the GGUF type of tensor name of PyTorch shape: cv.typ for the
// matrices that take it, F32 for the rest.
func (cv *converter) typeFor(name string, shape []int) uint32 {
	// Routers stay F32, as convert_hf_to_gguf keeps them.
	plain := len(shape) >= 2 && !strings.Contains(name, "ffn_gate_inp") && !strings.Contains(name, "ssm_conv1d")
	switch {
	case plain && (cv.typ == F16 || cv.typ == BF16):
		return cv.typ
	case plain && cv.typ == Q8_0 && shape[len(shape)-1]%32 == 0 && !strings.Contains(name, "attn_k_b") && !strings.Contains(name, "attn_v_b"):
		// MLA's kv_b halves stay F32, as ferrite's --quant keeps kv_b_proj.
		return Q8_0
	}
	return F32
}

// encode encodes vals (of PyTorch shape) as typ.
func encode(typ uint32, shape []int, vals []float32) []byte {
	switch typ {
	case F16:
		return weights.NewTensor(kernels.F16, shape, vals).Data
	case BF16:
		return weights.NewTensor(kernels.BF16, shape, vals).Data
	case Q8_0:
		return QuantizeQ8_0(vals)
	}
	return EncodeF32(vals)
}

// encodedSize is the length of encode's result.
func encodedSize(typ uint32, shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	switch typ {
	case F16, BF16:
		return 2 * n
	case Q8_0:
		return n / 32 * 34
	}
	return 4 * n
}

// QuantizeQ8_0 encodes values (whole blocks of 32) as GGML's Q8_0, the way
// ggml's quantize_row_q8_0_ref does: per block d = max|x| / 127 stored as
// f16, q = round(x / d) half away from zero.
func QuantizeQ8_0(vals []float32) []byte {
	out := make([]byte, len(vals)/32*34)
	for b := range len(vals) / 32 {
		x, blk := vals[b*32:(b+1)*32], out[b*34:(b+1)*34]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		copy(blk, weights.NewTensor(kernels.F16, []int{1}, []float32{d}).Data)
		for i, v := range x {
			blk[2+i] = byte(int8(math.Round(float64(v * id))))
		}
	}
	return out
}

// permute is convert_hf_to_gguf's LlamaModel.permute: rows of each head
// reordered from (2, d/2) to (d/2, 2).
func permute(vals []float32, shape []int, heads int) []float32 {
	rows := shape[0]
	cols := len(vals) / rows
	hd := rows / heads
	out := make([]float32, len(vals))
	for h := range heads {
		for s := range 2 {
			for k := range hd / 2 {
				src := h*hd + s*hd/2 + k
				dst := h*hd + 2*k + s
				copy(out[dst*cols:(dst+1)*cols], vals[src*cols:(src+1)*cols])
			}
		}
	}
	return out
}

// FuseGateUpExperts replaces each block's ffn_gate_exps and ffn_up_exps
// with one ffn_gate_up_exps, each expert's gate rows then its up rows, as
// convert_hf_to_gguf does with fuse_gate_up_exps (of a Writer from
// ConvertFrom: it reads the tensors' Data).
func (w *Writer) FuseGateUpExperts() {
	byName := map[string]int{}
	for i, t := range w.Tensors {
		byName[t.Name] = i
	}
	var out []Tensor
	for _, t := range w.Tensors {
		blk, ok := strings.CutSuffix(t.Name, "ffn_gate_exps.weight")
		if strings.HasSuffix(t.Name, "ffn_up_exps.weight") {
			continue
		}
		if !ok {
			out = append(out, t)
			continue
		}
		up := w.Tensors[byName[blk+"ffn_up_exps.weight"]]
		experts := int(t.Dims[2])
		per := len(t.Data) / experts
		var data []byte
		for e := range experts {
			data = append(data, t.Data[e*per:(e+1)*per]...)
			data = append(data, up.Data[e*per:(e+1)*per]...)
		}
		out = append(out, Tensor{Name: blk + "ffn_gate_up_exps.weight", Type: t.Type, Dims: []uint64{t.Dims[0], 2 * t.Dims[1], t.Dims[2]}, Data: data})
	}
	w.Tensors = out
}
