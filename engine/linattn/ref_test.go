package linattn

import (
	"math"
	"math/rand/v2"
)

// problem is a random delta-rule input with its float64 reference result.
type problem struct {
	d  DeltaRule
	T  int
	q  []float32 // [T, Hk, DK] L2-normalised, scaled by DK^-½
	k  []float32 // [T, Hk, DK] L2-normalised
	v  []float32 // [T, H, DV]
	b  []float32 // [T, H]
	g  []float32 // [T, H] or [T, H, DK]
	s0 []float32 // [H, DK, DV]
}

// gen builds a problem; gmin is the most negative log-decay drawn (per
// step, per channel for KDA). KDA uses the glm5_next lower-bound gate,
// GDN the softplus gate.
func gen(rng *rand.Rand, d DeltaRule, T int, gmin float64) *problem {
	hk := d.keyHeads()
	p := &problem{d: d, T: T}
	p.q = randn(rng, T*hk*d.DK, 1)
	p.k = randn(rng, T*hk*d.DK, 1)
	L2Norm(p.q, T, hk, d.DK, 0, float32(1/math.Sqrt(float64(d.DK))))
	L2Norm(p.k, T, hk, d.DK, 0, 1)
	p.v = randn(rng, T*d.Heads*d.DV, 1)
	p.b = make([]float32, T*d.Heads)
	for i := range p.b {
		p.b[i] = float32(1 / (1 + math.Exp(-rng.NormFloat64()*2)))
	}
	ng := T * d.Heads
	if d.PerChannel {
		ng *= d.DK
	}
	p.g = make([]float32, ng)
	for i := range p.g {
		// Mostly mild decays with a tail down to gmin.
		u := rng.Float64()
		p.g[i] = float32(gmin * u * u * u)
	}
	p.s0 = randn(rng, d.StateLen(), 0.5)
	return p
}

func randn(rng *rand.Rand, n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * sd)
	}
	return x
}

// ref runs the recurrence of §3.1 in float64 and returns the outputs
// [T, H, DV] and the final state [H, DK, DV].
func (p *problem) ref() (out, state []float64) {
	d := p.d
	dk, dv, H := d.DK, d.DV, d.Heads
	hk := d.keyHeads()
	out = make([]float64, p.T*H*dv)
	state = make([]float64, len(p.s0))
	for i, x := range p.s0 {
		state[i] = float64(x)
	}
	u := make([]float64, dv)
	for h := 0; h < H; h++ {
		kh := h / (H / hk)
		S := state[h*dk*dv : (h+1)*dk*dv]
		for t := 0; t < p.T; t++ {
			q := p.q[(t*hk+kh)*dk:]
			k := p.k[(t*hk+kh)*dk:]
			v := p.v[(t*H+h)*dv:]
			for c := 0; c < dk; c++ {
				var g float64
				if d.PerChannel {
					g = float64(p.g[(t*H+h)*dk+c])
				} else {
					g = float64(p.g[t*H+h])
				}
				e := math.Exp(g)
				for j := 0; j < dv; j++ {
					S[c*dv+j] *= e
				}
			}
			for j := 0; j < dv; j++ {
				var s float64
				for c := 0; c < dk; c++ {
					s += S[c*dv+j] * float64(k[c])
				}
				u[j] = float64(p.b[t*H+h]) * (float64(v[j]) - s)
			}
			for c := 0; c < dk; c++ {
				for j := 0; j < dv; j++ {
					S[c*dv+j] += float64(k[c]) * u[j]
				}
			}
			for j := 0; j < dv; j++ {
				var s float64
				for c := 0; c < dk; c++ {
					s += S[c*dv+j] * float64(q[c])
				}
				out[(t*H+h)*dv+j] = s
			}
		}
	}
	return out, state
}

// seq returns a Seq over tokens [t0, t1) of p with fresh output and the
// given state.
func (p *problem) seq(t0, t1 int, state, out []float32) *Seq {
	d := p.d
	hk := d.keyHeads()
	gw := d.Heads
	if d.PerChannel {
		gw *= d.DK
	}
	return &Seq{
		T:     t1 - t0,
		Q:     p.q[t0*hk*d.DK : t1*hk*d.DK],
		K:     p.k[t0*hk*d.DK : t1*hk*d.DK],
		V:     p.v[t0*d.Heads*d.DV : t1*d.Heads*d.DV],
		Beta:  p.b[t0*d.Heads : t1*d.Heads],
		G:     p.g[t0*gw : t1*gw],
		Out:   out[t0*d.Heads*d.DV : t1*d.Heads*d.DV],
		State: state,
	}
}

// relErr returns max|got − want| / max|want|.
func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		num = max(num, math.Abs(g-w))
		den = max(den, math.Abs(w))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func widen(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, e := range x {
		y[i] = float64(e)
	}
	return y
}
