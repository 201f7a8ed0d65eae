package model

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Info describes a loaded model.
type Info struct {
	Arch            string // config.json model_type, e.g. "qwen3"
	Vocab           int    // logits per row
	Hidden          int    // hidden size (the width of Output hidden states)
	Layers          int    // decoder layers
	MaxContext      int    // max_position_embeddings
	KVBytesPerToken int64  // cache bytes one token takes (CacheLayout().BytesPerToken())

	// StateBytesPerSeq is the fixed recurrent state one sequence takes in a
	// linattn.StatePool (StateModel: the sum of StateLayout's Bytes); 0 for
	// models without linear-attention layers.
	StateBytesPerSeq int64
}

// Model is an architecture ready to run.
type Model interface {
	// Info describes the model.
	Info() Info
	// CacheLayout is the per-layer K/V widths the model's cache must have.
	CacheLayout() kvcache.Layout
	// Forward runs one batch and returns the requested logits and hidden
	// states. Errors report invalid batches; the model's state (other
	// than the cache slots of the batch's positions) is unchanged.
	// Forward must not be called concurrently.
	Forward(b *Batch) (*Output, error)
}

// DeviceModel is a Model that runs on the op set: its activations and KV
// cache live in its device's memory, so its caches must be created with
// NewCache (or kvcache.Options.Memory = Device()).
type DeviceModel interface {
	Model
	// Device is the backend the model runs on.
	Device() kernels.Device
	// SetCacheDType picks the KV storage type, kernels.BF16 (the default)
	// or kernels.F32, for caches created afterwards; CacheLayout and
	// Info().KVBytesPerToken follow it.
	SetCacheDType(dt kernels.DType) error
}

// NewCache creates the KV cache for m in the device memory of the
// DeviceModel m is or wraps (a wrapper exposes what it wraps with an
// Unwrap() Model method); the cache has no host form.
func NewCache(m Model, opts kvcache.Options) (*kvcache.Cache, error) {
	dm := AsDevice(m)
	if dm == nil {
		return nil, fmt.Errorf("model: %s is not on the op set: its KV cache has no device memory", m.Info().Arch)
	}
	opts.Memory = dm.Device()
	return kvcache.New(m.CacheLayout(), opts)
}

// AsDevice returns the DeviceModel m is or wraps, or nil.
func AsDevice(m Model) DeviceModel {
	for m != nil {
		if dm, ok := m.(DeviceModel); ok {
			return dm
		}
		w, ok := m.(interface{ Unwrap() Model })
		if !ok {
			return nil
		}
		m = w.Unwrap()
	}
	return nil
}

// WeightSource is where a Constructor gets its tensors; *weights.Set and
// *randweights.Source satisfy it.
type WeightSource interface {
	// Has reports whether the checkpoint holds the tensor name.
	Has(name string) bool
	// Mat returns the 2-D tensor name, shape-checked to (rows, cols).
	Mat(name string, rows, cols int) (*kernels.Mat, error)
	// Expert returns slice e, shape (rows, cols), of the fused 3-D tensor name.
	Expert(name string, e, rows, cols int) (*kernels.Mat, error)
	// Float32 returns a small tensor of exactly shape, converted to float32.
	Float32(name string, shape ...int) ([]float32, error)
}

// OpsError is a Constructor's error when the backend lacks operations the
// architecture needs (the op set, or a capability of it such as
// kernels.MLAOps); engine.Load falls back to the CPU on it under
// --device auto.
type OpsError struct {
	Backend string // the backend's name
	Missing string // what it lacks, e.g. "the op set (kernels.Device)"
}

func (e *OpsError) Error() string {
	return fmt.Sprintf("backend %s does not implement %s", e.Backend, e.Missing)
}

// Constructor builds an architecture from its config and weights. It must
// return an error naming the key or tensor at fault, never panic.
type Constructor func(cfg *config.Config, w WeightSource, be kernels.Backend) (Model, error)

var (
	regMu    sync.Mutex
	registry = map[string]Constructor{}
)

// Register makes an architecture available under a config.json model_type.
// It is called from the architecture package's init and panics on a
// duplicate name (a programming error).
func Register(modelType string, fn Constructor) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[modelType]; dup {
		panic("model: architecture registered twice")
	}
	registry[modelType] = fn
}

// Supported lists the registered model types, sorted.
func Supported() []string {
	regMu.Lock()
	defer regMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New builds the model for cfg.ModelType.
func New(cfg *config.Config, w WeightSource, be kernels.Backend) (Model, error) {
	regMu.Lock()
	fn, ok := registry[cfg.ModelType]
	regMu.Unlock()
	if !ok {
		mt := cfg.ModelType
		if mt == "" {
			mt = "(none)"
		}
		return nil, fmt.Errorf("%s: unsupported model_type %q; supported: %s", cfg.Path, mt, strings.Join(Supported(), ", "))
	}
	m, err := fn(cfg, w, be)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", cfg.Path, cfg.ModelType, err)
	}
	return m, nil
}

// Logits selects which rows of a sequence's chunk produce logits.
type Logits uint8

const (
	NoLogits   Logits = iota // none (a prompt chunk that is not the last)
	LastLogits               // the last token's (prompt end, decode)
	AllLogits                // every token's (speculative verification, scoring)
)

// Seq is one sequence's part of a batch.
type Seq struct {
	Tokens []int32      // token ids to run, at positions Pos, Pos+1, …
	Pos    int          // position of Tokens[0]; positions [0, Pos) are already cached
	KV     *kvcache.Seq // the sequence's cache; Len() ≥ Pos+len(Tokens) (the caller reserves)
	Logits Logits       // which rows return logits
	Hidden bool         // return the final hidden states (after the final norm) of every token

	// State is the sequence's recurrent-state slot for linear-attention
	// layers (nil for models without them; see StateModel). Forward reads the
	// state as it was after position Pos-1 and leaves it as it is after the
	// last token of this chunk.
	State *linattn.Slot

	// Record, for a sequence with State, keeps the recurrent state after
	// chosen tokens: Record[i], when not nil, receives the state as it is
	// after Tokens[i] (speculative verification rolls back to the last
	// accepted token from it, without running the tokens again). Empty, or
	// one entry per token for a chunk of at most kernels.RecordMaxRows
	// tokens; the snapshots are distinct.
	Record []*linattn.Snapshot

	// Full keeps this sequence's logit rows whole when Batch.Top asks for
	// the best entries only (a sampler that needs the whole row).
	Full bool
}

// LogitRows is how many logit rows the sequence's chunk returns.
func (s *Seq) LogitRows() int {
	switch s.Logits {
	case LastLogits:
		return 1
	case AllLogits:
		return len(s.Tokens)
	}
	return 0
}

// Batch is one forward pass: sequences sharing a cache.
type Batch struct {
	Cache  *kvcache.Cache     // the storage every Seq.KV lives in; its layout must be the model's
	States *linattn.StatePool // the pool every Seq.State lives in; nil for models without linear layers
	Seqs   []Seq

	// Top, when positive, asks for each logit row's Top best entries
	// (SeqOutput.Top), reduced on the model's device, instead of the row,
	// for every sequence without Seq.Full: a step then sends back a few
	// values per row rather than the vocabulary. Top is capped at the
	// vocabulary. A model that cannot reduce returns the rows; callers
	// look at SeqOutput.Top.
	Top int
}

// Tokens is the total number of tokens in the batch.
func (b *Batch) Tokens() int {
	n := 0
	for i := range b.Seqs {
		n += len(b.Seqs[i].Tokens)
	}
	return n
}

// Output holds a forward pass's results, one entry per batch Seq. The
// slices are freshly allocated and owned by the caller.
type Output struct {
	Seqs []SeqOutput

	// Logits, when not nil, reads the whole logit rows of batch sequence i
	// that Batch.Top reduced, from the device (rows·vocab values, as
	// SeqOutput.Logits would hold them): a sampler's fallback when the best
	// entries do not decide. It is valid until the model's next forward
	// pass.
	Logits func(i int) []float32
}

// SeqOutput is one sequence's results.
type SeqOutput struct {
	Logits []float32 // (rows, vocab): rows is 0, 1 or len(Tokens) per Seq.Logits; nil when Top > 0
	Hidden []float32 // (len(Tokens), hidden) when Seq.Hidden, else nil

	// Top is the number of best entries per logit row when the model
	// reduced the rows (Batch.Top), else 0. TopVals and TopIDs (rows,
	// Top) are each row's best logits and their ids, best first: the
	// larger value, ties to the lower id, NaN as -Inf
	// (kernels.SampleOps.TopKRows's order).
	Top     int
	TopVals []float32
	TopIDs  []int32
}

// TopRow is logit row r's best entries (Top > 0).
func (o *SeqOutput) TopRow(r int) (vals []float32, ids []int32) {
	k := o.Top
	return o.TopVals[r*k : (r+1)*k : (r+1)*k], o.TopIDs[r*k : (r+1)*k : (r+1)*k]
}

// Validate checks b against a model's vocabulary and cache layout: every
// sequence has tokens in range, a distinct reserved cache handle, and the
// cache has layout.
func (b *Batch) Validate(vocab int, layout kvcache.Layout) error {
	if b.Cache == nil {
		return fmt.Errorf("model: batch has no cache")
	}
	if !slices.Equal(b.Cache.Layout(), layout) {
		return fmt.Errorf("model: cache layout does not match the model's")
	}
	if b.Top < 0 {
		return fmt.Errorf("model: batch Top %d is negative", b.Top)
	}
	seen := make(map[*kvcache.Seq]bool, len(b.Seqs))
	for i := range b.Seqs {
		s := &b.Seqs[i]
		switch {
		case len(s.Tokens) == 0:
			return fmt.Errorf("model: batch sequence %d has no tokens", i)
		case s.KV == nil:
			return fmt.Errorf("model: batch sequence %d has no cache handle", i)
		case seen[s.KV]:
			return fmt.Errorf("model: batch sequence %d repeats a cache handle", i)
		case s.Pos < 0 || s.KV.Len() < s.Pos+len(s.Tokens):
			return fmt.Errorf("model: batch sequence %d: positions [%d, %d) not reserved (cache length %d)",
				i, s.Pos, s.Pos+len(s.Tokens), s.KV.Len())
		case s.Logits > AllLogits:
			return fmt.Errorf("model: batch sequence %d: bad logits mode %d", i, s.Logits)
		}
		seen[s.KV] = true
		for _, t := range s.Tokens {
			if t < 0 || int(t) >= vocab {
				return fmt.Errorf("model: batch sequence %d: token %d outside the vocabulary [0, %d)", i, t, vocab)
			}
		}
	}
	return nil
}

// StepReserver is implemented by models that keep a step's inputs (token
// ids, row maps, block tables) in device buffers between steps. The
// runtime calls ReserveSteps once, before its first step, with its limits,
// so those buffers are sized by the limits rather than grown by whichever
// steps the schedule happens to form: a model's memory then does not depend
// on timing, and steps within the limits never reallocate.
type StepReserver interface {
	// ReserveSteps sizes the step inputs for steps of at most tokens
	// tokens over at most seqs sequences of at most blocks cache blocks
	// each. Buffers never shrink; a later larger step still grows them.
	ReserveSteps(tokens, seqs, blocks int) error
}

// ReserveSteps calls ReserveSteps on the StepReserver m is or wraps (a
// wrapper exposes what it wraps with an Unwrap() Model method); it does
// nothing for other models.
func ReserveSteps(m Model, tokens, seqs, blocks int) error {
	for m != nil {
		if r, ok := m.(StepReserver); ok {
			return r.ReserveSteps(tokens, seqs, blocks)
		}
		w, ok := m.(interface{ Unwrap() Model })
		if !ok {
			return nil
		}
		m = w.Unwrap()
	}
	return nil
}
