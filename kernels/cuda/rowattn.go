//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"strconv"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Decode-batch attention (src/rowattn.cu): Attention over rows that are
// each the next token of a sequence, as a decode step of many sequences
// has them. The split-KV kernel of ops.cu gives each lane a key and loops
// over the keys of a block's split serially; rowattn gives the lanes the
// head dims (one coalesced load a key row), four query heads a block, and
// splits the keys so that the batch fills the GPU, the last split of a
// row merging them in the kernel.

const (
	rowAttnGroup    = 4    // query heads a block
	rowAttnMaxKeys  = 1024 // keys a split
	rowAttnThreads  = 128
	rowAttnCounters = 8192 // (row, head chunk) blocks the merge counters cover
	rowAttnMinKeys  = 64   // the fewest keys a split is given
)

// rowAttnKernels[bf16][i] handles head dims up to 32·2^i (2^i of them a
// lane).
var rowAttnKernels = [2][4]string{
	{"ferrite_attn_rows_f32_1", "ferrite_attn_rows_f32_2", "ferrite_attn_rows_f32_4", "ferrite_attn_rows_f32_8"},
	{"ferrite_attn_rows_bf16_1", "ferrite_attn_rows_bf16_2", "ferrite_attn_rows_bf16_4", "ferrite_attn_rows_bf16_8"},
}

// The decode-batch attention kernels load with the module and start with
// FERRITE_PDL_WAIT.
func init() {
	for _, ks := range rowAttnKernels {
		for _, k := range ks {
			kernelNames = append(kernelNames, k)
			pdlKernels[k] = true
		}
	}
}

// rowAttnState is a Backend's decode-batch attention setting and merge
// counters.
type rowAttnState struct {
	rows     int // batches of at least rows rows take rowattn; 0: never
	once     sync.Once
	counters *Buffer // rowAttnCounters int32, zero between launches
}

// rowAttnDefault is a new Backend's rowattn threshold: off (GPU run 2
// measured the first version 1.2–2.5× slower than the split-KV kernel),
// or FERRITE_CUDA_ROWATTN=N for batches of N rows or more.
func rowAttnDefault() int {
	if n, err := strconv.Atoi(os.Getenv("FERRITE_CUDA_ROWATTN")); err == nil && n >= 0 {
		return n
	}
	return 0
}

// SetRowAttention sets the fewest rows Attention runs the decode-batch
// kernel for (0: never) and returns the old value: a switch for tests and
// benchmarks, outside a step.
func (b *Backend) SetRowAttention(rows int) int {
	old := b.rowAttn.rows
	b.rowAttn.rows = max(0, rows)
	return old
}

// rowAttnCounters returns the merge counters, allocating and zeroing them
// on first use (nil if that failed).
func (b *Backend) rowAttnCounters() *Buffer {
	b.rowAttn.once.Do(func() {
		c, err := b.dev.Alloc(rowAttnCounters * 4)
		if err == nil {
			if err = c.Fill32(0, rowAttnCounters, 0); err != nil {
				c.Free()
			}
		}
		if err == nil {
			b.rowAttn.counters = c
		}
	})
	return b.rowAttn.counters
}

// rowAttnSplits is how many key splits rowattn gives a launch of blocks
// (row, head chunk) blocks over a block table of maxKeys keys on sms
// multiprocessors: enough for about four blocks a multiprocessor, none
// under rowAttnMinKeys keys, none over rowAttnMaxKeys.
func rowAttnSplits(blocks, maxKeys, sms int) int {
	s := min(ceilDiv(4*sms, blocks), ceilDiv(maxKeys, rowAttnMinKeys))
	return max(1, s, ceilDiv(maxKeys, rowAttnMaxKeys))
}

// rowAttention runs Attention on rowattn when it applies — at least
// rowAttn.rows rows, no row tile the prefill kernel could take (fewer rows
// than a tile in the longest sequence the step can hold), a head dim that
// divides into the lanes, not a row-exact step (a verification keeps the
// split-KV kernel, which plain decoding of one sequence runs) — and
// reports whether it did. The shapes are checked by Attention.
func (b *Backend) rowAttention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape) bool {
	n := q.Rows
	if b.rowAttn.rows == 0 || n < b.rowAttn.rows || b.rowExact || b.usePrefill(s, n) && n-(p.Blocks.Rows-1) >= b.prefillTile() {
		return false
	}
	dpl := 0
	for 32<<dpl < s.HeadDim {
		dpl++
	}
	grp := s.Heads / s.KVHeads
	chunks := ceilDiv(grp, rowAttnGroup)
	blocks := n * s.KVHeads * chunks
	if s.HeadDim%(1<<dpl) != 0 || blocks > rowAttnCounters || b.rowAttnCounters() == nil {
		return false
	}
	maxKeys := p.Blocks.Cols * p.BlockSize
	splits := rowAttnSplits(blocks, maxKeys, b.dev.SMs)
	split := min(rowAttnMaxKeys, ceilDiv(ceilDiv(maxKeys, splits), 32)*32)
	splits = ceilDiv(maxKeys, split)
	var part uint64
	if splits > 1 {
		part = dptr(b.Scratch(kernels.F32, n*s.Heads*splits, s.HeadDim+2)) // (n, heads, splits, max, sum, hd acc)
	}
	bf := 0
	if kc.DType == kernels.BF16 {
		bf = 1
	}
	o, qp, kcp, vcp := dptr(out), dptr(q), dptr(kc), dptr(vc)
	pos, seq, bt, cnt := dptr(p.Pos), dptr(p.Seq), dptr(p.Blocks), b.rowAttn.counters.ptr
	b.queue(func(d *Device) error {
		return d.launch3L(rowAttnKernels[bf][dpl], [3]uint32{uint32(n), uint32(s.KVHeads * chunks), uint32(splits)}, rowAttnThreads, 0,
			o, qp, kcp, vcp, pos, seq, bt, part, i32(p.Blocks.Cols), i32(p.BlockSize), i32(n), i32(s.Heads), i32(s.KVHeads),
			i32(s.HeadDim), i32(chunks), i32(split), f32(s.Scale), cnt)
	})
	return true
}
