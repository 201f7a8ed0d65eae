// Package kvcache is the engine's paged key/value cache.
//
// Storage is a pool of fixed-size blocks (BlockSize token slots each) sized
// from a byte budget. Every layer has its own K and V arrays whose per-token
// widths the model declares in a Layout: GQA layers store 2·nKV·headDim
// values per token, an MLA layer stores one latent of kv_lora+rope values and
// no V (V width 0), and a layer with no attention cache (linear attention)
// declares 0 and 0. The arrays are tensors in the model's backend memory
// (Options.Memory; there is no host form), BF16 by default or F32, a
// layer's V optionally F32 whatever its K (LayerWidth).
//
// A sequence is a *Seq: a length and a block table mapping token positions
// to blocks (position p lives in slot p%BlockSize of block table[p/BlockSize]).
// The cache grows a sequence on demand (Reserve), shrinks it (Truncate, which
// is how rejected speculative tokens are rolled back) and returns its blocks
// (Free). Blocks are reference-counted: Fork makes a new sequence that shares
// a prefix of another, and the first Reserve that would write into a shared
// partially-filled block copies it first (copy-on-write), so writers never
// see each other's tokens.
//
// Invariants:
//   - Reserve never panics; it returns ErrCacheFull (wrapped) when the pool
//     cannot supply the blocks, leaving the sequence unchanged.
//   - A model writes K/V only at positions in [old length, new length) of the
//     last Reserve, which are never in a shared block.
//   - Every block with a non-zero reference count is reachable from some live
//     sequence's table; BlocksUsed counts exactly those blocks.
//
// A Cache is not safe for concurrent mutation: the scheduler calls Reserve,
// Truncate, Fork and Free between forward passes. During a forward pass many
// goroutines may read and write disjoint token slots.
package kvcache
