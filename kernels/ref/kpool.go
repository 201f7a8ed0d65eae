package ref

import (
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/kernels"
)

// KPoolKey sets key (dim) to the key of a complete pool whose members'
// cached rows [k | γ] (2·dim each) are members (kpool), with ape (kpool,
// dim): per channel c, Σ_j softmax_j(γ_j[c] + ape[j][c])·k_j[c], the
// softmax and sum in float64 (γ + ape added in float32, as transformers
// does). prob is scratch of len(members).
func KPoolKey(key []float32, members [][]float32, ape []float32, prob []float64) {
	dim := len(key)
	for c := range dim {
		mx := math.Inf(-1)
		for j, v := range members {
			prob[j] = float64(v[dim+c] + ape[j*dim+c])
			mx = max(mx, prob[j])
		}
		var sum float64
		for j := range members {
			prob[j] = math.Exp(prob[j] - mx)
			sum += prob[j]
		}
		var acc float64
		for j, v := range members {
			acc += prob[j] / sum * float64(v[c])
		}
		key[c] = float32(acc)
	}
}

// KPoolScores sets scores (len(scores) candidate pools) for one query:
// I_P = Σ_h w[h]·ReLU(scale·q_h·key(P)), float64 sums, q (heads·dim), w
// (heads), key(P) the pool's key (dim).
func KPoolScores(scores, q, w []float32, key func(P int) []float32, scale float32) {
	heads := len(w)
	dim := len(q) / heads
	for P := range scores {
		k := key(P)
		var acc float64
		for h := range heads {
			var d float64
			for c, v := range q[h*dim : (h+1)*dim] {
				d += float64(v) * float64(k[c])
			}
			acc += float64(w[h]) * max(d*float64(scale), 0)
		}
		scores[P] = float32(acc)
	}
}

// TopPools appends to dst (which has room for k) the indices of the k
// largest scores (all of them when there are at most k), ties going to the
// lower index, and returns them in increasing index order.
func TopPools(dst []int32, scores []float32, k int) []int32 {
	n := len(scores)
	if n <= k {
		for i := range n {
			dst = append(dst, int32(i))
		}
		return dst
	}
	if k == 0 {
		return dst
	}
	// worse(a, b): a ranks below b.
	worse := func(a, b int32) bool {
		return scores[a] < scores[b] || (scores[a] == scores[b] && a > b)
	}
	// A min-heap (root = worst kept) of the best k seen so far.
	h := dst[len(dst) : len(dst)+k]
	for i := range k {
		h[i] = int32(i)
	}
	down := func(i int) {
		for {
			l, m := 2*i+1, i
			if l < k && worse(h[l], h[m]) {
				m = l
			}
			if l+1 < k && worse(h[l+1], h[m]) {
				m = l + 1
			}
			if m == i {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for i := k; i < n; i++ {
		if worse(h[0], int32(i)) {
			h[0] = int32(i)
			down(0)
		}
	}
	slices.Sort(h)
	return dst[:len(dst)+k]
}

// KPoolSelect sets sel (kp.SelWidth()) to the positions a query at
// position pos attends to (kernels.KPoolOps): the tokens of its kept pools,
// then the tail's, then −1. q (heads·dim) and w (heads) are the query's;
// key(P) is complete pool P's key (dim). scores and pools are scratch of
// at least (pos+1)/Size and Keep values.
func KPoolSelect(sel []int32, q, w []float32, pos int, key func(P int) []float32, kp *kernels.KPool, scores []float32, pools []int32) {
	cand := (pos + 1) / kp.Size
	sc := scores[:cand]
	KPoolScores(sc, q, w, key, kp.Scale)
	n := 0
	for _, P := range TopPools(pools[:0], sc, kp.Keep) {
		for j := range kp.Size {
			sel[n] = P*int32(kp.Size) + int32(j)
			n++
		}
	}
	if kp.Tail {
		for s := pos + 1 - (pos+1)%kp.Size; s <= pos; s++ {
			sel[n] = int32(s)
			n++
		}
	}
	for ; n < len(sel); n++ {
		sel[n] = -1
	}
}
