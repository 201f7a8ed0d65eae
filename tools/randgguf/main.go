// Command randgguf writes a GGUF file with random weights of a model's real
// shape, from its config.json alone: the files that `ferrite bench` and
// llama.cpp's llama-bench are compared on (BENCHMARKS.md), without
// downloading a checkpoint. The matrices come from engine/randweights (the
// values `ferrite bench` invents for a config directory), named, shaped
// and written as llama.cpp's convert_hf_to_gguf.py would
// (internal/ggufwrite), with a byte-level tokenizer sized to the
// vocabulary. Quantize the bf16 file with llama-quantize for the other
// types.
//
//	go run ./tools/randgguf -config engine/testdata/qwen3-0.6b -o qwen3-0.6b-bf16.gguf
//	llama-quantize qwen3-0.6b-bf16.gguf qwen3-0.6b-q4_0.gguf Q4_0
//
// Dense Qwen3 and Llama configs, and Qwen3-MoE: its stacked experts are
// generated and encoded one tensor at a time while the file is written
// (ggufwrite.ConvertLazy), so that a real-size MoE model cut to a few
// layers fits in memory:
//
//	go run ./tools/randgguf -config engine/testdata/qwen3-30b-a3b -layers 8 -type q8_0 -o qwen3-30b-a3b-8l-q8_0.gguf
//
// Other architectures take the tensors ferrite's model asks for, recorded
// while it is built on random weights (recordSource). -kvb q8_0 stores an
// MLA model's attn_k_b and attn_v_b in Q8_0 where their rows are whole
// blocks, as llama-quantize does (the converter keeps them F32):
//
//	go run ./tools/randgguf -config engine/testdata/glm4.7-flash -layers 8 -type q8_0 -kvb q8_0 -o glm47flash-8l-q8_0.gguf
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	econfig "github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/all" // every architecture, for recordSource
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

func main() {
	cfgDir := flag.String("config", "", "directory with the model's config.json")
	out := flag.String("o", "", "GGUF file to write")
	layers := flag.Int("layers", 0, "keep only the first N layers (0: all)")
	typ := flag.String("type", "bf16", "matrix type: bf16, f16, f32 or q8_0")
	seed := flag.Uint64("seed", 1, "seed of the random weights")
	kvb := flag.String("kvb", "", "an MLA model's attn_k_b and attn_v_b: q8_0 where their rows are whole blocks (default: as the matrices' -type allows, F32 for q8_0)")
	flag.Parse()
	if err := run(*cfgDir, *out, *typ, *layers, *seed, *kvb); err != nil {
		fmt.Fprintln(os.Stderr, "randgguf:", err)
		os.Exit(1)
	}
}

var types = map[string]uint32{"bf16": ggufwrite.BF16, "f16": ggufwrite.F16, "f32": ggufwrite.F32, "q8_0": ggufwrite.Q8_0}

// run writes the GGUF; kvb says how attn_k_b and attn_v_b are stored
// ("" as the converter stores them, or "q8_0").
func run(cfgDir, out, typ string, layers int, seed uint64, kvb string) error {
	t, ok := types[typ]
	if cfgDir == "" || out == "" || !ok || (kvb != "" && kvb != "q8_0") {
		return errors.New("usage: randgguf -config DIR -o FILE.gguf [-type bf16|f16|f32|q8_0] [-layers N] [-seed S] [-kvb q8_0]")
	}
	raw, err := os.ReadFile(filepath.Join(cfgDir, "config.json"))
	if err != nil {
		return err
	}
	var cfg config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s/config.json: %w", cfgDir, err)
	}
	// The converter reads config.json in the current transformers layout:
	// give it an edited copy, cut to the layers asked for, with a
	// top-level rope_theta (older configs) moved into rope_parameters.
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	if layers > 0 && layers < cfg.Layers {
		for k, v := range m { // per-layer lists (mlp_layer_types, layer_types) cut too
			if l, ok := v.([]any); ok && len(l) == cfg.Layers {
				m[k] = l[:layers]
			}
		}
		m["num_hidden_layers"], cfg.Layers = layers, layers
	}
	if theta, ok := m["rope_theta"]; ok && m["rope_parameters"] == nil {
		m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": theta}
	}
	tmp, err := os.MkdirTemp("", "randgguf")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// general.name is the config directory's name, not the temporary one's,
	// so that the file depends only on the config and the seed.
	abs, err := filepath.Abs(cfgDir)
	if err != nil {
		return err
	}
	tmp = filepath.Join(tmp, filepath.Base(abs))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	if raw, err = json.Marshal(m); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), raw, 0o644); err != nil {
		return err
	}
	var src ggufwrite.Source
	if known(cfg.ModelType) {
		src, err = newSource(cfg, seed)
	} else {
		src, err = recordSource(tmp, seed)
	}
	if err != nil {
		return err
	}
	w, err := ggufwrite.ConvertLazy(tmp, src, t)
	if err != nil {
		return err
	}
	if kvb == "q8_0" {
		for i := range w.Tensors {
			tn := &w.Tensors[i]
			if (strings.Contains(tn.Name, "attn_k_b") || strings.Contains(tn.Name, "attn_v_b")) && tn.Type == ggufwrite.F32 &&
				tn.Data != nil && tn.Dims[0]%32 == 0 {
				tn.Type, tn.Data = ggufwrite.Q8_0, ggufwrite.QuantizeQ8_0(ggufwrite.DecodeF32(tn.Data))
			}
		}
	}
	ggufwrite.AddByteTokenizer(w, cfg.Vocab)
	return w.WriteFile(out)
}

// known reports whether newSource lists model type mt's tensors itself.
func known(mt string) bool { return mt == "qwen3" || mt == "qwen3_moe" || mt == "llama" }

// config is the part of config.json the tensor list depends on.
type config struct {
	ModelType string `json:"model_type"`
	Hidden    int    `json:"hidden_size"`
	Layers    int    `json:"num_hidden_layers"`
	Heads     int    `json:"num_attention_heads"`
	KVHeads   int    `json:"num_key_value_heads"`
	HeadDim   int    `json:"head_dim"`
	Inter     int    `json:"intermediate_size"`
	MoEInter  int    `json:"moe_intermediate_size"`
	Experts   int    `json:"num_experts"`
	Local     int    `json:"num_local_experts"` // transformers 5's name of num_experts
	Sparse    int    `json:"decoder_sparse_step"`
	MLPOnly   []int  `json:"mlp_only_layers"`
	Vocab     int    `json:"vocab_size"`
	Tied      bool   `json:"tie_word_embeddings"`
}

// source invents a dense model's tensors under their Hugging Face names.
type source struct {
	seed   uint64
	names  []string
	shapes map[string][]int
}

func newSource(c config, seed uint64) (*source, error) {
	moe := c.ModelType == "qwen3_moe"
	if c.ModelType != "qwen3" && c.ModelType != "llama" && !moe {
		return nil, fmt.Errorf("model_type %q: only the qwen3, qwen3_moe and llama layouts are known", c.ModelType)
	}
	c.Experts = max(c.Experts, c.Local)
	if moe && (c.Experts <= 0 || c.MoEInter <= 0) {
		return nil, fmt.Errorf("qwen3_moe config without num_experts or moe_intermediate_size")
	}
	// Qwen3MoeDecoderLayer: experts where (l+1) % decoder_sparse_step == 0,
	// except the mlp_only_layers.
	sparse := func(l int) bool {
		return moe && !slices.Contains(c.MLPOnly, l) && (l+1)%max(c.Sparse, 1) == 0
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	s := &source{seed: seed, shapes: map[string][]int{}}
	add := func(name string, shape ...int) {
		s.names = append(s.names, name)
		s.shapes[name] = shape
	}
	h, q, kv := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	add("model.embed_tokens.weight", c.Vocab, h)
	for l := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", h)
		add(p+"post_attention_layernorm.weight", h)
		add(p+"self_attn.q_proj.weight", q, h)
		add(p+"self_attn.k_proj.weight", kv, h)
		add(p+"self_attn.v_proj.weight", kv, h)
		add(p+"self_attn.o_proj.weight", h, q)
		if c.ModelType != "llama" {
			add(p+"self_attn.q_norm.weight", c.HeadDim)
			add(p+"self_attn.k_norm.weight", c.HeadDim)
		}
		if !sparse(l) {
			add(p+"mlp.gate_proj.weight", c.Inter, h)
			add(p+"mlp.up_proj.weight", c.Inter, h)
			add(p+"mlp.down_proj.weight", h, c.Inter)
			continue
		}
		add(p+"mlp.gate.weight", c.Experts, h)
		for e := range c.Experts {
			x := fmt.Sprintf("%smlp.experts.%d.", p, e)
			add(x+"gate_proj.weight", c.MoEInter, h)
			add(x+"up_proj.weight", c.MoEInter, h)
			add(x+"down_proj.weight", h, c.MoEInter)
		}
	}
	add("model.norm.weight", h)
	if !c.Tied {
		add("lm_head.weight", c.Vocab, h)
	}
	for name, shape := range s.shapes {
		for _, d := range shape {
			if d <= 0 {
				return nil, fmt.Errorf("config.json gives %s the shape %v", name, shape)
			}
		}
	}
	return s, nil
}

func (s *source) Names() []string { return s.names }

func (s *source) Tensor(name string) (*weights.Tensor, error) {
	shape, ok := s.shapes[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return &weights.Tensor{Name: name, DType: kernels.BF16, Dtype: "BF16", Shape: shape}, nil
}

// Float32 returns the tensor's values: randweights' bf16 matrices (a
// fresh source each time, so none stays cached; the values depend only
// on the seed and the name) or its role-aware vectors.
func (s *source) Float32(name string, shape ...int) ([]float32, error) {
	rw := randweights.New(s.seed, kernels.BF16)
	if len(shape) != 2 {
		return rw.Float32(name, shape...)
	}
	m, err := rw.Mat(name, shape[0], shape[1])
	if err != nil {
		return nil, err
	}
	out := make([]float32, shape[0]*shape[1])
	for r := range shape[0] {
		m.RowF32(out[r*shape[1]:(r+1)*shape[1]], r)
	}
	return out, nil
}

// recordSource lists the tensors ferrite's model of the config in dir
// asks for, with their shapes, by building it on random weights (the
// matrices stay unmade: randweights' are lazy) with fused expert tensors
// reported missing, so that experts come one by one as the converter
// stacks them.
func recordSource(dir string, seed uint64) (*source, error) {
	cfg, err := econfig.Load(dir)
	if err != nil {
		return nil, err
	}
	rw := randweights.New(seed, kernels.BF16)
	rw.Missing = func(name string) bool { return fusedExperts.MatchString(name) }
	s := &source{seed: seed, shapes: map[string][]int{}}
	r := &recorder{Source: rw, s: s}
	be := cpu.New(1)
	defer be.Close()
	if _, err := model.New(cfg, r, be); err != nil {
		return nil, err
	}
	return s, nil
}

// fusedExperts are the fused 3-D expert tensors a model takes where a
// checkpoint has them.
var fusedExperts = regexp.MustCompile(`experts\.(gate_up_proj|gate_proj|up_proj|down_proj)$`)

// recorder is a model.WeightSource that notes each tensor asked for in
// s, in order.
type recorder struct {
	*randweights.Source
	s *source
}

func (r *recorder) note(name string, shape []int) {
	if _, ok := r.s.shapes[name]; !ok {
		r.s.names = append(r.s.names, name)
		r.s.shapes[name] = slices.Clone(shape)
	}
}

func (r *recorder) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	r.note(name, []int{rows, cols})
	return r.Source.Mat(name, rows, cols)
}

func (r *recorder) Float32(name string, shape ...int) ([]float32, error) {
	r.note(name, shape)
	return r.Source.Float32(name, shape...)
}
