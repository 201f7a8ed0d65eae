package cpu

import "sync"

// recWS is the scratch of one worker of the recurrent form.
type recWS struct {
	dec []float64 // [DK] e^{g} for the current token (broadcast for GDN)
	ak  []float64 // [DK] k ⊙ e^{g}
	u   []float64 // [DV] (diag(e^g) S)ᵀ k
	del []float64 // [DV] δ = β (v − u)
	o   []float64 // [DV] Sᵀ q
}

var recPool = sync.Pool{New: func() any { return new(recWS) }}

func (w *recWS) ensure(dk, dv int) {
	if cap(w.dec) < dk {
		w.dec, w.ak = make([]float64, dk), make([]float64, dk)
	}
	if cap(w.u) < dv {
		w.u, w.del, w.o = make([]float64, dv), make([]float64, dv), make([]float64, dv)
	}
	w.dec, w.ak = w.dec[:dk], w.ak[:dk]
	w.u, w.del, w.o = w.u[:dv], w.del[:dv], w.o[:dv]
}

// recurrentHead applies the rule token by token to value head h (decode,
// short chunks), keeping the head's state hot.
func (d *deltaRule) recurrentHead(s *deltaSeq, h int, ws *recWS) {
	dk, dv, H := d.DK, d.DV, d.Heads
	kh := h / (H / d.keyHeads())
	qs, ks, vs, os := d.strides(s)
	hs := dk * dv
	S := s.State[h*hs : (h+1)*hs] // [DK, DV]
	for t := 0; t < s.T; t++ {
		q := s.Q[t*qs+kh*dk : t*qs+kh*dk+dk] // [DK]
		k := s.K[t*ks+kh*dk : t*ks+kh*dk+dk] // [DK]
		v := s.V[t*vs+h*dv : t*vs+h*dv+dv]   // [DV]
		if d.PerChannel {
			g := s.G[(t*H+h)*dk : (t*H+h)*dk+dk] // [DK]
			for c, gc := range g {
				ws.dec[c] = expDecay(float64(gc))
			}
		} else {
			e := expDecay(float64(s.G[t*H+h]))
			for c := range ws.dec {
				ws.dec[c] = e
			}
		}
		deltaStep(S, dv, q, k, v, float64(s.Beta[t*H+h]), ws)
		out := s.Out[t*os+h*dv : t*os+h*dv+dv] // [DV]
		for j, x := range ws.o {
			out[j] = float32(x)
		}
	}
}

// deltaStep advances one head's state S ([DK, DV], row-major) by one token
// with decays ws.dec and leaves the output Sᵀq in ws.o. Two passes over S:
// u = (diag(e^g)S)ᵀk read-only, then S ← diag(e^g)S + kδᵀ fused with o = Sᵀq.
// Sums are float64; S is rounded to float32 once per token.
func deltaStep(S []float32, dv int, q, k, v []float32, beta float64, ws *recWS) {
	dk := len(k)
	dec, ak, u, del, o := ws.dec, ws.ak[:dk], ws.u, ws.del, ws.o
	for c := range ak {
		ak[c] = float64(k[c]) * dec[c]
	}
	clear(u)
	c := 0
	for ; c+4 <= dk; c += 4 {
		r0 := S[c*dv : c*dv+dv]
		r1 := S[(c+1)*dv : (c+2)*dv]
		r2 := S[(c+2)*dv : (c+3)*dv]
		r3 := S[(c+3)*dv : (c+4)*dv]
		r1, r2, r3, uu := r1[:len(r0)], r2[:len(r0)], r3[:len(r0)], u[:len(r0)]
		a0, a1, a2, a3 := ak[c], ak[c+1], ak[c+2], ak[c+3]
		for j, s0 := range r0 {
			uu[j] += a0*float64(s0) + a1*float64(r1[j]) + a2*float64(r2[j]) + a3*float64(r3[j])
		}
	}
	for ; c < dk; c++ {
		r0 := S[c*dv : c*dv+dv]
		uu := u[:len(r0)]
		a0 := ak[c]
		for j, s0 := range r0 {
			uu[j] += a0 * float64(s0)
		}
	}
	vv := v[:len(del)]
	for j := range del {
		del[j] = beta * (float64(vv[j]) - u[j])
	}
	clear(o)
	c = 0
	for ; c+4 <= dk; c += 4 {
		r0 := S[c*dv : c*dv+dv]
		r1 := S[(c+1)*dv : (c+2)*dv]
		r2 := S[(c+2)*dv : (c+3)*dv]
		r3 := S[(c+3)*dv : (c+4)*dv]
		r1, r2, r3 = r1[:len(r0)], r2[:len(r0)], r3[:len(r0)]
		dd, oo := del[:len(r0)], o[:len(r0)]
		d0, d1, d2, d3 := dec[c], dec[c+1], dec[c+2], dec[c+3]
		k0, k1, k2, k3 := float64(k[c]), float64(k[c+1]), float64(k[c+2]), float64(k[c+3])
		q0, q1, q2, q3 := float64(q[c]), float64(q[c+1]), float64(q[c+2]), float64(q[c+3])
		for j, s0 := range r0 {
			dj := dd[j]
			x0 := d0*float64(s0) + k0*dj
			x1 := d1*float64(r1[j]) + k1*dj
			x2 := d2*float64(r2[j]) + k2*dj
			x3 := d3*float64(r3[j]) + k3*dj
			r0[j], r1[j], r2[j], r3[j] = float32(x0), float32(x1), float32(x2), float32(x3)
			oo[j] += q0*x0 + q1*x1 + q2*x2 + q3*x3
		}
	}
	for ; c < dk; c++ {
		r0 := S[c*dv : c*dv+dv]
		dd, oo := del[:len(r0)], o[:len(r0)]
		d0, k0, q0 := dec[c], float64(k[c]), float64(q[c])
		for j, s0 := range r0 {
			x0 := d0*float64(s0) + k0*dd[j]
			r0[j] = float32(x0)
			oo[j] += q0 * x0
		}
	}
}
