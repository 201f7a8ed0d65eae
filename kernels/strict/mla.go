package strict

import (
	"fmt"
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var (
	_ kernels.MLAOps    = (*Device)(nil)
	_ kernels.SparseOps = (*Device)(nil)
)

// angles returns the rotary's cos and sin at position p, checking its
// shape; a nil r (no rotated dims) gives none.
func (d *Device) angles(op string, r *kernels.Rotary, p int) (cos, sin []float32) {
	if r == nil {
		return nil, nil
	}
	if r.Dim <= 0 || r.Dim%2 != 0 {
		panic("strict: " + op + ": rotary dim")
	}
	shape(op+" frequencies", r.InvFreq, 1, r.Dim/2)
	cos, sin = make([]float32, r.Dim/2), make([]float32, r.Dim/2)
	ref.RopeAngles(cos, sin, d.in(op, r.InvFreq, kernels.F32), p, r.Scale)
	return cos, sin
}

// putRow stores row into slot s of cache layer c (F32 or BF16).
func (d *Device) putRow(c kernels.Tensor, s int, row []float32) {
	cv := d.view(c, c.DType)
	for j, f := range row[:c.Cols] {
		if c.DType == kernels.BF16 {
			cv.bf16[s*c.Stride+j] = kernels.F32ToBF16(f)
		} else {
			cv.f32[s*c.Stride+j] = f
		}
	}
}

// cacheLayer panics unless c is an F32 or BF16 cache layer of width cols.
func cacheLayer(op string, c kernels.Tensor, cols int) {
	shape(op+" cache", c, -1, cols)
	if c.DType != kernels.F32 && c.DType != kernels.BF16 {
		panic(fmt.Sprintf("strict: %s: cache %v must be F32 or BF16", op, c))
	}
}

// StoreLatent implements kernels.MLAOps.
func (d *Device) StoreLatent(cache, kv, norm kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	kl := norm.Cols
	shape("StoreLatent norm", norm, 1, -1)
	shape("StoreLatent", kv, -1, kl+r.RotatedDims())
	cacheLayer("StoreLatent", cache, kv.Cols)
	pos, _, slot, _ := d.paged("StoreLatent", p, kv.Rows, cache.Rows)
	xs, ns := d.in("StoreLatent", kv, kernels.F32), d.in("StoreLatent", norm, kernels.F32)
	row := make([]float32, kv.Cols)
	for i, s := range slot {
		cos, sin := d.angles("StoreLatent", r, int(pos[i]))
		ref.LatentRow(row, xs[i*kv.Cols:(i+1)*kv.Cols], ns, eps, cos, sin, r != nil && r.Interleaved)
		d.putRow(cache, int(s), row)
	}
}

// StoreIndexKey implements kernels.SparseOps.
func (d *Device) StoreIndexKey(cache, k, w, b kernels.Tensor, eps float32, r *kernels.Rotary, p *kernels.Paged) {
	dim := k.Cols
	shape("StoreIndexKey weight", w, 1, dim)
	shape("StoreIndexKey bias", b, 1, dim)
	cacheLayer("StoreIndexKey", cache, dim)
	if r.RotatedDims() > dim {
		panic("strict: StoreIndexKey rotary wider than the key")
	}
	pos, _, slot, _ := d.paged("StoreIndexKey", p, k.Rows, cache.Rows)
	xs := d.in("StoreIndexKey", k, kernels.F32)
	ws, bs := d.in("StoreIndexKey", w, kernels.F32), d.in("StoreIndexKey", b, kernels.F32)
	row := make([]float32, dim)
	for i, s := range slot {
		cos, sin := d.angles("StoreIndexKey", r, int(pos[i]))
		ref.IndexKeyRow(row, xs[i*dim:(i+1)*dim], ws, bs, eps, cos, sin, r != nil && r.Interleaved)
		d.putRow(cache, int(s), row)
	}
}

// selection reads sel (N, k) I32 and checks every row is ascending, then
// −1, within the row's visible positions.
func (d *Device) selection(op string, sel kernels.Tensor, pos []int32) [][]int32 {
	shape(op+" selection", sel, len(pos), -1)
	v := d.ints(op, sel)
	rows := make([][]int32, len(pos))
	for i := range pos {
		row := v[i*sel.Cols : (i+1)*sel.Cols]
		n := 0
		for n < len(row) && row[n] >= 0 {
			if row[n] > pos[i] || (n > 0 && row[n] <= row[n-1]) {
				panic(fmt.Sprintf("strict: %s: row %d selects %v at position %d (ascending, visible positions only)", op, i, row, pos[i]))
			}
			n++
		}
		for _, x := range row[n:] {
			if x != -1 {
				panic(fmt.Sprintf("strict: %s: row %d selection %v has a position after a −1", op, i, row))
			}
		}
		rows[i] = row[:n]
	}
	return rows
}

// AttentionMLA implements kernels.MLAOps with the float64 reference (both
// forms are the same function; Form is ignored).
func (d *Device) AttentionMLA(out, q, cache kernels.Tensor, kvB *kernels.Mat, r *kernels.Rotary, p *kernels.Paged, s kernels.MLAShape, sel kernels.Tensor) {
	weight("AttentionMLA", kvB)
	hd := s.Nope + s.Rope
	shape("AttentionMLA", q, -1, s.Heads*hd)
	shape("AttentionMLA", out, q.Rows, s.Heads*s.V)
	if kvB.Rows != s.Heads*(s.Nope+s.V) || kvB.Cols != s.KVLora {
		panic(fmt.Sprintf("strict: AttentionMLA: kv_b_proj (%d, %d) does not match %+v", kvB.Rows, kvB.Cols, s))
	}
	cacheLayer("AttentionMLA", cache, s.KVLora+s.Rope)
	if r.RotatedDims() != s.Rope {
		panic("strict: AttentionMLA rotary dim is not qk_rope_head_dim")
	}
	pos, seq, _, blocks := d.paged("AttentionMLA", p, q.Rows, cache.Rows)
	var rows [][]int32
	if sel.Valid() {
		rows = d.selection("AttentionMLA", sel, pos)
	}
	qs := d.in("AttentionMLA", q, kernels.F32)
	kvb := ref.MatF32(kvB)
	qw := q.Cols
	y := make([]float32, out.Elems())
	for i := range q.Rows {
		cos, sin := d.angles("AttentionMLA", r, int(pos[i]))
		qr := qs[i*qw : (i+1)*qw]
		ref.RotateMLAQuery(qr, s, cos, sin, r != nil && r.Interleaved)
		keys := rows
		var idx []int32
		if keys != nil {
			idx = keys[i]
		} else {
			for t := range pos[i] + 1 {
				idx = append(idx, t)
			}
		}
		bt := blocks[int(seq[i])*p.Blocks.Cols:]
		slot := func(t int) int { return int(bt[t/p.BlockSize])*p.BlockSize + t%p.BlockSize }
		ref.AttentionMLA(y[i*out.Cols:(i+1)*out.Cols], qr, idx, func(t int) []float32 { return d.cacheRow(cache, slot(t)) }, kvb, s)
	}
	d.out(q, qs)
	d.out(out, y)
}

// IndexerScores implements kernels.SparseOps.
func (d *Device) IndexerScores(scores, q, w, keys kernels.Tensor, p *kernels.Paged, s kernels.IndexerShape) {
	shape("IndexerScores", q, -1, s.Heads*s.Dim)
	shape("IndexerScores weights", w, q.Rows, s.Heads)
	shape("IndexerScores", scores, q.Rows, -1)
	cacheLayer("IndexerScores", keys, s.Dim)
	pos, seq, _, blocks := d.paged("IndexerScores", p, q.Rows, keys.Rows)
	qs, ws := d.in("IndexerScores", q, kernels.F32), d.in("IndexerScores", w, kernels.F32)
	L, qw := scores.Cols, q.Cols
	y := make([]float32, scores.Elems())
	for i := range q.Rows {
		if int(pos[i]) >= L {
			panic("strict: IndexerScores scores narrower than a row's length")
		}
		bt := blocks[int(seq[i])*p.Blocks.Cols:]
		row := y[i*L : (i+1)*L]
		for t := range row {
			switch {
			case t > int(pos[i]):
				row[t] = float32(math.Inf(-1))
			case int(pos[i])+1 <= s.TopK:
				row[t] = 0
			default:
				k := d.cacheRow(keys, int(bt[t/p.BlockSize])*p.BlockSize+t%p.BlockSize)
				row[t] = ref.IndexerScore(qs[i*qw:(i+1)*qw], ws[i*s.Heads:(i+1)*s.Heads], k, s)
			}
		}
	}
	d.out(scores, y)
}

// TopK implements kernels.SparseOps.
func (d *Device) TopK(sel, scores kernels.Tensor) {
	shape("TopK", sel, scores.Rows, -1)
	sc := d.in("TopK", scores, kernels.F32)
	v := d.view(sel, kernels.I32)
	k, L := sel.Cols, scores.Cols
	for i := range sel.Rows {
		ref.SelectTopK(v.i32[i*sel.Stride:i*sel.Stride+k], sc[i*L:(i+1)*L])
	}
}

// ReadI32 implements kernels.SparseOps; reading a poisoned element panics.
func (d *Device) ReadI32(dst []int32, t kernels.Tensor) {
	d.host("ReadI32")
	if len(dst) != t.Elems() {
		panic("strict: ReadI32 length does not match the tensor")
	}
	copy(dst, d.ints("ReadI32", t))
}
