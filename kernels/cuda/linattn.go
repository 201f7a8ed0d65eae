//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ferrite-llm/ferrite/kernels"

// The linear-attention ops (kernels.LinearAttentionOps: qwen3_next's Gated
// DeltaNet, glm5_next's KDA) on the GPU, the kernels of
// src/ops_linattn.cu. As in opset.go: shapes checked on the host, launches
// queued, nothing read back; the sequence map and the state slots are
// device data the kernels read, so a step with recurrent layers is
// captured in a graph like any other.

var _ kernels.LinearAttentionOps = (*Backend)(nil)

func init() {
	kernelNames = append(kernelNames, "ferrite_short_conv", "ferrite_short_conv_rows", "ferrite_short_conv_state", "ferrite_delta_prep",
		"ferrite_delta_rule_1", "ferrite_delta_rule_2", "ferrite_delta_rule_4", "ferrite_delta_rule_8",
		"ferrite_gated_rmsnorm", "ferrite_sigmoid_gate")
	kernelNames = append(kernelNames, deltaChunkKernels[:]...)
	bigSmemKernels = append(bigSmemKernels, deltaChunkKernels[:]...)
}

// Limits of the kernels: the convolution's width, the key head size.
const (
	convRun     = 16 // rows a thread of ferrite_short_conv_rows (kConvRun)
	convMaxK    = 8
	deltaMaxDK  = 256
	deltaBlockV = 8 // state columns per block of ferrite_delta_rule_*
)

// deltaKernels[i] handles key heads of up to 32·2^i.
var deltaKernels = [4]string{"ferrite_delta_rule_1", "ferrite_delta_rule_2", "ferrite_delta_rule_4", "ferrite_delta_rule_8"}

// keyLanes is i of the delta-rule kernels (deltaKernels[i],
// deltaChunkKernels[i]) for key heads of dk: the least with 32·2^i ≥ dk.
func keyLanes(dk int) int {
	i := 0
	for 32<<i < dk {
		i++
	}
	return i
}

// The chunked form of the delta rule (src/ops_linattn_chunk.cu) for the
// sequences of a call longer than deltaRecurrentMax rows: chunks of
// deltaChunkL rows, deltaChunkCols state columns a block of
// deltaChunkThreads threads; deltaChunkKernels[i] handles key heads of up
// to 32·2^i (128 at most: a block's shared memory holds the chunk's
// float64 products, deltaChunkSmem).
const (
	deltaRecurrentMax = 8 // kDeltaRecurrentMax: longer sequences keep the state in float64 across the call
	deltaChunkL       = 32
	deltaChunkCols    = 32
	deltaChunkThreads = 256
)

var deltaChunkKernels = [3]string{"ferrite_delta_chunk_1", "ferrite_delta_chunk_2", "ferrite_delta_chunk_4"}

// deltaChunkSmem is the chunked kernel's dynamic shared memory for key
// heads of dk (chunk_layout in src/ops_linattn_chunk.cu), in float64: S
// (dk, cols), A and P (L, L+1), R (2L, cols), Vn (L, cols), β (L); per
// channel also eg/Kt (L, dk), M (2L, dk+1), e^{Γ_{L−1}} (dk, even) and, in
// float32, k and q (L, dk); with one decay a head k and q (L, dk+1) and
// three (L) decay columns.
func deltaChunkSmem(dk int, perChannel bool) int {
	const L, C = deltaChunkL, deltaChunkCols
	doubles := dk*C + 2*L*(L+1) + 2*L*C + L*C + L
	if perChannel {
		return (doubles+L*dk+2*L*(dk+1)+dk+(dk&1))*8 + 2*L*dk*4
	}
	return (doubles + 2*L*(dk+1) + 3*L) * 8
}

// deltaChunked reports whether a DeltaRule call of rows over seqs
// sequences with key heads of dk runs its long sequences in the chunked
// form: some sequence can be longer than deltaRecurrentMax rows, no state
// is recorded after each row (recording steps are verifications, at most
// deltaRecurrentMax rows a sequence), the key heads fit a chunked kernel
// (a multiple of 4 up to 128) and its shared memory fits the device's
// blocks. Off unless FERRITE_CUDA_DELTA_CHUNK=1 (deltaChunk): on the H200
// it measured slower than the row-by-row kernel (BENCHMARKS.md, "Hybrid
// prefill on the GPU: the short convolution over all rows, the chunked
// delta rule").
func (b *Backend) deltaChunked(rows, seqs, dk int, perChannel, recording bool) int {
	kpl := keyLanes(dk)
	if !b.deltaChunk || recording || rows-seqs+1 <= deltaRecurrentMax || kpl >= len(deltaChunkKernels) ||
		dk%4 != 0 || deltaChunkSmem(dk, perChannel) > b.dev.SmemOptIn {
		return -1
	}
	return kpl
}

// recurrent checks r against a step of n rows and a state tensor (F32,
// width cols) and returns the sequence count.
func recurrent(op string, r *kernels.Recurrent, state kernels.Tensor, cols int) int {
	seqs := r.Slot.Rows
	index(op, r.Start, seqs+1, 1)
	index(op, r.Slot, seqs, 1)
	if state.DType != kernels.F32 || state.Cols != cols {
		panic("cuda: " + op + " state tensor " + state.String() + " does not match")
	}
	return seqs
}

// RecordsStates implements kernels.StateRecorder: ShortConv and DeltaRule
// honour Recurrent.Record.
func (b *Backend) RecordsStates() bool { return true }

// record returns r.Record's device address and row stride for a step of n
// rows, or zeros without it.
func record(op string, r *kernels.Recurrent, n int) (uint64, uint64) {
	if !r.Record.Valid() {
		return 0, 0
	}
	index(op+" record", r.Record, n, 1)
	return dptr(r.Record), i32(r.Record.Stride)
}

// ShortConv implements kernels.LinearAttentionOps. Where convRows says so
// (a prompt: some sequence longer than deltaRecurrentMax rows, no states
// recorded), every row at once: ferrite_short_conv_rows into y (a scratch
// copy when dst is x), ferrite_short_conv_state for the states, then the
// copy to dst; otherwise a thread per (sequence, channel) runs the
// sequence's rows in order (ferrite_short_conv). The same bits either way.
func (b *Backend) ShortConv(dst, x, w, state kernels.Tensor, r *kernels.Recurrent) {
	f32Contig("ShortConv", dst, x, w)
	C, K := x.Cols, w.Cols
	if dst.Rows != x.Rows || dst.Cols != C || w.Rows != C || K < 1 || K > convMaxK {
		panic("cuda: ShortConv shapes do not match")
	}
	seqs := recurrent("ShortConv", r, state, (K-1)*C)
	if seqs == 0 || C == 0 {
		return
	}
	y, xp, wp, st, start, slot := dptr(dst), dptr(x), dptr(w), dptr(state), dptr(r.Start), dptr(r.Slot)
	rec, recStride := record("ShortConv", r, x.Rows)
	if b.convRows(x.Rows, seqs, rec != 0) {
		out, inPlace := dst, dptr(dst) == dptr(x)
		if inPlace {
			out = b.Scratch(kernels.F32, x.Rows, C)
		}
		yp, n, cb := dptr(out), x.Rows, uint32(ceilDiv(C, 128))
		b.queue(func(d *Device) error {
			err := d.launch3L("ferrite_short_conv_rows", [3]uint32{uint32(ceilDiv(n, convRun)), cb, 1}, 128, 0,
				yp, xp, wp, st, i32(state.Stride), start, i32(r.Start.Stride), slot, i32(r.Slot.Stride), i32(seqs),
				i32(n), i32(C), i32(K))
			if err != nil {
				return err
			}
			return d.launch3L("ferrite_short_conv_state", [3]uint32{uint32(seqs), cb, 1}, 128, 0,
				xp, st, i32(state.Stride), start, i32(r.Start.Stride), slot, i32(r.Slot.Stride), i32(C), i32(K))
		})
		if inPlace {
			b.Copy(dst, out)
		}
		return
	}
	b.queue(func(d *Device) error {
		return d.launch3L("ferrite_short_conv", [3]uint32{uint32(seqs), uint32(ceilDiv(C, 128)), 1}, 128, 0,
			y, xp, wp, st, i32(state.Stride), start, i32(r.Start.Stride), slot, i32(r.Slot.Stride), i32(C), i32(K),
			rec, recStride)
	})
}

// convRows reports whether a ShortConv call of rows over seqs sequences
// runs every row at once: some sequence can be longer than
// deltaRecurrentMax rows and no state is recorded after each row;
// FERRITE_CUDA_CONV_ROWS=0 (noConvRows) keeps the row-by-row kernel.
func (b *Backend) convRows(rows, seqs int, recording bool) bool {
	return !b.noConvRows && !recording && rows-seqs+1 > deltaRecurrentMax
}

// DeltaRule implements kernels.LinearAttentionOps: ferrite_delta_prep
// normalises q and k and forms the gates of every row, then a block per
// (sequence, value head, 8 state columns) runs the rule over the
// sequence's rows with its part of the state in registers: token by token
// with the state rounded after every row for up to 8 rows, in float64
// across the call beyond (the contract's two forms; see ops_linattn.cu).
// Where deltaChunked says so (FERRITE_CUDA_DELTA_CHUNK=1), the sequences of
// more than 8 rows run in the chunked WY form instead (ferrite_delta_chunk_*,
// the same float64 arithmetic up to the order of its sums, 32 rows a step),
// and the row-by-row kernel skips them.
func (b *Backend) DeltaRule(out, qkv, a, bt, state kernels.Tensor, r *kernels.Recurrent, n *kernels.DeltaNet) {
	f32Contig("DeltaRule", out, qkv, a, bt, n.ALog, n.DtBias)
	H, Hk, dk, dv := n.Heads, n.KeyHeads, n.DK, n.DV
	if H <= 0 || Hk <= 0 || H%Hk != 0 || dk <= 0 || dv <= 0 {
		panic("cuda: DeltaRule head shape")
	}
	if dk > deltaMaxDK {
		panic("cuda: DeltaRule key heads above 256")
	}
	gw := H
	if n.PerChannel {
		gw *= dk
	}
	rows, w := qkv.Rows, n.QKVWidth()
	if qkv.Cols != w || out.Rows != rows || out.Cols != H*dv || a.Rows != rows || a.Cols != gw ||
		bt.Rows != rows || bt.Cols != H || n.ALog.Elems() != H || n.DtBias.Elems() != gw {
		panic("cuda: DeltaRule shapes do not match")
	}
	seqs := recurrent("DeltaRule", r, state, n.StateWidth())
	if seqs == 0 || rows == 0 {
		return
	}
	kpl := keyLanes(dk)
	qk := dptr(b.Scratch(kernels.F32, rows, 2*Hk*dk)) // (rows, 2·Hk·DK) normalised [q | k]
	dec := dptr(b.Scratch(kernels.F32, rows, 2*gw))   // (rows, gw) float64 decays e^g
	beta := dptr(b.Scratch(kernels.F32, rows, H))     // (rows, H) write strengths
	o, xp, ap, bp, alog, dtb := dptr(out), dptr(qkv), dptr(a), dptr(bt), dptr(n.ALog), dptr(n.DtBias)
	st, start, slot := dptr(state), dptr(r.Start), dptr(r.Slot)
	rec, recStride := record("DeltaRule", r, rows)
	ck := b.deltaChunked(rows, seqs, dk, n.PerChannel, rec != 0)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_delta_prep", uint32(rows), 128, 0, qk, dec, beta, xp, ap, bp, alog, dtb,
			i32(w), i32(H), i32(Hk), i32(dk), b32(n.PerChannel), f32(n.LowerBound))
		if err != nil {
			return err
		}
		err = d.launch3L(deltaKernels[kpl], [3]uint32{uint32(seqs), uint32(H), uint32(ceilDiv(dv, deltaBlockV))}, 128, 0,
			o, qk, xp, dec, beta, st, i32(state.Stride), start, i32(r.Start.Stride), slot, i32(r.Slot.Stride),
			i32(H), i32(Hk), i32(dk), i32(dv), b32(n.PerChannel), rec, recStride, b32(ck >= 0))
		if err != nil || ck < 0 {
			return err
		}
		return d.launch3L(deltaChunkKernels[ck], [3]uint32{uint32(seqs), uint32(H), uint32(ceilDiv(dv, deltaChunkCols))},
			deltaChunkThreads, uint32(deltaChunkSmem(dk, n.PerChannel)), o, qk, xp, dec, beta, st, i32(state.Stride), start,
			i32(r.Start.Stride), slot, i32(r.Slot.Stride), i32(H), i32(Hk), i32(dk), i32(dv), b32(n.PerChannel))
	})
}

// GatedRMSNorm implements kernels.LinearAttentionOps: a block per row.
func (b *Backend) GatedRMSNorm(dst, x, z, w kernels.Tensor, eps float32, gate kernels.Gate) {
	f32Contig("GatedRMSNorm", dst, x, z, w)
	for _, t := range []kernels.Tensor{dst, z} {
		if t.Rows != x.Rows || t.Cols != x.Cols {
			panic("cuda: GatedRMSNorm shapes differ")
		}
	}
	if w.Elems() != x.Cols {
		panic("cuda: GatedRMSNorm weight width")
	}
	if x.Rows == 0 || x.Cols == 0 {
		return
	}
	y, xp, zp, wp := dptr(dst), dptr(x), dptr(z), dptr(w)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_gated_rmsnorm", uint32(x.Rows), 128, 0, y, xp, zp, wp, i32(x.Cols), f32(eps), b32(gate == kernels.GateSiLU))
	})
}

// SigmoidGate implements kernels.LinearAttentionOps.
func (b *Backend) SigmoidGate(dst, x, gate kernels.Tensor, accumulate bool) {
	f32Contig("SigmoidGate", dst, x, gate)
	c, gc := x.Cols, gate.Cols
	if dst.Rows != x.Rows || dst.Cols != c || gate.Rows != x.Rows || (gc != c && gc != 1) {
		panic("cuda: SigmoidGate shapes do not match")
	}
	total := int64(x.Rows) * int64(c)
	if total == 0 {
		return
	}
	y, xp, gp := dptr(dst), dptr(x), dptr(gate)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_sigmoid_gate", d.elementwiseGrid(total), 256, 0, y, xp, gp, uint64(total), i32(c),
			b32(gc == 1), b32(accumulate))
	})
}
