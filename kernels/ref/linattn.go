package ref

import (
	"math"

	"github.com/ferrite-llm/ferrite/kernels"
)

// The linear-attention references (kernels.LinearAttentionOps): the short
// convolution, the delta-rule gates, q/k L2 normalisation, the gated delta
// rule in its recurrent form and its chunked WY form, and the gated
// RMSNorm. Each works on one sequence's rows.

// L2NormEps is the epsilon inside the square root of the q/k L2 norm
// (HF/FLA l2norm).
const L2NormEps = 1e-6

// ShortConv runs one sequence of T rows through the causal depthwise
// convolution (kernels.LinearAttentionOps.ShortConv): y (T, C) =
// silu(Σ_j w[ch, j]·x_{t−K+1+j}[ch]) for w (C, K), with the inputs before
// the sequence taken from state ((K−1)·C, oldest row first), which is left
// holding the last K−1 raw inputs. y may be x.
func ShortConv(y, x, w, state []float32, T, C, K int) {
	km1 := K - 1
	// The history followed by the new rows, raw: (K−1+T, C).
	hist := make([]float32, (km1+T)*C)
	copy(hist, state[:km1*C])
	copy(hist[km1*C:], x[:T*C])
	for t := range T {
		for ch := range C {
			var acc float64
			for j := range K {
				acc += float64(w[ch*K+j]) * float64(hist[(t+j)*C+ch])
			}
			y[t*C+ch] = float32(acc * Sigmoid64(acc))
		}
	}
	copy(state[:km1*C], hist[T*C:])
}

// L2Normalize sets v ← scale·v/sqrt(Σv² + L2NormEps), the sum in float64,
// rounded once.
func L2Normalize(v []float32, scale float32) {
	var ss float64
	for _, e := range v {
		ss += float64(e) * float64(e)
	}
	f := float64(scale) / math.Sqrt(ss+L2NormEps)
	for i, e := range v {
		v[i] = float32(float64(e) * f)
	}
}

// DeltaGates sets one row's log-decays g (Heads, or Heads·DK when
// PerChannel) and write strengths beta (Heads) from the raw projections a
// (as g) and b (as beta), as kernels.DeltaNet describes; aLog (Heads) and
// dtBias (as g) are the layer's parameters. g may be a and beta may be b.
func DeltaGates(g, beta, a, b []float32, n *kernels.DeltaNet, aLog, dtBias []float32) {
	per := 1
	if n.PerChannel {
		per = n.DK
	}
	for h := range n.Heads {
		e := math.Exp(float64(aLog[h]))
		for c := h * per; c < (h+1)*per; c++ {
			x := float64(a[c] + dtBias[c]) // float32 sum, as HF
			if n.LowerBound < 0 {
				g[c] = float32(float64(n.LowerBound) * Sigmoid64(e*x))
			} else {
				g[c] = float32(-e * softplus64(x))
			}
		}
		beta[h] = float32(Sigmoid64(float64(b[h])))
	}
}

// deltaInputs are one sequence's rule inputs in the per-head form both
// references use.
type deltaInputs struct {
	n    *kernels.DeltaNet
	q, k [][]float32 // (T·KeyHeads) normalised heads (DK), q scaled by DK^-½
	v    []float32   // (T, QKVWidth) the rows, read at the v columns
	g    []float32   // (T, Heads) or (T, Heads·DK)
	beta []float32   // (T, Heads)
}

// prepare normalises q and k and computes the gates of T rows.
func prepare(qkv, a, b []float32, T int, n *kernels.DeltaNet, aLog, dtBias []float32) *deltaInputs {
	hk, dk, w := n.KeyHeads, n.DK, n.QKVWidth()
	gw := n.Heads
	if n.PerChannel {
		gw *= dk
	}
	in := &deltaInputs{n: n, v: qkv, g: make([]float32, T*gw), beta: make([]float32, T*n.Heads)}
	qs := float32(1 / math.Sqrt(float64(dk)))
	for t := range T {
		for j := range hk {
			q := append([]float32(nil), qkv[t*w+j*dk:t*w+(j+1)*dk]...)
			k := append([]float32(nil), qkv[t*w+hk*dk+j*dk:t*w+hk*dk+(j+1)*dk]...)
			L2Normalize(q, qs)
			L2Normalize(k, 1)
			in.q, in.k = append(in.q, q), append(in.k, k)
		}
		DeltaGates(in.g[t*gw:(t+1)*gw], in.beta[t*n.Heads:(t+1)*n.Heads], a[t*gw:(t+1)*gw], b[t*n.Heads:(t+1)*n.Heads], n, aLog, dtBias)
	}
	return in
}

// head returns row t's q, k (DK), v (DV), log-decays g (DK, broadcast for
// a per-head decay) and β for value head h.
func (in *deltaInputs) head(t, h int) (q, k, v []float32, lg []float64, beta float64) {
	n := in.n
	kh := h / (n.Heads / n.KeyHeads)
	q, k = in.q[t*n.KeyHeads+kh], in.k[t*n.KeyHeads+kh]
	off := t*n.QKVWidth() + 2*n.KeyHeads*n.DK + h*n.DV
	v = in.v[off : off+n.DV]
	lg = make([]float64, n.DK)
	for c := range lg {
		if n.PerChannel {
			lg[c] = float64(in.g[(t*n.Heads+h)*n.DK+c])
		} else {
			lg[c] = float64(in.g[t*n.Heads+h])
		}
	}
	return q, k, v, lg, float64(in.beta[t*n.Heads+h])
}

// DeltaRule is the golden gated delta rule for one sequence of T rows, token
// by token (kernels.LinearAttentionOps.DeltaRule): out (T, Heads·DV) from
// qkv (T, QKVWidth) and the raw gates a, b, continuing from state
// (Heads·DK·DV) and leaving the state after row T−1 there. Sums are
// float64; the state is rounded to float32 after every row.
func DeltaRule(out, qkv, a, b, state []float32, T int, n *kernels.DeltaNet, aLog, dtBias []float32) {
	in := prepare(qkv, a, b, T, n, aLog, dtBias)
	dk, dv := n.DK, n.DV
	u := make([]float64, dv)
	o := make([]float64, dv)
	for h := range n.Heads {
		S := state[h*dk*dv : (h+1)*dk*dv] // (DK, DV)
		for t := range T {
			q, k, v, dec, beta := in.head(t, h)
			for c, g := range dec {
				dec[c] = math.Exp(g)
			}
			// u = (diag(e^g)·S)ᵀk; δ = β(v − u).
			clear(u)
			for c := range dk {
				for j := range dv {
					u[j] += float64(k[c]) * dec[c] * float64(S[c*dv+j])
				}
			}
			for j := range dv {
				u[j] = beta * (float64(v[j]) - u[j])
			}
			// S ← diag(e^g)·S + k·δᵀ; o = Sᵀq (before S is rounded).
			clear(o)
			for c := range dk {
				for j := range dv {
					x := dec[c]*float64(S[c*dv+j]) + float64(k[c])*u[j]
					S[c*dv+j] = float32(x)
					o[j] += float64(q[c]) * x
				}
			}
			for j, x := range o {
				out[t*n.Heads*dv+h*dv+j] = float32(x)
			}
		}
	}
}

// DeltaRuleChunked is DeltaRule in the chunked WY (UT-transform) form of
// prefill, chunk rows at a time, for checking a backend's chunked kernel.
// Within a chunk of L rows, with Γ_r = Σ_{u≤r} g_u and decayed products
// ⟨x, y⟩_{r,s} = Σ_c x_c·y_c·e^{Γ_{r,c} − Γ_{s,c}} (exponents ≤ 0 for
// r ≥ s):
//
//	A[r,s] = β_r⟨k_r, k_s⟩_{r,s} (s < r)    T = (I + A)⁻¹
//	Y[r]   = β_r(v_r − (e^{Γ_r} ⊙ k_r)ᵀS₀)   Vn = T·Y
//	O[r]   = (e^{Γ_r} ⊙ q_r)ᵀS₀ + Σ_{s≤r} ⟨q_r, k_s⟩_{r,s}·Vn[s]
//	S      = diag(e^{Γ_{L−1}})·S₀ + Σ_r (k_r ⊙ e^{Γ_{L−1} − Γ_r})·Vn[r]ᵀ
//
// All in float64; the state is rounded to float32 once, at the end.
func DeltaRuleChunked(out, qkv, a, b, state []float32, T, chunk int, n *kernels.DeltaNet, aLog, dtBias []float32) {
	in := prepare(qkv, a, b, T, n, aLog, dtBias)
	dk, dv := n.DK, n.DV
	for h := range n.Heads {
		st := state[h*dk*dv : (h+1)*dk*dv]
		S := make([]float64, dk*dv) // (DK, DV)
		for i, x := range st {
			S[i] = float64(x)
		}
		for t0 := 0; t0 < T; t0 += chunk {
			L := min(chunk, T-t0)
			q, k, v := make([][]float32, L), make([][]float32, L), make([][]float32, L)
			beta := make([]float64, L)
			G := make([][]float64, L) // (L, DK) Γ
			for r := range L {
				q[r], k[r], v[r], G[r], beta[r] = in.head(t0+r, h)
				if r > 0 {
					for c := range G[r] {
						G[r][c] += G[r-1][c]
					}
				}
			}
			decayed := func(x []float32, r, s int) float64 { // ⟨x, k_s⟩_{r,s}
				var sum float64
				for c := range dk {
					sum += float64(x[c]) * float64(k[s][c]) * math.Exp(G[r][c]-G[s][c])
				}
				return sum
			}
			// T = (I + A)⁻¹ by forward substitution, row by row.
			Tm := make([][]float64, L)
			for r := range L {
				Tm[r] = make([]float64, L)
				Tm[r][r] = 1
				for s := range r {
					var acc float64
					for j := s; j < r; j++ {
						acc += beta[r] * decayed(k[r], r, j) * Tm[j][s]
					}
					Tm[r][s] = -acc
				}
			}
			Y := make([][]float64, L)
			for r := range L {
				Y[r] = make([]float64, dv)
				for j := range dv {
					var ks float64
					for c := range dk {
						ks += float64(k[r][c]) * math.Exp(G[r][c]) * S[c*dv+j]
					}
					Y[r][j] = beta[r] * (float64(v[r][j]) - ks)
				}
			}
			Vn := make([][]float64, L)
			for r := range L {
				Vn[r] = make([]float64, dv)
				for s := 0; s <= r; s++ {
					for j := range dv {
						Vn[r][j] += Tm[r][s] * Y[s][j]
					}
				}
			}
			for r := range L {
				for j := range dv {
					var o float64
					for c := range dk {
						o += float64(q[r][c]) * math.Exp(G[r][c]) * S[c*dv+j]
					}
					for s := 0; s <= r; s++ {
						o += decayed(q[r], r, s) * Vn[s][j]
					}
					out[(t0+r)*n.Heads*dv+h*dv+j] = float32(o)
				}
			}
			for c := range dk {
				for j := range dv {
					x := math.Exp(G[L-1][c]) * S[c*dv+j]
					for r := range L {
						x += float64(k[r][c]) * math.Exp(G[L-1][c]-G[r][c]) * Vn[r][j]
					}
					S[c*dv+j] = x
				}
			}
		}
		for i, x := range S {
			st[i] = float32(x)
		}
	}
}

// GatedRMSNorm sets y = w ⊙ rmsnorm(x) ⊙ gate(z) for every len(w)-wide row
// of x and z (kernels.LinearAttentionOps.GatedRMSNorm), in float64,
// rounded once. y may be x or z.
func GatedRMSNorm(y, x, z, w []float32, eps float32, gate kernels.Gate) {
	d := len(w)
	for r := range len(x) / d {
		xr, zr, yr := x[r*d:(r+1)*d], z[r*d:(r+1)*d], y[r*d:(r+1)*d]
		var ss float64
		for _, e := range xr {
			ss += float64(e) * float64(e)
		}
		inv := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		for i, e := range xr {
			zi := float64(zr[i])
			gz := Sigmoid64(zi)
			if gate == kernels.GateSiLU {
				gz *= zi
			}
			yr[i] = float32(float64(w[i]) * (float64(e) * inv) * gz)
		}
	}
}

// SigmoidGate sets y = x·sigmoid(gate), or adds it to y when acc, for rows
// of width c of x and y with one gate per element (len(gate) = len(x)) or
// per row (len(gate)·c = len(x)). y may be x.
func SigmoidGate(y, x, gate []float32, c int, acc bool) {
	perRow := len(gate)*c == len(x) && len(gate) != len(x)
	for i, v := range x {
		gi := i
		if perRow {
			gi = i / c
		}
		p := v * Sigmoid(gate[gi])
		if acc {
			p += y[i]
		}
		y[i] = p
	}
}

// softplus64 is torch's softplus (beta 1, threshold 20).
func softplus64(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}
