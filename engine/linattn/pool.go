package linattn

import (
	"errors"
	"fmt"
	"sync"
)

// LayerShape is the per-sequence state of one linear-attention layer.
type LayerShape struct {
	Heads, DK, DV int // delta-rule state S: [Heads, DK, DV] float32
	ConvK         int // conv kernel width K; conv state: [K−1, ConvChannels] float32
	ConvChannels  int // conv_dim (GDN: 2·Hk·dk + Hv·dv; KDA: 3·H·dk)
}

// SLen is the number of float32s of S.
func (l LayerShape) SLen() int { return l.Heads * l.DK * l.DV }

// ConvLen is the number of float32s of the conv state.
func (l LayerShape) ConvLen() int { return (l.ConvK - 1) * l.ConvChannels }

// Bytes is the layer's state size in bytes.
func (l LayerShape) Bytes() int64 { return 4 * int64(l.SLen()+l.ConvLen()) }

// ErrExhausted is matched (errors.Is) by the error of an allocation that
// does not fit the pool's budget.
var ErrExhausted = errors.New("linattn: state pool exhausted")

// ExhaustedError reports a failed allocation: Need more bytes were asked
// for while Used of Budget bytes were taken.
type ExhaustedError struct{ Need, Used, Budget int64 }

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("linattn: state pool exhausted: need %d bytes, %d of %d in use", e.Need, e.Used, e.Budget)
}

// Unwrap makes errors.Is(err, ErrExhausted) hold.
func (e *ExhaustedError) Unwrap() error { return ErrExhausted }

// StatePool owns the recurrent state of the linear-attention layers of
// every live sequence, one fixed-size slot per sequence, within a byte
// budget. A slot's buffer is, for each layer l in order,
//
//	S_l    [Heads_l, DK_l, DV_l]       float32
//	conv_l [ConvK_l−1, ConvChannels_l] float32
//
// contiguously, BytesPerSeq() bytes in all. Snapshots have the same layout
// and count against the same budget. Memory is allocated on first use and
// kept for reuse after Free (never more than the budget at any time).
//
// Alloc, Free, NewSnapshot and FreeSnapshot may be called concurrently.
// The data of one slot must not be used by two goroutines at once.
type StatePool struct {
	layers  []LayerShape
	offS    []int // offset of S_l in a slot's buffer
	offConv []int // offset of conv_l
	per     int   // float32s per slot
	budget  int64

	mu     sync.Mutex
	used   int64       // bytes of live slots and snapshots
	spare  [][]float32 // freed buffers kept for reuse
	freeID []int       // freed slot ids, reused first
	nextID int
}

// Slot is one sequence's state in a StatePool. Its ID is a small integer,
// unique among live slots, reused after Free.
type Slot struct {
	id  int
	buf []float32 // nil once freed
}

// ID returns the slot's index in [0, peak number of live slots).
func (s *Slot) ID() int { return s.id }

// Snapshot is a copy of one slot's state (speculative rollback, turn
// checkpoints), laid out as a slot.
type Snapshot struct{ buf []float32 }

// NewStatePool makes a pool for the given linear layers (in model order,
// linear layers only) with room for budgetBytes of slots and snapshots.
func NewStatePool(layers []LayerShape, budgetBytes int64) (*StatePool, error) {
	p := &StatePool{layers: append([]LayerShape(nil), layers...), budget: budgetBytes}
	for i, l := range layers {
		if l.Heads <= 0 || l.DK <= 0 || l.DV <= 0 || l.ConvK <= 0 || l.ConvChannels < 0 {
			return nil, fmt.Errorf("linattn: bad LayerShape %d: %+v", i, l)
		}
		p.offS = append(p.offS, p.per)
		p.per += l.SLen()
		p.offConv = append(p.offConv, p.per)
		p.per += l.ConvLen()
	}
	if budgetBytes < 0 {
		return nil, fmt.Errorf("linattn: negative budget %d", budgetBytes)
	}
	return p, nil
}

// Layers returns the number of layers of a slot.
func (p *StatePool) Layers() int { return len(p.layers) }

// BytesPerSeq is the exact size of one slot (or snapshot) in bytes.
func (p *StatePool) BytesPerSeq() int64 { return 4 * int64(p.per) }

// Budget is the pool's budget in bytes.
func (p *StatePool) Budget() int64 { return p.budget }

// Used is the number of bytes held by live slots and snapshots.
func (p *StatePool) Used() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Available is how many more slots (or snapshots) fit the budget now.
func (p *StatePool) Available() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.per == 0 {
		return int(^uint(0) >> 1)
	}
	return int((p.budget - p.used) / p.BytesPerSeq())
}

// take reserves one buffer's worth of budget and returns a zeroed buffer.
func (p *StatePool) take() ([]float32, error) {
	p.mu.Lock()
	need := p.BytesPerSeq()
	if p.used+need > p.budget {
		err := &ExhaustedError{Need: need, Used: p.used, Budget: p.budget}
		p.mu.Unlock()
		return nil, err
	}
	p.used += need
	var buf []float32
	if n := len(p.spare); n > 0 {
		buf, p.spare = p.spare[n-1], p.spare[:n-1]
	}
	p.mu.Unlock()
	if buf == nil {
		return make([]float32, p.per), nil
	}
	clear(buf)
	return buf, nil
}

func (p *StatePool) give(buf []float32) {
	p.mu.Lock()
	p.used -= p.BytesPerSeq()
	p.spare = append(p.spare, buf)
	p.mu.Unlock()
}

// Alloc returns a new slot with all state zeroed (a fresh sequence), or an
// *ExhaustedError (errors.Is(err, ErrExhausted)) if it does not fit.
func (p *StatePool) Alloc() (*Slot, error) {
	buf, err := p.take()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	id := p.nextID
	if n := len(p.freeID); n > 0 {
		id, p.freeID = p.freeID[n-1], p.freeID[:n-1]
	} else {
		p.nextID++
	}
	p.mu.Unlock()
	return &Slot{id: id, buf: buf}, nil
}

// Free returns a slot's memory to the pool. Using the slot afterwards, or
// freeing it twice, panics.
func (p *StatePool) Free(s *Slot) {
	buf := p.buf(s)
	s.buf = nil
	p.give(buf)
	p.mu.Lock()
	p.freeID = append(p.freeID, s.id)
	p.mu.Unlock()
}

// Reset zeroes a slot's state (the sequence starts over).
func (p *StatePool) Reset(s *Slot) { clear(p.buf(s)) }

func (p *StatePool) buf(s *Slot) []float32 {
	if s == nil || s.buf == nil {
		panic("linattn: use of a freed or nil Slot")
	}
	return s.buf
}

// S returns layer l's delta-rule state in slot s, [Heads, DK, DV].
func (p *StatePool) S(s *Slot, l int) []float32 { return p.sOf(p.buf(s), l) }

// Conv returns layer l's conv state in slot s, [ConvK−1, ConvChannels].
func (p *StatePool) Conv(s *Slot, l int) []float32 { return p.convOf(p.buf(s), l) }

func (p *StatePool) sOf(buf []float32, l int) []float32 {
	o := p.offS[l]
	return buf[o : o+p.layers[l].SLen() : o+p.layers[l].SLen()]
}

func (p *StatePool) convOf(buf []float32, l int) []float32 {
	o := p.offConv[l]
	return buf[o : o+p.layers[l].ConvLen() : o+p.layers[l].ConvLen()]
}

// Copy copies every layer's state of src into dst (conversation reuse:
// fork a sequence from a checkpointed turn boundary).
func (p *StatePool) Copy(dst, src *Slot) { copy(p.buf(dst), p.buf(src)) }

// NewSnapshot allocates a (zeroed) snapshot buffer from the budget.
func (p *StatePool) NewSnapshot() (*Snapshot, error) {
	buf, err := p.take()
	if err != nil {
		return nil, err
	}
	return &Snapshot{buf: buf}, nil
}

// FreeSnapshot returns a snapshot's memory to the pool.
func (p *StatePool) FreeSnapshot(sn *Snapshot) {
	buf := p.snapBuf(sn)
	sn.buf = nil
	p.give(buf)
}

func (p *StatePool) snapBuf(sn *Snapshot) []float32 {
	if sn == nil || sn.buf == nil {
		panic("linattn: use of a freed or nil Snapshot")
	}
	return sn.buf
}

// Snapshot copies slot src's state into dst.
func (p *StatePool) Snapshot(dst *Snapshot, src *Slot) { copy(p.snapBuf(dst), p.buf(src)) }

// Restore copies snapshot src back into slot dst.
func (p *StatePool) Restore(dst *Slot, src *Snapshot) { copy(p.buf(dst), p.snapBuf(src)) }

// SnapshotS returns layer l's S inside a snapshot, [Heads, DK, DV]: pass it
// as Seq.StatesAfter[t] to record the state after token t directly.
func (p *StatePool) SnapshotS(sn *Snapshot, l int) []float32 { return p.sOf(p.snapBuf(sn), l) }

// SnapshotConv returns layer l's conv state inside a snapshot,
// [ConvK−1, ConvChannels] (a Conv.SaveStates destination).
func (p *StatePool) SnapshotConv(sn *Snapshot, l int) []float32 { return p.convOf(p.snapBuf(sn), l) }

// Trim drops the buffers kept for reuse, letting the garbage collector
// return their memory.
func (p *StatePool) Trim() {
	p.mu.Lock()
	p.spare = nil
	p.mu.Unlock()
}
