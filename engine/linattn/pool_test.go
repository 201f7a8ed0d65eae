package linattn

import (
	"errors"
	"sync"
	"testing"
)

func TestPoolAccounting(t *testing.T) {
	// Qwen3-Next-80B-A3B: 36 GDN layers, S 32×128×128, conv 3×8192 (fp32).
	qwen := LayerShape{Heads: 32, DK: 128, DV: 128, ConvK: 4, ConvChannels: 8192}
	layers := make([]LayerShape, 36)
	for i := range layers {
		layers[i] = qwen
	}
	p, err := NewStatePool(layers, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.BytesPerSeq(), int64(36*(2<<20+3*8192*4)); got != want {
		t.Errorf("Qwen3-Next BytesPerSeq %d, want %d", got, want)
	}

	small := []LayerShape{{Heads: 2, DK: 3, DV: 4, ConvK: 4, ConvChannels: 5}, {Heads: 1, DK: 2, DV: 2, ConvK: 2, ConvChannels: 3}}
	per := int64(4 * (2*3*4 + 3*5 + 1*2*2 + 1*3))
	p, err = NewStatePool(small, 3*per+per/2)
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

	// Views have the documented sizes and do not overlap.
	if len(p.S(a, 0)) != 24 || len(p.Conv(a, 0)) != 15 || len(p.S(a, 1)) != 4 || len(p.Conv(a, 1)) != 3 {
		t.Fatal("view sizes")
	}
	fillSlot := func(s *Slot, v float32) {
		for l := 0; l < p.Layers(); l++ {
			for i := range p.S(s, l) {
				p.S(s, l)[i] = v + float32(l*100+i)
			}
			for i := range p.Conv(s, l) {
				p.Conv(s, l)[i] = -v - float32(l*100+i)
			}
		}
	}
	equal := func(x, y *Slot) bool {
		for l := 0; l < p.Layers(); l++ {
			for i, e := range p.S(x, l) {
				if p.S(y, l)[i] != e {
					return false
				}
			}
			for i, e := range p.Conv(x, l) {
				if p.Conv(y, l)[i] != e {
					return false
				}
			}
		}
		return true
	}
	fillSlot(a, 1)
	if p.Conv(a, 0)[0] != -1 || p.S(a, 1)[0] != 101 || p.Conv(a, 1)[2] != -103 {
		t.Fatal("layer views overlap")
	}

	// Snapshot / Restore round trip.
	p.Snapshot(sn, a)
	saved := append([]float32(nil), p.SnapshotS(sn, 1)...)
	fillSlot(a, 7)
	p.Restore(a, sn)
	fillSlot(b, 1)
	if !equal(a, b) {
		t.Fatal("Restore did not bring back the snapshotted state")
	}
	if p.SnapshotS(sn, 1)[0] != saved[0] || len(p.SnapshotConv(sn, 1)) != 3 {
		t.Fatal("snapshot views")
	}

	// Copy.
	fillSlot(b, 5)
	p.Copy(a, b)
	if !equal(a, b) {
		t.Fatal("Copy")
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
	for l := 0; l < p.Layers(); l++ {
		for _, e := range append(p.S(c, l), p.Conv(c, l)...) {
			if e != 0 {
				t.Fatal("Alloc returned a non-zero slot")
			}
		}
	}
	p.Reset(a)
	if p.S(a, 0)[3] != 0 {
		t.Fatal("Reset")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("use after Free did not panic")
			}
		}()
		p.S(b, 0)
	}()
	p.Trim()
}

func TestPoolConcurrent(t *testing.T) {
	p, _ := NewStatePool([]LayerShape{{Heads: 1, DK: 4, DV: 4, ConvK: 4, ConvChannels: 8}}, 8*4*(16+24))
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
				p.S(s, 0)[0] = float32(i)
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
