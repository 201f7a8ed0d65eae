package ref

import (
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/kernels"
)

// LayerNorm sets y (rows, len(w)) = (x − mean(x))/sqrt(var(x) + eps)·w + b
// over rows of x, with the biased variance; mean and variance are float64
// sums rounded to float32, as torch.nn.LayerNorm in fp32. y may be x.
func LayerNorm(y, x, w, b []float32, eps float32, rows int) {
	d := len(w)
	for i := range rows {
		xr, yr := x[i*d:(i+1)*d], y[i*d:(i+1)*d]
		var s float64
		for _, v := range xr {
			s += float64(v)
		}
		mean := float32(s / float64(d))
		var ss float64
		for _, v := range xr {
			c := float64(v - mean)
			ss += c * c
		}
		inv := float32(1 / math.Sqrt(float64(float32(ss/float64(d))+eps)))
		for j, v := range xr {
			yr[j] = (v-mean)*inv*w[j] + b[j]
		}
	}
}

// LatentRow sets dst (KVLora+Rope) to the MLA cache row of one token
// (kernels.MLAOps.StoreLatent): [RMSNorm(kv[:KVLora])·norm | kv[KVLora:]
// rotated by cos and sin], KVLora = len(norm).
func LatentRow(dst, kv, norm []float32, eps float32, cos, sin []float32, interleaved bool) {
	kl := len(norm)
	RMSNorm(dst[:kl], kv[:kl], norm, eps, false, 1)
	copy(dst[kl:], kv[kl:len(dst)])
	Rotate(dst[kl:], 1, len(dst)-kl, cos, sin, interleaved)
}

// IndexKeyRow sets dst (Dim) to the DSA indexer's cache row of one token
// (kernels.SparseOps.StoreIndexKey): LayerNorm(k)·w + b with its first
// 2·len(cos) dims rotated.
func IndexKeyRow(dst, k, w, b []float32, eps float32, cos, sin []float32, interleaved bool) {
	LayerNorm(dst, k, w, b, eps, 1)
	Rotate(dst, 1, len(dst), cos, sin, interleaved)
}

// RotateMLAQuery rotates, in place, the last s.Rope dims of every head of
// one query row q (Heads·(Nope+Rope)).
func RotateMLAQuery(q []float32, s kernels.MLAShape, cos, sin []float32, interleaved bool) {
	Rotate(q[s.Nope:], s.Heads, s.Nope+s.Rope, cos, sin, interleaved)
}

// MatF32 decodes every row of m into one (Rows, Cols) float32 slice.
func MatF32(m *kernels.Mat) []float32 {
	out := make([]float32, m.Rows*m.Cols)
	for r := range m.Rows {
		m.RowF32(out[r*m.Cols:(r+1)*m.Cols], r)
	}
	return out
}

// AttentionMLA computes one row's multi-head latent attention
// (kernels.MLAOps.AttentionMLA) in float64, in the absorbed form: out
// (Heads·V) from the rotated query q (Heads·(Nope+Rope)) over the cache
// rows row(p) (KVLora+Rope) of the given positions; kvb is kv_b_proj
// decoded (MatF32). No positions leave out zero.
func AttentionMLA(out, q []float32, positions []int32, row func(p int) []float32, kvb []float32, s kernels.MLAShape) {
	kl, dn, dr, dv := s.KVLora, s.Nope, s.Rope, s.V
	hd := dn + dr
	qc := make([]float64, kl)             // W_UK_hᵀ q_nope
	sc := make([]float64, len(positions)) // scores, then probabilities
	lat := make([]float64, kl)            // Σ p·c
	rows := make([][]float32, len(positions))
	for j, p := range positions {
		rows[j] = row(int(p))
	}
	for h := range s.Heads {
		qh := q[h*hd : (h+1)*hd]
		clear(qc)
		for d := range dn {
			uk := kvb[(h*(dn+dv)+d)*kl : (h*(dn+dv)+d+1)*kl]
			for c, w := range uk {
				qc[c] += float64(qh[d]) * float64(w)
			}
		}
		m := math.Inf(-1)
		for j, r := range rows {
			var v float64
			for c, x := range r[:kl] {
				v += qc[c] * float64(x)
			}
			for k, x := range r[kl : kl+dr] {
				v += float64(qh[dn+k]) * float64(x)
			}
			sc[j] = v * float64(s.Scale)
			m = max(m, sc[j])
		}
		var sum float64
		for j := range sc {
			sc[j] = math.Exp(sc[j] - m)
			sum += sc[j]
		}
		clear(lat)
		for j, r := range rows {
			for c, x := range r[:kl] {
				lat[c] += sc[j] / sum * float64(x)
			}
		}
		for j := range dv {
			uv := kvb[(h*(dn+dv)+dn+j)*kl : (h*(dn+dv)+dn+j+1)*kl]
			var v float64
			for c, w := range uv {
				v += float64(w) * lat[c]
			}
			out[h*dv+j] = float32(v)
		}
	}
}

// IndexerScore is the DSA indexer score of one cached key (Dim) for one
// row's query q (Heads·Dim) and head weights w (Heads):
// Σ_h w_h·ReLU(Scale·q_h·key), in float64.
func IndexerScore(q, w, key []float32, s kernels.IndexerShape) float32 {
	var sum float64
	for h, wh := range w {
		var d float64
		for j, x := range q[h*s.Dim : (h+1)*s.Dim] {
			d += float64(x) * float64(key[j])
		}
		if d *= float64(s.Scale); d > 0 {
			sum += float64(wh) * d
		}
	}
	return float32(sum)
}

// SelectTopK sets sel (k) to the indices of the k largest scores, ties to
// the lower index, never a −∞ one, in ascending order, then −1 where fewer
// than k are finite (kernels.SparseOps.TopK).
func SelectTopK(sel []int32, scores []float32) {
	cand := rank(scores) // −∞ scores rank last, so cutting first keeps the finite ones
	cand = slices.DeleteFunc(cand[:min(len(cand), len(sel))], func(i int32) bool { return math.IsInf(float64(scores[i]), -1) })
	slices.Sort(cand)
	for i := range sel {
		sel[i] = -1
		if i < len(cand) {
			sel[i] = cand[i]
		}
	}
}
