//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ferrite-llm/ferrite/kernels"

// glm5_next's capabilities on the GPU, the kernels of
// src/ops_mhc_kpool.cu: the clamped SwiGLU (kernels.ClampOps), the mHC
// hyper-connections (kernels.HyperOps) and the k-pool indexer
// (kernels.KPoolOps). Host shape checks, then queued launches, as in
// opset.go.

var (
	_ kernels.ClampOps = (*Backend)(nil)
	_ kernels.HyperOps = (*Backend)(nil)
	_ kernels.KPoolOps = (*Backend)(nil)
)

func init() {
	kernelNames = append(kernelNames, "ferrite_swiglu_clamp", "ferrite_hyper_norm", "ferrite_hyper_mix", "ferrite_hyper_pre",
		"ferrite_hyper_post", "ferrite_hyper_merge", "ferrite_kpool_store", "ferrite_kpool_pool",
		"ferrite_kpool_scores", "ferrite_kpool_select")
}

// SwiGLUClamp implements kernels.ClampOps.
func (b *Backend) SwiGLUClamp(dst, gate, up kernels.Tensor, limit float32) {
	f32Contig("SwiGLUClamp", dst, gate, up)
	if gate.Elems() != dst.Elems() || up.Elems() != dst.Elems() {
		panic("cuda: SwiGLUClamp shapes differ")
	}
	y, g, u, n := dptr(dst), dptr(gate), dptr(up), int64(dst.Elems())
	if n == 0 {
		return
	}
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_swiglu_clamp", d.elementwiseGrid(n), 256, 0, y, g, u, uint64(n), f32(limit))
	})
}

// ExpertsClamp implements kernels.ClampOps: Experts' kernels with the
// clamp in the gate/up kernel's SwiGLU.
func (b *Backend) ExpertsClamp(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, limit float32) {
	b.runExperts(dst, x, ids, w, experts, limit)
}

// hyperMaxStreams is the most residual streams the hyper kernels take.
const hyperMaxStreams = 16

// hyperStreams checks streams (N, hc·hidden) against y (N, hidden), both
// contiguous F32, and returns hc.
func hyperStreams(op string, streams, y kernels.Tensor) int {
	f32Contig(op, streams, y)
	if y.Cols <= 0 || streams.Rows != y.Rows || streams.Cols%y.Cols != 0 {
		panic("cuda: " + op + " streams do not match")
	}
	hc := streams.Cols / y.Cols
	if hc > hyperMaxStreams {
		panic("cuda: " + op + " with more than 16 streams")
	}
	return hc
}

// HyperPre implements kernels.HyperOps: the weightless norm of every
// token's streams, the mix product in float64 (ferrite_hyper_mix), then a
// block per token for the coefficients (Sinkhorn on one thread) and the
// pre-weighted sum.
func (b *Backend) HyperPre(x, coef, streams kernels.Tensor, h *kernels.Hyper) {
	hc := h.Streams
	f32Contig("HyperPre", coef, h.Base)
	m, cw := (2+hc)*hc, hc+hc*hc
	if hc < 1 || hyperStreams("HyperPre", streams, x) != hc || coef.Rows != x.Rows || coef.Cols != cw ||
		h.Fn.Rows != m || h.Fn.Cols != streams.Cols || h.Base.Elems() != m || h.Iters < 1 {
		panic("cuda: HyperPre shapes do not match")
	}
	n, w, hidden := x.Rows, streams.Cols, x.Cols
	if n == 0 {
		return
	}
	fn, err := b.weight(h.Fn)
	if err != nil {
		b.fail(err)
		return
	}
	var scale uint64
	if fn.Scale != nil {
		scale = fn.Scale.ptr
	}
	xn := dptr(b.Scratch(kernels.F32, n, w))  // (N, hc·hidden) normed streams
	mix := dptr(b.Scratch(kernels.F32, n, m)) // (N, (2+hc)·hc)
	X, xp, cp, base := dptr(streams), dptr(x), dptr(coef), dptr(h.Base)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_hyper_norm", uint32(n), 256, 0, xn, X, i32(w), f32(h.NormEps))
		if err == nil {
			err = d.launch3L("ferrite_hyper_mix", [3]uint32{uint32(ceilDiv(n, 4)), uint32(m), 1}, 256, 0, mix, xn, fn.Buf.ptr, scale,
				i32(n), i32(m), i32(w), i32(int(fn.DType)), i32(max(fn.BlockRows, 1)), i32(max(fn.BlockCols, 1)))
		}
		if err != nil {
			return err
		}
		return d.launchL("ferrite_hyper_pre", uint32(n), 128, 0, xp, cp, X, mix, base, i32(hidden), i32(hc), i32(h.Iters),
			f32(h.Scale[0]), f32(h.Scale[1]), f32(h.Scale[2]), f32(h.Eps))
	})
}

// HyperPost implements kernels.HyperOps.
func (b *Backend) HyperPost(streams, y, coef kernels.Tensor) {
	hc := hyperStreams("HyperPost", streams, y)
	f32Contig("HyperPost", coef)
	if coef.Rows != y.Rows || coef.Cols != hc+hc*hc {
		panic("cuda: HyperPost coefficients do not match the streams")
	}
	total := int64(y.Rows) * int64(y.Cols)
	if total == 0 {
		return
	}
	X, yp, cp := dptr(streams), dptr(y), dptr(coef)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_hyper_post", d.elementwiseGrid(total), 256, 0, X, yp, cp, i32(y.Rows), i32(y.Cols), i32(hc))
	})
}

// HyperMerge implements kernels.HyperOps.
func (b *Backend) HyperMerge(dst, streams kernels.Tensor) {
	hc := hyperStreams("HyperMerge", streams, dst)
	total := int64(dst.Rows) * int64(dst.Cols)
	if total == 0 {
		return
	}
	y, X := dptr(dst), dptr(streams)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_hyper_merge", d.elementwiseGrid(total), 256, 0, y, X, i32(dst.Rows), i32(dst.Cols), i32(hc))
	})
}

// kpoolCheck checks a k-pool op's cache layer (slots, 2·Dim), F32 or BF16,
// its parameters and the paged map of n rows (contiguous Pos, Seq, Slot),
// and reports whether the cache is BF16.
func kpoolCheck(op string, cache kernels.Tensor, p *kernels.Paged, kp *kernels.KPool, n int) bool {
	if cache.DType != kernels.F32 && cache.DType != kernels.BF16 {
		panic("cuda: " + op + " cache dtype must be F32 or BF16")
	}
	f32Contig(op, kp.Ape)
	if !cache.Contiguous() || cache.Cols != 2*kp.Dim || kp.Size < 1 || kp.Dim < 1 || kp.Ape.Rows != kp.Size || kp.Ape.Cols != kp.Dim {
		panic("cuda: " + op + " shapes do not match")
	}
	for _, t := range []kernels.Tensor{p.Pos, p.Seq, p.Slot} {
		index(op, t, n, 1)
		if t.Stride != 1 && n > 1 {
			panic("cuda: " + op + " wants contiguous positions, sequences and slots")
		}
	}
	if !p.Blocks.Contiguous() || p.Blocks.DType != kernels.I32 || p.BlockSize <= 0 {
		panic("cuda: " + op + " block table")
	}
	return cache.DType == kernels.BF16
}

// StoreKPool implements kernels.KPoolOps: every row's [LayerNorm(k) | γ]
// is stored, then a second launch pools the pools the rows complete.
func (b *Backend) StoreKPool(cache, k, g kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	f32Contig("StoreKPool", k, g, kp.NormW, kp.NormB)
	n := k.Rows
	bf := kpoolCheck("StoreKPool", cache, p, kp, n)
	if k.Cols != kp.Dim || g.Cols != kp.Dim || g.Rows != n || kp.NormW.Elems() != kp.Dim || kp.NormB.Elems() != kp.Dim {
		panic("cuda: StoreKPool shapes do not match")
	}
	if n == 0 {
		return
	}
	c, kp0, gp, nw, nb, ape := dptr(cache), dptr(k), dptr(g), dptr(kp.NormW), dptr(kp.NormB), dptr(kp.Ape)
	pos, seq, slot, bt := dptr(p.Pos), dptr(p.Seq), dptr(p.Slot), dptr(p.Blocks)
	b.queue(func(d *Device) error {
		err := d.launchL("ferrite_kpool_store", uint32(n), 128, 0, c, kp0, gp, slot, i32(cache.Rows), i32(kp.Dim),
			nw, nb, f32(kp.NormEps), b32(bf))
		if err != nil {
			return err
		}
		return d.launchL("ferrite_kpool_pool", uint32(n), 128, 0, c, pos, seq, slot, bt, i32(p.Blocks.Cols), i32(p.BlockSize),
			i32(cache.Rows), i32(kp.Dim), i32(kp.Size), ape, b32(bf))
	})
}

// kpoolTile is the pools a block of ferrite_kpool_scores scores.
const kpoolTile = 64

// kpoolScoreElems bounds KPoolSelect's score scratch (64 MiB), a long
// prefill's rows taking turns (a variable for tests).
var kpoolScoreElems = 16 << 20

// KPoolSelect implements kernels.KPoolOps: the pool scores of every row
// into scratch (blocks of kpoolTile pools), then a block per row selects
// its best pools by a radix select and writes their tokens and the tail's.
func (b *Backend) KPoolSelect(sel, q, w, cache kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	f32Contig("KPoolSelect", q, w)
	n, sw := q.Rows, kp.SelWidth()
	bf := kpoolCheck("KPoolSelect", cache, p, kp, n)
	index("KPoolSelect", sel, n, sw)
	if kp.Heads < 1 || kp.Keep < 0 || q.Cols != kp.Heads*kp.Dim || w.Rows != n || w.Cols != kp.Heads {
		panic("cuda: KPoolSelect shapes do not match")
	}
	smem := (kp.Heads*(kp.Dim+1) + 4*kp.Dim) * 4
	if smem > 48<<10 {
		panic("cuda: KPoolSelect queries larger than shared memory holds")
	}
	if n == 0 || sw == 0 {
		return
	}
	// L: the most complete pools a row of this block table can see. The
	// rows go kpoolScoreElems scores at a time through one scratch.
	L := max(1, p.Blocks.Cols*p.BlockSize/kp.Size)
	chunk := max(1, min(n, kpoolScoreElems/L))
	scores := b.Scratch(kernels.F32, chunk, L) // (chunk, L) pool scores
	sc, c, bt := dptr(scores), dptr(cache), dptr(p.Blocks)
	for r0 := 0; r0 < n; r0 += chunk {
		m := min(chunk, n-r0)
		qp, wp, pos, seq := dptr(q.Slice(r0, r0+m)), dptr(w.Slice(r0, r0+m)), dptr(p.Pos.Slice(r0, r0+m)), dptr(p.Seq.Slice(r0, r0+m))
		b.queue(func(d *Device) error {
			return d.launch3L("ferrite_kpool_scores", [3]uint32{uint32(m), uint32(ceilDiv(L, kpoolTile)), 1}, 128, uint32(smem),
				sc, i32(L), qp, wp, c, pos, seq, bt, i32(p.Blocks.Cols), i32(p.BlockSize), i32(kp.Heads), i32(kp.Dim),
				i32(kp.Size), f32(kp.Scale), b32(bf))
		})
		b.kpoolSelect(sel.Slice(r0, r0+m), scores.Slice(0, m), p.Pos.Slice(r0, r0+m), kp)
	}
}

// kpoolSelect queues the selection of KPoolSelect from the pool scores
// (n, L) F32 of rows at positions pos (n, 1) I32: row i reads its first
// (pos_i+1)/Size scores.
func (b *Backend) kpoolSelect(sel, scores, pos kernels.Tensor, kp *kernels.KPool) {
	n, sw := scores.Rows, kp.SelWidth()
	sp, sc, pp := dptr(sel), dptr(scores), dptr(pos)
	b.queue(func(d *Device) error {
		return d.launchL("ferrite_kpool_select", uint32(n), 256, 0, sp, i32(sw), sc, i32(scores.Stride), pp, i32(kp.Size),
			i32(kp.Keep), b32(kp.Tail))
	})
}
