package mla

import (
	"math"
	"slices"

	"github.com/ferrite-llm/ferrite/engine/nn"
)

// Selection is the set of cached positions every row of a forward pass may
// attend to in a DSA layer.
type Selection struct {
	Full []bool  // (N) the row attends to every visible position [0, pos]
	Off  []int32 // (N+1) a sparse row i's positions are Idx[Off[i]:Off[i+1]]
	Idx  []int32 // selected positions, ascending within a row, all ≤ the row's position
}

// Row returns row i's selected positions, or full = true when the row sees
// every position up to its own.
func (s *Selection) Row(i int) (idx []int32, full bool) {
	if s.Full[i] {
		return nil, true
	}
	return s.Idx[s.Off[i]:s.Off[i+1]], false
}

// reset sizes s for n rows whose positions are pos, keeping at most topK
// positions per row: rows with pos+1 ≤ topK are full.
func (s *Selection) reset(pos []int32, topK int) {
	n := len(pos)
	s.Full = slices.Grow(s.Full[:0], n)[:n]
	s.Off = slices.Grow(s.Off[:0], n+1)[:n+1]
	off := int32(0)
	for i, p := range pos {
		s.Off[i] = off
		s.Full[i] = int(p)+1 <= topK
		if !s.Full[i] {
			off += int32(topK)
		}
	}
	s.Off[n] = off
	s.Idx = slices.Grow(s.Idx[:0], int(off))[:off]
}

// Indexer is the DSA lightning indexer of one layer (self_attn.indexer.*).
// Its per-token key lives in the layer's V cache slot.
type Indexer struct {
	Heads int     // index_n_heads
	Dim   int     // index_head_dim
	TopK  int     // index_topk
	Scale float32 // Dim^-½

	WQ    *nn.Linear    // wq_b (Heads·Dim, q_lora_rank), input: the normed q latent
	WK    *nn.Linear    // wk (Dim, hidden), input: the layer input after input_layernorm
	KNorm *nn.LayerNorm // k_norm (Dim) with bias, eps 1e-6
	W     *nn.Linear    // weights_proj (Heads, hidden)
	RoPE  *nn.RoPE      // on the first RoPE.Dim dims of every query head and of the key
}

// Forward stores the batch's index keys in cache layer `layer` (V slots)
// and fills sel with every row's top-k positions. x (N, hidden) is the
// normed layer input, qr (N, q_lora_rank) the normed q latent.
func (ix *Indexer) Forward(c *nn.Ctx, layer int, x, qr []float32, sel *Selection) {
	be, ar, n := c.Backend, &c.Arena, c.N()
	t := &c.Tok
	mark := ar.Mark()
	d, nh := ix.Dim, ix.Heads

	k := ar.Get(n * d) // (N, Dim) index keys
	ix.WK.Forward(be, k, x, n)
	ix.KNorm.Forward(k, k, n)
	ix.RoPE.Ensure(t.MaxPos())
	for i, p := range t.Pos {
		ix.RoPE.Apply(k[i*d:], 1, d, int(p))
		copy(c.Cache.V(layer, t.KV[t.Seq[i]], int(p)), k[i*d:(i+1)*d])
	}

	sel.reset(t.Pos, ix.TopK)
	var sparse []int32 // rows that must choose
	for i := range n {
		if !sel.Full[i] {
			sparse = append(sparse, int32(i))
		}
	}
	if len(sparse) == 0 {
		ar.Release(mark)
		return
	}

	m := len(sparse)
	xs := ar.Get(m * ix.WK.In()) // (m, hidden) inputs of the sparse rows
	qs := ar.Get(m * ix.WQ.In()) // (m, q_lora) q latents of the sparse rows
	q := ar.Get(m * nh * d)      // (m, Heads·Dim) index queries
	w := ar.Get(m * nh)          // (m, Heads) head weights
	hw, qw := ix.WK.In(), ix.WQ.In()
	for r, i := range sparse {
		copy(xs[r*hw:(r+1)*hw], x[int(i)*hw:])
		copy(qs[r*qw:(r+1)*qw], qr[int(i)*qw:])
	}
	ix.WQ.Forward(be, q, qs, m)
	ix.W.Forward(be, w, xs, m)
	hs := float32(1 / math.Sqrt(float64(nh)))
	for r, i := range sparse {
		ix.RoPE.Apply(q[r*nh*d:], nh, d, int(t.Pos[i]))
		scaleVec(w[r*nh:(r+1)*nh], hs)
	}

	maxLen := t.MaxPos()
	if m*maxLen <= scoreBudget {
		// Few rows (decode, short chunks): score (row, key block) items in
		// parallel, then select per row.
		scores := ar.Get(m * maxLen) // (m, maxLen) index scores
		bs := c.Cache.BlockSize()
		nb := (maxLen + bs - 1) / bs
		be.Parallel(m*nb, func(lo, hi int) {
			for item := lo; item < hi; item++ {
				r, b := item/nb, item%nb
				ln := int(t.Pos[sparse[r]]) + 1
				if p0, p1 := b*bs, min((b+1)*bs, ln); p0 < p1 {
					ix.score(c, layer, int(sparse[r]), q[r*nh*d:(r+1)*nh*d], w[r*nh:(r+1)*nh], p0, p1, scores[r*maxLen:])
				}
			}
		})
		be.Parallel(m, func(lo, hi int) {
			heap := make([]int32, 0, ix.TopK) // selection scratch
			for r := lo; r < hi; r++ {
				i := int(sparse[r])
				topK(scores[r*maxLen:r*maxLen+int(t.Pos[i])+1], heap, sel.Idx[sel.Off[i]:sel.Off[i+1]])
			}
		})
	} else {
		be.Parallel(m, func(lo, hi int) {
			scores := make([]float32, maxLen) // one row's index scores
			heap := make([]int32, 0, ix.TopK) // selection scratch
			for r := lo; r < hi; r++ {
				i := int(sparse[r])
				ln := int(t.Pos[i]) + 1
				ix.score(c, layer, i, q[r*nh*d:(r+1)*nh*d], w[r*nh:(r+1)*nh], 0, ln, scores)
				topK(scores[:ln], heap, sel.Idx[sel.Off[i]:sel.Off[i+1]])
			}
		})
	}
	ar.Release(mark)
}

// scoreBudget is the most scores (rows × context) the indexer holds at once
// to spread one row's keys over the workers (a variable for tests).
var scoreBudget = 1 << 22

// score sets out[s] = I(row, s) for s in [p0, p1): Σ_j w_j·ReLU(Scale·q_j·k_s)
// over the cached index keys of the row's sequence. qv is the row's
// (Heads·Dim) rotated query, wv its (Heads) weights.
func (ix *Indexer) score(c *nn.Ctx, layer, row int, qv, wv []float32, p0, p1 int, out []float32) {
	t := &c.Tok
	d, bs := ix.Dim, c.Cache.BlockSize()
	blocks := t.KV[t.Seq[row]].Blocks()
	for p := p0; p < p1; {
		vb := c.Cache.VBlock(layer, blocks[p/bs])
		for j := p % bs; j < bs && p < p1; j, p = j+1, p+1 {
			ks := vb[j*d : (j+1)*d]
			var s float32
			for h, wh := range wv {
				if v := nn.Dot(qv[h*d:(h+1)*d], ks) * ix.Scale; v > 0 {
					s += wh * v
				}
			}
			out[p] = s
		}
	}
}

// topK writes into out the indices of the len(out) largest scores (ties go
// to the lower index), in ascending index order. heap is scratch with
// capacity len(out).
func topK(scores []float32, heap, out []int32) {
	k := len(out)
	// below reports whether a ranks below b.
	below := func(a, b int32) bool {
		if scores[a] != scores[b] {
			return scores[a] < scores[b]
		}
		return a > b
	}
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(heap) {
				return
			}
			m := l
			if r := l + 1; r < len(heap) && below(heap[r], heap[l]) {
				m = r
			}
			if !below(heap[m], heap[i]) {
				return
			}
			heap[i], heap[m] = heap[m], heap[i]
			i = m
		}
	}
	// A min-heap (by rank) of the best k seen so far: its root is the
	// weakest kept position.
	for s := range scores {
		p := int32(s)
		if len(heap) < k {
			heap = append(heap, p)
			for i := len(heap) - 1; i > 0; {
				parent := (i - 1) / 2
				if !below(heap[i], heap[parent]) {
					break
				}
				heap[i], heap[parent] = heap[parent], heap[i]
				i = parent
			}
			continue
		}
		if below(heap[0], p) {
			heap[0] = p
			down(0)
		}
	}
	copy(out, heap)
	slices.Sort(out)
}
