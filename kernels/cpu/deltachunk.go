package cpu

import (
	"math"
	"sync"
)

// Chunkwise (WY / UT-transform) form, §3.2 of the spec. For one head and one
// chunk of L ≤ C tokens r, s = 0..L−1, with Γ_r = Σ_{u≤r} g_u (within the
// chunk) and the decayed product ⟨x, y⟩_{r,s} = Σ_c x_c y_c e^{Γ_{r,c}−Γ_{s,c}}:
//
//	A[r,s] = β_r ⟨k_r, k_s⟩_{r,s}   (s < r)      T = (I + A)^{-1}
//	P[r,s] = ⟨q_r, k_s⟩_{r,s}       (s ≤ r)
//	Y      = βV − (β e^Γ ⊙ K) S₀      Vnew = T·Y   (= U − W S₀ of the spec)
//	O      = (e^Γ ⊙ Q) S₀ + P·Vnew
//	S      = diag(e^{Γ_{L−1}}) S₀ + Σ_r (k_r ⊙ e^{Γ_{L−1}−Γ_r}) Vnew[r]ᵀ
//
// Every exponential is a running product of per-step factors e^{g} ≤ 1
// taken inside the lower triangle, so nothing can overflow; decay factors
// that fall below flushBelow are set to 0. All arithmetic is float64; the
// head's state stays float64 across the chunks of one call and is rounded
// to float32 at the end.

// flushBelow (≈ e^{−576}) is the smallest decay factor kept; smaller ones
// become 0. Such a factor times any nonzero float32 is still a normal
// float64, which keeps subnormal arithmetic (slow on x86) out of the loops;
// the values dropped are far below float32 resolution.
const flushBelow = 1e-250

// chunkWS is the scratch of one worker of the chunk form (C = chunk size,
// DVp = DV rounded up to a multiple of 4).
type chunkWS struct {
	dk, dv, dvp, C int

	q, k []float64    // [C, DK] the chunk's q and k rows
	beta []float64    // [C]
	egs  []float64    // [C] e^{g_r} (GDN)
	eg   []float64    // [C, DK] e^{g_{r,c}} (KDA)
	gmin []float64    // [C] min_c g_{r,c} (KDA)
	eG   []float64    // [C, DK] e^{Γ_r} (broadcast over c for GDN)
	eGL  []float64    // [C, DK] e^{Γ_{L−1} − Γ_r}
	kd   []float64    // [DK] k_s ⊙ e^{Γ_r − Γ_s}, running over r (KDA)
	trow []float64    // [C] a row of A while its row of T is formed
	A    []float64    // [C, C] row-major: A, then T = (I+A)^{-1} in place (unit lower)
	P    []float64    // [C, C] row-major, lower triangular including the diagonal
	M    []float64    // [2C, DK] row-major: row r < L: β_r e^{Γ_r}⊙k_r; row L+r: e^{Γ_r}⊙q_r
	R    [][4]float64 // panels [DVp/4][2C+1] quads (+1: no 4 KiB stride): M·S₀; rows < L become Y, rows L+r become O
	Vn   [][4]float64 // panels [DVp/4][C+1] quads: Vnew
	Kt   []float64    // [DK, C] row-major: Kt[c][r] = k_{r,c} e^{Γ_{L−1,c}−Γ_{r,c}}
	S    [][4]float64 // panels [DVp/4][DK+1] quads: the head's state
}

var chunkPool = sync.Pool{New: func() any { return new(chunkWS) }}

func (w *chunkWS) ensure(dk, dv, C int) {
	if w.dk == dk && w.dv == dv && w.C == C {
		return
	}
	dvp := (dv + 3) &^ 3
	*w = chunkWS{
		dk: dk, dv: dv, dvp: dvp, C: C,
		q: make([]float64, C*dk), k: make([]float64, C*dk),
		beta: make([]float64, C), egs: make([]float64, C),
		eg: make([]float64, C*dk), gmin: make([]float64, C),
		eG: make([]float64, C*dk), eGL: make([]float64, C*dk),
		kd: make([]float64, dk), trow: make([]float64, C),
		A: make([]float64, C*C), P: make([]float64, C*C),
		M:  make([]float64, 2*C*dk),
		R:  make([][4]float64, (2*C+1)*dvp/4),
		Vn: make([][4]float64, (C+1)*dvp/4),
		Kt: make([]float64, dk*C),
		S:  make([][4]float64, (dk+1)*dvp/4),
	}
}

// chunkHead applies the rule chunk by chunk to value head h (prefill),
// continuing from its state and leaving the final state there; the last
// chunk may be short. Results equal recurrentHead's up to rounding.
func (d *deltaRule) chunkHead(s *deltaSeq, h int, w *chunkWS) {
	dk, dv, C := d.DK, d.DV, w.C
	n4 := w.dvp / 4
	// Panel strides, one quad more than the rows so that power-of-two
	// sizes do not put every panel's row i in the same cache set.
	sps, rps, vps := dk+1, 2*C+1, C+1
	hs := dk * dv
	st := s.State[h*hs : (h+1)*hs] // [DK, DV] float32
	_, _, vs, os := d.strides(s)

	// Load the state into panel layout, zero-padding columns DV..DVp−1.
	for c := 0; c < dk; c++ {
		row := st[c*dv : c*dv+dv]
		for jp := 0; jp < n4; jp++ {
			var q [4]float64
			if 4*jp+4 <= dv {
				x := (*[4]float32)(row[4*jp:])
				q = [4]float64{float64(x[0]), float64(x[1]), float64(x[2]), float64(x[3])}
			} else {
				for i, x := range row[4*jp:] {
					q[i] = float64(x)
				}
			}
			w.S[jp*sps+c] = q
		}
	}
	for t0 := 0; t0 < s.T; t0 += C {
		L := min(C, s.T-t0)
		d.loadChunk(s, h, t0, L, w)
		if d.PerChannel {
			w.decayedKKQKChannel(L)
		} else {
			w.decayedKKQKScalar(L)
		}
		w.invertUnitLower(L)

		// M = [β e^Γ ⊙ K ; e^Γ ⊙ Q]  (2L × DK), then R = M·S₀.
		for r := 0; r < L; r++ {
			b := w.beta[r]
			kr, qr, e := w.k[r*dk:r*dk+dk], w.q[r*dk:r*dk+dk], w.eG[r*dk:r*dk+dk]
			mk, mq := w.M[r*dk:r*dk+dk], w.M[(L+r)*dk:(L+r)*dk+dk]
			for c := range kr {
				mk[c] = b * e[c] * kr[c]
				mq[c] = e[c] * qr[c]
			}
		}
		gemmP(2*L, dk, n4, w.M, dk, w.S, sps, w.R, rps, false, true)

		// Y = βV − R[:L], in place in R (padding columns stay 0).
		for r := 0; r < L; r++ {
			v := s.V[(t0+r)*vs+h*dv : (t0+r)*vs+h*dv+dv] // [DV]
			b := w.beta[r]
			for j := 0; j < w.dvp; j++ {
				y := &w.R[(j>>2)*rps+r][j&3]
				var bv float64
				if j < dv {
					bv = b * float64(v[j])
				}
				*y = bv - *y
			}
		}
		// Vnew = T·Y;  O = R[L:] += P·Vnew.
		gemmP(L, L, n4, w.A, C, w.R, rps, w.Vn, vps, true, true)
		gemmP(L, L, n4, w.P, C, w.Vn, vps, w.R[L:], rps, true, false)
		for r := 0; r < L; r++ {
			out := s.Out[(t0+r)*os+h*dv : (t0+r)*os+h*dv+dv] // [DV]
			for j := range out {
				out[j] = float32(w.R[(j>>2)*rps+L+r][j&3])
			}
		}

		// S = diag(e^{Γ_{L−1}}) S₀ + Kt·Vnew: scale the rows, then accumulate.
		eL := w.eG[(L-1)*dk : L*dk]
		for jp := 0; jp < n4; jp++ {
			p := w.S[jp*sps : jp*sps+dk]
			for c, e := range eL {
				q := &p[c]
				q[0] *= e
				q[1] *= e
				q[2] *= e
				q[3] *= e
			}
		}
		for r := 0; r < L; r++ {
			kr, e := w.k[r*dk:r*dk+dk], w.eGL[r*dk:r*dk+dk]
			for c := range kr {
				w.Kt[c*C+r] = kr[c] * e[c]
			}
		}
		gemmP(dk, L, n4, w.Kt, C, w.Vn, vps, w.S, sps, false, false)
	}
	for c := 0; c < dk; c++ {
		row := st[c*dv : c*dv+dv]
		for jp := 0; jp < n4; jp++ {
			q := &w.S[jp*sps+c]
			if 4*jp+4 <= dv {
				*(*[4]float32)(row[4*jp:]) = [4]float32{float32(q[0]), float32(q[1]), float32(q[2]), float32(q[3])}
			} else {
				for i := range row[4*jp:] {
					row[4*jp+i] = float32(q[i])
				}
			}
		}
	}
}

// loadChunk copies tokens t0..t0+L−1 of head h into w and forms the decays.
func (d *deltaRule) loadChunk(s *deltaSeq, h, t0, L int, w *chunkWS) {
	dk, H := d.DK, d.Heads
	kh := h / (H / d.keyHeads())
	qs, ks, _, _ := d.strides(s)
	for r := 0; r < L; r++ {
		t := t0 + r
		q := s.Q[t*qs+kh*dk : t*qs+kh*dk+dk] // [DK]
		k := s.K[t*ks+kh*dk : t*ks+kh*dk+dk] // [DK]
		wq, wk := w.q[r*dk:r*dk+dk], w.k[r*dk:r*dk+dk]
		for c := range q {
			wq[c] = float64(q[c])
			wk[c] = float64(k[c])
		}
		w.beta[r] = float64(s.Beta[t*H+h])
	}
	if !d.PerChannel {
		e := 1.0
		for r := 0; r < L; r++ {
			w.egs[r] = expDecay(float64(s.G[(t0+r)*H+h]))
			e = flush(e * w.egs[r])
			fill(w.eG[r*dk:r*dk+dk], e)
		}
		e = 1
		for r := L - 1; r >= 0; r-- {
			fill(w.eGL[r*dk:r*dk+dk], e)
			e = flush(e * w.egs[r])
		}
		return
	}
	for r := 0; r < L; r++ {
		g := s.G[((t0+r)*H+h)*dk : ((t0+r)*H+h)*dk+dk] // [DK]
		eg := w.eg[r*dk : r*dk+dk]
		gm := 0.0
		for c, x := range g {
			eg[c] = expDecay(float64(x))
			gm = min(gm, float64(x))
		}
		w.gmin[r] = gm
		eG := w.eG[r*dk : r*dk+dk]
		if r == 0 {
			copy(eG, eg)
			continue
		}
		prev := w.eG[(r-1)*dk : r*dk]
		for c := range eG {
			eG[c] = flush(prev[c] * eg[c])
		}
	}
	fill(w.eGL[(L-1)*dk:L*dk], 1)
	for r := L - 2; r >= 0; r-- {
		cur, next, eg := w.eGL[r*dk:r*dk+dk], w.eGL[(r+1)*dk:(r+2)*dk], w.eg[(r+1)*dk:(r+2)*dk]
		for c := range cur {
			cur[c] = flush(next[c] * eg[c])
		}
	}
}

// decayedKKQKScalar fills A (strictly lower) and P (lower with diagonal) for
// a scalar decay: the dot products times the running factor e^{Γ_r−Γ_s}.
func (w *chunkWS) decayedKKQKScalar(L int) {
	dk, C := w.dk, w.C
	for r := 0; r < L; r++ {
		clear(w.A[r*C : r*C+L])
		clear(w.P[r*C : r*C+L])
	}
	for s := 0; s < L; s++ {
		ks := w.k[s*dk : s*dk+dk]
		dec := 1.0
		for r := s; r < L; r++ {
			if r > s {
				dec = flush(dec * w.egs[r])
			}
			if dec == 0 {
				break // every later pair is 0 too
			}
			kk, qk := dot2(w.k[r*dk:r*dk+dk], w.q[r*dk:r*dk+dk], ks)
			if r > s {
				w.A[r*C+s] = w.beta[r] * dec * kk
			}
			w.P[r*C+s] = dec * qk
		}
	}
}

// decayedKKQKChannel fills A and P for a per-channel decay. For each column
// s it walks r = s, s+1, … keeping kd = k_s ⊙ e^{Γ_r−Γ_s} as a running
// product, so no exponent is ever positive. While Σ min_c g (a lower bound
// on every channel's exponent) stays above −600 no factor can become
// subnormal (e^{−600} times the smallest float32 is a normal float64);
// past that, factors are flushed to 0 one by one.
func (w *chunkWS) decayedKKQKChannel(L int) {
	dk, C := w.dk, w.C
	kd := w.kd
	for r := 0; r < L; r++ {
		clear(w.A[r*C : r*C+L])
		clear(w.P[r*C : r*C+L])
	}
	for s := 0; s < L; s++ {
		copy(kd, w.k[s*dk:s*dk+dk])
		_, w.P[s*C+s] = dot2(kd, w.q[s*dk:s*dk+dk], kd)
		lb := 0.0
		for r := s + 1; r < L; r++ {
			lb += w.gmin[r]
			eg := w.eg[r*dk : r*dk+dk]
			kr, qr := w.k[r*dk:r*dk+dk], w.q[r*dk:r*dk+dk]
			eg, kr, qr = eg[:len(kd)], kr[:len(kd)], qr[:len(kd)]
			var a0, a1, p0, p1 float64
			if lb >= -600 {
				c := 0
				for ; c+2 <= len(kd); c += 2 {
					x0, x1 := kd[c]*eg[c], kd[c+1]*eg[c+1]
					kd[c], kd[c+1] = x0, x1
					a0 += kr[c] * x0
					a1 += kr[c+1] * x1
					p0 += qr[c] * x0
					p1 += qr[c+1] * x1
				}
				if c < len(kd) {
					x0 := kd[c] * eg[c]
					kd[c] = x0
					a0 += kr[c] * x0
					p0 += qr[c] * x0
				}
			} else {
				for c := range kd {
					x := kd[c] * eg[c]
					if math.Abs(x) < flushBelow {
						x = 0
					}
					kd[c] = x
					a0 += kr[c] * x
					p0 += qr[c] * x
				}
			}
			w.A[r*C+s] = w.beta[r] * (a0 + a1)
			w.P[r*C+s] = p0 + p1
		}
	}
}

// invertUnitLower replaces the strictly lower A (L×L, row stride C) by
// T = (I + A)^{-1}, unit lower triangular, by forward substitution:
// T[r,s] = −A[r,s] − Σ_{j=s+1}^{r−1} A[r,j] T[j,s].
func (w *chunkWS) invertUnitLower(L int) {
	C := w.C
	for r := 0; r < L; r++ {
		row := w.A[r*C : r*C+r]
		a := w.trow[:r]
		copy(a, row)
		for s := range row {
			row[s] = -a[s]
		}
		for j := 1; j < r; j++ {
			x := a[j]
			if x == 0 {
				continue
			}
			tj := w.A[j*C : j*C+j]
			rr := row[:len(tj)]
			for s, y := range tj {
				rr[s] -= x * y
			}
		}
		w.A[r*C+r] = 1
	}
}

// expDecay is e^x for a log-decay x ≤ 0, flushed to 0 below flushBelow.
func expDecay(x float64) float64 { return flush(math.Exp(x)) }

func flush(x float64) float64 {
	if x < flushBelow {
		return 0
	}
	return x
}

func fill(x []float64, v float64) {
	for i := range x {
		x[i] = v
	}
}
