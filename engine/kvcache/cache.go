package kvcache

import (
	"errors"
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
)

// DefaultBlockSize is the number of token slots per block when Options
// leaves BlockSize zero.
const DefaultBlockSize = 16

// ErrCacheFull is the error Reserve and Fork wrap when the pool has too few
// free blocks. Test with errors.Is; errors.As with *FullError gives counts.
var ErrCacheFull = errors.New("kvcache: cache full")

// FullError reports a failed allocation: Need blocks were required and only
// Free were available. It matches ErrCacheFull under errors.Is.
type FullError struct {
	Need, Free int
}

func (e *FullError) Error() string {
	return fmt.Sprintf("kvcache: cache full: need %d blocks, %d free", e.Need, e.Free)
}

// Is makes errors.Is(err, ErrCacheFull) true for a *FullError.
func (e *FullError) Is(target error) bool { return target == ErrCacheFull }

// LayerWidth is the number of values one token occupies in a layer's K and
// V arrays, and their storage type.
type LayerWidth struct {
	K int // e.g. nKV·headDim (GQA) or kv_lora+qk_rope (MLA latent)
	V int // e.g. nKV·headDim; 0 when the layer caches no V (MLA) or nothing

	// DType is kernels.F32 (the zero value) or kernels.BF16.
	DType kernels.DType

	// VFloat32 keeps V in F32 whatever DType: data whose rounding would
	// change discrete choices (glm5_next's k-pool indexer keys, from which
	// the attended pools are selected).
	VFloat32 bool
}

// vDType is the storage type of V.
func (w LayerWidth) vDType() kernels.DType {
	if w.VFloat32 {
		return kernels.F32
	}
	return w.DType
}

// Bytes is the cache memory one token takes in the layer.
func (w LayerWidth) Bytes() int64 {
	return int64(w.K)*int64(w.DType.Size()) + int64(w.V)*int64(w.vDType().Size())
}

// Layout is the cache shape a model needs: one LayerWidth per cached layer,
// indexed by the model's own layer numbering (an MTP layer may be appended).
type Layout []LayerWidth

// BytesPerToken is the cache memory one token takes across all layers.
func (l Layout) BytesPerToken() int64 {
	var n int64
	for _, w := range l {
		n += w.Bytes()
	}
	return n
}

// Options size a Cache.
type Options struct {
	BlockSize int   // token slots per block; 0 means DefaultBlockSize
	Budget    int64 // bytes of K/V storage; the pool holds Budget/blockBytes blocks

	// Memory allocates every layer's storage as backend tensors
	// (Cache.Layer): the model's device memory (model.NewCache). Required.
	Memory kernels.Memory
}

// zeroWidthBlocks is the pool size for a layout that stores nothing per token
// (for example a model made only of linear-attention layers): block tables
// still track lengths, but blocks cost no memory.
const zeroWidthBlocks = 1 << 16

// Cache is a paged K/V cache: a pool of blocks shared by many sequences.
type Cache struct {
	layout     Layout
	blockSize  int
	numBlocks  int
	blockBytes int64 // bytes one block takes across all layers
	budget     int64

	mem    kernels.Memory   // backend holding kt, vt
	kt, vt []kernels.Tensor // per layer: (numBlocks·blockSize, width); invalid for width 0

	refs []int32 // (numBlocks) reference count of each block; 0 = free
	free []int32 // stack of free block ids
	seqs int     // live sequences (created and not yet freed)
}

// New allocates a cache for layout within opts.Budget bytes in
// opts.Memory. It fails without memory, when the budget cannot hold a
// single block or a width is negative.
func New(layout Layout, opts Options) (*Cache, error) {
	if opts.Memory == nil {
		return nil, errors.New("kvcache: no backend memory (Options.Memory) to hold the cache")
	}
	bs := opts.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if bs < 0 {
		return nil, fmt.Errorf("kvcache: block size %d", bs)
	}
	for i, w := range layout {
		switch {
		case w.K < 0 || w.V < 0:
			return nil, fmt.Errorf("kvcache: layer %d has negative width (K %d, V %d)", i, w.K, w.V)
		case w.DType != kernels.F32 && w.DType != kernels.BF16:
			return nil, fmt.Errorf("kvcache: layer %d: unsupported dtype %v", i, w.DType)
		}
	}
	blockBytes := layout.BytesPerToken() * int64(bs)
	var n int
	if blockBytes == 0 {
		n = zeroWidthBlocks
	} else {
		nb := opts.Budget / blockBytes
		if nb < 1 {
			return nil, fmt.Errorf("kvcache: budget %d bytes is less than one block (%d bytes: %d tokens × %d bytes)",
				opts.Budget, blockBytes, bs, layout.BytesPerToken())
		}
		if nb > 1<<31-1 {
			nb = 1<<31 - 1
		}
		n = int(nb)
	}
	c := &Cache{
		layout:     append(Layout(nil), layout...),
		blockSize:  bs,
		numBlocks:  n,
		blockBytes: blockBytes,
		budget:     opts.Budget,
		refs:       make([]int32, n),
		free:       make([]int32, n),
	}
	if err := c.allocTensors(opts.Memory); err != nil {
		return nil, err
	}
	// Pop order low ids first: the stack holds n-1 … 0.
	for i := range n {
		c.free[i] = int32(n - 1 - i)
	}
	return c, nil
}

// allocTensors allocates every layer's K and V in m; on failure it frees
// what it allocated.
func (c *Cache) allocTensors(m kernels.Memory) error {
	c.mem = m
	c.kt = make([]kernels.Tensor, len(c.layout))
	c.vt = make([]kernels.Tensor, len(c.layout))
	slots := c.numBlocks * c.blockSize
	for l, w := range c.layout {
		var err error
		if w.K > 0 {
			c.kt[l], err = m.Alloc(w.DType, slots, w.K)
		}
		if err == nil && w.V > 0 {
			c.vt[l], err = m.Alloc(w.vDType(), slots, w.V)
		}
		if err != nil {
			c.Release()
			return fmt.Errorf("kvcache: layer %d: %w", l, err)
		}
	}
	return nil
}

// Release frees the cache's layer tensors in its backend memory at once,
// rather than when the backend closes. The cache must not be used
// afterwards, nor released twice: its owner calls it once, when done.
func (c *Cache) Release() {
	for _, ts := range [][]kernels.Tensor{c.kt, c.vt} {
		for _, t := range ts {
			if t.Valid() {
				c.mem.Free(t)
			}
		}
	}
}

// Seq is one sequence's view of the cache: its length in tokens and its
// block table. Create with NewSeq or Fork; release with Free.
type Seq struct {
	c      *Cache
	n      int     // tokens whose slots are reserved
	blocks []int32 // block table: position p is in blocks[p/blockSize]
	freed  bool
}

// Len is the number of reserved token positions, [0, Len).
func (s *Seq) Len() int { return s.n }

// Blocks is the sequence's block table (read-only; valid until the next
// Reserve, Truncate or Free of this sequence).
func (s *Seq) Blocks() []int32 { return s.blocks }

// ** used by model implementations **

// Layout is the per-layer widths the cache was built for.
func (c *Cache) Layout() Layout { return c.layout }

// BlockSize is the number of token slots per block.
func (c *Cache) BlockSize() int { return c.blockSize }

// Layer is layer l's K and V storage in backend memory, each
// (blocks·BlockSize, width): slot b·BlockSize + j holds token j of block b.
func (c *Cache) Layer(l int) (k, v kernels.Tensor) { return c.kt[l], c.vt[l] }

// Memory is the backend memory holding the storage (Options.Memory).
func (c *Cache) Memory() kernels.Memory { return c.mem }

// Slot is the storage slot of token pos of s (pos < s.Len()).
func (c *Cache) Slot(s *Seq, pos int) int32 {
	if pos < 0 || pos >= s.n {
		panic("kvcache: position outside the sequence")
	}
	return s.blocks[pos/c.blockSize]*int32(c.blockSize) + int32(pos%c.blockSize)
}

// ** cache management (the scheduler, between forward passes) **

// NewSeq returns an empty sequence.
func (c *Cache) NewSeq() *Seq {
	c.seqs++
	return &Seq{c: c}
}

// blocksFor is the number of blocks n tokens occupy.
func (c *Cache) blocksFor(n int) int { return (n + c.blockSize - 1) / c.blockSize }

// BlocksNeeded is how many free blocks Reserve(s, n) would take, counting a
// copy-on-write of a shared partial last block.
func (c *Cache) BlocksNeeded(s *Seq, n int) int {
	if n <= s.n {
		return 0
	}
	need := c.blocksFor(n) - len(s.blocks)
	if c.sharedTail(s) {
		need++
	}
	return need
}

// sharedTail reports whether the block that the next token of s would be
// written into already exists and is shared with another sequence.
func (c *Cache) sharedTail(s *Seq) bool {
	if s.n%c.blockSize == 0 {
		return false // the next token starts a new block
	}
	return c.refs[s.blocks[s.n/c.blockSize]] > 1
}

// Reserve grows s to n tokens so that positions [s.Len(), n) may be written.
// It allocates the missing blocks and, when the partly filled last block is
// shared, replaces it with a private copy. When the pool is short it returns
// an error wrapping ErrCacheFull and leaves s unchanged. n ≤ s.Len() is a
// no-op: Reserve never shrinks (use Truncate).
func (c *Cache) Reserve(s *Seq, n int) error {
	if s.c != c || s.freed {
		return errors.New("kvcache: reserve on a freed or foreign sequence")
	}
	need := c.BlocksNeeded(s, n)
	if need == 0 {
		if n > s.n {
			s.n = n
		}
		return nil
	}
	if need > len(c.free) {
		return &FullError{Need: need, Free: len(c.free)}
	}
	if c.sharedTail(s) {
		i := s.n / c.blockSize
		old := s.blocks[i]
		b := c.pop()
		c.CopyBlock(b, old)
		c.refs[old]--
		s.blocks[i] = b
	}
	for len(s.blocks) < c.blocksFor(n) {
		s.blocks = append(s.blocks, c.pop())
	}
	s.n = n
	return nil
}

// Truncate shrinks s to its first n tokens (rolling back rejected
// speculative tokens, say) and returns the blocks no longer needed.
// n ≥ s.Len() is a no-op.
func (c *Cache) Truncate(s *Seq, n int) {
	if n < 0 {
		n = 0
	}
	if n >= s.n {
		return
	}
	keep := c.blocksFor(n)
	for _, b := range s.blocks[keep:] {
		c.release(b)
	}
	s.blocks = s.blocks[:keep]
	s.n = n
}

// Free returns all of s's blocks to the pool. Freeing twice is a no-op.
func (c *Cache) Free(s *Seq) {
	if s.freed {
		return
	}
	c.Truncate(s, 0)
	s.blocks = nil
	s.freed = true
	c.seqs--
}

// Fork returns a new sequence that shares the first n tokens of src: their
// blocks gain a reference rather than being copied. Writes by either
// sequence after the fork copy a shared partial block first (see Reserve).
func (c *Cache) Fork(src *Seq, n int) (*Seq, error) {
	if src.c != c || src.freed {
		return nil, errors.New("kvcache: fork of a freed or foreign sequence")
	}
	if n < 0 || n > src.n {
		return nil, fmt.Errorf("kvcache: fork of %d tokens from a sequence of %d", n, src.n)
	}
	s := c.NewSeq()
	s.n = n
	s.blocks = append(make([]int32, 0, c.blocksFor(n)+1), src.blocks[:c.blocksFor(n)]...)
	for _, b := range s.blocks {
		c.refs[b]++
	}
	return s, nil
}

func (c *Cache) pop() int32 {
	b := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.refs[b] = 1
	return b
}

func (c *Cache) release(b int32) {
	c.refs[b]--
	switch {
	case c.refs[b] == 0:
		c.free = append(c.free, b)
	case c.refs[b] < 0:
		panic("kvcache: block reference count below zero")
	}
}

// CopyBlock copies every layer's K and V contents of block src into dst.
func (c *Cache) CopyBlock(dst, src int32) {
	bs := c.blockSize
	d, s := int(dst)*bs, int(src)*bs
	for l, w := range c.layout {
		if w.K > 0 {
			c.mem.Copy(c.kt[l].Slice(d, d+bs), c.kt[l].Slice(s, s+bs))
		}
		if w.V > 0 {
			c.mem.Copy(c.vt[l].Slice(d, d+bs), c.vt[l].Slice(s, s+bs))
		}
	}
}

// Prefault writes every memory page of the storage once (values unchanged),
// so that a measurement after it does not pay for first-touch page faults.
func (c *Cache) Prefault() {
	for l := range c.layout {
		for _, t := range []kernels.Tensor{c.kt[l], c.vt[l]} {
			if t.Valid() {
				c.mem.Copy(t, t)
			}
		}
	}
}

// Stats is a snapshot of the cache's accounting.
type Stats struct {
	BlockSize   int
	BlocksUsed  int   // blocks referenced by at least one sequence
	BlocksTotal int   // pool size
	BytesUsed   int64 // BlocksUsed × bytes per block
	BytesTotal  int64 // BlocksTotal × bytes per block (≤ Budget)
	Budget      int64 // the byte budget the pool was sized from
	Seqs        int   // live sequences
}

// Stats returns the current accounting.
func (c *Cache) Stats() Stats {
	used := c.numBlocks - len(c.free)
	return Stats{
		BlockSize:   c.blockSize,
		BlocksUsed:  used,
		BlocksTotal: c.numBlocks,
		BytesUsed:   int64(used) * c.blockBytes,
		BytesTotal:  int64(c.numBlocks) * c.blockBytes,
		Budget:      c.budget,
		Seqs:        c.seqs,
	}
}

// BlocksFree is the number of blocks in the pool not used by any sequence.
func (c *Cache) BlocksFree() int { return len(c.free) }
