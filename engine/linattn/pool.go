package linattn

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
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
// budget, in backend tensors: per layer l,
//
//	S_l    (rows, Heads_l·DK_l·DV_l)       F32
//	conv_l (rows, (ConvK_l−1)·ConvChannels_l) F32
//
// one row per slot or snapshot, which the op set's linear-attention ops
// index by Row. BytesPerSeq() bytes make one slot; snapshots have the same
// layout and count against the same budget. Copy, Snapshot, Restore and
// Reset are backend copies of rows; nothing is ever on the host.
//
// Alloc, Free, NewSnapshot and FreeSnapshot may be called concurrently.
// The data of one slot must not be used by two goroutines at once.
type StatePool struct {
	layers []LayerShape
	per    int // float32s per slot
	budget int64

	mu     sync.Mutex
	used   int64 // bytes of live slots and snapshots
	freeID []int // freed slot ids, reused first
	nextID int

	dev devStore
}

// devStore is a pool's storage: per layer, S and the conv state as
// (rows, SLen) and (rows, ConvLen) F32 tensors. Row 0 stays zero (the
// source of Reset); slots and snapshots take rows 1, 2, … Rows are
// allocated as needed, doubling up to the budget's worth.
type devStore struct {
	mem      kernels.Memory
	s, conv  []kernels.Tensor // (layers) the current tensors
	rows     int              // rows allocated
	maxRows  int              // 1 + the budget's worth of slots
	freeRows []int
	nextRow  int
}

// Slot is one sequence's state in a StatePool. Its ID is a small integer,
// unique among live slots, reused after Free.
type Slot struct {
	id int
	store
}

// store is where a slot's or snapshot's state lives.
type store struct {
	row  int // the row in the pool's tensors
	live bool
}

// check panics unless st is live; what names it in the message.
func (st *store) check(what string) {
	if !st.live {
		panic("linattn: use of a freed " + what)
	}
}

// ID returns the slot's index in [0, peak number of live slots).
func (s *Slot) ID() int { return s.id }

// Snapshot is a copy of one slot's state (speculative rollback, turn
// checkpoints), laid out as a slot.
type Snapshot struct{ store }

// NewStatePool makes a pool in mem for the given linear layers (in model
// order, linear layers only) with room for budgetBytes of slots and
// snapshots.
func NewStatePool(mem kernels.Memory, layers []LayerShape, budgetBytes int64) (*StatePool, error) {
	if mem == nil {
		return nil, errors.New("linattn: a state pool needs backend memory")
	}
	p := &StatePool{layers: append([]LayerShape(nil), layers...), budget: budgetBytes}
	for i, l := range layers {
		if l.Heads <= 0 || l.DK <= 0 || l.DV <= 0 || l.ConvK <= 0 || l.ConvChannels < 0 {
			return nil, fmt.Errorf("linattn: bad LayerShape %d: %+v", i, l)
		}
		p.per += l.SLen() + l.ConvLen()
	}
	if budgetBytes < 0 {
		return nil, fmt.Errorf("linattn: negative budget %d", budgetBytes)
	}
	p.dev = devStore{mem: mem, nextRow: 1, maxRows: 1}
	if p.per > 0 {
		p.dev.maxRows += int(budgetBytes / p.BytesPerSeq())
	}
	return p, nil
}

// Memory is the backend memory the pool's tensors live in.
func (p *StatePool) Memory() kernels.Memory { return p.dev.mem }

// Tensors returns the state tensors of layer l: S (rows, Heads·DK·DV) and
// the conv state (rows, (ConvK−1)·ConvChannels; invalid when ConvK is 1),
// F32, a slot's state in its Row. They are reallocated (larger) when a
// slot or snapshot needs a row past them, so fetch them for every step.
func (p *StatePool) Tensors(l int) (s, conv kernels.Tensor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dev.rows == 0 {
		return kernels.Tensor{}, kernels.Tensor{}
	}
	return p.dev.s[l], p.dev.conv[l]
}

// Row is slot s's row in the pool's tensors.
func (p *StatePool) Row(s *Slot) int {
	p.check(s)
	return s.row
}

// SnapshotRow is snapshot sn's row in the pool's tensors (an op writes it
// through kernels.Recurrent.Record).
func (p *StatePool) SnapshotRow(sn *Snapshot) int {
	p.checkSnap(sn)
	return sn.row
}

// grow makes the tensors at least n rows long, copying what they held.
func (d *devStore) grow(layers []LayerShape, n int) error {
	if n <= d.rows {
		return nil
	}
	rows := min(max(n, 2*d.rows, 4), max(d.maxRows, n))
	s, conv := make([]kernels.Tensor, len(layers)), make([]kernels.Tensor, len(layers))
	for i, l := range layers {
		var err error
		s[i], err = d.mem.Alloc(kernels.F32, rows, l.SLen())
		if err == nil && l.ConvLen() > 0 {
			conv[i], err = d.mem.Alloc(kernels.F32, rows, l.ConvLen())
		}
		if err != nil {
			d.free(s, conv)
			return fmt.Errorf("linattn: state pool: %w", err)
		}
		if d.rows > 0 {
			d.mem.Copy(s[i].Slice(0, d.rows), d.s[i])
			if conv[i].Valid() {
				d.mem.Copy(conv[i].Slice(0, d.rows), d.conv[i])
			}
		}
	}
	d.free(d.s, d.conv)
	d.s, d.conv, d.rows = s, conv, rows
	return nil
}

// free releases the valid tensors of s and conv.
func (d *devStore) free(s, conv []kernels.Tensor) {
	for _, ts := range [][]kernels.Tensor{s, conv} {
		for _, t := range ts {
			if t.Valid() {
				d.mem.Free(t)
			}
		}
	}
}

// Release frees the pool's tensors in its backend memory at once, rather
// than when the backend closes. The pool and its slots must not be used
// afterwards, nor released twice: its owner calls it once, when done.
func (p *StatePool) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dev.free(p.dev.s, p.dev.conv)
}

// copyRow sets row dst of every tensor to row src.
func (d *devStore) copyRow(dst, src int) {
	for i := range d.s {
		d.mem.Copy(d.s[i].Slice(dst, dst+1), d.s[i].Slice(src, src+1))
		if d.conv[i].Valid() {
			d.mem.Copy(d.conv[i].Slice(dst, dst+1), d.conv[i].Slice(src, src+1))
		}
	}
}

// takeRow returns a row, zeroed when zero is set; p.mu is held.
func (p *StatePool) takeRow(zero bool) (int, error) {
	d := &p.dev
	row := d.nextRow
	if n := len(d.freeRows); n > 0 {
		row, d.freeRows = d.freeRows[n-1], d.freeRows[:n-1]
	} else {
		if err := d.grow(p.layers, row+1); err != nil {
			return 0, err
		}
		d.nextRow++
	}
	if zero {
		d.copyRow(row, 0)
	}
	return row, nil
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

// take reserves one slot's worth of budget and returns a zeroed row.
func (p *StatePool) take() (int, error) { return p.takeAs(true) }

// takeAs is take, the row zeroed only when zero is set.
func (p *StatePool) takeAs(zero bool) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	need := p.BytesPerSeq()
	if p.used+need > p.budget {
		return 0, &ExhaustedError{Need: need, Used: p.used, Budget: p.budget}
	}
	row, err := p.takeRow(zero)
	if err != nil {
		return 0, err
	}
	p.used += need
	return row, nil
}

func (p *StatePool) give(row int) {
	p.mu.Lock()
	p.used -= p.BytesPerSeq()
	p.dev.freeRows = append(p.dev.freeRows, row)
	p.mu.Unlock()
}

// Alloc returns a new slot with all state zeroed (a fresh sequence), or an
// *ExhaustedError (errors.Is(err, ErrExhausted)) if it does not fit.
func (p *StatePool) Alloc() (*Slot, error) {
	row, err := p.take()
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
	return &Slot{id: id, store: store{row: row, live: true}}, nil
}

// Free returns a slot's row to the pool. Using the slot afterwards, or
// freeing it twice, panics.
func (p *StatePool) Free(s *Slot) {
	p.check(s)
	s.live = false
	p.give(s.row)
	p.mu.Lock()
	p.freeID = append(p.freeID, s.id)
	p.mu.Unlock()
}

// Reset zeroes a slot's state (the sequence starts over).
func (p *StatePool) Reset(s *Slot) {
	p.check(s)
	p.copyRow(s.row, 0)
}

// copyRow copies row src over row dst on the backend.
func (p *StatePool) copyRow(dst, src int) {
	p.mu.Lock()
	p.dev.copyRow(dst, src)
	p.mu.Unlock()
}

func (p *StatePool) check(s *Slot) {
	if s == nil {
		panic("linattn: use of a nil Slot")
	}
	s.check("Slot")
}

func (p *StatePool) checkSnap(sn *Snapshot) {
	if sn == nil {
		panic("linattn: use of a nil Snapshot")
	}
	sn.check("Snapshot")
}

// Copy copies every layer's state of src into dst (conversation reuse:
// fork a sequence from a checkpointed turn boundary).
func (p *StatePool) Copy(dst, src *Slot) {
	p.check(dst)
	p.check(src)
	p.copyRow(dst.row, src.row)
}

// NewSnapshot allocates a (zeroed) snapshot from the budget.
func (p *StatePool) NewSnapshot() (*Snapshot, error) {
	row, err := p.take()
	if err != nil {
		return nil, err
	}
	return &Snapshot{store{row: row, live: true}}, nil
}

// NewRecord allocates a snapshot from the budget whose contents are
// undefined until written: the target of an op's
// kernels.Recurrent.Record, which writes the whole state (no device copy
// to zero it first).
func (p *StatePool) NewRecord() (*Snapshot, error) {
	row, err := p.takeAs(false)
	if err != nil {
		return nil, err
	}
	return &Snapshot{store{row: row, live: true}}, nil
}

// Adopt makes src's state slot dst's, without copying: the two swap
// rows, so src holds dst's former state afterwards (speculative
// rollback, whose snapshot is freed next).
func (p *StatePool) Adopt(dst *Slot, src *Snapshot) {
	p.check(dst)
	p.checkSnap(src)
	dst.row, src.row = src.row, dst.row
}

// FreeSnapshot returns a snapshot's row to the pool.
func (p *StatePool) FreeSnapshot(sn *Snapshot) {
	p.checkSnap(sn)
	sn.live = false
	p.give(sn.row)
}

// Snapshot copies slot src's state into dst.
func (p *StatePool) Snapshot(dst *Snapshot, src *Slot) {
	p.checkSnap(dst)
	p.check(src)
	p.copyRow(dst.row, src.row)
}

// Restore copies snapshot src back into slot dst.
func (p *StatePool) Restore(dst *Slot, src *Snapshot) {
	p.check(dst)
	p.checkSnap(src)
	p.copyRow(dst.row, src.row)
}
