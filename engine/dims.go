package engine

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/weights"
)

// notDims are config.json keys whose numbers size nothing that is allocated
// at load: positions, token ids, frequencies. Keys ending in _id or _ids
// (token ids) are skipped too.
var notDims = map[string]bool{
	"max_position_embeddings":          true,
	"original_max_position_embeddings": true,
	"rope_theta":                       true,
	"sliding_window":                   true,
	"seed":                             true,
}

// CheckDims checks every number of config.json that can size something —
// hidden_size, head_dim, index_head_dim, layer, head and expert counts,
// intermediate sizes, vocab_size, kernel sizes, top-k, iteration counts —
// before a model is built from it: none may pass the largest dimension of
// the checkpoint's tensors or their count. A real model's dimensions are
// all dimensions of its tensors (or counts of them: layers, experts), so a
// value past that bound is damage, and would otherwise allocate memory
// sized by it before any tensor shape is compared (10^12 ends the process:
// Go cannot recover from running out of memory), or loop over it. The architectures
// compare the shapes exactly when they load each tensor. Load and
// LoadWeights call it; a caller building a model from a checkpoint itself
// (model.New) should too.
func CheckDims(cfg *config.Config, w *weights.Set) error {
	var shapes [][]int
	for _, name := range w.Names() {
		if t, err := w.Tensor(name); err == nil {
			shapes = append(shapes, t.Shape)
		}
	}
	return checkDims(cfg, len(w.Names()), shapes)
}

// CheckGGUFDims is CheckDims for a GGUF file, whose config comes from its
// metadata.
func CheckGGUFDims(cfg *config.Config, g *gguf.Model) error {
	names := g.TensorNames()
	shapes := make([][]int, 0, len(names))
	for _, name := range names {
		if t, ok := g.Tensor(name); ok {
			shapes = append(shapes, t.Shape())
		}
	}
	return checkDims(cfg, len(names), shapes)
}

// checkDims is CheckDims over a checkpoint of count tensors of the given
// shapes.
func checkDims(cfg *config.Config, count int, shapes [][]int) error {
	bound := int64(count)
	for _, shape := range shapes {
		for _, d := range shape {
			bound = max(bound, int64(d))
		}
	}
	var problems []string
	top := cfg.Top()
	for _, key := range top.Keys() {
		walkNumbers(key, top.Raw(key), func(path string, last string, v float64) {
			if notDims[last] || strings.HasSuffix(last, "_id") || strings.HasSuffix(last, "_ids") {
				return
			}
			if v != math.Trunc(v) || v <= float64(bound) {
				return
			}
			problems = append(problems, fmt.Sprintf("key %q is %.0f, larger than any tensor dimension of the checkpoint (%d)", path, v, bound))
		})
	}
	if len(problems) == 0 {
		return nil
	}
	slices.Sort(problems)
	return fmt.Errorf("%s: %s", cfg.Path, strings.Join(problems, "; "))
}

// walkNumbers calls fn for every number in v (a config value as Raw gives
// it), with its dotted path and its own key (for an array item, the array's).
func walkNumbers(path string, v any, fn func(path, last string, v float64)) {
	last := path[strings.LastIndexByte(path, '.')+1:]
	if i := strings.IndexByte(last, '['); i >= 0 {
		last = last[:i]
	}
	switch v := v.(type) {
	case float64:
		fn(path, last, v)
	case []any:
		for i, e := range v {
			walkNumbers(fmt.Sprintf("%s[%d]", path, i), e, fn)
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			walkNumbers(path+"."+k, v[k], fn)
		}
	}
}
