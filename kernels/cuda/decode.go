//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"

	"github.com/ferrite-llm/ferrite/kernels"
)

// One-row decode kernels (src/ops_decode.cu) for a batch-1 decode step,
// where every kernel is latency: the attention of a single query row over
// many small key splits and the one-row RMSNorm.
//
// The split-KV attention kernel of ops.cu gives a decode row of Qwen3-8B
// 16 blocks at ~150 keys (20–27 µs a layer in GPU run 3's graph profile:
// positions, block table, keys, values and the merge as a chain of
// dependent loads). ferrite_dattn_* instead splits the keys into chunks
// of 32 keys or more so that the blocks number up to two a
// multiprocessor, a block taking every query head of its KV head's group
// (up to 8); before its PDL wait it reads the step's inputs and copies its
// first tile of past keys and values into shared memory, so only the
// queries, the row's own key and value, the arithmetic and the merge of
// the splits (the last split to finish, by a counter) follow the kernel
// before. In its QKV form (QKVAttention) it also prepares the queries and
// the row's key and value from the q/k/v product (PrepareQKV's bits) and
// stores them, with the rotation's cos and sin computed before the wait.
//
// Switches (GPU run 2 of session 14 measured the first three on, the
// default; FERRITE_CUDA_DATTN=0, FERRITE_CUDA_DATTN_G4=0 and
// FERRITE_CUDA_DNORM=0 turn them off):
// FERRITE_CUDA_DATTN=1 runs ferrite_dattn for one-row Attention (after
// PrepareQKV) and for a row-exact verification's rows (each with the bits
// of the row alone), FERRITE_CUDA_DATTN=qkv also for one-row QKVAttention (no
// PrepareQKV kernel). FERRITE_CUDA_DATTN_KEYS, FERRITE_CUDA_DATTN_BLOCKS
// and FERRITE_CUDA_DATTN_SPLITS set the keys a split at least (default
// 32), the blocks the splits aim at (2·SMs) and the splits at most (64);
// FERRITE_CUDA_DATTN_G4=1 gives a block 4 query heads for any group (a
// group of 8 in two chunks, each reading the keys).
// FERRITE_CUDA_DATTN_BATCH=N runs decode batches of 2 to N rows (each row
// a sequence of its own) on ferrite_dattn too (default decBatchRowsDef;
// 0: the split-KV kernel), their splits aimed at
// FERRITE_CUDA_DATTN_BATCH_BLOCKS blocks (2·SMs). FERRITE_CUDA_DNORM=1
// runs one-row RMSNorm and AddRMSNorm as ferrite_rmsnorm_row;
// FERRITE_CUDA_DNORM=gemv also joins the RMSNorm of a one-row Linear's
// output (the o and down products adding into the residual stream, then
// its norm) to that product: ferrite_gemv_*_1n, whose last block norms the
// row (decLinear, decFuseNorm). GPU run 1 measured it slower than the norm
// kernel (every block's release add); it stays off.

func init() {
	for _, n := range decAttnKernels {
		for _, m := range n {
			for _, k := range m {
				for _, name := range k {
					kernelNames = append(kernelNames, name)
					pdlKernels[name] = true
				}
			}
		}
	}
	for _, name := range []string{"ferrite_rmsnorm_row", "ferrite_gemv_f32_1n", "ferrite_gemv_bf16_1n"} {
		kernelNames = append(kernelNames, name)
		pdlKernels[name] = true
	}
}

// gemvNormKernels1n names the one-row GEMV that also norms its product
// (ferrite_gemv_*_1n) per weight dtype.
var gemvNormKernels1n = map[kernels.DType]string{kernels.F32: "ferrite_gemv_f32_1n", kernels.BF16: "ferrite_gemv_bf16_1n"}

// decGemvNormRows is the most rows ferrite_gemv_*_1n norms (4 float4 a
// thread of its last block).
const decGemvNormRows = 4096

// decAttnKernels[qkv][bf16][hd == 128][g == 8] are ferrite_dattn's
// instances: the QKV form or not, the cache's dtype, head dim 64 or 128,
// 4 or 8 query heads a block.
var decAttnKernels = [2][2][2][2]string{
	{{{"ferrite_dattn_f32_64_g4", "ferrite_dattn_f32_64_g8"}, {"ferrite_dattn_f32_128_g4", "ferrite_dattn_f32_128_g8"}},
		{{"ferrite_dattn_bf16_64_g4", "ferrite_dattn_bf16_64_g8"}, {"ferrite_dattn_bf16_128_g4", "ferrite_dattn_bf16_128_g8"}}},
	{{{"ferrite_dattn_qkv_f32_64_g4", "ferrite_dattn_qkv_f32_64_g8"}, {"ferrite_dattn_qkv_f32_128_g4", "ferrite_dattn_qkv_f32_128_g8"}},
		{{"ferrite_dattn_qkv_bf16_64_g4", "ferrite_dattn_qkv_bf16_64_g8"}, {"ferrite_dattn_qkv_bf16_128_g4", "ferrite_dattn_qkv_bf16_128_g8"}}},
}

// Limits and defaults of ferrite_dattn: splits a merge takes
// (kDecMaxSplits), threads a block, keys a split at least by default.
const (
	decMaxSplits  = 64
	decThreads    = 128
	decMinKeysDef = 32
	decMaxRows    = 64 // rows ferrite_dattn takes in a row-exact step (a speculative verification's)
	// decBatchRowsDef is the most rows of a decode batch (a row a
	// sequence) ferrite_dattn takes by default (FERRITE_CUDA_DATTN_BATCH).
	decBatchRowsDef = 256
)

// Decode attention modes (decState.attn).
const (
	decAttnOff   = 0
	decAttnPlain = 1 // ferrite_dattn for one-row Attention
	decAttnQKV   = 2 // and its QKV form for one-row QKVAttention
)

// decState is the one-row decode kernels' configuration.
type decState struct {
	attn    int  // decAttnOff, decAttnPlain or decAttnQKV
	minKeys int  // keys a split at least (decMinKeys); 0: decMinKeysDef
	blocks  int  // blocks the splits aim at; 0: two a multiprocessor
	splits  int  // splits at most (FERRITE_CUDA_DATTN_SPLITS); 0: decMaxSplits
	g4      bool // 4 query heads a block whatever the group (FERRITE_CUDA_DATTN_G4=1): wider groups in chunks
	norm    bool // one-row norms as ferrite_rmsnorm_row
	// gemvNorm: a one-row Linear adding into its output, followed by an
	// RMSNorm of that output, runs as ferrite_gemv_*_1n (the norm in the
	// product's last block; decLinear, decFuseNorm)
	gemvNorm bool
	pend     decPend        // the Linear just queued whose norm may still join it
	cnt      kernels.Tensor // ferrite_gemv_*_1n's counter (one zeroed int32); the zero Tensor until first used
	// batchRows: decode batches of 2 to batchRows rows, every row a
	// sequence of its own, run ferrite_dattn too (0: the split-KV kernel),
	// their splits aimed at batchBlocks blocks for the whole batch (0: two
	// a multiprocessor, as one row's).
	batchRows, batchBlocks int
}

// decPend is the last queued one-row Linear that can norm its product y
// (dim values): the norm that follows fills fix before the step's launches
// run (EndStep), instead of queueing a kernel. queue clears it.
type decPend struct {
	y   uint64
	dim int
	fix *decFix
}

// decFix is ferrite_gemv_*_1n's norm: output h (0: no norm joined, the
// plain GEMV runs), weight w, eps, offset, counter.
type decFix struct {
	h, w, cnt uint64
	eps       float32
	off       bool
}

// decConfigFromEnv reads the FERRITE_CUDA_DATTN* and FERRITE_CUDA_DNORM
// switches. The defaults (GPU run 2 of session 14: Qwen3-8B batch 1 188 →
// 205 tok/s, Qwen3-30B-A3B 208–213 → 238–241): the QKV form, 4 query heads
// a block, the one-row norm kernel; FERRITE_CUDA_DATTN=0, =1,
// FERRITE_CUDA_DATTN_G4=0 and FERRITE_CUDA_DNORM=0 switch back.
func decConfigFromEnv() decState {
	c := decState{attn: decAttnQKV, norm: true, g4: os.Getenv("FERRITE_CUDA_DATTN_G4") != "0", batchRows: decBatchRowsDef}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_DATTN_BATCH")); err == nil && n >= 0 {
		c.batchRows = n
	}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_DATTN_BATCH_BLOCKS")); err == nil && n > 0 {
		c.batchBlocks = n
	}
	switch os.Getenv("FERRITE_CUDA_DATTN") {
	case "0":
		c.attn = decAttnOff
	case "1":
		c.attn = decAttnPlain
	}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_DATTN_KEYS")); err == nil && n > 0 {
		c.minKeys = n
	}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_DATTN_BLOCKS")); err == nil && n > 0 {
		c.blocks = n
	}
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_DATTN_SPLITS")); err == nil && n > 0 {
		c.splits = min(n, decMaxSplits)
	}
	switch os.Getenv("FERRITE_CUDA_DNORM") {
	case "0":
		c.norm = false
	case "gemv":
		c.gemvNorm = true
	}
	return c
}

// SetDecodeAttention sets the one-row attention mode (decAttnOff,
// decAttnPlain, decAttnQKV) and the split tuning (minKeys, blocks; 0 for
// the defaults) for the steps that follow and returns the previous
// configuration's mode: a switch for tests and benchmarks.
func (b *Backend) SetDecodeAttention(mode, minKeys, blocks int) int {
	prev := b.dec.attn
	b.dec.attn, b.dec.minKeys, b.dec.blocks = mode, minKeys, blocks
	return prev
}

// SetDecodeBatch sets the most rows of a decode batch ferrite_dattn takes
// (0: none, the split-KV kernel runs them) and the blocks its splits aim at
// (0: the default) for the steps that follow, and returns the previous
// row limit: a switch for tests and benchmarks.
func (b *Backend) SetDecodeBatch(rows, blocks int) int {
	prev := b.dec.batchRows
	b.dec.batchRows, b.dec.batchBlocks = max(0, rows), max(0, blocks)
	return prev
}

// SetDecodeNorm turns ferrite_rmsnorm_row for one-row norms on or off for
// the steps that follow and returns the previous setting.
func (b *Backend) SetDecodeNorm(on bool) bool {
	prev := b.dec.norm
	b.dec.norm = on
	return prev
}

// SetGemvNorm turns the norm in the one-row GEMV before it
// (ferrite_gemv_*_1n) on or off for the steps that follow and returns the
// previous setting.
func (b *Backend) SetGemvNorm(on bool) bool {
	prev := b.dec.gemvNorm
	b.dec.gemvNorm = on
	return prev
}

// decLinear queues a one-row Linear y (1, w.Rows) += x·wᵀ as
// ferrite_gemv_*_1n's candidate when the GEMV-norm fusion is on, inside a
// step, not row-exact, no bias, adding into y, and w of a dtype, height and
// y of an address the kernel takes; it reports whether it did. Until the
// step's launches run, the next op may join its RMSNorm of y (decFuseNorm);
// otherwise the plain GEMV runs.
func (b *Backend) decLinear(y, x uint64, w *Weight, n int, bias uint64, acc bool) bool {
	name, ok := gemvNormKernels1n[w.DType]
	if !b.dec.gemvNorm || !ok || n != 1 || !acc || bias != 0 || !b.inStep || b.rowExact || w.Rows%4 != 0 ||
		w.Rows > decGemvNormRows || y%16 != 0 {
		return false
	}
	fix := &decFix{}
	b.queue(func(d *Device) error {
		switch {
		case fix.h == 0:
			return d.linearL(y, x, w, 1, 0, true)
		case d.gemvRows > 0: // another GEMV layout: the norm as its own kernel
			if err := d.linearL(y, x, w, 1, 0, true); err != nil {
				return err
			}
			return d.launchL("ferrite_add_rmsnorm", 1, 1024, 0, fix.h, y, 0, fix.w, i32(1), i32(w.Rows), f32(fix.eps), b32(fix.off), 0)
		}
		grid := uint32(ceilDiv(w.Rows, gemvBlock/32/gemvSplit))
		return d.launchL(name, grid, gemvBlock, 0, y, x, w.Buf.ptr, i32(1), i32(w.Rows), i32(w.Cols), 0, b32(true),
			i32(d.prefetchBlocks()), fix.h, fix.w, f32(fix.eps), b32(fix.off), fix.cnt)
	})
	b.dec.pend = decPend{y: y, dim: w.Rows, fix: fix}
	return true
}

// decFuseNorm joins the RMSNorm y = norm(res) (norm's arguments) to the
// Linear queued just before it when that Linear wrote res (decLinear), and
// reports whether it did.
func (b *Backend) decFuseNorm(y, res, delta, w uint64, rows, dim int, eps float32, offset bool, sum uint64) bool {
	p := b.dec.pend
	if p.fix == nil || !b.inStep || p.y != res || delta != 0 || sum != 0 || rows != 1 || dim != p.dim || y == res || (y|w)%16 != 0 {
		return false
	}
	if !b.dec.cnt.Valid() {
		t, err := b.Alloc(kernels.I32, 1, 1)
		if err != nil {
			return false
		}
		b.dec.cnt = t
	}
	*p.fix = decFix{h: y, w: w, cnt: dptr(b.dec.cnt), eps: eps, off: offset}
	b.dec.pend = decPend{}
	return true
}

// decSplits is ferrite_dattn's split of maxKeys keys for cols block
// columns (KV heads × head chunks) on sms multiprocessors: about target
// blocks (0: 2·sms), no split under minKeys keys unless the keys are
// fewer, at most maxSplits splits (0: decMaxSplits), each a multiple of 8
// keys. It returns the split count and the keys a split. GPU run 1 of
// session 14 measured fewer, longer splits faster (Qwen3-8B at 256 keys:
// 8 splits of 32 keys 8.3 µs a layer, 16 of 16 9.7; every split adds
// ~0.2 µs to the merge), hence decMinKeysDef.
func decSplits(cols, maxKeys, sms, target, minKeys, maxSplits int) (splits, split int) {
	if target <= 0 {
		target = 2 * sms
	}
	if minKeys <= 0 {
		minKeys = decMinKeysDef
	}
	if maxSplits <= 0 || maxSplits > decMaxSplits {
		maxSplits = decMaxSplits
	}
	s := min(ceilDiv(target, cols), ceilDiv(maxKeys, minKeys))
	s = max(1, min(s, maxSplits))
	split = ceilDiv(ceilDiv(maxKeys, s), 8) * 8
	return ceilDiv(maxKeys, split), split
}

// decGroup is ferrite_dattn's query heads a block (4 or 8; 4 with
// only4) and head chunks a KV head for a group of grp query heads.
func decGroup(grp int, only4 bool) (g, chunks int) {
	g = 4
	if grp > 4 && !only4 {
		g = 8
	}
	return g, ceilDiv(grp, g)
}

// decAttnFits reports whether ferrite_dattn takes an attention of shape s
// over the caches kc, vc into out (q the queries, or the zero Tensor for
// the QKV form): the mode on, one row, up to decMaxRows rows of a
// row-exact step (kernels.RowExact: each row's sums are those of the row
// alone, so a speculative verification's rows get plain decoding's bits),
// or a decode batch (decBatch), head dim 64 or 128, caches at 16-byte
// addresses (cp.async), and few enough blocks for the split counters.
func (b *Backend) decAttnFits(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape) bool {
	n := out.Rows
	if b.dec.attn == decAttnOff || n < 1 || (s.HeadDim != 64 && s.HeadDim != 128) {
		return false
	}
	switch {
	case n == 1:
	case b.rowExact:
		if n > decMaxRows || b.usePrefill(s, n) {
			return false
		}
	case !b.decBatch(n, p):
		return false
	}
	if s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 || (kc.DType != kernels.F32 && kc.DType != kernels.BF16) || kc.DType != vc.DType {
		return false
	}
	_, chunks := decGroup(s.Heads/s.KVHeads, b.dec.g4)
	if n*s.KVHeads*chunks > attnCounters || !p.Blocks.Valid() || p.BlockSize <= 0 {
		return false
	}
	align := dptr(kc) | dptr(vc)
	if q.Valid() {
		align |= dptr(q)
	}
	return align%16 == 0
}

// decBatch reports whether the n rows of p are a decode batch that
// ferrite_dattn takes: 2 to dec.batchRows rows, each a sequence of its own
// (decodeBatch), not row-exact.
func (b *Backend) decBatch(n int, p *kernels.Paged) bool {
	return n > 1 && n <= b.dec.batchRows && !b.rowExact && p.Blocks.Valid() && decodeBatch(n, p)
}

// decAttention queues ferrite_dattn (decAttnFits): with qf the QKV form of
// one row (q the zero Tensor), which prepares and stores the row's q, k
// and v itself. One row and a row-exact step's rows get the splits of one
// row (each row's bits as alone); a decode batch's splits are counted over
// all its rows' blocks, and its rows, of distinct sequences, copy their
// first tile before the kernel's PDL wait.
func (b *Backend) decAttention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape, qf *qkvForm) {
	g, chunks := decGroup(s.Heads/s.KVHeads, b.dec.g4)
	cols, n := s.KVHeads*chunks, out.Rows
	batch := qf == nil && b.decBatch(n, p)
	target, blocks := b.dec.blocks, cols
	if batch {
		target, blocks = b.dec.batchBlocks, cols*n
	}
	splits, split := decSplits(blocks, p.Blocks.Cols*p.BlockSize, b.dev.SMs, target, b.dec.minKeys, b.dec.splits)
	var part, cnt uint64
	if splits > 1 {
		part = dptr(b.Scratch(kernels.F32, n*splits*s.Heads, s.HeadDim+2)) // per row (splits, heads, hd) sums, then (splits, heads, 2) max and sum
		var err error
		if cnt, err = b.splitCounters(); err != nil {
			b.fail(err)
			return
		}
	}
	form, bf, wide, g8 := 0, 0, 0, 0
	if qf != nil {
		form = 1
	}
	if kc.DType == kernels.BF16 {
		bf = 1
	}
	if s.HeadDim == 128 {
		wide = 1
	}
	if g == 8 {
		g8 = 1
	}
	name := decAttnKernels[form][bf][wide][g8]
	var qp uint64
	var extra [11]uint64 // the QKV form's qkv, slot, slots and PrepArgs; zeros otherwise
	if qf != nil {
		extra[0], extra[1], extra[2] = qf.qkv, qf.slot, i32(qf.slots)
		copy(extra[3:], qf.prep[:])
	} else {
		qp = dptr(q)
	}
	args := append([]uint64{dptr(out), qp, dptr(kc), dptr(vc), dptr(p.Pos), dptr(p.Seq), dptr(p.Blocks), part, cnt,
		i32(p.Blocks.Cols), i32(p.BlockSize), i32(s.Heads), i32(s.KVHeads), i32(chunks), i32(split), f32(s.Scale)}, extra[:]...)
	args = append(args, b32(batch))
	b.queue(func(d *Device) error {
		return d.launch3L(name, [3]uint32{uint32(cols), uint32(splits), uint32(n)}, decThreads, 0, args...)
	})
}

// decNorm queues ferrite_rmsnorm_row for a one-row norm, or the rows of a
// row-exact step (up to decMaxRows: each row's bits as alone), when the
// switch is on and the rows fit it (norm's arguments; dim a multiple of 4
// up to 16,384, every pointer at a 16-byte address) and reports whether it
// did.
func (b *Backend) decNorm(y, res, delta, w uint64, rows, dim int, eps float32, offset bool, sum uint64) bool {
	if !b.dec.norm || rows < 1 || rows > 1 && (!b.rowExact || rows > decMaxRows) || dim%4 != 0 || (y|res|delta|w|sum)%16 != 0 {
		return false
	}
	n4 := dim / 4
	threads := min(1024, 32*ceilDiv(n4, 32))
	if n4 > 4*threads {
		return false
	}
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_rmsnorm_row", uint32(rows), uint32(threads), 0, y, res, delta, w, i32(dim), f32(eps), b32(offset), sum)
	})
	return true
}
