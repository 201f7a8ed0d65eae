// Package builtin holds ferrite-tiny, the small model built into the ferrite
// binary, so that a fresh build can chat with no download.
//
// ferrite-tiny is a 16-million-parameter glm5_next model (the GLM-5.3-Flash
// architecture: Kimi Delta Attention and k-pool DSA layers, mHC residual
// streams, dense and MoE feed-forward layers and one NextN MTP layer),
// trained by tools/train on WordNet, the King James Bible, The Devil's
// Dictionary, the Jargon File and fortune-file quotations to be a small
// dictionary and quotation companion. MODEL_CARD.md at the repository root
// describes it: data and licences, training, evaluation and limits.
//
// The files under model/ are embedded with go:embed: config.json and
// generation_config.json as transformers saved them (the latter with
// do_sample false added: greedy decoding unless asked otherwise), the tokenizer
// (tokenizer.json, tokenizer_config.json, chat_template.jinja), and the
// weights, model.gguf: a GGUF file holding the matrices in Q8_0 (the MoE
// router gates, MLA's kv_b_proj and the indexer's compress gate in BF16, as
// ferrite's --quant q8_0 keeps them) and the norms and other small tensors
// in F32, under the checkpoint's tensor names (the MTP layer at
// model.language_model.layers.6). tools/packtiny writes it from the bf16
// checkpoint that tools/train trains. The weights are used in place
// (gguf.FromBytes): loading copies nothing.
//
//	l, tok, err := builtin.Open(engine.Options{})
//	defer l.Close()
package builtin

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Name is the built-in model's name (the default model; /model ferrite-tiny).
const Name = "ferrite-tiny"

// Description is a one-line summary for model lists.
const Description = "ferrite-tiny: a 16M-parameter glm5_next dictionary and quotation companion built into ferrite"

// Label is what the loaded model's Dir and error messages say.
const Label = "builtin:" + Name

//go:embed model/config.json model/generation_config.json model/tokenizer.json model/tokenizer_config.json model/chat_template.jinja
var files embed.FS

// Quant is the quantization of the embedded weights (general.file_type).
const Quant = "Q8_0"

// WeightsFile is the name of the embedded weights under model/.
const WeightsFile = "model.gguf"

//go:embed model/model.gguf
var weightBytes []byte

// fileNames are the embedded files other than the weights.
var fileNames = []string{
	"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
}

// IsName reports whether s names the built-in model: "ferrite-tiny" or
// "builtin" (any case, surrounding spaces ignored).
func IsName(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return s == Name || s == "builtin" || s == Label
}

// Files returns the embedded files other than the weights, at the root of
// the returned file system (config.json, generation_config.json,
// tokenizer.json, tokenizer_config.json, chat_template.jinja).
func Files() fs.FS {
	sub, err := fs.Sub(files, "model")
	if err != nil {
		panic("builtin: " + err.Error()) // cannot happen: the directory is embedded
	}
	return sub
}

// WeightBytes returns the embedded model.gguf. The slice is the binary's
// own data: it must not be modified.
func WeightBytes() []byte { return weightBytes }

// Config parses the embedded config.json.
func Config() (*config.Config, error) {
	data, err := fs.ReadFile(Files(), "config.json")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Label, err)
	}
	return config.Parse(Label+"/config.json", data)
}

// Weights parses the embedded model.gguf; its tensors view the binary's
// data (nothing is copied). Serve them with CheckpointWeights.
func Weights() (*gguf.Model, error) {
	return gguf.FromBytes(Label+"/"+WeightsFile, weightBytes)
}

// Tokenizer loads the embedded tokenizer, with its chat template and the
// end-of-turn ids of generation_config.json.
func Tokenizer() (*tokenizer.Tokenizer, error) {
	return tokenizer.LoadFS(Files(), ".")
}

// Open loads the built-in model and its tokenizer. The Loaded's Dir is
// Label; Close releases the backend (the weights stay in the binary).
func Open(opts engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
	tok, err := Tokenizer()
	if err != nil {
		return nil, nil, err
	}
	cfg, err := Config()
	if err != nil {
		return nil, nil, err
	}
	w, err := Weights()
	if err != nil {
		return nil, nil, err
	}
	l, err := engine.LoadGGUFCheckpoint(Label, cfg, w, opts)
	if err != nil {
		return nil, nil, err
	}
	return l, tok, nil
}

// Export writes the model's files into dir (created if needed), so that it
// can be loaded from disk like any other model directory (engine.Load,
// tokenizer.Load, or transformers' from_pretrained, which initialises the
// unused vision stub that is not shipped): the embedded files other than
// the weights as they are, and model.safetensors holding the weights
// dequantized to F32, the very values of the built-in model's weights (a
// Q8_0 value, a float16 scale times an int8, is exact in float32).
func Export(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, n := range fileNames {
		data, err := fs.ReadFile(Files(), n)
		if err != nil {
			return fmt.Errorf("%s: %w", Label, err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
			return err
		}
	}
	tensors, err := dequantized()
	if err != nil {
		return err
	}
	return weights.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"})
}

// dequantized returns every embedded tensor as F32, in the checkpoint's
// shape.
func dequantized() ([]weights.WriteTensor, error) {
	g, err := Weights()
	if err != nil {
		return nil, err
	}
	var out []weights.WriteTensor
	for _, name := range g.TensorNames() {
		t, _ := g.Tensor(name)
		dt, ok := t.Type.DType()
		if !ok {
			return nil, fmt.Errorf("%s: tensor %s has type %s", Label, name, t.Type)
		}
		cols := int(t.Dims[0])
		m := &kernels.Mat{DType: dt, Rows: t.Numel() / cols, Cols: cols, Data: t.Data}
		vals := make([]float32, t.Numel())
		for r := range m.Rows {
			m.RowF32(vals[r*cols:(r+1)*cols], r)
		}
		out = append(out, weights.Encode(name, kernels.F32, t.Shape(), vals))
	}
	return out, nil
}
