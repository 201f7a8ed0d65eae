package engine

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/weights"
)

// LoadWeights is Load for a model whose config and weights are already in
// memory, for example the model built into the binary (package builtin):
// cfg is the parsed config.json and w its weights (weights.FromBytes or
// weights.Open). name is what Loaded.Dir reports, such as
// "builtin:ferrite-tiny". The Loaded owns w: Close closes it, and w is
// closed when the model cannot be built. opts.RandomWeights is not allowed.
func LoadWeights(name string, cfg *config.Config, w *weights.Set, opts Options) (*Loaded, error) {
	if cfg == nil || w == nil {
		return nil, fmt.Errorf("%s: LoadWeights needs a config and weights", name)
	}
	if opts.RandomWeights {
		return nil, fmt.Errorf("%s: LoadWeights does not build random weights (use Load)", name)
	}
	if err := checkQuant(name, opts); err != nil {
		w.Close()
		return nil, err
	}
	if err := CheckDims(cfg, w); err != nil {
		w.Close()
		return nil, err
	}
	l := &Loaded{Dir: name, Config: cfg, Weights: w, Backend: opts.Backend}
	if err := l.openBackend(opts); err != nil {
		l.Close()
		return nil, err
	}
	m, err := l.newModel(cfg, w, opts)
	if err != nil {
		l.Close()
		return nil, err
	}
	l.Model = m
	return l, nil
}
