package engine

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
)

// LoadWeights is Load for a model whose config and weights are already in
// memory: cfg is the parsed config.json and w its weights (weights.FromBytes
// or weights.Open). name is what Loaded.Dir reports. The Loaded owns w:
// Close closes it, and w is closed when the model cannot be built.
// opts.RandomWeights is not allowed (an error that leaves w open).
func LoadWeights(name string, cfg *config.Config, w *weights.Set, opts Options) (*Loaded, error) {
	if cfg == nil || w == nil {
		return nil, fmt.Errorf("%s: LoadWeights needs a config and weights", name)
	}
	if opts.RandomWeights {
		return nil, fmt.Errorf("%s: LoadWeights does not build random weights (use Load)", name)
	}
	l := &Loaded{Dir: name, Config: cfg, Weights: w, Backend: opts.Backend}
	return l.build(w, func() error { return CheckDims(cfg, w) }, opts)
}

// LoadGGUFCheckpoint is LoadWeights for a GGUF file that keeps the
// checkpoint's tensor names (gguf.Model.CheckpointWeights), with the
// checkpoint's config.json parsed as cfg: the model built into the binary
// (package builtin, name "builtin:ferrite-tiny"), whose Q8_0 matrices are
// used in place. The Loaded owns g as LoadWeights owns w.
func LoadGGUFCheckpoint(name string, cfg *config.Config, g *gguf.Model, opts Options) (*Loaded, error) {
	if cfg == nil || g == nil {
		return nil, fmt.Errorf("%s: LoadGGUFCheckpoint needs a config and a GGUF model", name)
	}
	if opts.RandomWeights {
		return nil, fmt.Errorf("%s: LoadGGUFCheckpoint does not build random weights (use Load)", name)
	}
	l := &Loaded{Dir: name, Config: cfg, GGUF: g, Backend: opts.Backend}
	return l.build(g.CheckpointWeights(), func() error { return CheckGGUFDims(cfg, g) }, opts)
}

// build checks the options and the config's dimensions against the
// weights (check), starts the backend and builds l's model from src; on
// failure l is closed, and with it the weights it owns.
func (l *Loaded) build(src model.WeightSource, check func() error, opts Options) (*Loaded, error) {
	err := l.buildModel(src, check, opts)
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Loaded) buildModel(src model.WeightSource, check func() error, opts Options) error {
	if err := checkQuant(l.Dir, opts); err != nil {
		return err
	}
	if err := check(); err != nil {
		return err
	}
	if err := l.openBackend(opts); err != nil {
		return err
	}
	m, err := l.newModel(l.Config, src, opts)
	if err != nil {
		return err
	}
	l.Model = m
	return nil
}
