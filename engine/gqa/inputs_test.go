package gqa_test

import (
	"errors"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// TestEnsureI32Frees: a step input that grows frees the tensor it
// replaces, so the backend holds only the current one.
func TestEnsureI32Frees(t *testing.T) {
	d := strict.New()
	var buf kernels.Tensor
	for _, c := range []struct{ n, rows int }{{10, 64}, {64, 64}, {65, 128}, {300, 300}, {12, 300}} {
		v, err := gqa.EnsureI32(d, &buf, c.n)
		if err != nil {
			t.Fatal(err)
		}
		if v.Rows != c.n || buf.Rows != c.rows {
			t.Fatalf("n %d: view of %d rows over %d, want %d over %d", c.n, v.Rows, buf.Rows, c.n, c.rows)
		}
		if got := d.MemoryUse().Tensors; got != int64(4*c.rows) {
			t.Errorf("n %d: Tensors = %d, want %d (the replaced tensors freed)", c.n, got, 4*c.rows)
		}
	}
	old := buf
	if _, err := gqa.EnsureI32(d, &buf, 1000); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, kernels.ErrFreed) {
			t.Errorf("the replaced tensor written: panic %v, want kernels.ErrFreed", err)
		}
	}()
	d.WriteI32(old, make([]int32, old.Rows))
}

// writeCounter is a strict device that records every WriteI32.
type writeCounter struct {
	*strict.Device
	writes [][]int32
}

func (w *writeCounter) WriteI32(t kernels.Tensor, src []int32) {
	w.writes = append(w.writes, append([]int32(nil), src...))
	w.Device.WriteI32(t, src)
}

// TestStepInputsOneWrite: a step's ids, positions, sequences, slots, row
// maps and block table reach the device in one WriteI32 (one host-to-device
// copy), the block table padded to a power-of-two width (at least 4), so
// that steps of one batch shape keep one launch trace for many tokens.
func TestStepInputsOneWrite(t *testing.T) {
	dev := &writeCounter{Device: strict.New()}
	m := modeltest.BuildOn(t, dev, tiny, kernels.F32, nil)
	c, err := model.NewCache(m, kvcache.Options{BlockSize: 4, Budget: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSeq()
	pos := 0
	for _, c0 := range []struct{ tokens, width int }{{9, 4}, {1, 4}, {7, 8}, {1, 8}, {16, 16}} {
		if err := c.Reserve(s, pos+c0.tokens); err != nil {
			t.Fatal(err)
		}
		toks := make([]int32, c0.tokens)
		for i := range toks {
			toks[i] = int32(1 + (pos+i)%90)
		}
		dev.writes = nil
		if _, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: s, Logits: model.LastLogits}}}); err != nil {
			t.Fatal(err)
		}
		pos += c0.tokens
		// ids, positions, sequences, slots (4 per token), one logit row,
		// the block table.
		if want := 4*c0.tokens + 1 + c0.width; len(dev.writes) != 1 || len(dev.writes[0]) != want {
			lens := []int{}
			for _, w := range dev.writes {
				lens = append(lens, len(w))
			}
			t.Errorf("%d tokens at %d: WriteI32 lengths %v, want one of %d", c0.tokens, pos, lens, want)
		}
	}
}
