package cpu

import (
	"encoding/binary"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.KPoolOps = (*Backend)(nil)

// cacheRow returns the first cols values of slot s of cache layer c (F32
// or BF16): a view for F32, converted into buf for BF16.
func cacheRow(c kernels.Tensor, s, cols int, buf []float32) []float32 {
	off := s * c.Stride
	switch c.DType {
	case kernels.F32:
		return f32(c)[off : off+cols]
	case kernels.BF16:
		r := raw(c)[2*off : 2*(off+cols)]
		for j := range cols {
			buf[j] = kernels.BF16ToF32(binary.LittleEndian.Uint16(r[2*j:]))
		}
		return buf[:cols]
	}
	panic("cpu: cache layer dtype must be F32 or BF16")
}

// kpoolPaged unpacks p for a k-pool op over n rows of cache c.
func kpoolPaged(c kernels.Tensor, p *kernels.Paged, kp *kernels.KPool, n int) (pos, seq, slot []int32, table func(s int32) []int32) {
	if c.Cols != 2*kp.Dim || kp.Ape.Rows != kp.Size || kp.Ape.Cols != kp.Dim || p.Pos.Rows != n || p.Slot.Rows != n || p.Seq.Rows != n {
		panic("cpu: k-pool shapes do not match")
	}
	contiguous(p.Pos)
	contiguous(p.Seq)
	contiguous(p.Slot)
	blocks, mb := i32(p.Blocks), p.Blocks.Stride
	return i32(p.Pos), i32(p.Seq), i32(p.Slot), func(s int32) []int32 { return blocks[int(s)*mb : int(s)*mb+p.Blocks.Cols] }
}

// StoreKPool implements kernels.KPoolOps: the rows are stored, then the
// pools they complete are pooled over the worker pool.
func (b *Backend) StoreKPool(cache, k, g kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	contiguous(k)
	contiguous(g)
	if k.Cols != kp.Dim || g.Cols != kp.Dim || g.Rows != k.Rows {
		panic("cpu: StoreKPool shapes do not match")
	}
	pos, seq, slot, table := kpoolPaged(cache, p, kp, k.Rows)
	if kp.NormW.Elems() != kp.Dim || kp.NormB.Elems() != kp.Dim {
		panic("cpu: StoreKPool norm shapes do not match")
	}
	ks, gs, dim := f32(k), f32(g), kp.Dim
	nw, nb := f32(kp.NormW)[:dim], f32(kp.NormB)[:dim]
	row := grow(&b.tmp, 2*dim) // one token's [LayerNorm(k) | γ]
	for i, s := range slot[:k.Rows] {
		ref.LayerNorm(row[:dim], ks[i*dim:(i+1)*dim], nw, nb, kp.NormEps, 1)
		copy(row[dim:], gs[i*dim:(i+1)*dim])
		putRow(cache, int(s), row)
	}
	var closing []int // rows that complete a pool
	for i, t := range pos[:k.Rows] {
		if int(t)%kp.Size == kp.Size-1 {
			closing = append(closing, i)
		}
	}
	ape, bs := f32(kp.Ape), p.BlockSize
	b.Parallel(len(closing), func(lo, hi int) {
		members := make([][]float32, kp.Size)
		for j := range members {
			members[j] = make([]float32, 2*dim)
		}
		prob, key := make([]float64, kp.Size), make([]float32, dim)
		for _, i := range closing[lo:hi] {
			bt, first := table(seq[i]), int(pos[i])+1-kp.Size
			for j := range members {
				q := first + j
				copy(members[j], cacheRow(cache, int(bt[q/bs])*bs+q%bs, 2*dim, members[j]))
			}
			// The pool's key replaces its last member's k; its γ stays.
			ref.KPoolKey(key, members, ape, prob)
			last := members[kp.Size-1]
			copy(last, key)
			putRow(cache, int(slot[i]), last)
		}
	})
}

// KPoolSelect implements kernels.KPoolOps, rows over the worker pool.
func (b *Backend) KPoolSelect(sel, q, w, cache kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	contiguous(sel)
	contiguous(q)
	contiguous(w)
	n, qw, sw := q.Rows, kp.Heads*kp.Dim, kp.SelWidth()
	if q.Cols != qw || w.Cols != kp.Heads || w.Rows != n || sel.Rows != n || sel.Cols != sw {
		panic("cpu: KPoolSelect shapes do not match")
	}
	pos, seq, _, table := kpoolPaged(cache, p, kp, n)
	out, qs, ws, bs := i32(sel), f32(q), f32(w), p.BlockSize
	b.Parallel(n, func(lo, hi int) {
		var scores []float32
		pools, buf := make([]int32, kp.Keep), make([]float32, kp.Dim)
		for i := lo; i < hi; i++ {
			bt, t := table(seq[i]), int(pos[i])
			key := func(P int) []float32 {
				e := P*kp.Size + kp.Size - 1
				return cacheRow(cache, int(bt[e/bs])*bs+e%bs, kp.Dim, buf)
			}
			if c := (t + 1) / kp.Size; cap(scores) < c {
				scores = make([]float32, c)
			}
			ref.KPoolSelect(out[i*sw:(i+1)*sw], qs[i*qw:(i+1)*qw], ws[i*kp.Heads:(i+1)*kp.Heads], t, key, kp, scores, pools)
		}
	})
}
