package kvcache

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// testLayout has a GQA-like layer, an MLA-like layer (no V) and a layer that
// caches nothing.
var testLayout = Layout{{K: 4, V: 4}, {K: 3, V: 0}, {K: 0, V: 0}}

func newTestCache(t *testing.T, blocks, bs int) *Cache {
	t.Helper()
	c, err := New(testLayout, Options{BlockSize: bs, Budget: int64(blocks*bs) * testLayout.BytesPerToken(), Memory: strict.New()})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().BlocksTotal; got != blocks {
		t.Fatalf("BlocksTotal = %d, want %d", got, blocks)
	}
	return c
}

// checkRefs recomputes every block's reference count from the live
// sequences and compares it with the cache's accounting.
func checkRefs(t *testing.T, c *Cache, live []*Seq) {
	t.Helper()
	want := make([]int32, c.numBlocks)
	for _, s := range live {
		if len(s.blocks) != c.blocksFor(s.n) {
			t.Fatalf("seq of %d tokens has %d blocks", s.n, len(s.blocks))
		}
		for _, b := range s.blocks {
			want[b]++
		}
	}
	inFree := make([]bool, c.numBlocks)
	for _, b := range c.free {
		if inFree[b] {
			t.Fatalf("block %d twice in the free list", b)
		}
		inFree[b] = true
	}
	used := 0
	for b := range want {
		if want[b] != c.refs[b] {
			t.Fatalf("block %d: refs %d, want %d", b, c.refs[b], want[b])
		}
		if (want[b] == 0) != inFree[b] {
			t.Fatalf("block %d: refs %d but free=%v", b, want[b], inFree[b])
		}
		if want[b] > 0 {
			used++
		}
	}
	st := c.Stats()
	if st.BlocksUsed != used || st.BytesUsed != int64(used)*c.blockBytes || st.Seqs != len(live) {
		t.Fatalf("stats %+v, want %d blocks used, %d seqs", st, used, len(live))
	}
}

func TestLayoutBytes(t *testing.T) {
	if got, want := testLayout.BytesPerToken(), int64((4+4+3)*4); got != want {
		t.Fatalf("BytesPerToken = %d, want %d", got, want)
	}
	// BF16 halves K and V, except a V kept in F32.
	bf := Layout{{K: 4, V: 6, DType: kernels.BF16}, {K: 4, V: 6, DType: kernels.BF16, VFloat32: true}}
	if got, want := bf.BytesPerToken(), int64((4+6)*2+4*2+6*4); got != want {
		t.Fatalf("BF16 BytesPerToken = %d, want %d", got, want)
	}
	c, err := New(bf, Options{BlockSize: 2, Budget: 4 * bf.BytesPerToken(), Memory: strict.New()})
	if err != nil {
		t.Fatal(err)
	}
	for l, want := range []kernels.DType{kernels.BF16, kernels.F32} {
		if k, v := c.Layer(l); k.DType != kernels.BF16 || v.DType != want || v.Cols != 6 {
			t.Errorf("layer %d: K %v, V %v, want V %v", l, k, v, want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	mem := strict.New()
	if _, err := New(testLayout, Options{Budget: 10, Memory: mem}); err == nil {
		t.Error("budget below one block: want error")
	}
	if _, err := New(Layout{{K: -1}}, Options{Budget: 1 << 20, Memory: mem}); err == nil {
		t.Error("negative width: want error")
	}
	if _, err := New(testLayout, Options{Budget: 1 << 20}); err == nil {
		t.Error("no backend memory: want error")
	}
	c, err := New(Layout{{}, {}}, Options{Memory: mem})
	if err != nil {
		t.Fatalf("zero-width layout: %v", err)
	}
	s := c.NewSeq()
	if err := c.Reserve(s, 100); err != nil {
		t.Fatal(err)
	}
	c.Free(s)
}

func TestReserveTruncateFree(t *testing.T) {
	c := newTestCache(t, 4, 4)
	s := c.NewSeq()
	if err := c.Reserve(s, 5); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 5 || len(s.Blocks()) != 2 {
		t.Fatalf("len %d blocks %d", s.Len(), len(s.Blocks()))
	}
	if err := c.Reserve(s, 3); err != nil || s.Len() != 5 {
		t.Fatalf("shrinking Reserve: err %v len %d", err, s.Len())
	}
	// 16 tokens fit exactly, 17 do not.
	if err := c.Reserve(s, 16); err != nil {
		t.Fatal(err)
	}
	err := c.Reserve(s, 17)
	var full *FullError
	if !errors.Is(err, ErrCacheFull) || !errors.As(err, &full) || full.Need != 1 || full.Free != 0 {
		t.Fatalf("Reserve past capacity: %v", err)
	}
	if s.Len() != 16 {
		t.Fatalf("failed Reserve changed the length to %d", s.Len())
	}
	c.Truncate(s, 9)
	if s.Len() != 9 || c.BlocksFree() != 1 {
		t.Fatalf("after Truncate(9): len %d free %d", s.Len(), c.BlocksFree())
	}
	checkRefs(t, c, []*Seq{s})
	c.Free(s)
	c.Free(s)
	checkRefs(t, c, nil)
	if c.BlocksFree() != 4 {
		t.Fatalf("free %d after Free", c.BlocksFree())
	}
	if err := c.Reserve(s, 1); err == nil {
		t.Fatal("Reserve on a freed sequence: want error")
	}
}

func TestForkCopyOnWrite(t *testing.T) {
	c := newTestCache(t, 8, 4)
	a := c.NewSeq()
	if err := c.Reserve(a, 6); err != nil {
		t.Fatal(err)
	}
	for p := range 6 {
		put(c, 0, a, p, false, 0, float32(p))
		put(c, 0, a, p, true, 0, float32(-p))
		put(c, 1, a, p, false, 2, float32(10+p))
	}
	b, err := c.Fork(a, 6)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stats().BlocksUsed != 2 {
		t.Fatalf("fork copied blocks: used %d", c.Stats().BlocksUsed)
	}
	if got := c.BlocksNeeded(b, 7); got != 1 {
		t.Fatalf("BlocksNeeded for a CoW = %d, want 1", got)
	}
	// b writes position 6: the shared partial block must be copied first.
	if err := c.Reserve(b, 7); err != nil {
		t.Fatal(err)
	}
	put(c, 0, b, 6, false, 0, 100)
	if err := c.Reserve(a, 7); err != nil {
		t.Fatal(err)
	}
	put(c, 0, a, 6, false, 0, 200)
	if a.Blocks()[0] != b.Blocks()[0] || a.Blocks()[1] == b.Blocks()[1] {
		t.Fatalf("tables a %v b %v: want the full block shared, the tail private", a.Blocks(), b.Blocks())
	}
	for p := range 6 {
		if at(c, 0, b, p, false, 0) != float32(p) || at(c, 0, b, p, true, 0) != float32(-p) || at(c, 1, b, p, false, 2) != float32(10+p) {
			t.Fatalf("fork lost token %d", p)
		}
	}
	if at(c, 0, a, 6, false, 0) != 200 || at(c, 0, b, 6, false, 0) != 100 {
		t.Fatal("writes after the fork leaked between sequences")
	}
	checkRefs(t, c, []*Seq{a, b})
	if _, err := c.Fork(a, 8); err == nil {
		t.Fatal("fork past the end: want error")
	}
	c.Free(a)
	checkRefs(t, c, []*Seq{b})
	c.Free(b)
	checkRefs(t, c, nil)
}

// TestStress runs random reserve/write/fork/truncate/free operations against
// a shadow copy of every sequence's contents, checking the contents and the
// reference counts after each step and that every block returns at the end.
func TestStress(t *testing.T) {
	const blocks, bs = 40, 4
	c := newTestCache(t, blocks, bs)
	rng := rand.New(rand.NewPCG(1, 2))
	type entry struct {
		s      *Seq
		shadow []float32 // value written at each position (layer 0 K[0])
	}
	var live []*entry
	seqs := func() []*Seq {
		out := make([]*Seq, len(live))
		for i, e := range live {
			out[i] = e.s
		}
		return out
	}
	stamp := float32(0)
	fulls := 0
	for step := range 5000 {
		switch op := rng.IntN(10); {
		case op < 2 || len(live) == 0:
			live = append(live, &entry{s: c.NewSeq()})
		case op < 6:
			e := live[rng.IntN(len(live))]
			n := e.s.Len() + 1 + rng.IntN(9)
			need, free := c.BlocksNeeded(e.s, n), c.BlocksFree()
			err := c.Reserve(e.s, n)
			if (err != nil) != (need > free) {
				t.Fatalf("step %d: need %d free %d: Reserve error %v", step, need, free, err)
			}
			if err != nil {
				if !errors.Is(err, ErrCacheFull) {
					t.Fatal(err)
				}
				fulls++
				break
			}
			for p := len(e.shadow); p < n; p++ {
				stamp++
				put(c, 0, e.s, p, false, 0, stamp)
				put(c, 0, e.s, p, true, 3, -stamp)
				put(c, 1, e.s, p, false, 1, stamp/2)
				e.shadow = append(e.shadow, stamp)
			}
		case op < 7:
			e := live[rng.IntN(len(live))]
			n := rng.IntN(e.s.Len() + 1)
			f, err := c.Fork(e.s, n)
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, &entry{s: f, shadow: append([]float32(nil), e.shadow[:n]...)})
		case op < 9:
			e := live[rng.IntN(len(live))]
			n := rng.IntN(e.s.Len() + 1)
			c.Truncate(e.s, n)
			e.shadow = e.shadow[:n]
		default:
			i := rng.IntN(len(live))
			c.Free(live[i].s)
			live = append(live[:i], live[i+1:]...)
		}
		checkRefs(t, c, seqs())
		for _, e := range live {
			if e.s.Len() != len(e.shadow) {
				t.Fatalf("step %d: len %d, shadow %d", step, e.s.Len(), len(e.shadow))
			}
			for p, want := range e.shadow {
				if at(c, 0, e.s, p, false, 0) != want || at(c, 0, e.s, p, true, 3) != -want || at(c, 1, e.s, p, false, 1) != want/2 {
					t.Fatalf("step %d: position %d corrupted", step, p)
				}
			}
		}
	}
	if fulls == 0 {
		t.Error("stress never filled the cache; make it smaller")
	}
	for _, e := range live {
		c.Free(e.s)
	}
	checkRefs(t, c, nil)
	if c.BlocksFree() != blocks {
		t.Fatalf("%d of %d blocks returned", c.BlocksFree(), blocks)
	}
}

// row is the storage row of layer l's K (or V) at position p of s.
func row(c *Cache, l int, s *Seq, p int, v bool) kernels.Tensor {
	k, vt := c.Layer(l)
	if v {
		k = vt
	}
	slot := int(c.Slot(s, p))
	return k.Slice(slot, slot+1)
}

// at reads value i of layer l's K (or V) at position p of s.
func at(c *Cache, l int, s *Seq, p int, v bool, i int) float32 {
	r := row(c, l, s, p, v)
	vals := make([]float32, r.Cols)
	c.Memory().ReadF32(vals, r)
	return vals[i]
}

// put sets value i of layer l's K (or V) at position p of s to x.
func put(c *Cache, l int, s *Seq, p int, v bool, i int, x float32) {
	r := row(c, l, s, p, v)
	vals := make([]float32, r.Cols)
	c.Memory().ReadF32(vals, r)
	vals[i] = x
	c.Memory().WriteF32(r, vals)
}

// TestRelease: Release frees every layer tensor (the backend's tensors
// back at the baseline), a released layer panics on use, and a New that
// fails half-way frees what it allocated.
func TestRelease(t *testing.T) {
	d := strict.New()
	layout := Layout{{K: 4, V: 4, DType: kernels.BF16}, {K: 3}, {K: 2, V: 2, VFloat32: true}}
	c, err := New(layout, Options{BlockSize: 2, Budget: 4 * layout.BytesPerToken(), Memory: d})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.MemoryUse().Tensors, 4*layout.BytesPerToken(); got != want {
		t.Fatalf("Tensors = %d, want %d (the budget)", got, want)
	}
	c.Release()
	if got := d.MemoryUse().Tensors; got != 0 {
		t.Errorf("Tensors = %d after Release, want 0", got)
	}
	func() {
		defer func() {
			if err, _ := recover().(error); !errors.Is(err, kernels.ErrFreed) {
				t.Errorf("a released layer read: panic %v, want kernels.ErrFreed", err)
			}
		}()
		k, _ := c.Layer(2)
		d.ReadF32(make([]float32, k.Elems()), k)
	}()

	fail := &failingMemory{Memory: d, left: 3}
	if _, err := New(layout, Options{BlockSize: 2, Budget: 4 * layout.BytesPerToken(), Memory: fail}); err == nil {
		t.Fatal("New with an Alloc that fails: no error")
	}
	if got := d.MemoryUse().Tensors; got != 0 {
		t.Errorf("Tensors = %d after a failed New, want 0 (what it allocated freed)", got)
	}
}

// failingMemory fails every Alloc after the first left.
type failingMemory struct {
	kernels.Memory
	left int
}

func (m *failingMemory) Alloc(dt kernels.DType, rows, cols int) (kernels.Tensor, error) {
	if m.left == 0 {
		return kernels.Tensor{}, errors.New("out of memory")
	}
	m.left--
	return m.Memory.Alloc(dt, rows, cols)
}
