package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Weights serves a GGUF model's tensors under the Hugging Face names
// ferrite's architectures ask for (model.WeightSource): Mat views the
// mapped data in place, in the stored type. Only the matrices llama.cpp's
// converter rearranged are copies: llama's Q and K rows un-permuted, MLA's
// kv_b_proj and Qwen3-Next's in_proj_qkvz rebuilt from their halves.
type Weights struct {
	m         *Model
	permuteQK bool
	heads     int // attention heads (rows of attn_q in head blocks)
	kvHeads   int
	mainLayer int // layers at or above this index are NextN (MTP) blocks

	// Qwen3-Next: norms stored as 1+w, and the Gated DeltaNet geometry
	// (key heads, key head size, value heads, value head size).
	normOffset     bool
	nk, dk, nv, dv int

	// asStored: tensors are served under the names they are stored with
	// (CheckpointWeights).
	asStored bool

	mu       sync.Mutex
	copies   map[string][]byte            // un-permuted and rebuilt matrices, by GGUF name
	joined   map[string]kernels.DType     // the dtype of each rebuilt matrix
	kvbParts map[string]*kernels.KVBHeads // a rebuilt kv_b_proj's parts as stored (joinKVB), by GGUF name
}

// Weights returns the model's tensors as a weight source for model.New,
// with the config Config builds.
func (m *Model) Weights() (*Weights, error) {
	a, ok := archs[m.Meta.Arch()]
	if !ok {
		return nil, fmt.Errorf("%s: %s", m.Path, Unsupported(m.Meta.Arch()))
	}
	w := &Weights{m: m, permuteQK: a.permuteQK, copies: map[string][]byte{}, joined: map[string]kernels.DType{},
		kvbParts: map[string]*kernels.KVBHeads{}}
	prefix := m.Meta.Arch() + "."
	get := func(key string, def int) int {
		u, ok, err := m.Meta.uintKey(m.Path, prefix+key)
		if err != nil || !ok {
			return def
		}
		return int(u)
	}
	w.heads = get("attention.head_count", 0)
	w.kvHeads = get("attention.head_count_kv", w.heads)
	w.mainLayer = get("block_count", 0) - get("nextn_predict_layers", 0)
	if m.Meta.Arch() == "qwen3next" {
		w.normOffset = true
		w.nk, w.dk, w.nv = get("ssm.group_count", 0), get("ssm.state_size", 0), get("ssm.time_step_rank", 0)
		if w.nv > 0 {
			w.dv = get("ssm.inner_size", 0) / w.nv
		}
	}
	return w, nil
}

// TensorNamesKey is the metadata key that marks a file keeping the
// checkpoint's tensor names: its value is TensorNamesCheckpoint. ferrite
// writes it (tools/packtiny); llama.cpp's files have llama.cpp's names.
const (
	TensorNamesKey        = "ferrite.tensor_names"
	TensorNamesCheckpoint = "checkpoint"
)

// KeepsCheckpointNames reports whether the file says it keeps the
// checkpoint's tensor names (TensorNamesKey), to be served by
// CheckpointWeights with the checkpoint's config.json.
func (m *Model) KeepsCheckpointNames() bool {
	return m.Meta.String(TensorNamesKey) == TensorNamesCheckpoint
}

// CheckpointWeights serves the tensors under the names they are stored
// with, for a file that keeps the checkpoint's (Hugging Face) tensor names
// rather than llama.cpp's, such as the built-in model's (tools/packtiny
// writes it): Mat views a 2-D tensor (out, in) in place, Expert slices a
// 3-D one (experts, out, in), and Float32 converts any other. The config
// comes from elsewhere (the checkpoint's config.json): Config does not apply
// to such a file.
func (m *Model) CheckpointWeights() *Weights {
	return &Weights{m: m, asStored: true, copies: map[string][]byte{}, joined: map[string]kernels.DType{},
		kvbParts: map[string]*kernels.KVBHeads{}}
}

// ref is where a Hugging Face tensor lives in the GGUF file.
type ref struct {
	name   string // GGUF tensor name
	expert int    // the expert's slice of a 3-D tensor, or -1
	heads  int    // > 0: rows are permuted in this many head blocks
	join   join   // the matrix is rebuilt from split tensors
	fused  bool   // a 3-D tensor of all experts, served by Expert
	value  value  // how stored values map back to the checkpoint's
}

// join names a matrix llama.cpp's converter splits in two.
type join uint8

const (
	joinNone join = iota
	joinKVB       // MLA kv_b_proj from attn_k_b and attn_v_b (joinKVB)
	joinQKVZ      // Gated DeltaNet in_proj_qkvz from attn_qkv and attn_gate (joinQKVZ)
)

// value names a converter's change to a small tensor's values.
type value uint8

const (
	valuePlain    value = iota
	valueMinusOne       // stored 1+w (Qwen3-Next's zero-centred norms): w = stored − 1
	valueLogNeg         // stored −exp(A_log): A_log = log(−stored)
)

var (
	layerName  = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)$`)
	expertName = regexp.MustCompile(`^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$`)
)

// topNames are the tensors outside the blocks.
var topNames = map[string]string{
	"model.embed_tokens.weight": "token_embd.weight",
	"model.norm.weight":         "output_norm.weight",
	"lm_head.weight":            "output.weight",
}

// blockNames maps the names inside model.layers.N. to those inside blk.N.
var blockNames = map[string]string{
	"input_layernorm.weight":              "attn_norm.weight",
	"post_attention_layernorm.weight":     "ffn_norm.weight",
	"self_attn.q_proj.weight":             "attn_q.weight",
	"self_attn.q_proj.bias":               "attn_q.bias",
	"self_attn.k_proj.weight":             "attn_k.weight",
	"self_attn.k_proj.bias":               "attn_k.bias",
	"self_attn.v_proj.weight":             "attn_v.weight",
	"self_attn.v_proj.bias":               "attn_v.bias",
	"self_attn.o_proj.weight":             "attn_output.weight",
	"self_attn.q_norm.weight":             "attn_q_norm.weight",
	"self_attn.k_norm.weight":             "attn_k_norm.weight",
	"mlp.gate_proj.weight":                "ffn_gate.weight",
	"mlp.up_proj.weight":                  "ffn_up.weight",
	"mlp.down_proj.weight":                "ffn_down.weight",
	"mlp.gate.weight":                     "ffn_gate_inp.weight",
	"mlp.gate.e_score_correction_bias":    "exp_probs_b.bias",
	"mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
	"mlp.shared_experts.up_proj.weight":   "ffn_up_shexp.weight",
	"mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
	// Gated DeltaNet (qwen3next); in_proj_qkvz is rebuilt (joinQKVZ).
	"linear_attn.A_log":                  "ssm_a",
	"linear_attn.dt_bias":                "ssm_dt.bias",
	"linear_attn.conv1d.weight":          "ssm_conv1d.weight",
	"linear_attn.in_proj_ba.weight":      "ssm_ba.weight",
	"linear_attn.norm.weight":            "ssm_norm.weight",
	"linear_attn.out_proj.weight":        "ssm_out.weight",
	"linear_attn.in_proj_qkvz.weight":    "attn_qkv.weight",
	"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
	"mlp.shared_expert.up_proj.weight":   "ffn_up_shexp.weight",
	"mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
	"mlp.shared_expert_gate.weight":      "ffn_gate_inp_shexp.weight",
	// Multi-head latent attention (deepseek2).
	"self_attn.q_a_proj.weight":           "attn_q_a.weight",
	"self_attn.q_a_layernorm.weight":      "attn_q_a_norm.weight",
	"self_attn.q_b_proj.weight":           "attn_q_b.weight",
	"self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
	"self_attn.kv_a_layernorm.weight":     "attn_kv_a_norm.weight",
	"self_attn.kv_b_proj.weight":          "attn_kv_b.weight",
	// DeepSeek sparse attention's indexer (deepseek32, glm-dsa).
	"self_attn.indexer.k_norm.weight":       "indexer.k_norm.weight",
	"self_attn.indexer.k_norm.bias":         "indexer.k_norm.bias",
	"self_attn.indexer.weights_proj.weight": "indexer.proj.weight",
	"self_attn.indexer.wk.weight":           "indexer.attn_k.weight",
	"self_attn.indexer.wq_b.weight":         "indexer.attn_q_b.weight",
}

// fusedExperts are transformers' fused expert tensors (E, 2·inter, hidden)
// and (E, hidden, inter), which GGUF files converted with fused gate and up
// projections hold as ffn_gate_up_exps (gate rows first, as transformers)
// and ffn_down_exps.
var fusedExperts = map[string]string{
	"mlp.experts.gate_up_proj": "ffn_gate_up_exps.weight",
	"mlp.experts.down_proj":    "ffn_down_exps.weight",
}

// nextnNames maps a NextN (MTP) layer's own tensors.
var nextnNames = map[string]string{
	"eh_proj.weight":          "nextn.eh_proj.weight",
	"enorm.weight":            "nextn.enorm.weight",
	"hnorm.weight":            "nextn.hnorm.weight",
	"shared_head.head.weight": "nextn.shared_head_head.weight",
	"shared_head.norm.weight": "nextn.shared_head_norm.weight",
	"embed_tokens.weight":     "nextn.embed_tokens.weight",
}

// mtpNames are Qwen3-Next's MTP tensors outside mtp.layers, which
// convert_hf_to_gguf renames to NextN names on the block after the last.
var mtpNames = map[string]string{
	"mtp.fc.weight":                    "eh_proj.weight",
	"mtp.pre_fc_norm_embedding.weight": "enorm.weight",
	"mtp.pre_fc_norm_hidden.weight":    "hnorm.weight",
	"mtp.norm.weight":                  "shared_head.norm.weight",
	"mtp.embed_tokens.weight":          "embed_tokens.weight",
}

var mtpLayerName = regexp.MustCompile(`^mtp\.layers\.(\d+)\.(.+)$`)

// resolve finds the GGUF tensor behind a Hugging Face name.
func (w *Weights) resolve(hf string) (ref, bool) {
	if w.asStored {
		t, ok := w.m.tensors[hf]
		return ref{name: hf, expert: -1, fused: ok && len(t.Dims) == 3}, ok
	}
	if g, ok := mtpNames[hf]; ok {
		hf = fmt.Sprintf("model.layers.%d.%s", w.mainLayer, g)
	} else if m := mtpLayerName.FindStringSubmatch(hf); m != nil {
		k, _ := strconv.Atoi(m[1])
		hf = fmt.Sprintf("model.layers.%d.%s", w.mainLayer+k, m[2])
	}
	r, ok := w.find(hf)
	switch {
	case strings.HasSuffix(hf, "linear_attn.A_log"):
		r.value = valueLogNeg
	case w.normOffset && strings.HasSuffix(hf, "norm.weight") && !strings.HasSuffix(hf, "linear_attn.norm.weight"):
		r.value = valueMinusOne
	}
	return r, ok
}

// find is resolve of a model.layers name, without the value changes.
func (w *Weights) find(hf string) (ref, bool) {
	if g, ok := topNames[hf]; ok {
		return ref{name: g, expert: -1}, w.has(g)
	}
	m := layerName.FindStringSubmatch(hf)
	if m == nil {
		return ref{}, false
	}
	layer, err := strconv.Atoi(m[1])
	if err != nil {
		return ref{}, false
	}
	blk := "blk." + m[1] + "."
	rest := m[2]
	if g, ok := nextnNames[rest]; ok && layer >= w.mainLayer {
		return ref{name: blk + g, expert: -1}, w.has(blk + g)
	}
	if g, ok := fusedExperts[rest]; ok { // served fused only where the file fuses gate and up
		return ref{name: blk + g, expert: -1, fused: true}, w.has(blk+"ffn_gate_up_exps.weight") && w.has(blk+g)
	}
	if e := expertName.FindStringSubmatch(rest); e != nil {
		x, _ := strconv.Atoi(e[1])
		if one := fmt.Sprintf("%sffn_%s.%d.weight", blk, e[2], x); w.has(one) { // older files: one tensor per expert
			return ref{name: one, expert: -1}, true
		}
		g := blk + "ffn_" + e[2] + "_exps.weight"
		return ref{name: g, expert: x}, w.has(g)
	}
	g, ok := blockNames[rest]
	if !ok {
		return ref{}, false
	}
	r := ref{name: blk + g, expert: -1}
	if rest == "self_attn.kv_b_proj.weight" && !w.has(r.name) {
		r.join = joinKVB
		return r, w.has(blk+"attn_k_b.weight") && w.has(blk+"attn_v_b.weight")
	}
	if rest == "linear_attn.in_proj_qkvz.weight" {
		r.join = joinQKVZ
		return r, w.has(blk+"attn_qkv.weight") && w.has(blk+"attn_gate.weight")
	}
	if w.permuteQK {
		switch rest {
		case "self_attn.q_proj.weight", "self_attn.q_proj.bias":
			r.heads = w.heads
		case "self_attn.k_proj.weight", "self_attn.k_proj.bias":
			r.heads = w.kvHeads
		}
	}
	return r, w.has(r.name)
}

func (w *Weights) has(g string) bool {
	_, ok := w.m.tensors[g]
	return ok
}

// Has reports whether the Hugging Face tensor name is in the file.
func (w *Weights) Has(name string) bool {
	if w.m.closed.Load() {
		return false
	}
	_, ok := w.resolve(name)
	return ok
}

// tensor resolves name to its GGUF tensor.
func (w *Weights) tensor(name string) (ref, *TensorInfo, error) {
	if w.m.closed.Load() {
		return ref{}, nil, fmt.Errorf("%s: tensor %q: the model is closed", w.m.Path, name)
	}
	r, ok := w.resolve(name)
	if !ok {
		if r.name == "" {
			return r, nil, fmt.Errorf("%s: no GGUF tensor for %q", w.m.Path, name)
		}
		return r, nil, fmt.Errorf("%s: missing tensor %s (for %s)", w.m.Path, r.name, name)
	}
	if r.join != joinNone {
		return r, nil, nil
	}
	return r, w.m.tensors[r.name], nil
}

// shapeErr reports a tensor whose shape is not the wanted one.
func (w *Weights) shapeErr(r ref, t *TensorInfo, want []int) error {
	return fmt.Errorf("%s: tensor %s has shape %v (GGML ne %v), want %v", w.m.Path, r.name, t.Shape(), t.Dims, want)
}

// dtype is the kernels' dtype of t, or an error naming its GGML type.
func (w *Weights) dtype(r ref, t *TensorInfo) (kernels.DType, error) {
	kd, ok := t.Type.DType()
	if !ok {
		return 0, fmt.Errorf("%s: tensor %s has type %s, which ferrite does not support (supported: %s)", w.m.Path, r.name, t.Type, supportedTypes)
	}
	return kd, nil
}

// Mat returns the 2-D tensor name, of shape (rows, cols), viewing the file.
func (w *Weights) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	r, t, err := w.tensor(name)
	if err != nil {
		return nil, err
	}
	switch r.join {
	case joinKVB:
		return w.joinKVB(r, rows, cols)
	case joinQKVZ:
		return w.joinQKVZ(r, rows, cols)
	}
	if r.expert >= 0 {
		return w.expertMat(r, t, rows, cols)
	}
	if r.fused {
		return nil, fmt.Errorf("%s: tensor %s holds every expert: ask for one with Expert", w.m.Path, r.name)
	}
	vector := len(t.Dims) == 1 && rows == 1 && int(t.Dims[0]) == cols // a (1, n) matrix stored as a vector
	if !vector && (len(t.Dims) != 2 || int(t.Dims[1]) != rows || int(t.Dims[0]) != cols) {
		return nil, w.shapeErr(r, t, []int{rows, cols})
	}
	kd, err := w.dtype(r, t)
	if err != nil {
		return nil, err
	}
	data := t.Data
	if r.heads > 0 {
		if data, err = w.unpermute(r, t, rows, kd.RowBytes(cols)); err != nil {
			return nil, err
		}
	}
	return &kernels.Mat{DType: kd, Rows: rows, Cols: cols, Data: data}, nil
}

// Expert returns expert e's (rows, cols) slice of a fused expert tensor
// (model.layers.N.mlp.experts.gate_up_proj or .down_proj), which Has
// reports only for files that fuse gate and up (ffn_gate_up_exps). Other
// files' experts are asked for one by one
// (model.layers.N.mlp.experts.E.gate_proj.weight), which Mat serves.
func (w *Weights) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	r, t, err := w.tensor(name)
	if err != nil {
		return nil, err
	}
	if !r.fused {
		return nil, fmt.Errorf("%s: %q is not a fused expert tensor", w.m.Path, name)
	}
	r.expert = e
	if e < 0 {
		return nil, fmt.Errorf("%s: tensor %s: expert %d", w.m.Path, r.name, e)
	}
	return w.expertMat(r, t, rows, cols)
}

// expertMat is the Mat of a per-expert name resolved to a 3-D slice.
func (w *Weights) expertMat(r ref, t *TensorInfo, rows, cols int) (*kernels.Mat, error) {
	if len(t.Dims) != 3 || int(t.Dims[1]) != rows || int(t.Dims[0]) != cols {
		return nil, w.shapeErr(r, t, []int{int(t.Dims[len(t.Dims)-1]), rows, cols})
	}
	if r.expert >= int(t.Dims[2]) {
		return nil, fmt.Errorf("%s: tensor %s has %d experts, want expert %d", w.m.Path, r.name, t.Dims[2], r.expert)
	}
	kd, err := w.dtype(r, t)
	if err != nil {
		return nil, err
	}
	n := rows * kd.RowBytes(cols)
	return &kernels.Mat{DType: kd, Rows: rows, Cols: cols, Data: t.Data[r.expert*n : (r.expert+1)*n : (r.expert+1)*n]}, nil
}

// unpermute returns t's rows in Hugging Face order, copied once and kept.
// convert_hf_to_gguf stores Q and K rows of head h as
// h·d + 2k + s ← h·d + s·d/2 + k (d the head size, s ∈ {0,1}, k < d/2), so
// that GGML's adjacent-pair rotation equals the half-split one.
func (w *Weights) unpermute(r ref, t *TensorInfo, rows, rowBytes int) ([]byte, error) {
	if rows%r.heads != 0 || rows/r.heads%2 != 0 {
		return nil, fmt.Errorf("%s: tensor %s: %d rows do not split into %d heads of even size", w.m.Path, r.name, rows, r.heads)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if d, ok := w.copies[r.name]; ok {
		return d, nil
	}
	hd := rows / r.heads
	out := make([]byte, len(t.Data))
	for h := range r.heads {
		for s := range 2 {
			for k := range hd / 2 {
				dst := (h*hd + s*hd/2 + k) * rowBytes
				src := (h*hd + 2*k + s) * rowBytes
				copy(out[dst:dst+rowBytes], t.Data[src:src+rowBytes])
			}
		}
	}
	w.copies[r.name] = out
	return out, nil
}

// joinKVB rebuilds MLA's kv_b_proj (heads·(nope+v), kv_lora) from the two
// tensors convert_hf_to_gguf splits it into for llama.cpp's absorbed
// attention: attn_k_b, each head's nope rows transposed (ne = [nope,
// kv_lora, heads]), and attn_v_b, each head's v rows (ne = [kv_lora, v,
// heads]). The result is a copy, kept; it stays in the stored dtype when
// both are the same plain float type, else it is F32 and carries the two
// as stored, per head (Mat.KVB), for the absorbed form.
func (w *Weights) joinKVB(r ref, rows, cols int) (*kernels.Mat, error) {
	blk := strings.TrimSuffix(r.name, "attn_kv_b.weight")
	kb, vb := w.m.tensors[blk+"attn_k_b.weight"], w.m.tensors[blk+"attn_v_b.weight"]
	if len(kb.Dims) != 3 || len(vb.Dims) != 3 || kb.Dims[2] != vb.Dims[2] || int(kb.Dims[1]) != cols || int(vb.Dims[0]) != cols ||
		rows != int(kb.Dims[2])*int(kb.Dims[0]+vb.Dims[1]) {
		return nil, fmt.Errorf("%s: %sattn_k_b %v and attn_v_b %v do not make kv_b_proj [%d %d]", w.m.Path, blk, kb.Shape(), vb.Shape(), rows, cols)
	}
	kd, err := w.dtype(ref{name: kb.Name}, kb)
	if err != nil {
		return nil, err
	}
	vd, err := w.dtype(ref{name: vb.Name}, vb)
	if err != nil {
		return nil, err
	}
	heads, nope, v := int(kb.Dims[2]), int(kb.Dims[0]), int(vb.Dims[1])
	w.mu.Lock()
	defer w.mu.Unlock()
	if d, ok := w.copies[r.name]; ok {
		return &kernels.Mat{DType: w.joined[r.name], Rows: rows, Cols: cols, Data: d, KVB: w.kvbParts[r.name]}, nil
	}
	out := kernels.F32
	if kd == vd && !kd.Quantized() {
		out = kd
	}
	if out != kd || out != vd { // the parts as stored, for the absorbed form (Mat.KVB)
		hs := &kernels.KVBHeads{UK: make([]*kernels.Mat, heads), UV: make([]*kernels.Mat, heads)}
		kr, vr := cols*kd.RowBytes(nope), v*vd.RowBytes(cols)
		for h := range heads {
			hs.UK[h] = &kernels.Mat{DType: kd, Rows: cols, Cols: nope, Data: kb.Data[h*kr : (h+1)*kr]}
			hs.UV[h] = &kernels.Mat{DType: vd, Rows: v, Cols: cols, Data: vb.Data[h*vr : (h+1)*vr]}
		}
		w.kvbParts[r.name] = hs
	}
	size := out.Size()
	data := make([]byte, rows*cols*size)
	kmat := &kernels.Mat{DType: kd, Rows: heads * cols, Cols: nope, Data: kb.Data}
	vmat := &kernels.Mat{DType: vd, Rows: heads * v, Cols: cols, Data: vb.Data}
	put := func(dst int, m *kernels.Mat, row, col int, buf []float32) {
		if out == kd && out == vd {
			es := size
			copy(data[dst*es:(dst+1)*es], m.Data[(row*m.Cols+col)*es:])
			return
		}
		binary.LittleEndian.PutUint32(data[dst*4:], math.Float32bits(buf[col]))
	}
	krow, vrow := make([]float32, nope), make([]float32, cols)
	for h := range heads {
		base := h * (nope + v) * cols
		for c := range cols { // k_b[h] is (kv_lora, nope): row c gives column c of the nope rows
			if out == kernels.F32 {
				kmat.RowF32(krow, h*cols+c)
			}
			for k := range nope {
				put(base+k*cols+c, kmat, h*cols+c, k, krow)
			}
		}
		for j := range v {
			if out == kernels.F32 {
				vmat.RowF32(vrow, h*v+j)
			}
			for c := range cols {
				put(base+(nope+j)*cols+c, vmat, h*v+j, c, vrow)
			}
		}
	}
	w.copies[r.name] = data
	w.joined[r.name] = out
	return &kernels.Mat{DType: out, Rows: rows, Cols: cols, Data: data, KVB: w.kvbParts[r.name]}, nil
}

// joinQKVZ rebuilds Qwen3-Next's in_proj_qkvz (per key head g: q dk rows,
// k dk rows, v r·dv rows, z r·dv rows, r = nv/nk) from the two tensors
// convert_hf_to_gguf makes of it: attn_qkv (all q rows, then all k, then
// all v) and attn_gate (the z rows). Rows are copied whole, so any type
// stays as stored when both halves share it; else the result is F32.
func (w *Weights) joinQKVZ(r ref, rows, cols int) (*kernels.Mat, error) {
	blk := strings.TrimSuffix(r.name, "attn_qkv.weight")
	qkv, gate := w.m.tensors[r.name], w.m.tensors[blk+"attn_gate.weight"]
	nk, dk, nv, dv := w.nk, w.dk, w.nv, w.dv
	if nk <= 0 || nv%nk != 0 || rows != 2*nk*dk+2*nv*dv || len(qkv.Dims) != 2 || len(gate.Dims) != 2 ||
		int(qkv.Dims[0]) != cols || int(gate.Dims[0]) != cols || int(qkv.Dims[1]) != 2*nk*dk+nv*dv || int(gate.Dims[1]) != nv*dv {
		return nil, fmt.Errorf("%s: %sattn_qkv %v and attn_gate %v do not make in_proj_qkvz [%d %d] with %d key heads of %d and %d value heads of %d",
			w.m.Path, blk, qkv.Shape(), gate.Shape(), rows, cols, nk, dk, nv, dv)
	}
	qd, err := w.dtype(r, qkv)
	if err != nil {
		return nil, err
	}
	gd, err := w.dtype(ref{name: gate.Name}, gate)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if d, ok := w.copies[blk+"in_proj_qkvz"]; ok {
		return &kernels.Mat{DType: w.joined[blk+"in_proj_qkvz"], Rows: rows, Cols: cols, Data: d}, nil
	}
	out := kernels.F32
	if qd == gd {
		out = qd
	}
	rb := out.RowBytes(cols)
	data := make([]byte, rows*rb)
	src := map[*TensorInfo]*kernels.Mat{
		qkv:  {DType: qd, Rows: int(qkv.Dims[1]), Cols: cols, Data: qkv.Data},
		gate: {DType: gd, Rows: nv * dv, Cols: cols, Data: gate.Data},
	}
	buf := make([]float32, cols)
	dst := 0
	copyRows := func(t *TensorInfo, from, n int) {
		m := src[t]
		for i := from; i < from+n; i++ {
			if out == m.DType {
				copy(data[dst*rb:(dst+1)*rb], m.Data[i*rb:(i+1)*rb])
			} else {
				m.RowF32(buf, i)
				for j, v := range buf {
					binary.LittleEndian.PutUint32(data[dst*rb+4*j:], math.Float32bits(v))
				}
			}
			dst++
		}
	}
	rv := nv / nk * dv // value rows per key head
	for g := range nk {
		copyRows(qkv, g*dk, dk)
		copyRows(qkv, nk*dk+g*dk, dk)
		copyRows(qkv, 2*nk*dk+g*rv, rv)
		copyRows(gate, g*rv, rv)
	}
	w.copies[blk+"in_proj_qkvz"] = data
	w.joined[blk+"in_proj_qkvz"] = out
	return &kernels.Mat{DType: out, Rows: rows, Cols: cols, Data: data}, nil
}

// Float32 returns the tensor name, of exactly shape, converted to float32
// (norm weights, biases: GGUF keeps them in F32).
func (w *Weights) Float32(name string, shape ...int) ([]float32, error) {
	r, t, err := w.tensor(name)
	if err != nil {
		return nil, err
	}
	if t == nil {
		return nil, fmt.Errorf("%s: %q is a rebuilt matrix, not a small tensor", w.m.Path, name)
	}
	// GGUF drops dimensions of 1 (Qwen3-Next's conv1d (C, 1, K) is (C, K)).
	if !slices.Equal(squeeze(t.Shape()), squeeze(shape)) {
		return nil, w.shapeErr(r, t, shape)
	}
	kd, err := w.dtype(r, t)
	if err != nil {
		return nil, err
	}
	data := t.Data
	cols := int(t.Dims[0])
	rows := t.Numel() / max(cols, 1)
	if kd.Quantized() && len(t.Dims) == 1 && r.heads > 0 {
		return nil, fmt.Errorf("%s: tensor %s: a %s vector cannot be un-permuted row by row", w.m.Path, r.name, t.Type)
	}
	if r.heads > 0 && len(t.Dims) == 1 { // a permuted bias: one element per row
		if data, err = w.unpermute(r, t, cols, kd.RowBytes(1)); err != nil {
			return nil, err
		}
		rows, cols = cols, 1
	}
	out := make([]float32, t.Numel())
	if kd == kernels.F32 {
		for i := range out {
			out[i] = f32At(data, i)
		}
	} else {
		m := &kernels.Mat{DType: kd, Rows: rows, Cols: cols, Data: data}
		for i := range rows {
			m.RowF32(out[i*cols:(i+1)*cols], i)
		}
	}
	for i, v := range out {
		switch r.value {
		case valueMinusOne:
			out[i] = v - 1 // exact for stored values in [0.5, 2]: 1 + (v − 1) gives v back
		case valueLogNeg:
			out[i] = float32(math.Log(-float64(v)))
		}
	}
	return out, nil
}

// squeeze drops dimensions of 1.
func squeeze(shape []int) []int {
	out := []int{}
	for _, d := range shape {
		if d != 1 {
			out = append(out, d)
		}
	}
	return out
}

// f32At is element i of little-endian float32 data.
func f32At(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}
