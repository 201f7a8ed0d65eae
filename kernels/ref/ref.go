// Package ref holds the golden references of the op set (kernels/ops.go):
// plain Go loops over host slices, float64 wherever the math benefits,
// written for clarity rather than speed. The strict test backend computes
// with them and the conformance suite (kernels/kerneltest) checks every
// backend against them, so each formula exists once.
package ref

import (
	"cmp"
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Silu is x·sigmoid(x).
func Silu(x float32) float32 { return float32(float64(x) / (1 + math.Exp(-float64(x)))) }

// Sigmoid is 1/(1+e^-x).
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// Softmax replaces x with softmax(x) (max-subtracted, float64 sum).
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := slices.Max(x)
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - m))
		x[i] = float32(e)
		sum += e
	}
	inv := 1 / sum
	for i, v := range x {
		x[i] = float32(float64(v) * inv)
	}
}

// RMSNorm sets y (rows, len(w)) = w ⊙ x·rsqrt(mean(x²) + eps), or (1 + w) ⊙ …
// with offset, over rows of x. The mean of squares is summed in float64 and
// rounded to float32 before eps is added, as the PyTorch reference does.
// y may be x.
func RMSNorm(y, x, w []float32, eps float32, offset bool, rows int) {
	d := len(w)
	for i := range rows {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		ms := float32(ss / float64(d))
		inv := float32(1 / math.Sqrt(float64(ms+eps)))
		if offset {
			for j, v := range xr {
				yr[j] = (1 + w[j]) * (v * inv)
			}
		} else {
			for j, v := range xr {
				yr[j] = w[j] * (v * inv)
			}
		}
	}
}

// Linear sets y (n, w.Rows) = x·wᵀ + bias (bias may be nil), or adds that
// to y when acc, with float64 dot products (kernels.MatMulRef).
func Linear(y, x []float32, w *kernels.Mat, bias []float32, acc bool, n int) {
	out := w.Rows
	t := make([]float32, n*out)
	kernels.MatMulRef(t, x, w, n)
	for i := range n {
		for j := range out {
			v := t[i*out+j]
			if bias != nil {
				v += bias[j]
			}
			if acc {
				v += y[i*out+j]
			}
			y[i*out+j] = v
		}
	}
}

// SwiGLU sets y[i] = silu(gate[i])·up[i]; y may be gate.
func SwiGLU(y, gate, up []float32) {
	for i, g := range gate {
		y[i] = Silu(g) * up[i]
	}
}

// SwiGLUClamp sets y[i] = silu(min(gate[i], limit))·clamp(up[i], −limit,
// limit) (kernels.ClampOps); limit 0 means no clamp (SwiGLU). y may be
// gate.
func SwiGLUClamp(y, gate, up []float32, limit float32) {
	if limit == 0 {
		SwiGLU(y, gate, up)
		return
	}
	for i, g := range gate {
		y[i] = Silu(min(g, limit)) * max(min(up[i], limit), -limit)
	}
}

// RopeAngles sets cos and sin (len(invFreq) each) for position pos:
// angle = float32(pos)·invFreq[i] in float32, cos and sin in float64,
// rounded and multiplied by scale.
func RopeAngles(cos, sin, invFreq []float32, pos int, scale float32) {
	for i, f := range invFreq {
		a := float64(float32(pos) * f)
		cos[i] = float32(math.Cos(a)) * scale
		sin[i] = float32(math.Sin(a)) * scale
	}
}

// Rotate rotates, in place, n vectors of x that start stride values apart
// over their first 2·len(cos) dims, by the angles whose cos and sin are
// given; interleaved pairs (2i, 2i+1), else (i, i+half).
func Rotate(x []float32, n, stride int, cos, sin []float32, interleaved bool) {
	half := len(cos)
	for h := range n {
		v := x[h*stride : h*stride+2*half]
		if interleaved {
			for i := range half {
				a, b := v[2*i], v[2*i+1]
				v[2*i] = a*cos[i] - b*sin[i]
				v[2*i+1] = b*cos[i] + a*sin[i]
			}
			continue
		}
		lo, hi := v[:half], v[half:]
		for i := range half {
			a, b := lo[i], hi[i]
			lo[i] = a*cos[i] - b*sin[i]
			hi[i] = b*cos[i] + a*sin[i]
		}
	}
}

// RoPE rotates every head of the rows of x (rows, heads·headDim) at
// positions pos (rows) (kernels.RopeOps.RoPE).
func RoPE(x []float32, heads, headDim int, pos []int32, invFreq []float32, interleaved bool, scale float32) {
	half := len(invFreq)
	cos, sin := make([]float32, half), make([]float32, half)
	w := heads * headDim
	for i, p := range pos {
		RopeAngles(cos, sin, invFreq, int(p), scale)
		Rotate(x[i*w:(i+1)*w], heads, headDim, cos, sin, interleaved)
	}
}

// Attention computes one row's causal GQA attention (kernels.AttentionOps)
// in float64: out (heads·headDim) from q (heads·headDim) over keys and
// values at positions [0, n), which k(p) and v(p) return as KVHeads·HeadDim
// float32 values.
func Attention(out, q []float32, n int, k, v func(p int) []float32, s kernels.AttnShape) {
	hd := s.HeadDim
	group := s.Heads / s.KVHeads
	sc := make([]float64, n)
	acc := make([]float64, hd)
	for h := range s.Heads {
		off := (h / group) * hd
		qv := q[h*hd : (h+1)*hd]
		m := math.Inf(-1)
		for p := range n {
			kv := k(p)[off : off+hd]
			var d float64
			for j, x := range qv {
				d += float64(x) * float64(kv[j])
			}
			sc[p] = d * float64(s.Scale)
			m = max(m, sc[p])
		}
		var sum float64
		for p := range n {
			sc[p] = math.Exp(sc[p] - m)
			sum += sc[p]
		}
		clear(acc)
		for p := range n {
			vv := v(p)[off : off+hd]
			for j, x := range vv {
				acc[j] += sc[p] / sum * float64(x)
			}
		}
		for j, a := range acc {
			out[h*hd+j] = float32(a)
		}
	}
}

// Route picks the experts of one token from its router logits (experts)
// into ids and w (r.Width() each: the TopK routed, then the Shared ones),
// as kernels.Router describes. bias is the
// selection bias (nil for none). logits is overwritten with the scores.
func Route(ids []int32, w, logits []float32, r *kernels.Router, bias []float32) {
	e := len(logits)
	for s := range r.Shared { // the shared experts after the routed ones, weight 1
		ids[r.TopK+s], w[r.TopK+s] = int32(e+s), 1
	}
	ids, w = ids[:r.TopK], w[:r.TopK]
	choice := make([]float32, e)
	switch r.Scoring {
	case kernels.SoftmaxScoring:
		Softmax(logits)
		copy(choice, logits)
	case kernels.SigmoidScoring:
		for j, v := range logits {
			logits[j] = Sigmoid(v)
			choice[j] = logits[j]
			if bias != nil {
				choice[j] += bias[j]
			}
		}
		if r.Groups > 1 {
			maskGroups(choice, r.Groups, r.TopKGroups)
		}
	}
	TopK(ids, choice)
	var sum float64
	for k, j := range ids {
		w[k] = logits[j]
		sum += float64(logits[j])
	}
	if r.NormTopK {
		den := float32(sum)
		if r.Scoring == kernels.SigmoidScoring {
			den += 1e-20
		}
		for k := range w {
			w[k] /= den
		}
	}
	if r.Scale != 1 && r.Scale != 0 {
		for k := range w {
			w[k] *= r.Scale
		}
	}
}

// maskGroups sets the scores of every expert outside the keep best of
// groups equal groups to −inf; a group scores the sum of its two best.
func maskGroups(choice []float32, groups, keep int) {
	per := len(choice) / groups
	gs := make([]float32, groups)
	for k := range groups {
		b1, b2 := float32(math.Inf(-1)), float32(math.Inf(-1))
		for _, v := range choice[k*per : (k+1)*per] {
			if v > b1 {
				b1, b2 = v, b1
			} else if v > b2 {
				b2 = v
			}
		}
		if per == 1 {
			b2 = 0
		}
		gs[k] = b1 + b2
	}
	best := make([]int32, keep)
	TopK(best, gs)
	for k := range groups {
		if !slices.Contains(best, int32(k)) {
			for j := k * per; j < (k+1)*per; j++ {
				choice[j] = float32(math.Inf(-1))
			}
		}
	}
}

// TopK writes into out the indices of the len(out) ≤ len(v) largest values
// of v, largest first; ties go to the lower index. It is the one top-k of
// the references: routing uses it directly, SelectTopK (DSA) through rank.
func TopK(out []int32, v []float32) { copy(out, rank(v)[:len(out)]) }

// rank returns v's indices by decreasing value, ties to the lower index.
func rank(v []float32) []int32 {
	order := make([]int32, len(v))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(v[b], v[a]) })
	return order
}

// Expert sets y (hidden) = down(silu(gate(x))·up(x)) for one token x
// (hidden), float64 dot products.
func Expert(y, x []float32, e *kernels.Expert) { expert(y, x, e, 0, nil) }

// expert is Expert with its SwiGLU clamped at limit (0: none) and its
// output rounded by rh (nil: as it is) before the down product.
func expert(y, x []float32, e *kernels.Expert, limit float32, rh func([]float32) []float32) {
	inter := e.Down.Cols
	g, u := make([]float32, inter), make([]float32, inter)
	if e.GateUp != nil {
		gu := make([]float32, 2*inter)
		kernels.MatMulRef(gu, x, e.GateUp, 1)
		copy(g, gu[:inter])
		copy(u, gu[inter:])
	} else {
		kernels.MatMulRef(g, x, e.Gate, 1)
		kernels.MatMulRef(u, x, e.Up, 1)
	}
	SwiGLUClamp(g, g, u, limit)
	if rh != nil {
		g = rh(g)
	}
	kernels.MatMulRef(y, g, e.Down, 1)
}

// Experts sets y (n, hidden) = Σ_k w[i,k]·Expert_{ids[i,k]}(x[i]), each
// token's experts summed in increasing expert id (kernels.MoEOps.Experts).
func Experts(y, x []float32, ids []int32, w []float32, n int, experts []kernels.Expert) {
	ExpertsClamp(y, x, ids, w, n, experts, 0)
}

// ExpertsClamp is Experts with every expert's SwiGLU clamped at limit
// (kernels.ClampOps; 0: no clamp).
func ExpertsClamp(y, x []float32, ids []int32, w []float32, n int, experts []kernels.Expert, limit float32) {
	ExpertsRounded(y, x, ids, w, n, experts, limit, nil, nil)
}

// ExpertsRounded is ExpertsClamp on each token's x as rx returns it and
// each expert's SwiGLU output as rh returns it (nil: as they are): what a
// backend that quantizes its products' activations computes.
func ExpertsRounded(y, x []float32, ids []int32, w []float32, n int, experts []kernels.Expert, limit float32,
	rx, rh func([]float32) []float32) {
	hidden := experts[0].Down.Rows
	k := len(ids) / max(n, 1)
	ye := make([]float32, hidden)
	order := make([]int, k)
	for i := range n {
		yr := y[i*hidden : (i+1)*hidden]
		clear(yr)
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int { return int(ids[i*k+a] - ids[i*k+b]) })
		for _, j := range order {
			xi := x[i*hidden : (i+1)*hidden]
			if rx != nil {
				xi = rx(xi)
			}
			expert(ye, xi, &experts[ids[i*k+j]], limit, rh)
			for d, v := range ye {
				yr[d] += w[i*k+j] * v
			}
		}
	}
}

// LinearCat sets y (n, Σ ws[i].Rows) = x·[ws[0]; ws[1]; …]ᵀ + bias (bias
// (Σ rows) may be nil), or adds that to y when acc: each weight's Linear
// written into its columns (kernels.LinearOps.LinearCat).
func LinearCat(y, x []float32, ws []*kernels.Mat, bias []float32, acc bool, n int) {
	total := 0
	for _, w := range ws {
		total += w.Rows
	}
	c0 := 0
	for _, w := range ws {
		part := make([]float32, n*w.Rows)
		var b []float32
		if bias != nil {
			b = bias[c0 : c0+w.Rows]
		}
		for i := range n {
			copy(part[i*w.Rows:(i+1)*w.Rows], y[i*total+c0:])
		}
		Linear(part, x, w, b, acc, n)
		for i := range n {
			copy(y[i*total+c0:i*total+c0+w.Rows], part[i*w.Rows:])
		}
		c0 += w.Rows
	}
}

// SwiGLULinear sets y (n, gate.Rows) = SwiGLUClamp(x·gateᵀ, x·upᵀ, limit)
// (kernels.LinearOps.SwiGLULinear).
func SwiGLULinear(y, x []float32, gate, up *kernels.Mat, limit float32, n int) {
	g, u := make([]float32, n*gate.Rows), make([]float32, n*up.Rows)
	Linear(g, x, gate, nil, false, n)
	Linear(u, x, up, nil, false, n)
	SwiGLUClamp(y, g, u, limit)
}

// Norm is an RMSNorm's weights on the host; a nil *Norm is none.
type Norm struct {
	W      []float32
	Eps    float32
	Offset bool
}

// Rope is a rotary embedding on the host (kernels.Rotary: Dim is
// 2·len(InvFreq)); a nil *Rope is none.
type Rope struct {
	InvFreq     []float32
	Interleaved bool
	Scale       float32
}

// PrepareQKV splits the rows of qkv (n, (Heads + 2·KVHeads)·HeadDim) into
// q (n, Heads·HeadDim), k and v (n, KVHeads·HeadDim), normalises every q
// and k head with qn and kn and rotates them at pos with r: RMSNorm, then
// RoPE, as kernels.AttentionOps.PrepareQKV computes q and the k and v it
// stores.
func PrepareQKV(q, k, v, qkv []float32, n int, s kernels.AttnShape, qn, kn *Norm, r *Rope, pos []int32) {
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	w := qw + 2*kw
	for i := range n {
		row := qkv[i*w : (i+1)*w]
		copy(q[i*qw:(i+1)*qw], row[:qw])
		copy(k[i*kw:(i+1)*kw], row[qw:qw+kw])
		copy(v[i*kw:(i+1)*kw], row[qw+kw:])
	}
	for _, c := range []struct {
		x     []float32
		heads int
		norm  *Norm
	}{{q, s.Heads, qn}, {k, s.KVHeads, kn}} {
		if c.norm != nil {
			RMSNorm(c.x, c.x, c.norm.W, c.norm.Eps, c.norm.Offset, n*c.heads)
		}
		if r != nil {
			RoPE(c.x, c.heads, s.HeadDim, pos[:n], r.InvFreq, r.Interleaved, r.Scale)
		}
	}
}
