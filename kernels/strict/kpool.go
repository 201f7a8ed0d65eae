package strict

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.KPoolOps = (*Device)(nil)

// kpoolCheck checks a k-pool cache layer and parameters.
func kpoolCheck(op string, cache kernels.Tensor, kp *kernels.KPool) {
	if cache.DType != kernels.F32 && cache.DType != kernels.BF16 {
		panic("strict: " + op + ": the cache layer must be F32 or BF16")
	}
	if kp.Size <= 0 || kp.Dim <= 0 || kp.Heads <= 0 || kp.Keep < 0 {
		panic("strict: " + op + ": bad k-pool shape")
	}
	shape(op+" cache", cache, -1, 2*kp.Dim)
	shape(op+" ape", kp.Ape, kp.Size, kp.Dim)
}

// pagedSlot is the cache slot of position pos of sequence seq.
func pagedSlot(p *kernels.Paged, blocks []int32, seq, pos int) int {
	if pos < 0 || pos/p.BlockSize >= p.Blocks.Cols {
		panic("strict: position outside the block table")
	}
	return int(blocks[seq*p.Blocks.Cols+pos/p.BlockSize])*p.BlockSize + pos%p.BlockSize
}

// StoreKPool implements kernels.KPoolOps.
func (d *Device) StoreKPool(cache, k, g kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	kpoolCheck("StoreKPool", cache, kp)
	shape("StoreKPool", k, -1, kp.Dim)
	shape("StoreKPool", g, k.Rows, kp.Dim)
	pos, seq, slot, blocks := d.paged("StoreKPool", p, k.Rows, cache.Rows)
	shape("StoreKPool norm", kp.NormW, 1, kp.Dim)
	shape("StoreKPool norm", kp.NormB, 1, kp.Dim)
	ks, gs := d.in("StoreKPool", k, kernels.F32), d.in("StoreKPool", g, kernels.F32)
	ref.LayerNorm(ks, ks, d.in("StoreKPool", kp.NormW, kernels.F32), d.in("StoreKPool", kp.NormB, kernels.F32), kp.NormEps, k.Rows)
	ape := d.in("StoreKPool", kp.Ape, kernels.F32)
	dim := kp.Dim
	for i, s := range slot {
		d.putRow(cache, int(s), append(append([]float32(nil), ks[i*dim:(i+1)*dim]...), gs[i*dim:(i+1)*dim]...))
	}
	members := make([][]float32, kp.Size)
	prob := make([]float64, kp.Size)
	for i, t := range pos {
		if int(t)%kp.Size != kp.Size-1 {
			continue
		}
		first := int(t) + 1 - kp.Size
		for j := range members {
			members[j] = d.cacheRow(cache, pagedSlot(p, blocks, int(seq[i]), first+j))
		}
		last := members[kp.Size-1] // the pool's key replaces its k; its γ stays
		key := make([]float32, dim)
		ref.KPoolKey(key, members, ape, prob)
		d.putRow(cache, int(slot[i]), append(key, last[dim:]...))
	}
}

// KPoolSelect implements kernels.KPoolOps.
func (d *Device) KPoolSelect(sel, q, w, cache kernels.Tensor, p *kernels.Paged, kp *kernels.KPool) {
	kpoolCheck("KPoolSelect", cache, kp)
	shape("KPoolSelect", q, -1, kp.Heads*kp.Dim)
	shape("KPoolSelect", w, q.Rows, kp.Heads)
	shape("KPoolSelect", sel, q.Rows, kp.SelWidth())
	pos, seq, _, blocks := d.paged("KPoolSelect", p, q.Rows, cache.Rows)
	qs, ws := d.in("KPoolSelect", q, kernels.F32), d.in("KPoolSelect", w, kernels.F32)
	qw, sw := kp.Heads*kp.Dim, kp.SelWidth()
	out := make([]int32, q.Rows*sw)
	pools := make([]int32, kp.Keep)
	for i, t := range pos {
		key := func(P int) []float32 {
			return d.cacheRow(cache, pagedSlot(p, blocks, int(seq[i]), P*kp.Size+kp.Size-1))[:kp.Dim]
		}
		scores := make([]float32, (int(t)+1)/kp.Size)
		ref.KPoolSelect(out[i*sw:(i+1)*sw], qs[i*qw:(i+1)*qw], ws[i*kp.Heads:(i+1)*kp.Heads], int(t), key, kp, scores, pools)
	}
	v := d.view(sel, kernels.I32)
	for i := range sel.Rows {
		copy(v.i32[i*sel.Stride:i*sel.Stride+sw], out[i*sw:])
	}
}
