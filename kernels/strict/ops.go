package strict

import (
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// Linear implements kernels.LinearOps.
func (d *Device) Linear(dst, x kernels.Tensor, w *kernels.Mat, e kernels.Epilogue) {
	weight("Linear", w)
	contiguous("Linear", dst, x)
	shape("Linear", x, -1, w.Cols)
	shape("Linear", dst, x.Rows, w.Rows)
	xs := d.in("Linear", x, kernels.F32)
	y := make([]float32, dst.Elems())
	if e.Accumulate {
		y = d.in("Linear (accumulate)", dst, kernels.F32)
	}
	var bias []float32
	if e.Bias.Valid() {
		shape("Linear bias", e.Bias, 1, w.Rows)
		bias = d.in("Linear", e.Bias, kernels.F32)
	}
	ref.Linear(y, xs, w, bias, e.Accumulate, x.Rows)
	d.out(dst, y)
}

// LinearCat implements kernels.LinearOps.
func (d *Device) LinearCat(dst, x kernels.Tensor, ws []*kernels.Mat, e kernels.Epilogue) {
	if len(ws) == 0 {
		panic("strict: LinearCat without weights")
	}
	total := 0
	for _, w := range ws {
		stackable("LinearCat", w)
		if w.Cols != ws[0].Cols || w.DType != ws[0].DType {
			panic("strict: LinearCat weights of different widths or dtypes")
		}
		total += w.Rows
	}
	contiguous("LinearCat", dst, x)
	shape("LinearCat", x, -1, ws[0].Cols)
	shape("LinearCat", dst, x.Rows, total)
	xs := d.in("LinearCat", x, kernels.F32)
	y := make([]float32, dst.Elems())
	if e.Accumulate {
		y = d.in("LinearCat (accumulate)", dst, kernels.F32)
	}
	var bias []float32
	if e.Bias.Valid() {
		shape("LinearCat bias", e.Bias, 1, total)
		bias = d.in("LinearCat", e.Bias, kernels.F32)
	}
	ref.LinearCat(y, xs, ws, bias, e.Accumulate, x.Rows)
	d.out(dst, y)
}

// stackable panics unless w is a weight a backend may stack and cache: not
// Transient.
func stackable(op string, w *kernels.Mat) {
	weight(op, w)
	if w.Transient {
		panic("strict: " + op + ": a Transient matrix (backends cache stacked weights)")
	}
}

// SwiGLULinear implements kernels.LinearOps.
func (d *Device) SwiGLULinear(dst, x kernels.Tensor, gate, up *kernels.Mat, limit float32) {
	stackable("SwiGLULinear", gate)
	stackable("SwiGLULinear", up)
	if gate.Rows != up.Rows || gate.Cols != up.Cols || gate.DType != up.DType {
		panic("strict: SwiGLULinear gate and up differ")
	}
	if limit != 0 {
		checkLimit("SwiGLULinear", limit)
	}
	contiguous("SwiGLULinear", dst, x)
	shape("SwiGLULinear", x, -1, gate.Cols)
	shape("SwiGLULinear", dst, x.Rows, gate.Rows)
	y := make([]float32, dst.Elems())
	ref.SwiGLULinear(y, d.in("SwiGLULinear", x, kernels.F32), gate, up, limit, x.Rows)
	d.out(dst, y)
}

// NormLinearCat implements kernels.LinearOps: the norm's checks and
// reference into a scratch tensor, then LinearCat's.
func (d *Device) NormLinearCat(dst, x kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	d.LinearCat(dst, d.normed("NormLinearCat", dst, x, n), ws, e)
}

// AddNormLinearCat implements kernels.LinearOps: the add's checks, then
// NormLinearCat's over sum.
func (d *Device) AddNormLinearCat(dst, sum, x, delta kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	contiguous("AddNormLinearCat", sum, x, delta)
	shape("AddNormLinearCat", sum, x.Rows, x.Cols)
	shape("AddNormLinearCat", delta, x.Rows, x.Cols)
	xs, dl := d.in("AddNormLinearCat", x, kernels.F32), d.in("AddNormLinearCat", delta, kernels.F32)
	for i, v := range dl {
		xs[i] += v
	}
	d.out(sum, xs)
	d.NormLinearCat(dst, sum, n, ws, e)
}

// NormSwiGLULinear implements kernels.LinearOps: the norm as
// NormLinearCat's, then SwiGLULinear's checks and reference.
func (d *Device) NormSwiGLULinear(dst, x kernels.Tensor, n *kernels.HeadNorm, gate, up *kernels.Mat, limit float32) {
	d.SwiGLULinear(dst, d.normed("NormSwiGLULinear", dst, x, n), gate, up, limit)
}

// QKVAttention implements kernels.AttentionOps: PrepareQKV's and
// Attention's checks and references, q in a scratch tensor.
func (d *Device) QKVAttention(out, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	q := d.Scratch(kernels.F32, qkv.Rows, s.Heads*s.HeadDim) // (N, heads·headDim)
	d.PrepareQKV(q, kc, vc, qkv, qn, kn, r, p, s)
	d.Attention(out, q, kc, vc, p, s)
}

// normed checks a fused norm's operands (x and dst contiguous, the weight
// (1, x.Cols)) and returns RMSNorm(x, n) by the reference in a scratch
// tensor.
func (d *Device) normed(op string, dst, x kernels.Tensor, n *kernels.HeadNorm) kernels.Tensor {
	if n == nil {
		panic("strict: " + op + " without a norm")
	}
	contiguous(op, dst, x)
	shape(op+" norm weight", n.W, 1, x.Cols)
	xs := d.in(op, x, kernels.F32)
	ref.RMSNorm(xs, xs, d.in(op, n.W, kernels.F32), n.Eps, n.Offset, x.Rows)
	h := d.Scratch(kernels.F32, x.Rows, x.Cols) // (N, in) the normed rows
	d.out(h, xs)
	return h
}

// SwiGLU implements kernels.LinearOps.
func (d *Device) SwiGLU(dst, gate, up kernels.Tensor) { d.swiglu("SwiGLU", dst, gate, up, 0) }

// SwiGLUClamp implements kernels.ClampOps.
func (d *Device) SwiGLUClamp(dst, gate, up kernels.Tensor, limit float32) {
	checkLimit("SwiGLUClamp", limit)
	d.swiglu("SwiGLUClamp", dst, gate, up, limit)
}

// checkLimit panics unless limit is a positive clamp.
func checkLimit(op string, limit float32) {
	if !(limit > 0) {
		panic("strict: " + op + ": the clamp must be positive")
	}
}

func (d *Device) swiglu(op string, dst, gate, up kernels.Tensor, limit float32) {
	shape(op, gate, dst.Rows, dst.Cols)
	shape(op, up, dst.Rows, dst.Cols)
	g, u := d.in(op, gate, kernels.F32), d.in(op, up, kernels.F32)
	ref.SwiGLUClamp(g, g, u, limit)
	d.out(dst, g)
}

// Embed implements kernels.LinearOps.
func (d *Device) Embed(dst kernels.Tensor, w *kernels.Mat, ids kernels.Tensor) {
	weight("Embed", w)
	shape("Embed", dst, -1, w.Cols)
	shape("Embed ids", ids, dst.Rows, 1)
	id := d.ints("Embed", ids)
	y := make([]float32, dst.Elems())
	for i, t := range id {
		if t < 0 || int(t) >= w.Rows {
			panic("strict: Embed id outside the table")
		}
		w.RowF32(y[i*w.Cols:(i+1)*w.Cols], int(t))
	}
	d.out(dst, y)
}

// GatherRows implements kernels.LinearOps.
func (d *Device) GatherRows(dst, src, rows kernels.Tensor) {
	shape("GatherRows", dst, -1, src.Cols)
	shape("GatherRows rows", rows, dst.Rows, 1)
	r := d.ints("GatherRows", rows)
	x := d.in("GatherRows", src, kernels.F32)
	y := make([]float32, dst.Elems())
	for i, s := range r {
		if s < 0 || int(s) >= src.Rows {
			panic("strict: GatherRows row outside the source")
		}
		copy(y[i*src.Cols:(i+1)*src.Cols], x[int(s)*src.Cols:])
	}
	d.out(dst, y)
}

// RMSNorm implements kernels.NormOps.
func (d *Device) RMSNorm(dst, x, w kernels.Tensor, eps float32, offset bool) {
	shape("RMSNorm", dst, x.Rows, x.Cols)
	shape("RMSNorm weight", w, 1, x.Cols)
	xs, ws := d.in("RMSNorm", x, kernels.F32), d.in("RMSNorm", w, kernels.F32)
	ref.RMSNorm(xs, xs, ws, eps, offset, x.Rows)
	d.out(dst, xs)
}

// AddRMSNorm implements kernels.NormOps.
func (d *Device) AddRMSNorm(dst, res, delta, w kernels.Tensor, eps float32, offset bool) {
	shape("AddRMSNorm", dst, res.Rows, res.Cols)
	shape("AddRMSNorm", delta, res.Rows, res.Cols)
	shape("AddRMSNorm weight", w, 1, res.Cols)
	r, dl := d.in("AddRMSNorm", res, kernels.F32), d.in("AddRMSNorm", delta, kernels.F32)
	ws := d.in("AddRMSNorm", w, kernels.F32)
	for i, v := range dl {
		r[i] += v
	}
	d.out(res, r)
	ref.RMSNorm(r, r, ws, eps, offset, res.Rows)
	d.out(dst, r)
}

// RoPE implements kernels.RopeOps.
func (d *Device) RoPE(x kernels.Tensor, heads, headDim int, pos kernels.Tensor, r *kernels.Rotary) {
	shape("RoPE", x, -1, heads*headDim)
	shape("RoPE positions", pos, x.Rows, 1)
	shape("RoPE frequencies", r.InvFreq, 1, r.Dim/2)
	if r.Dim <= 0 || r.Dim%2 != 0 || r.Dim > headDim {
		panic("strict: RoPE rotary dim")
	}
	xs := d.in("RoPE", x, kernels.F32)
	ref.RoPE(xs, heads, headDim, d.ints("RoPE", pos), d.in("RoPE", r.InvFreq, kernels.F32), r.Interleaved, r.Scale)
	d.out(x, xs)
}

// paged reads and checks p's index tensors for n rows.
func (d *Device) paged(op string, p *kernels.Paged, n, slots int) (pos, seq, slot, blocks []int32) {
	shape(op+" positions", p.Pos, n, 1)
	shape(op+" sequences", p.Seq, n, 1)
	shape(op+" slots", p.Slot, n, 1)
	pos, seq, slot = d.ints(op, p.Pos), d.ints(op, p.Seq), d.ints(op, p.Slot)
	blocks = d.ints(op, p.Blocks)
	for i := range n {
		s := int(seq[i])
		if s < 0 || s >= p.Blocks.Rows || pos[i] < 0 || int(pos[i])/p.BlockSize >= p.Blocks.Cols {
			panic("strict: " + op + ": row outside the block tables")
		}
		b := blocks[s*p.Blocks.Cols+int(pos[i])/p.BlockSize]
		if want := int(b)*p.BlockSize + int(pos[i])%p.BlockSize; want != int(slot[i]) || want >= slots {
			panic("strict: " + op + ": a row's slot does not match its block table")
		}
	}
	return pos, seq, slot, blocks
}

// cacheRow returns slot s of cache layer c as float32.
func (d *Device) cacheRow(c kernels.Tensor, s int) []float32 {
	v := d.view(c, c.DType)
	out := make([]float32, c.Cols)
	for j := range out {
		if c.DType == kernels.BF16 {
			out[j] = kernels.BF16ToF32(v.bf16[s*c.Stride+j])
		} else {
			out[j] = v.f32[s*c.Stride+j]
		}
	}
	return out
}

// StoreKV implements kernels.AttentionOps.
func (d *Device) StoreKV(kc, vc, k, v kernels.Tensor, p *kernels.Paged) {
	shape("StoreKV", k, -1, kc.Cols)
	shape("StoreKV", v, k.Rows, vc.Cols)
	if kc.DType != vc.DType || kc.Rows != vc.Rows || (kc.DType != kernels.F32 && kc.DType != kernels.BF16) {
		panic("strict: StoreKV cache layers must be F32 or BF16 and alike")
	}
	_, _, slot, _ := d.paged("StoreKV", p, k.Rows, kc.Rows)
	d.store(kc, slot, d.in("StoreKV", k, kernels.F32))
	d.store(vc, slot, d.in("StoreKV", v, kernels.F32))
}

// store writes the packed rows xs into cache layer c at slot.
func (d *Device) store(c kernels.Tensor, slot []int32, xs []float32) {
	cv := d.view(c, c.DType)
	for i, s := range slot {
		row := xs[i*c.Cols : (i+1)*c.Cols]
		if c.DType == kernels.BF16 {
			for j, f := range row {
				cv.bf16[int(s)*c.Stride+j] = kernels.F32ToBF16(f)
			}
		} else {
			copy(cv.f32[int(s)*c.Stride:], row)
		}
	}
}

// PrepareQKV implements kernels.AttentionOps.
func (d *Device) PrepareQKV(q, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	shape("PrepareQKV", qkv, -1, qw+2*kw)
	shape("PrepareQKV", q, qkv.Rows, qw)
	shape("PrepareQKV cache", kc, -1, kw)
	shape("PrepareQKV cache", vc, kc.Rows, kw)
	if kc.DType != vc.DType || (kc.DType != kernels.F32 && kc.DType != kernels.BF16) {
		panic("strict: PrepareQKV cache layers must be F32 or BF16 and alike")
	}
	n := qkv.Rows
	pos, _, slot, _ := d.paged("PrepareQKV", p, n, kc.Rows)
	norm := func(hn *kernels.HeadNorm) *ref.Norm {
		if hn == nil {
			return nil
		}
		shape("PrepareQKV norm", hn.W, 1, s.HeadDim)
		return &ref.Norm{W: d.in("PrepareQKV", hn.W, kernels.F32), Eps: hn.Eps, Offset: hn.Offset}
	}
	var rope *ref.Rope
	if r != nil {
		shape("PrepareQKV frequencies", r.InvFreq, 1, r.Dim/2)
		if r.Dim <= 0 || r.Dim%2 != 0 || r.Dim > s.HeadDim {
			panic("strict: PrepareQKV rotary dim")
		}
		rope = &ref.Rope{InvFreq: d.in("PrepareQKV", r.InvFreq, kernels.F32), Interleaved: r.Interleaved, Scale: r.Scale}
	}
	qs, ks, vs := make([]float32, n*qw), make([]float32, n*kw), make([]float32, n*kw)
	ref.PrepareQKV(qs, ks, vs, d.in("PrepareQKV", qkv, kernels.F32), n, s, norm(qn), norm(kn), rope, pos)
	d.out(q, qs)
	d.store(kc, slot, ks)
	d.store(vc, slot, vs)
}

// Attention implements kernels.AttentionOps.
func (d *Device) Attention(out, q, kc, vc kernels.Tensor, p *kernels.Paged, s kernels.AttnShape) {
	if s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 {
		panic("strict: Attention head counts")
	}
	qw := s.Heads * s.HeadDim
	shape("Attention", q, -1, qw)
	shape("Attention", out, q.Rows, qw)
	shape("Attention cache", kc, -1, s.KVHeads*s.HeadDim)
	shape("Attention cache", vc, kc.Rows, s.KVHeads*s.HeadDim)
	pos, seq, _, blocks := d.paged("Attention", p, q.Rows, kc.Rows)
	qs := d.in("Attention", q, kernels.F32)
	y := make([]float32, out.Elems())
	for i := range q.Rows {
		bt := blocks[int(seq[i])*p.Blocks.Cols:]
		slot := func(p0 int) int { return int(bt[p0/p.BlockSize])*p.BlockSize + p0%p.BlockSize }
		ref.Attention(y[i*qw:(i+1)*qw], qs[i*qw:(i+1)*qw], int(pos[i])+1,
			func(p int) []float32 { return d.cacheRow(kc, slot(p)) },
			func(p int) []float32 { return d.cacheRow(vc, slot(p)) }, s)
	}
	d.out(out, y)
}

// Route implements kernels.MoEOps.
func (d *Device) Route(ids, w, logits kernels.Tensor, r *kernels.Router) {
	shape("Route", ids, logits.Rows, r.Width())
	shape("Route", w, logits.Rows, r.Width())
	lg := d.in("Route", logits, kernels.F32)
	var bias []float32
	if r.Bias.Valid() {
		shape("Route bias", r.Bias, 1, logits.Cols)
		bias = d.in("Route", r.Bias, kernels.F32)
	}
	e, k := logits.Cols, r.Width()
	id, ws := make([]int32, ids.Elems()), make([]float32, w.Elems())
	for i := range logits.Rows {
		ref.Route(id[i*k:(i+1)*k], ws[i*k:(i+1)*k], lg[i*e:(i+1)*e], r, bias)
	}
	iv := d.view(ids, kernels.I32)
	for i := range ids.Rows {
		copy(iv.i32[i*ids.Stride:i*ids.Stride+k], id[i*k:])
	}
	d.out(w, ws)
}

// Experts implements kernels.MoEOps.
func (d *Device) Experts(dst, x, ids, w kernels.Tensor, experts []kernels.Expert) {
	d.experts(dst, x, ids, w, experts, 0)
}

// ExpertsClamp implements kernels.ClampOps.
func (d *Device) ExpertsClamp(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, limit float32) {
	checkLimit("ExpertsClamp", limit)
	d.experts(dst, x, ids, w, experts, limit)
}

func (d *Device) experts(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, limit float32) {
	if len(experts) == 0 {
		panic("strict: Experts without experts")
	}
	for _, e := range experts {
		for _, m := range []*kernels.Mat{e.GateUp, e.Gate, e.Up, e.Down} {
			m.Materialize()
		}
	}
	hidden := experts[0].Down.Rows
	shape("Experts", x, -1, hidden)
	shape("Experts", dst, x.Rows, hidden)
	shape("Experts", ids, x.Rows, -1)
	shape("Experts", w, x.Rows, ids.Cols)
	id := d.ints("Experts", ids)
	for _, e := range id {
		if e < 0 || int(e) >= len(experts) {
			panic("strict: Experts id outside the expert list")
		}
	}
	y := make([]float32, dst.Elems())
	ref.ExpertsClamp(y, d.in("Experts", x, kernels.F32), id, d.in("Experts", w, kernels.F32), x.Rows, experts, limit)
	d.out(dst, y)
}
