package cpu

import (
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The linear-attention ops (kernels.LinearAttentionOps) on the CPU. The
// delta rule runs every (sequence, value head) pair as one work item over
// the worker pool: token by token for short chunks (deltarecurrent.go), in
// the chunked WY form for prefill (deltachunk.go, deltagemm*.go).

var _ kernels.LinearAttentionOps = (*Backend)(nil)

// recurrentMaxT is the longest chunk the delta rule runs token by token: 8,
// the op's contract (speculative verification equals plain decoding). On a
// CPU the two forms cost about the same per token for long prompts
// (both are dominated by ~3·DK·DV multiply-adds per token and head); the
// chunked form's start-up cost loses for a few tokens.
const recurrentMaxT = 8

// deltaChunk is the chunk size of the WY form. 16 to 32 is some 15–25 %
// faster than FLA's 64 on a CPU, with the same results up to rounding.
const deltaChunk = 32

// convBlock is the channel block of one ShortConv work item.
const convBlock = 64

// minSplitWork is the least work (multiply-adds, roughly) worth spreading
// over the pool: a wake-up of the helpers costs about as much as 16k
// elements, and on a loaded machine much more, so a decode step's small
// per-row ops run on the caller.
const minSplitWork = 1 << 16

// split is Parallel for n items of cost work each, run serially when the
// whole is below minSplitWork.
func (b *Backend) split(n, cost int, fn func(lo, hi int)) {
	if n*cost < minSplitWork {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	b.Parallel(n, fn)
}

// linScratch is the delta rule's host scratch, reused between calls.
type linScratch struct {
	qk   []float32 // (N, 2·KeyHeads·DK) L2-normalised [q | k], q scaled
	g    []float32 // (N, Heads) or (N, Heads·DK) log-decays
	beta []float32 // (N, Heads)
}

// deltaRule is one layer's shape for the head kernels.
type deltaRule struct {
	Heads, KeyHeads, DK, DV int
	PerChannel              bool // G holds one log-decay per key channel
}

func (d *deltaRule) keyHeads() int { return d.KeyHeads }

// deltaSeq is one sequence's rows as the head kernels read them: row t of
// a strided operand X starts at X[t·XStride]; within a row head j occupies
// [j·D, (j+1)·D).
type deltaSeq struct {
	T       int
	Q, K, V []float32 // (T) rows of KeyHeads·DK, KeyHeads·DK, Heads·DV
	Beta    []float32 // (T, Heads)
	G       []float32 // (T, Heads) or (T, Heads, DK)

	QStride, KStride, VStride int

	Out       []float32 // (T) rows of Heads·DV at OutStride
	OutStride int
	State     []float32 // (Heads, DK, DV) the state before row 0, then after row T−1
}

func (d *deltaRule) strides(s *deltaSeq) (qs, ks, vs, os int) {
	return s.QStride, s.KStride, s.VStride, s.OutStride
}

// RecordsStates implements kernels.StateRecorder.
func (b *Backend) RecordsStates() bool { return true }

// seqs reads r's sequence starts and slots, checking them against n rows
// and a state tensor of slots rows.
func seqs(r *kernels.Recurrent, n, slots int) (start, slot []int32) {
	if r.Start.Rows != r.Slot.Rows+1 || r.Start.Cols != 1 || r.Slot.Cols != 1 {
		panic("cpu: Recurrent shapes do not match")
	}
	start, slot = i32(r.Start), i32(r.Slot)
	if start[0] != 0 || int(start[r.Slot.Rows*r.Start.Stride]) != n {
		panic("cpu: Recurrent sequences do not cover the rows")
	}
	for s := range r.Slot.Rows {
		if sl := slot[s*r.Slot.Stride]; sl < 0 || int(sl) >= slots || start[(s+1)*r.Start.Stride] < start[s*r.Start.Stride] {
			panic("cpu: Recurrent slot outside the state tensor or rows out of order")
		}
	}
	return start, slot
}

// records reads r.Record for n rows (nil without it), checking the record
// slots against a state tensor of slots rows and the sequences that record
// against kernels.RecordMaxRows.
func records(r *kernels.Recurrent, n, slots int, start []int32) []int32 {
	if !r.Record.Valid() {
		return nil
	}
	if r.Record.Rows != n || r.Record.Cols != 1 || r.Record.Stride != 1 {
		panic("cpu: Recurrent record shape does not match the rows")
	}
	rec := i32(r.Record)
	ss := r.Start.Stride
	for s := range r.Slot.Rows {
		r0, r1 := int(start[s*ss]), int(start[(s+1)*ss])
		for i := r0; i < r1; i++ {
			if rec[i] >= int32(slots) || rec[i] >= 0 && r1-r0 > kernels.RecordMaxRows {
				panic("cpu: Recurrent record slot outside the state tensor, or a long sequence records")
			}
		}
	}
	return rec
}

// recording reports whether any of rows [r0, r1) records its state.
func recording(rec []int32, r0, r1 int) bool {
	for i := r0; rec != nil && i < r1; i++ {
		if rec[i] >= 0 {
			return true
		}
	}
	return false
}

// ShortConv implements kernels.LinearAttentionOps: (sequence, channel
// block) work items over the pool.
func (b *Backend) ShortConv(dst, x, w, state kernels.Tensor, r *kernels.Recurrent) {
	contiguous(dst)
	contiguous(x)
	contiguous(w)
	C, K := x.Cols, w.Cols
	if dst.Rows != x.Rows || dst.Cols != C || w.Rows != C || K < 1 || state.Cols != (K-1)*C {
		panic("cpu: ShortConv shapes do not match")
	}
	start, slot := seqs(r, x.Rows, state.Rows)
	rec := records(r, x.Rows, state.Rows, start)
	y, xs, ws, st := f32(dst), f32(x), f32(w), f32(state)
	nb := (C + convBlock - 1) / convBlock
	ss, sr := r.Start.Stride, r.Slot.Stride
	b.split(r.Slot.Rows*nb, x.Rows/max(r.Slot.Rows, 1)*convBlock*K, func(lo, hi int) {
		for it := lo; it < hi; it++ {
			s, blk := it/nb, it%nb
			r0, r1 := int(start[s*ss]), int(start[(s+1)*ss])
			sl := int(slot[s*sr])
			conv := st[sl*state.Stride : sl*state.Stride+state.Cols]
			c0, c1 := blk*convBlock, min(C, (blk+1)*convBlock)
			if !recording(rec, r0, r1) {
				convBlockRows(y[r0*C:r1*C], xs[r0*C:r1*C], ws, conv, r1-r0, C, K, c0, c1)
				continue
			}
			// One row at a time, this block's channels of the state
			// copied out after each recording row.
			for i := r0; i < r1; i++ {
				convBlockRows(y[i*C:(i+1)*C], xs[i*C:(i+1)*C], ws, conv, 1, C, K, c0, c1)
				if to := int(rec[i]); to >= 0 {
					dst := st[to*state.Stride : to*state.Stride+state.Cols]
					for j := range K - 1 {
						copy(dst[j*C+c0:j*C+c1], conv[j*C+c0:j*C+c1])
					}
				}
			}
		}
	})
}

// convBlockRows runs ShortConv over channels [c0, c1) of one sequence's T
// rows: y, x (T, C), w (C, K), state ((K−1)·C).
func convBlockRows(y, x, w, state []float32, T, C, K, c0, c1 int) {
	if T == 0 {
		return
	}
	km1, nb := K-1, c1-c0
	// The new state, saved before y (possibly x) is overwritten.
	var buf [7 * convBlock]float32
	tmp := buf[:]
	if km1*nb > len(buf) {
		tmp = make([]float32, km1*nb)
	}
	for i := range km1 {
		if tau := T - km1 + i; tau >= 0 {
			copy(tmp[i*nb:(i+1)*nb], x[tau*C+c0:tau*C+c1])
		} else {
			copy(tmp[i*nb:(i+1)*nb], state[(km1+tau)*C+c0:(km1+tau)*C+c1])
		}
	}
	// Outputs from the last row back, so that y may alias x: y_t only
	// reads inputs at times ≤ t, none of which has been overwritten yet.
	for t := T - 1; t >= 0; t-- {
		yr := y[t*C+c0 : t*C+c1] // [nb]
		for i := range yr {
			ch := c0 + i
			wc := w[ch*K : ch*K+K] // [K]
			var acc float64
			j := 0
			for ; t-km1+j < 0; j++ { // taps reaching into the state
				acc += float64(wc[j]) * float64(state[(t+j)*C+ch])
			}
			for ; j < K; j++ {
				acc += float64(wc[j]) * float64(x[(t-km1+j)*C+ch])
			}
			yr[i] = float32(acc / (1 + math.Exp(-acc)))
		}
	}
	for i := range km1 {
		copy(state[i*C+c0:i*C+c1], tmp[i*nb:(i+1)*nb])
	}
}

// DeltaRule implements kernels.LinearAttentionOps.
func (b *Backend) DeltaRule(out, qkv, a, bt, state kernels.Tensor, r *kernels.Recurrent, n *kernels.DeltaNet) {
	for _, t := range []kernels.Tensor{out, qkv, a, bt} {
		contiguous(t)
	}
	H, Hk, dk, dv := n.Heads, n.KeyHeads, n.DK, n.DV
	gw := H
	if n.PerChannel {
		gw *= dk
	}
	rows, w, kw := qkv.Rows, n.QKVWidth(), Hk*dk
	if H <= 0 || Hk <= 0 || H%Hk != 0 || qkv.Cols != w || out.Rows != rows || out.Cols != H*dv ||
		a.Rows != rows || a.Cols != gw || bt.Rows != rows || bt.Cols != H || state.Cols != n.StateWidth() ||
		n.ALog.Elems() != H || n.DtBias.Elems() != gw {
		panic("cpu: DeltaRule shapes do not match")
	}
	start, slot := seqs(r, rows, state.Rows)
	rec := records(r, rows, state.Rows, start)
	xs, as, bs, aLog, dtBias := f32(qkv), f32(a), f32(bt), f32(n.ALog), f32(n.DtBias)
	ls := &b.lin
	qk := grow(&ls.qk, rows*2*kw)
	g := grow(&ls.g, rows*gw)
	beta := grow(&ls.beta, rows*H)
	qs := float32(1 / math.Sqrt(float64(dk)))
	b.split(rows, 4*kw+2*gw, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := qk[i*2*kw : (i+1)*2*kw]
			copy(row, xs[i*w:i*w+2*kw])
			for j := range 2 * Hk {
				sc := float32(1)
				if j < Hk {
					sc = qs
				}
				ref.L2Normalize(row[j*dk:(j+1)*dk], sc)
			}
			ref.DeltaGates(g[i*gw:(i+1)*gw], beta[i*H:(i+1)*H], as[i*gw:(i+1)*gw], bs[i*H:(i+1)*H], n, aLog, dtBias)
		}
	})
	o, st := f32(out), f32(state)
	rule := &deltaRule{Heads: H, KeyHeads: Hk, DK: dk, DV: dv, PerChannel: n.PerChannel}
	ss, sr := r.Start.Stride, r.Slot.Stride
	b.split(r.Slot.Rows*H, rows/max(r.Slot.Rows, 1)*3*dk*dv, func(lo, hi int) {
		var rw *recWS
		var cw *chunkWS
		for it := lo; it < hi; it++ {
			s, h := it/H, it%H
			r0, r1 := int(start[s*ss]), int(start[(s+1)*ss])
			sl := int(slot[s*sr])
			sq := &deltaSeq{
				T: r1 - r0,
				Q: qk[r0*2*kw:], K: qk[r0*2*kw+kw:], V: xs[r0*w+2*kw:],
				QStride: 2 * kw, KStride: 2 * kw, VStride: w,
				Beta: beta[r0*H:], G: g[r0*gw:],
				Out: o[r0*H*dv:], OutStride: H * dv,
				State: st[sl*state.Stride : sl*state.Stride+state.Cols],
			}
			switch {
			case sq.T == 0:
			case recording(rec, r0, r1):
				// One row at a time, head h's part of the state copied
				// out after each recording row.
				if rw == nil {
					rw = recPool.Get().(*recWS)
					rw.ensure(dk, dv)
				}
				hs := sq.State[h*dk*dv : (h+1)*dk*dv]
				for i := r0; i < r1; i++ {
					row := *sq
					row.T, row.Q, row.K, row.V = 1, qk[i*2*kw:], qk[i*2*kw+kw:], xs[i*w+2*kw:]
					row.Beta, row.G, row.Out = beta[i*H:], g[i*gw:], o[i*H*dv:]
					rule.recurrentHead(&row, h, rw)
					if to := int(rec[i]); to >= 0 {
						copy(st[to*state.Stride+h*dk*dv:], hs)
					}
				}
			case sq.T <= recurrentMaxT:
				if rw == nil {
					rw = recPool.Get().(*recWS)
					rw.ensure(dk, dv)
				}
				rule.recurrentHead(sq, h, rw)
			default:
				if cw == nil {
					cw = chunkPool.Get().(*chunkWS)
					cw.ensure(dk, dv, deltaChunk)
				}
				rule.chunkHead(sq, h, cw)
			}
		}
		if rw != nil {
			recPool.Put(rw)
		}
		if cw != nil {
			chunkPool.Put(cw)
		}
	})
}

// GatedRMSNorm implements kernels.LinearAttentionOps.
func (b *Backend) GatedRMSNorm(dst, x, z, w kernels.Tensor, eps float32, gate kernels.Gate) {
	for _, t := range []kernels.Tensor{dst, x, z} {
		contiguous(t)
		if t.Rows != x.Rows || t.Cols != x.Cols {
			panic("cpu: GatedRMSNorm shapes differ")
		}
	}
	if w.Elems() != x.Cols {
		panic("cpu: GatedRMSNorm weight width")
	}
	y, xs, zs, ws, d := f32(dst), f32(x), f32(z), f32(w), x.Cols
	b.split(x.Rows, 4*d, func(lo, hi int) {
		ref.GatedRMSNorm(y[lo*d:hi*d], xs[lo*d:hi*d], zs[lo*d:hi*d], ws, eps, gate)
	})
}

// SigmoidGate implements kernels.LinearAttentionOps.
func (b *Backend) SigmoidGate(dst, x, gate kernels.Tensor, accumulate bool) {
	contiguous(dst)
	contiguous(x)
	contiguous(gate)
	c, gc := x.Cols, gate.Cols
	if dst.Rows != x.Rows || dst.Cols != c || gate.Rows != x.Rows || (gc != c && gc != 1) {
		panic("cpu: SigmoidGate shapes do not match")
	}
	y, xs, gs := f32(dst), f32(x), f32(gate)
	b.split(x.Rows, 4*c, func(lo, hi int) {
		ref.SigmoidGate(y[lo*c:hi*c], xs[lo*c:hi*c], gs[lo*gc:hi*gc], c, accumulate)
	})
}
