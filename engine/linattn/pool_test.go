package linattn

import (
	"errors"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

func TestPoolAccounting(t *testing.T) {
	// Qwen3-Next-80B-A3B: 36 GDN layers, S 32×128×128, conv 3×8192 (fp32).
	qwen := LayerShape{Heads: 32, DK: 128, DV: 128, ConvK: 4, ConvChannels: 8192}
	layers := make([]LayerShape, 36)
	for i := range layers {
		layers[i] = qwen
	}
	p, err := NewStatePool(strict.New(), layers, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.BytesPerSeq(), int64(36*(2<<20+3*8192*4)); got != want {
		t.Errorf("Qwen3-Next BytesPerSeq %d, want %d", got, want)
	}

	small := []LayerShape{{Heads: 2, DK: 3, DV: 4, ConvK: 4, ConvChannels: 5}, {Heads: 1, DK: 2, DV: 2, ConvK: 2, ConvChannels: 3}}
	per := int64(4 * (2*3*4 + 3*5 + 1*2*2 + 1*3))
	p, err = NewStatePool(strict.New(), small, 3*per+per/2)
	if err != nil {
		t.Fatal(err)
	}
	if p.BytesPerSeq() != per || p.Available() != 3 || p.Used() != 0 {
		t.Fatalf("BytesPerSeq %d (want %d), Available %d, Used %d", p.BytesPerSeq(), per, p.Available(), p.Used())
	}
	a, _ := p.Alloc()
	b, _ := p.Alloc()
	sn, err := p.NewSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if p.Used() != 3*per || p.Available() != 0 {
		t.Fatalf("Used %d, Available %d", p.Used(), p.Available())
	}
	_, err = p.Alloc()
	var ee *ExhaustedError
	if !errors.Is(err, ErrExhausted) || !errors.As(err, &ee) || ee.Need != per || ee.Used != 3*per {
		t.Fatalf("exhausted Alloc: %v", err)
	}
	if _, err := p.NewSnapshot(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("exhausted NewSnapshot: %v", err)
	}
	if a.ID() == b.ID() {
		t.Fatal("duplicate slot IDs")
	}

	// Free / re-Alloc: zeroed, ID reused, accounting back.
	id := b.ID()
	p.Free(b)
	p.FreeSnapshot(sn)
	if p.Used() != per {
		t.Fatalf("Used after Free %d", p.Used())
	}
	c, err := p.Alloc()
	if err != nil {
		t.Fatal(err)
	}
	if c.ID() != id {
		t.Errorf("ID %d not reused (%d)", c.ID(), id)
	}
	mustPanicPool(t, func() { p.Row(b) })
	mustPanicPool(t, func() { p.Free(b) })
	mustPanicPool(t, func() { p.FreeSnapshot(sn) })
	p.Free(a)
	p.Free(c)
	if p.Used() != 0 {
		t.Fatalf("Used after freeing everything %d", p.Used())
	}
	if _, err := NewStatePool(nil, small, 1<<20); err == nil {
		t.Error("a pool without memory")
	}
	if _, err := NewStatePool(strict.New(), []LayerShape{{Heads: 1}}, 1<<20); err == nil {
		t.Error("a bad layer shape")
	}
}

func TestPoolConcurrent(t *testing.T) {
	p, _ := NewStatePool(strict.New(), []LayerShape{{Heads: 1, DK: 4, DV: 4, ConvK: 4, ConvChannels: 8}}, 8*4*(16+24))
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				s, err := p.Alloc()
				if err != nil {
					if !errors.Is(err, ErrExhausted) {
						t.Error(err)
					}
					continue
				}
				sn, err := p.NewSnapshot()
				if err == nil {
					p.Snapshot(sn, s)
					p.FreeSnapshot(sn)
				}
				p.Free(s)
			}
		}()
	}
	wg.Wait()
	if p.Used() != 0 {
		t.Fatalf("Used %d after all frees", p.Used())
	}
}

// TestDevicePool checks a device pool on the strict backend: zeroed rows,
// Copy, Snapshot, Restore and Reset as row copies, growth keeping every
// row, and the budget.
func TestDevicePool(t *testing.T) {
	dev := strict.New()
	layers := []LayerShape{{Heads: 2, DK: 3, DV: 4, ConvK: 4, ConvChannels: 5}, {Heads: 1, DK: 2, DV: 2, ConvK: 1, ConvChannels: 3}}
	per := int64(4 * (2*3*4 + 3*5 + 1*2*2))
	p, err := NewStatePool(dev, layers, 7*per)
	if err != nil {
		t.Fatal(err)
	}
	if p.BytesPerSeq() != per || p.Memory() != kernels.Memory(dev) {
		t.Fatalf("BytesPerSeq %d, want %d", p.BytesPerSeq(), per)
	}
	// rows are s's rows of every state tensor.
	rows := func(s *Slot) []kernels.Tensor {
		var out []kernels.Tensor
		for l := range p.Layers() {
			st, conv := p.Tensors(l)
			for _, x := range []kernels.Tensor{st, conv} {
				if x.Valid() {
					out = append(out, x.Slice(p.Row(s), p.Row(s)+1))
				}
			}
		}
		return out
	}
	fill := func(s *Slot, v float32) {
		for _, r := range rows(s) {
			vals := make([]float32, r.Elems())
			for i := range vals {
				vals[i] = v
			}
			dev.WriteF32(r, vals)
		}
	}
	read := func(s *Slot) []float32 {
		var out []float32
		for _, r := range rows(s) {
			vals := make([]float32, r.Elems())
			dev.ReadF32(vals, r)
			out = append(out, vals...)
		}
		return out
	}
	all := func(s *Slot, v float32) bool {
		for _, x := range read(s) {
			if x != v {
				return false
			}
		}
		return true
	}
	var slots []*Slot
	for i := range 5 { // grows past the first allocation (4 rows)
		s, err := p.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		if !all(s, 0) {
			t.Fatalf("slot %d not zeroed", i)
		}
		fill(s, float32(i+1))
		slots = append(slots, s)
	}
	for i, s := range slots {
		if !all(s, float32(i+1)) {
			t.Fatalf("slot %d lost its state when the pool grew", i)
		}
	}
	sn, err := p.NewSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	p.Snapshot(sn, slots[1])
	p.Copy(slots[0], slots[2])
	p.Reset(slots[2])
	p.Restore(slots[3], sn)
	if !all(slots[0], 3) || !all(slots[2], 0) || !all(slots[3], 2) || !all(slots[1], 2) {
		t.Fatal("Copy, Reset, Snapshot or Restore")
	}
	if _, err := p.Alloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewSnapshot(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("8th slot: %v", err)
	}
	p.Free(slots[4])
	s, err := p.Alloc() // reuses slot 4's row: zeroed again
	if err != nil || !all(s, 0) {
		t.Fatalf("reused row not zeroed (%v)", err)
	}
	p.FreeSnapshot(sn)
	mustPanicPool(t, func() { p.Restore(s, sn) }) // a freed snapshot

	// A record snapshot: its row as the op writes it (here by hand), and
	// Adopt hands its state to a slot without a copy.
	p.Free(s)
	rec, err := p.NewRecord()
	if err != nil {
		t.Fatal(err)
	}
	rs := &Slot{store: store{row: p.SnapshotRow(rec), live: true}} // the record's rows, viewed as a slot
	fill(rs, 9)
	before := p.Row(slots[0])
	p.Adopt(slots[0], rec)
	if !all(slots[0], 9) || p.Row(slots[0]) == before || p.SnapshotRow(rec) != before {
		t.Fatal("Adopt: the slot does not hold the record's state, or the rows were not swapped")
	}
	p.FreeSnapshot(rec) // frees the slot's former row
	if _, err := p.Alloc(); err != nil {
		t.Fatal(err)
	}
	mustPanicPool(t, func() { p.Adopt(slots[0], rec) }) // a freed snapshot
}

func mustPanicPool(t *testing.T, fn func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	fn()
}

// TestDevicePoolRelease: growing frees the smaller tensors (the backend
// holds only the current rows), Release frees the rest, and a released
// pool's tensors panic on use.
func TestDevicePoolRelease(t *testing.T) {
	dev := strict.New()
	layers := []LayerShape{{Heads: 2, DK: 3, DV: 4, ConvK: 4, ConvChannels: 5}, {Heads: 1, DK: 2, DV: 2, ConvK: 1, ConvChannels: 3}}
	p, err := NewStatePool(dev, layers, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 9 { // rows 4, 8, then 16
		if _, err := p.Alloc(); err != nil {
			t.Fatalf("slot %d: %v", i, err)
		}
		s, _ := p.Tensors(0)
		if got, want := dev.MemoryUse().Tensors, int64(s.Rows)*p.BytesPerSeq(); got != want {
			t.Fatalf("after slot %d: Tensors = %d, want %d (%d rows, the old tensors freed)", i, got, want, s.Rows)
		}
	}
	s, _ := p.Tensors(0)
	p.Release()
	if got := dev.MemoryUse().Tensors; got != 0 {
		t.Errorf("Tensors = %d after Release, want 0", got)
	}
	defer func() {
		if err, _ := recover().(error); !errors.Is(err, kernels.ErrFreed) {
			t.Errorf("a released state tensor read: panic %v, want kernels.ErrFreed", err)
		}
	}()
	dev.ReadF32(make([]float32, s.Elems()), s)
}
