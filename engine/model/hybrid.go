package model

import (
	"errors"
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// StateModel is implemented by models with linear-attention layers, whose
// per-sequence recurrent state lives in a linattn.StatePool slot rather than
// in the paged KV cache. A model may implement it with an empty layout (no
// linear layers, as gqa.Decoder without them): it then needs no pool.
type StateModel interface {
	Model
	// StateLayout is the shape of one sequence's slot: one entry per linear
	// layer, in model order.
	StateLayout() []linattn.LayerShape
}

// MTPModel is implemented by models whose checkpoint holds a
// multi-token-prediction module (Qwen3-Next `mtp.*`, the DeepSeek/GLM NextN
// layer `model.layers.{num_hidden_layers}.*`). Its attention cache is one
// extra layer at the end of CacheLayout (index Info().Layers), so a
// sequence's kvcache.Seq covers it too.
type MTPModel interface {
	Model
	// ForwardMTP runs the MTP module. For each Seq, row i combines hidden[s]
	// row i (the main model's post-final-norm hidden state at position
	// Pos+i, width Info().Hidden) with the embedding of Tokens[i] (the token
	// at position Pos+i+1); it runs at position Pos+i against the MTP layer's
	// own cache and returns logits that predict the token at Pos+i+2 (rows
	// chosen by Seq.Logits) and, when Seq.Hidden, the MTP's own post-norm
	// output for chained drafting.
	//
	// hidden is host memory on purpose: the rows cross the step boundary
	// (the runtime keeps them between the main step and the drafts, with
	// the logits), and the implementation uploads them with the step's
	// other inputs; no op inside a step reads host activations.
	ForwardMTP(b *Batch, hidden [][]float32) (*Output, error)
}

// SpecModel is an MTPModel that runs a greedy speculative step as one step
// of its device: the MTP draft passes and the main model's verification
// pass after them, with each pass's drafts (argmaxes) fed into the passes
// after it on the device, so that the step has one hand-over to the device
// and one wait for it instead of one per pass. Discovered by type
// assertion; SpecReady says whether the model can run it at all.
type SpecModel interface {
	MTPModel
	// SpecReady reports whether ForwardSpec can run on the model's
	// backend (it needs kernels.DraftOps and kernels.SampleOps).
	SpecReady() bool
	// ForwardSpec runs s's draft passes in order, then s.Verify, and
	// returns their outputs as ForwardMTP and Forward would. Every entry
	// that feeds a later pass asks for its last row's logits, with
	// Batch.Top ≥ 1 (the fed token is the row's best entry, as
	// SeqOutput.TopIDs reports it), and, when it feeds a draft pass, its
	// hidden states. The tokens fed hold placeholders (any valid id).
	ForwardSpec(s *SpecStep) (drafts []*Output, verify *Output, err error)
}

// SpecStep is a speculative step for SpecModel.ForwardSpec.
type SpecStep struct {
	// Drafts are the MTP draft passes. Pass 0 is a ForwardMTP batch over
	// Hidden; entry j of a pass i ≥ 1 is one token whose id and hidden
	// state are draft pass i−1's entry Chain[i][j]'s: the best entry of its
	// last logit row and its last hidden row (the MTP's own output).
	Drafts []Batch
	Hidden [][]float32 // Drafts[0]'s hidden rows, as ForwardMTP's
	Chain  [][]int     // (len(Drafts)) Chain[0] is unused
	// Verify is the main model's pass. Entry e's last len(Feed[e]) tokens
	// are drafts: its token len(Tokens)−len(Feed[e])+i is the best entry of
	// the last logit row of Drafts[i]'s entry Feed[e][i].
	Verify *Batch
	Feed   [][]int // (len(Verify.Seqs))
}

// ValidateHidden checks ForwardMTP's hidden states against b: one slice
// per sequence of len(Tokens)·width values.
func (b *Batch) ValidateHidden(hidden [][]float32, width int) error {
	if len(hidden) != len(b.Seqs) {
		return fmt.Errorf("mtp: %d hidden-state slices for %d sequences", len(hidden), len(b.Seqs))
	}
	for i := range b.Seqs {
		if want := len(b.Seqs[i].Tokens) * width; len(hidden[i]) != want {
			return fmt.Errorf("mtp: sequence %d: %d hidden values, want %d (tokens × hidden)", i, len(hidden[i]), want)
		}
	}
	return nil
}

// ValidateStates checks b's recurrent-state slots against a StateModel's
// layout: a pool of that shape, and a distinct slot for every sequence. A
// model without linear layers (empty layout) needs none.
func (b *Batch) ValidateStates(layout []linattn.LayerShape) error {
	if len(layout) == 0 {
		return nil
	}
	if b.States == nil {
		return errors.New("model: batch has no state pool (Batch.States)")
	}
	var bytes int64
	for _, l := range layout {
		bytes += l.Bytes()
	}
	if b.States.Layers() != len(layout) || b.States.BytesPerSeq() != bytes {
		return fmt.Errorf("model: state pool has %d layers of %d bytes per sequence, the model needs %d layers of %d bytes (StateLayout)",
			b.States.Layers(), b.States.BytesPerSeq(), len(layout), bytes)
	}
	seen := make(map[*linattn.Slot]bool, len(b.Seqs))
	recs := map[*linattn.Snapshot]bool{}
	for i := range b.Seqs {
		s := &b.Seqs[i]
		st := s.State
		switch {
		case st == nil:
			return fmt.Errorf("model: batch sequence %d has no state slot", i)
		case seen[st]:
			return fmt.Errorf("model: batch sequence %d repeats a state slot", i)
		case len(s.Record) > 0 && (len(s.Record) != len(s.Tokens) || len(s.Tokens) > kernels.RecordMaxRows):
			return fmt.Errorf("model: batch sequence %d records %d states for %d tokens (at most %d)", i, len(s.Record), len(s.Tokens), kernels.RecordMaxRows)
		}
		seen[st] = true
		for _, r := range s.Record {
			if r != nil && recs[r] {
				return fmt.Errorf("model: batch sequence %d repeats a record snapshot", i)
			}
			recs[r] = true
		}
	}
	return nil
}

// NewStatePool creates the recurrent-state pool for a StateModel m with
// room for budget bytes of slots and snapshots, in the device memory of
// the DeviceModel m is or wraps (recurrent state has no host form).
func NewStatePool(m StateModel, budget int64) (*linattn.StatePool, error) {
	dm := AsDevice(m)
	if dm == nil {
		return nil, fmt.Errorf("model: %s is not on the op set: its recurrent state has no device memory", m.Info().Arch)
	}
	return linattn.NewStatePool(dm.Device(), m.StateLayout(), budget)
}
