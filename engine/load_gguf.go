package engine

import (
	"os"
	"path/filepath"

	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// findGGUF is the GGUF file path names: the file itself, or the one GGUF
// model of a directory without a config.json.
func findGGUF(path string) (string, bool, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		if _, err := os.Stat(filepath.Join(path, "config.json")); err == nil {
			return "", false, nil
		}
	}
	return gguf.Find(path)
}

// checkpointGGUF opens the GGUF file of a checkpoint directory without
// safetensors whose one GGUF model keeps the checkpoint's tensor names
// (gguf.Model.KeepsCheckpointNames); nil when dir is not one.
func checkpointGGUF(dir string, opts Options) (*gguf.Model, error) {
	if opts.RandomWeights {
		return nil, nil
	}
	if st, _ := filepath.Glob(filepath.Join(dir, "*.safetensors")); len(st) > 0 {
		return nil, nil
	}
	files := gguf.ModelFiles(dir)
	if len(files) != 1 {
		return nil, nil
	}
	g, err := gguf.Open(files[0])
	if err != nil {
		return nil, err
	}
	if !g.KeepsCheckpointNames() {
		g.Close()
		return nil, nil
	}
	return g, nil
}

// loadGGUF builds the model of a GGUF file: its config from the metadata,
// its weights viewed in place in the mapped file (opts.Quant quantizes the
// matrices not quantized already).
func loadGGUF(name, file string, opts Options) (_ *Loaded, err error) {
	g, err := gguf.Open(file)
	if err != nil {
		return nil, err
	}
	l := &Loaded{Dir: name, GGUF: g, Backend: opts.Backend}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.Config, err = g.Config(); err != nil {
		return nil, err
	}
	var src model.WeightSource
	if opts.RandomWeights {
		src = randweights.New(opts.Seed, randomDType(l.Config))
	} else {
		if err = CheckGGUFDims(l.Config, g); err != nil {
			return nil, err
		}
		if src, err = g.Weights(); err != nil {
			return nil, err
		}
	}
	if err = l.openBackend(opts); err != nil {
		return nil, err
	}
	if l.Model, err = l.newModel(l.Config, src, opts); err != nil {
		return nil, err
	}
	return l, nil
}

// LoadTokenizer loads the tokenizer of a model: tokenizer.Load of a model
// directory, or the tokenizer a GGUF file carries (path being the file or a
// directory holding one GGUF model and no config.json).
func LoadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	file, ok, err := findGGUF(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return tokenizer.Load(path)
	}
	g, err := gguf.Open(file)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return g.Tokenizer()
}
