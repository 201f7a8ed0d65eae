//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ferrite-llm/ferrite/kernels"

// Grouped bf16 experts for decode batches on the tensor cores
// (src/ops_moe_tc.cu): from moeConfig.tcFrom tokens up to moeConfig.tc,
// bf16 experts run ferrite_moe_sort, ferrite_bf16_terms3 (x's three bf16
// terms), ferrite_moe_tc_gate_up (each slot's SwiGLU, as its terms),
// ferrite_moe_tc_down and ferrite_moe_combine. The register tiles and the
// streamed kernels, which they replace there, widen every weight once per
// slot on the CUDA cores and read the chosen experts at 2.3–2.6 TB/s
// (GLM-4.7-Flash at 32 tokens: 407–414 µs a layer, BENCHMARKS.md 9); here
// a weight goes from memory into an mma fragment as it is.
//
// The products are exact (x in three bf16 terms) and a token's bits do
// not depend on the other tokens of the call, but they are not the
// one-token kernels' bits: the row-exact mode (a speculative
// verification) keeps to the register tiles and the streamed kernels.

// moeTCFrom is 16: on the H200 (session 26, BENCHMARKS.md 9) the kernels
// took 117 and 182 µs a GLM-4.7-Flash layer at 4 and 8 tokens against the
// register tiles' 99 and 161, 251 against 257 at 16, 320 against 410 at
// 32 and 362 against 703 at 64; Qwen3-30B-A3B's experts alike (190
// against 167 at 8, 247 against 267 at 16, 328 against 431 at 32).
const (
	moeTCMin    = 4   // the fewest tokens the kernels take
	moeTCFrom   = 16  // the fewest tokens by default (FERRITE_MOE_TC_FROM)
	moeTCTokens = 256 // the most tokens by default (FERRITE_MOE_TC)
	moeTCWarps  = 4   // warps a block (src kMtcWarps)
)

func init() {
	names := []string{"ferrite_bf16_terms3", "ferrite_moe_tc_gate_up", "ferrite_moe_tc_down", "ferrite_moe_tc_gate_up_u4",
		"ferrite_moe_tc_down_u4"}
	kernelNames = append(kernelNames, names...)
	for _, n := range names {
		pdlKernels[n] = true
	}
}

// useTC reports whether n tokens take the tensor-core decode kernels
// under c (outside the row-exact mode).
func (c moeConfig) useTC(n int) bool { return n >= max(c.tcFrom, moeTCMin) && n <= c.tc }

// tcFits reports whether x's n tokens take the tensor-core decode
// kernels for experts: n within useTC, the row-exact mode off, x's rows
// 16-byte aligned, and no shared expert folded in. A folded shared
// expert (every token's last slot) made them slower end to end: ferrite
// bench GLM-4.7-Flash, whose shared expert is folded, gave 1,016–1,022
// tok/s at 32 sequences with them against 1,120–1,126 without and 670
// against 750 at 16, where Qwen3-30B-A3B (no shared expert) gained 1.24×
// at 32 (session 26); FERRITE_MOE_TC_SHARED=1 takes them there anyway.
// The caller checks the experts' dtypes and widths.
func (b *Backend) tcFits(x kernels.Tensor, n int, experts []kernels.Expert) bool {
	shared := len(experts) > 0 && experts[len(experts)-1].Shared && !b.moe.tcShared
	return !b.rowExact && !shared && b.moe.useTC(n) && x.Stride%4 == 0 && dptr(x)%16 == 0
}

// expertsTC queues Experts (y (n, hidden) of row stride yStride, x, ids
// ip and weights wp (n, k)) of ne bf16 experts (table) as the tensor-core
// decode kernels where tcFits, and reports whether it did. The caller has
// checked the experts' dtypes and the widths (multiples of 32).
func (b *Backend) expertsTC(y uint64, yStride int, x kernels.Tensor, ip, wp uint64, table *Buffer, experts []kernels.Expert, n, k, hidden,
	inter int, limit float32) bool {
	if !b.tcFits(x, n, experts) {
		return false
	}
	ne := len(experts)
	slots := n * k
	xt := dptr(b.Scratch(kernels.BF16, 3*n, hidden))    // (3, n, hidden) x's terms: hi, mid, lo
	ht := dptr(b.Scratch(kernels.BF16, 3*slots, inter)) // (3, n·k, inter) each slot's SwiGLU's terms
	ye := dptr(b.Scratch(kernels.F32, slots, hidden))   // (n·k, hidden) each slot's expert output
	off := dptr(b.Scratch(kernels.I32, 1, ne+1))        // (experts + 1) where each expert's slots start in perm
	tiles := dptr(b.Scratch(kernels.I32, 1, ne+1))      // (experts + 1) 64-slot tiles before each expert
	perm := dptr(b.Scratch(kernels.I32, 1, slots))      // (n·k) the slots sorted by expert
	gy := uint32(ceilDiv(slots, moeTileM) + ne)
	parts := b.combineParts(n, hidden)
	xp, xs := dptr(x), x.Stride
	gateUp, down := "ferrite_moe_tc_gate_up", "ferrite_moe_tc_down"
	if b.moe.tcU4 {
		gateUp, down = gateUp+"_u4", down+"_u4"
	}
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_moe_sort", 1, 1024, 0, off, tiles, perm, ye, ip, i32(slots), i32(ne), i32(hidden))
		if err == nil {
			err = d.launchL("ferrite_bf16_terms3", d.elementwiseGrid(int64(n*hidden/4)), 256, 0, xt, xp, i32(xs), i32(n), i32(hidden))
		}
		if err == nil {
			err = d.launch3L(gateUp, [3]uint32{uint32(ceilDiv(inter, 16*moeTCWarps)), gy, 1}, 32*moeTCWarps, 0,
				ht, i32(slots), i32(inter), xt, i32(n), i32(hidden), off, tiles, perm, table.ptr, i32(ne), i32(k), f32(limit))
		}
		if err == nil {
			err = d.launch3L(down, [3]uint32{uint32(ceilDiv(hidden, 32*moeTCWarps)), gy, 1}, 32*moeTCWarps, 0,
				ye, i32(hidden), ht, i32(slots), i32(inter), off, tiles, perm, table.ptr, i32(ne), i32(k))
		}
		if err != nil {
			return err
		}
		return d.moeCombine(y, yStride, ye, ip, wp, n, k, hidden, parts)
	})
	return true
}
