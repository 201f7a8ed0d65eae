package cpu

import (
	"slices"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The op set on the CPU (kernels/ops.go). Element-wise and per-row ops are
// the kernels/ref loops spread over the worker pool; matrix products go
// through MatMul; attention has its own kernels (attention.go).

// grow returns s resized to n values, reallocating only to grow.
func grow(s *[]float32, n int) []float32 {
	if cap(*s) < n {
		*s = make([]float32, n)
	}
	return (*s)[:n]
}

// Linear implements kernels.LinearOps.
func (b *Backend) Linear(dst, x kernels.Tensor, w *kernels.Mat, e kernels.Epilogue) {
	contiguous(dst)
	contiguous(x)
	if x.Cols != w.Cols || dst.Cols != w.Rows || dst.Rows != x.Rows {
		panic("cpu: Linear shapes do not match the weight")
	}
	n, out := x.Rows, w.Rows
	y := f32(dst)
	if e.Accumulate {
		t := grow(&b.tmp, n*out)
		b.MatMul(t, f32(x), w, n)
		for i, v := range t {
			y[i] += v
		}
	} else {
		b.MatMul(y, f32(x), w, n)
	}
	if e.Bias.Valid() {
		bias := f32(e.Bias)[:out]
		for i := range n {
			row := y[i*out : (i+1)*out]
			for j, v := range bias {
				row[j] += v
			}
		}
	}
}

// LinearCat implements kernels.LinearOps: each weight's product goes
// through MatMul straight into its columns of dst, the bias added after;
// with Accumulate, into a scratch block first and then added to them.
func (b *Backend) LinearCat(dst, x kernels.Tensor, ws []*kernels.Mat, e kernels.Epilogue) {
	contiguous(dst)
	contiguous(x)
	total := 0
	for _, w := range ws {
		if w.Cols != x.Cols {
			panic("cpu: LinearCat weights of another width")
		}
		total += w.Rows
	}
	if dst.Cols != total || dst.Rows != x.Rows {
		panic("cpu: LinearCat shapes do not match the weights")
	}
	n := x.Rows
	y, xs := f32(dst), f32(x)
	var bias []float32
	if e.Bias.Valid() {
		bias = f32(e.Bias)[:total]
	}
	if !e.Accumulate {
		if len(ws) <= maxFused {
			var outs [maxFused]mmOut
			c0 := 0
			for i, w := range ws {
				outs[i] = mmOut{y[c0:], total}
				c0 += w.Rows
			}
			b.matMulsTo(outs[:len(ws)], xs, ws, n)
		} else {
			c0 := 0
			for _, w := range ws {
				b.matMulTo(y[c0:], total, xs, w, n)
				c0 += w.Rows
			}
		}
		if bias != nil {
			b.Parallel(n, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					row := y[i*total : (i+1)*total]
					for j, v := range bias {
						row[j] += v
					}
				}
			})
		}
		return
	}
	c0 := 0
	for _, w := range ws {
		t := grow(&b.tmp, n*w.Rows)
		b.MatMul(t, xs, w, n)
		b.Parallel(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				row, tr := y[i*total+c0:i*total+c0+w.Rows], t[i*w.Rows:(i+1)*w.Rows]
				for j, v := range tr {
					if bias != nil {
						v += bias[c0+j]
					}
					row[j] += v
				}
			}
		})
		c0 += w.Rows
	}
}

// SwiGLULinear implements kernels.LinearOps: the two products through
// MatMul, then SwiGLUClamp.
func (b *Backend) SwiGLULinear(dst, x kernels.Tensor, gate, up *kernels.Mat, limit float32) {
	contiguous(dst)
	contiguous(x)
	if gate.Rows != up.Rows || gate.Cols != x.Cols || up.Cols != x.Cols || dst.Cols != gate.Rows || dst.Rows != x.Rows {
		panic("cpu: SwiGLULinear shapes do not match the weights")
	}
	n, inter := x.Rows, gate.Rows
	t := grow(&b.tmp, 2*n*inter)
	g, u := t[:n*inter], t[n*inter:]
	xs := f32(x)
	kernels.CheckMatMul(g, xs, gate, n)
	kernels.CheckMatMul(u, xs, up, n)
	b.matMulsTo([]mmOut{{g, inter}, {u, inter}}, xs, []*kernels.Mat{gate, up}, n)
	y := f32(dst)
	if len(y) < minConvertSplit { // a decode step's: less than a hand-off costs
		swiglu(y, g, u, limit)
		return
	}
	b.Parallel(len(y), func(lo, hi int) { swiglu(y[lo:hi], g[lo:hi], u[lo:hi], limit) })
}

// NormLinearCat implements kernels.LinearOps: RMSNorm into a scratch
// tensor, then LinearCat (the bits of the two ops).
func (b *Backend) NormLinearCat(dst, x kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	b.LinearCat(dst, b.normed(x, n), ws, e)
}

// AddNormLinearCat implements kernels.LinearOps: the add, then
// NormLinearCat over sum.
func (b *Backend) AddNormLinearCat(dst, sum, x, delta kernels.Tensor, n *kernels.HeadNorm, ws []*kernels.Mat, e kernels.Epilogue) {
	for _, t := range []kernels.Tensor{sum, x, delta} {
		contiguous(t)
		if t.Rows != x.Rows || t.Cols != x.Cols {
			panic("cpu: AddNormLinearCat shapes differ")
		}
	}
	y, xs, d := f32(sum), f32(x), f32(delta)
	for i, v := range xs[:x.Elems()] {
		y[i] = v + d[i]
	}
	b.NormLinearCat(dst, sum, n, ws, e)
}

// NormSwiGLULinear implements kernels.LinearOps as NormLinearCat does.
func (b *Backend) NormSwiGLULinear(dst, x kernels.Tensor, n *kernels.HeadNorm, gate, up *kernels.Mat, limit float32) {
	b.SwiGLULinear(dst, b.normed(x, n), gate, up, limit)
}

// QKVAttention implements kernels.AttentionOps: PrepareQKV into a
// scratch q, then Attention.
func (b *Backend) QKVAttention(out, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	q := b.Scratch(kernels.F32, qkv.Rows, s.Heads*s.HeadDim) // (N, heads·headDim)
	b.PrepareQKV(q, kc, vc, qkv, qn, kn, r, p, s)
	b.Attention(out, q, kc, vc, p, s)
}

// normed returns RMSNorm(x, n) in a step's scratch tensor.
func (b *Backend) normed(x kernels.Tensor, n *kernels.HeadNorm) kernels.Tensor {
	h := b.Scratch(kernels.F32, x.Rows, x.Cols) // (N, in) the normed rows
	b.RMSNorm(h, x, n.W, n.Eps, n.Offset)
	return h
}

// SwiGLU implements kernels.LinearOps.
func (b *Backend) SwiGLU(dst, gate, up kernels.Tensor) { b.SwiGLUClamp(dst, gate, up, 0) }

// SwiGLUClamp implements kernels.ClampOps (limit 0: SwiGLU).
func (b *Backend) SwiGLUClamp(dst, gate, up kernels.Tensor, limit float32) {
	for _, t := range []kernels.Tensor{dst, gate, up} {
		contiguous(t)
	}
	if gate.Elems() != dst.Elems() || up.Elems() != dst.Elems() {
		panic("cpu: SwiGLU shapes differ")
	}
	y, g, u := f32(dst), f32(gate), f32(up)
	b.Parallel(len(y), func(lo, hi int) { swiglu(y[lo:hi], g[lo:hi], u[lo:hi], limit) })
}

// Embed implements kernels.LinearOps.
func (b *Backend) Embed(dst kernels.Tensor, w *kernels.Mat, ids kernels.Tensor) {
	if dst.Cols != w.Cols || ids.Rows != dst.Rows || ids.Cols != 1 {
		panic("cpu: Embed shapes do not match")
	}
	y, id := f32(dst), i32(ids)
	for i := range dst.Rows {
		t := int(id[i*ids.Stride])
		if t < 0 || t >= w.Rows {
			panic("cpu: Embed id outside the table")
		}
		w.RowF32(y[i*dst.Stride:i*dst.Stride+dst.Cols], t)
	}
}

// GatherRows implements kernels.LinearOps.
func (b *Backend) GatherRows(dst, src, rows kernels.Tensor) {
	if dst.Cols != src.Cols || rows.Rows != dst.Rows || rows.Cols != 1 {
		panic("cpu: GatherRows shapes do not match")
	}
	y, x, r := f32(dst), f32(src), i32(rows)
	for i := range dst.Rows {
		s := int(r[i*rows.Stride])
		if s < 0 || s >= src.Rows {
			panic("cpu: GatherRows row outside the source")
		}
		copy(y[i*dst.Stride:i*dst.Stride+dst.Cols], x[s*src.Stride:])
	}
}

// RMSNorm implements kernels.NormOps.
func (b *Backend) RMSNorm(dst, x, w kernels.Tensor, eps float32, offset bool) {
	contiguous(dst)
	contiguous(x)
	if dst.Rows != x.Rows || dst.Cols != x.Cols || w.Elems() != x.Cols {
		panic("cpu: RMSNorm shapes do not match")
	}
	y, xs, ws, d := f32(dst), f32(x), f32(w), x.Cols
	b.Parallel(x.Rows, func(lo, hi int) {
		rmsNorm(y[lo*d:hi*d], xs[lo*d:hi*d], ws, eps, offset, hi-lo)
	})
}

// AddRMSNorm implements kernels.NormOps.
func (b *Backend) AddRMSNorm(dst, res, delta, w kernels.Tensor, eps float32, offset bool) {
	for _, t := range []kernels.Tensor{dst, res, delta} {
		contiguous(t)
		if t.Rows != res.Rows || t.Cols != res.Cols {
			panic("cpu: AddRMSNorm shapes differ")
		}
	}
	if w.Elems() != res.Cols {
		panic("cpu: AddRMSNorm weight width")
	}
	y, r, dl, ws, d := f32(dst), f32(res), f32(delta), f32(w), res.Cols
	b.Parallel(res.Rows, func(lo, hi int) {
		rr := r[lo*d : hi*d]
		for i, v := range dl[lo*d : hi*d] {
			rr[i] += v
		}
		rmsNorm(y[lo*d:hi*d], rr, ws, eps, offset, hi-lo)
	})
}

// RoPE implements kernels.RopeOps. The CPU keeps each Rotary's cos/sin
// rows in a table grown to the largest position seen (the same values the
// reference computes per call), so a prefill does not recompute them per
// layer.
func (b *Backend) RoPE(x kernels.Tensor, heads, headDim int, pos kernels.Tensor, r *kernels.Rotary) {
	contiguous(x)
	half := r.Dim / 2
	if x.Cols != heads*headDim || pos.Rows != x.Rows || r.InvFreq.Elems() != half || r.Dim > headDim {
		panic("cpu: RoPE shapes do not match")
	}
	b.rotate(f32(x), x.Rows, heads, headDim, pos, r)
}

// rotate is RoPE over xs (rows, heads·headDim).
func (b *Backend) rotate(xs []float32, rows, heads, headDim int, pos kernels.Tensor, r *kernels.Rotary) {
	half := r.Dim / 2
	ps := i32(pos)
	tab := b.ropeTable(r, maxPos(pos)+1)
	w := heads * headDim
	b.Parallel(rows, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p := int(ps[i*pos.Stride])
			ref.Rotate(xs[i*w:(i+1)*w], heads, headDim, tab.cos[p*half:(p+1)*half], tab.sin[p*half:(p+1)*half], r.Interleaved)
		}
	})
}

// PrepareQKV implements kernels.AttentionOps: q is copied out of qkv and
// normed and rotated in place, k and v go through a scratch row block into
// the cache, the pieces as RMSNorm, RoPE and StoreKV run them.
func (b *Backend) PrepareQKV(q, kc, vc, qkv kernels.Tensor, qn, kn *kernels.HeadNorm, r *kernels.Rotary, p *kernels.Paged, s kernels.AttnShape) {
	contiguous(q)
	contiguous(qkv)
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	n := qkv.Rows
	if qkv.Cols != qw+2*kw || q.Rows != n || q.Cols != qw || kc.Cols != kw || vc.Cols != kw || p.Slot.Rows != n || p.Pos.Rows != n {
		panic("cpu: PrepareQKV shapes do not match")
	}
	if r != nil && (r.InvFreq.Elems() != r.Dim/2 || r.Dim > s.HeadDim) {
		panic("cpu: PrepareQKV rotary does not fit the heads")
	}
	hd := s.HeadDim
	var wq, wk []float32
	if qn != nil {
		wq = f32(qn.W)
	}
	if kn != nil {
		wk = f32(kn.W)
	}
	if qn != nil && len(wq) != hd || kn != nil && len(wk) != hd {
		panic("cpu: PrepareQKV norm width")
	}
	var tab *ropeTab
	if r != nil {
		tab = b.ropeTable(r, maxPos(p.Pos)+1)
	}
	src, qs, w := f32(qkv), f32(q), qkv.Cols
	pos, slots := i32(p.Pos), i32(p.Slot)
	// One pass per row over the workers: q out of qkv, normed and rotated
	// in place; k through a row of scratch into the cache; v straight in.
	b.Parallel(n, func(lo, hi int) {
		k := make([]float32, kw) // (kw) the row's keys
		for i := lo; i < hi; i++ {
			qi := qs[i*qw : (i+1)*qw]
			copy(qi, src[i*w:])
			copy(k, src[i*w+qw:])
			if qn != nil {
				rmsNorm(qi, qi, wq, qn.Eps, qn.Offset, s.Heads)
			}
			if kn != nil {
				rmsNorm(k, k, wk, kn.Eps, kn.Offset, s.KVHeads)
			}
			if r != nil {
				half := r.Dim / 2
				ps := int(pos[i*p.Pos.Stride])
				cos, sin := tab.cos[ps*half:(ps+1)*half], tab.sin[ps*half:(ps+1)*half]
				ref.Rotate(qi, s.Heads, hd, cos, sin, r.Interleaved)
				ref.Rotate(k, s.KVHeads, hd, cos, sin, r.Interleaved)
			}
			sl := int(slots[i*p.Slot.Stride])
			putRow(kc, sl, k)
			putRow(vc, sl, src[i*w+qw+kw:i*w+qw+2*kw])
		}
	})
}

// ropeKey identifies a Rotary's frequencies and scale.
type ropeKey struct {
	freq  *float32
	scale float32
}

// ropeTab is one Rotary's cos and sin rows, (positions, Dim/2) each.
type ropeTab struct{ cos, sin []float32 }

// ropeTable returns r's table covering positions [0, n).
func (b *Backend) ropeTable(r *kernels.Rotary, n int) *ropeTab {
	inv := f32(r.InvFreq)
	key := ropeKey{&inv[0], r.Scale}
	if b.rope == nil {
		b.rope = map[ropeKey]*ropeTab{}
	}
	t := b.rope[key]
	if t == nil {
		t = &ropeTab{}
		b.rope[key] = t
	}
	half := len(inv)
	have := len(t.cos) / half
	if n <= have {
		return t
	}
	n = max(n, 2*have, 256)
	cos := append(t.cos, make([]float32, (n-have)*half)...)
	sin := append(t.sin, make([]float32, (n-have)*half)...)
	for p := have; p < n; p++ {
		ref.RopeAngles(cos[p*half:(p+1)*half], sin[p*half:(p+1)*half], inv, p, r.Scale)
	}
	t.cos, t.sin = cos, sin
	return t
}

// Route implements kernels.MoEOps.
func (b *Backend) Route(ids, w, logits kernels.Tensor, r *kernels.Router) {
	contiguous(logits)
	k := r.Width()
	if ids.Rows != logits.Rows || w.Rows != logits.Rows || ids.Cols != k || w.Cols != k {
		panic("cpu: Route shapes do not match")
	}
	id, ws, lg, e := i32(ids), f32(w), f32(logits), logits.Cols
	var bias []float32
	if r.Bias.Valid() {
		bias = f32(r.Bias)[:e]
	}
	for i := range logits.Rows {
		ref.Route(id[i*k:(i+1)*k], ws[i*k:(i+1)*k], lg[i*e:(i+1)*e], r, bias)
	}
}

// moeScratch is Experts' reusable host scratch.
type moeScratch struct {
	count, fill []int
	tok         []int32
	tw          []float32
	xe, gu, h   []float32
	ye          []float32
	act         []int      // experts with tokens
	side        sideBySide // the active experts side by side, one a worker
}

// sideBySide runs items side by side over the workers, each item's
// products inline on one worker, the workers taking items off a counter
// (on a busy machine one may fall behind): a decode's experts
// (ExpertsClamp) and the absorbed MLA's heads (headMatMuls), products too
// small to split. Item i converts its x into xb[i] and works in
// scratch[i], both kept between calls.
type sideBySide struct {
	next    atomic.Int64
	xb      []xbufs
	scratch [][]float32
}

// run calls fn(i, its xbufs, its scratch) for every i < n over b's workers
// and returns when all have returned.
func (s *sideBySide) run(b *Backend, n int, fn func(i int, xb *xbufs, scratch *[]float32)) {
	for len(s.xb) < n {
		s.xb = append(s.xb, xbufs{})
		s.scratch = append(s.scratch, nil)
	}
	s.next.Store(0)
	b.Parallel(b.pool.workers, func(int, int) {
		for i := int(s.next.Add(1) - 1); i < n; i = int(s.next.Add(1) - 1) {
			fn(i, &s.xb[i], &s.scratch[i])
		}
	})
}

// moeSideBySide is the most tokens an expert may have for the experts to
// run side by side, each on one worker, instead of one after the other
// over all workers: with a few rows, an expert's products are too short to
// be worth splitting (a decode step's experts have one row each).
const moeSideBySide = 4

// Experts implements kernels.MoEOps: (token, weight) pairs are bucketed by
// expert so each expert runs once over its tokens; a token's outputs are
// added in increasing expert id.
func (b *Backend) Experts(dst, x, ids, w kernels.Tensor, experts []kernels.Expert) {
	b.ExpertsClamp(dst, x, ids, w, experts, 0)
}

// ExpertsClamp implements kernels.ClampOps (limit 0: Experts).
func (b *Backend) ExpertsClamp(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, limit float32) {
	contiguous(dst)
	contiguous(x)
	n, k := x.Rows, ids.Cols
	hidden, inter := experts[0].Down.Rows, experts[0].Down.Cols
	if dst.Rows != n || dst.Cols != hidden || x.Cols != hidden || ids.Rows != n || w.Rows != n || w.Cols != k {
		panic("cpu: Experts shapes do not match")
	}
	y, xs, id, ws := f32(dst), f32(x), i32(ids), f32(w)
	b.experts = true
	defer func() { b.experts = false }()
	s := &b.moe
	s.count = slices.Grow(s.count[:0], len(experts)+1)[:len(experts)+1]
	clear(s.count)
	for _, e := range id[:n*k] {
		if e < 0 || int(e) >= len(experts) {
			panic("cpu: Experts id outside the expert list")
		}
		s.count[e+1]++
	}
	for e := range experts {
		s.count[e+1] += s.count[e]
	}
	s.fill = append(s.fill[:0], s.count[:len(experts)]...)
	s.tok = slices.Grow(s.tok[:0], n*k)[:n*k]
	s.tw = grow(&s.tw, n*k)
	// Tokens in increasing order inside each bucket; buckets in expert order.
	for i := range n {
		for j := range k {
			e := id[i*k+j]
			s.tok[s.fill[e]], s.tw[s.fill[e]] = int32(i), ws[i*k+j]
			s.fill[e]++
		}
	}
	clear(y[:n*hidden])
	s.act = s.act[:0]
	most := 0
	for e := range experts {
		if rows := s.count[e+1] - s.count[e]; rows > 0 {
			s.act = append(s.act, e)
			most = max(most, rows)
		}
	}
	side := b.pool.workers > 1 && len(s.act) > 1 && most <= moeSideBySide
	bufRows := most // one expert at a time: its rows from 0
	if side {
		bufRows = n * k // side by side: expert e's rows from count[e]
	}
	xe := grow(&s.xe, bufRows*hidden)
	gu := grow(&s.gu, bufRows*2*inter)
	h := grow(&s.h, bufRows*inter)
	ye := grow(&s.ye, bufRows*hidden)
	// run runs expert e over its tokens with matMul (MatMul, or inline on
	// a worker), rows from at in the buffers, into ye.
	run := func(e, at int, matMul func(y, x []float32, w *kernels.Mat, n int)) {
		lo, hi := s.count[e], s.count[e+1]
		rows := hi - lo
		for r, t := range s.tok[lo:hi] {
			copy(xe[(at+r)*hidden:(at+r+1)*hidden], xs[int(t)*hidden:])
		}
		ex := &experts[e]
		xr, hr := xe[at*hidden:(at+rows)*hidden], h[at*inter:(at+rows)*inter]
		if ex.GateUp != nil {
			g := gu[at*2*inter : (at+rows)*2*inter]
			matMul(g, xr, ex.GateUp, rows)
			for r := range rows {
				row := g[r*2*inter : (r+1)*2*inter]
				swiglu(hr[r*inter:(r+1)*inter], row[:inter], row[inter:], limit)
			}
		} else {
			g, u := gu[2*at*inter:(2*at+rows)*inter], gu[(2*at+rows)*inter:2*(at+rows)*inter]
			matMul(g, xr, ex.Gate, rows)
			matMul(u, xr, ex.Up, rows)
			swiglu(hr, g, u, limit)
		}
		matMul(ye[at*hidden:(at+rows)*hidden], hr, ex.Down, rows)
	}
	add := func(e, at int) { // y += weight·ye, token by token
		lo, hi := s.count[e], s.count[e+1]
		for r, t := range s.tok[lo:hi] {
			axpy(y[int(t)*hidden:(int(t)+1)*hidden], s.tw[lo+r], ye[(at+r)*hidden:(at+r+1)*hidden])
		}
	}
	if !side {
		for _, e := range s.act {
			run(e, 0, b.MatMul)
			add(e, 0)
		}
		return
	}
	s.side.run(b, len(s.act), func(a int, xb *xbufs, scratch *[]float32) {
		run(s.act[a], s.count[s.act[a]], func(y, x []float32, w *kernels.Mat, n int) {
			b.matMulInline(y, x, w, n, xb, scratch)
		})
	})
	for _, e := range s.act { // in increasing expert id, as documented
		add(e, s.count[e])
	}
}

// axpy sets y += a·x.
func axpy(y []float32, a float32, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}
