package engine

import (
	"context"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"unsafe"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Weight preparation. A backend may keep, per weight matrix, a form of it
// made on the matrix's first MatMul (kernels.WeightPreparer: the CPU's
// copies of BF16 weights in huge pages and repacked Q4_0/Q8_0 weights, and
// the per-head splits of the kv_b_proj matrices an MLA model declares,
// kernels.KVBDeclarer; seconds of CPU time for a whole model). Load has the
// backend make them right after the model is built, on a goroutine of its
// own, rather than in the first request, and rather than before Load
// returns: the chat then opens as soon as the weights are mapped and the
// forms are made while the user types (0.5–2.7 s for Qwen3-0.6B BF16 on two
// threads of a shared VM, most of it kernel time; BENCHMARKS.md §13,
// sessions 16 and 17), a server is listening meanwhile, and a request that
// comes first loses nothing: a MatMul of a weight being prepared waits for
// that one form, and one of a weight not reached yet makes it as before
// (and the preparation then finds it made). Loaded.Close stops the
// preparation and waits for it before it closes the backend.

// WeightRecorder is a model.WeightSource that passes requests on and keeps
// the matrices the model took through Mat, by name, so that Prepare can
// pick those a backend may prepare. Safe for concurrent use.
type WeightRecorder struct {
	model.WeightSource

	mu   sync.Mutex
	mats []namedMat
}

// namedMat is one matrix the model took, under the name it asked for.
type namedMat struct {
	name string
	m    *kernels.Mat
}

// NewWeightRecorder wraps src.
func NewWeightRecorder(src model.WeightSource) *WeightRecorder {
	return &WeightRecorder{WeightSource: src}
}

// Mat loads and records a matrix.
func (r *WeightRecorder) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := r.WeightSource.Mat(name, rows, cols)
	if err == nil {
		r.mu.Lock()
		r.mats = append(r.mats, namedMat{name, m})
		r.mu.Unlock()
	}
	return m, err
}

// reRoutedExpert is a routed expert's matrix stored one per expert
// (nn.Loader.Experts; a GGUF file's experts are asked for under such
// names too, and fused ones through Expert, which r does not record).
var reRoutedExpert = regexp.MustCompile(`(?:^|\.)experts\.\d+\.`)

// Prepare returns the matrices, of those m took through r, to prepare
// (kernels.WeightPreparer), in the order m took them (a model's layers in
// turn, as a step runs them): those m keeps (reachable from it; not, say, a
// matrix it copied rows of into one of its own) that a step multiplies
// every time, so not
//   - a routed expert's (one per expert, fused ones come through Expert):
//     a step multiplies a few of them, and the CPU keeps no copy of them,
//   - an input embedding table, which a step only looks rows up in, unless
//     no lm_head was loaded (the embedding then is the tied head),
//   - a multi-token-prediction module's (mtp., or a layer past the main
//     stack's Info().Layers), multiplied only while drafting.
func (r *WeightRecorder) Prepare(m model.Model) []*kernels.Mat { return r.prepare(m, m.Info().Layers) }

// prepare is Prepare of the matrices reachable from keep, of a main stack
// of layers layers.
func (r *WeightRecorder) prepare(keep any, layers int) []*kernels.Mat {
	r.mu.Lock()
	defer r.mu.Unlock()
	untied := false
	for _, t := range r.mats {
		if model.OutputHead(t.name, layers) {
			untied = true
		}
	}
	kept := reachableMats(keep)
	var ws []*kernels.Mat
	seen := map[*kernels.Mat]bool{}
	for _, t := range r.mats {
		switch {
		case seen[t.m] || !kept[t.m]:
		case reRoutedExpert.MatchString(t.name), model.MTPWeight(t.name, layers):
		case untied && strings.HasSuffix(t.name, "embed_tokens.weight"):
		default:
			seen[t.m] = true
			ws = append(ws, t.m)
		}
	}
	return ws
}

// reachableMats returns the matrices reachable from v through pointers,
// interfaces, structs (exported fields or not), slices, arrays and maps:
// the weights a model keeps, wherever its architecture keeps them.
func reachableMats(v any) map[*kernels.Mat]bool {
	w := matWalker{out: map[*kernels.Mat]bool{}, seen: map[visit]bool{}, holds: map[reflect.Type]bool{}}
	w.walk(reflect.ValueOf(v))
	return w.out
}

// matWalker is reachableMats' state.
type matWalker struct {
	out   map[*kernels.Mat]bool
	seen  map[visit]bool        // pointers and slices walked already (models share blocks, point back)
	holds map[reflect.Type]bool // whether a value of the type can lead to a *kernels.Mat
}

// visit is a pointer or a slice walked, by its address, type and length.
type visit struct {
	p unsafe.Pointer
	t reflect.Type
	n int
}

var matType = reflect.TypeFor[kernels.Mat]()

func (w *matWalker) walk(v reflect.Value) {
	if !v.IsValid() || !w.mayHold(v.Type()) { // kernels.Mat itself holds
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return
		}
		if v.Type().Elem() == matType {
			w.out[(*kernels.Mat)(v.UnsafePointer())] = true
			return
		}
		k := visit{v.UnsafePointer(), v.Type(), 0}
		if w.seen[k] {
			return
		}
		w.seen[k] = true
		w.walk(v.Elem())
	case reflect.Interface:
		w.walk(v.Elem())
	case reflect.Struct:
		if v.Type() == matType {
			if v.CanAddr() {
				w.out[(*kernels.Mat)(v.Addr().UnsafePointer())] = true
			}
			return
		}
		for i := range v.NumField() {
			w.walk(v.Field(i))
		}
	case reflect.Slice:
		if v.IsNil() || v.Len() == 0 {
			return
		}
		k := visit{v.UnsafePointer(), v.Type(), v.Len()}
		if w.seen[k] {
			return
		}
		w.seen[k] = true
		for i := range v.Len() {
			w.walk(v.Index(i))
		}
	case reflect.Array:
		for i := range v.Len() {
			w.walk(v.Index(i))
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			w.walk(it.Key())
			w.walk(it.Value())
		}
	}
}

// mayHold reports whether a value of type t can lead to a *kernels.Mat
// (so that slices of numbers, a model's biggest values, are not walked).
func (w *matWalker) mayHold(t reflect.Type) bool {
	if t == matType {
		return true
	}
	if h, ok := w.holds[t]; ok {
		return h
	}
	w.holds[t] = true // a type that refers to itself: assume so while working it out
	h := false
	switch t.Kind() {
	case reflect.Interface:
		h = true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		h = t.Elem() == matType || w.mayHold(t.Elem())
	case reflect.Map:
		h = w.mayHold(t.Key()) || w.mayHold(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if h = t.Field(i).Type == matType || w.mayHold(t.Field(i).Type); h {
				break
			}
		}
	}
	w.holds[t] = h
	return h
}

// startPrepare has the backend prepare the weights the model keeps
// (Prepare) on a goroutine of its own, which Close stops and waits for;
// WaitPrepared waits for it. Nothing is started for a backend that is not
// a kernels.WeightPreparer.
func (l *Loaded) startPrepare() {
	p, ok := l.Backend.(kernels.WeightPreparer)
	if !ok || l.rec == nil {
		return
	}
	ws := l.rec.Prepare(l.Model)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	l.prepStop, l.prepDone = cancel, done
	go func() {
		defer close(done)
		defer func() { _ = recover() }() // a failure leaves the rest to MatMul, which makes them as before
		if p.PrepareWeights(ctx, ws) == nil {
			releaseCopied(ctx, l.Backend, ws)
		}
	}()
}

// releaseCopied gives back the file pages of the weights of ws that the
// backend now reads from copies of its own (kernels.WeightCopier): without
// it a BF16 model held its weights twice in the process's resident set,
// the copy and the file's mapped pages (2.4 GB for the 1.2 GB Qwen3-0.6B).
// weights.ReleasePages touches only pages of a read-only file mapping, which
// come back from the file if anything reads them again.
func releaseCopied(ctx context.Context, be any, ws []*kernels.Mat) {
	c, ok := be.(kernels.WeightCopier)
	if !ok {
		return
	}
	for _, w := range ws {
		if ctx.Err() != nil {
			return
		}
		if c.HasCopy(w) {
			weights.ReleasePages(w.Data)
		}
	}
}

// WaitPrepared returns when the backend has prepared the model's weights
// (Load starts that; see kernels.WeightPreparer), or been stopped, or ctx
// is done (with ctx.Err()). It returns at once where there is nothing to
// prepare.
func (l *Loaded) WaitPrepared(ctx context.Context) error {
	if l.prepDone == nil {
		return nil
	}
	select {
	case <-l.prepDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopPrepare stops the preparation and waits for it: a weight begun is
// finished first (tens of ms).
func (l *Loaded) stopPrepare() {
	if l.prepStop == nil {
		return
	}
	l.prepStop()
	<-l.prepDone
}
