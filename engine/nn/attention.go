package nn

import (
	"math"
	"unsafe"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Tokens maps the rows of a flattened batch to their sequences: row i is
// the token at position Pos[i] of sequence Seq[i], whose cache is KV[Seq[i]].
// Rows of one sequence are consecutive and in position order.
type Tokens struct {
	Pos []int32        // (N) absolute position of each row
	Seq []int32        // (N) index into KV of each row's sequence
	KV  []*kvcache.Seq // (sequences) each sequence's cache handle
}

// N is the number of rows.
func (t *Tokens) N() int { return len(t.Pos) }

// MaxPos is one past the largest position in the batch (0 when empty).
func (t *Tokens) MaxPos() int {
	m := 0
	for _, p := range t.Pos {
		m = max(m, int(p)+1)
	}
	return m
}

// Attention is causal grouped-query attention over the paged cache for one
// layer: query head h reads K/V head h/(Heads/KVHeads). The layer's cache
// slot per token is K (KVHeads·HeadDim) and V (KVHeads·HeadDim).
type Attention struct {
	Layer   int     // cache layer index
	Heads   int     // query heads
	KVHeads int     // key/value heads (divides Heads)
	HeadDim int     // per-head dimension of q, k and v
	Scale   float32 // softmax scale, usually HeadDim^-½
}

// NewAttention returns a GQA attention with the standard 1/√headDim scale.
func NewAttention(layer, heads, kvHeads, headDim int) *Attention {
	return &Attention{
		Layer: layer, Heads: heads, KVHeads: kvHeads, HeadDim: headDim,
		Scale: float32(1 / math.Sqrt(float64(headDim))),
	}
}

// Store writes every row's k and v, each (N, KVHeads·HeadDim), into the
// cache at the row's sequence and position. The positions must have been
// reserved (kvcache.Cache.Reserve).
func (a *Attention) Store(c *kvcache.Cache, t *Tokens, k, v []float32) {
	w := a.KVHeads * a.HeadDim
	for i, p := range t.Pos {
		s := t.KV[t.Seq[i]]
		copy(c.K(a.Layer, s, int(p)), k[i*w:(i+1)*w])
		copy(c.V(a.Layer, s, int(p)), v[i*w:(i+1)*w])
	}
}

// matmulRows is the chunk length from which a sequence's attention runs as
// two matrix products per KV head (prefill) rather than row by row.
const matmulRows = 16

// maxScores bounds the score matrix of one matrix-product tile, in values.
const maxScores = 1 << 22

// Forward sets out (N, Heads·HeadDim) to the attention of every row's query
// q (N, Heads·HeadDim) over its sequence's cached keys and values at
// positions [0, Pos[i]]; the batch's own k/v must already be stored.
// Sequences contributing at least matmulRows rows (prefill chunks) go
// through the backend's MatMul per KV head; the other rows (decode,
// short verification chunks) are spread over rows × heads with Parallel.
func (a *Attention) Forward(be kernels.Backend, c *kvcache.Cache, t *Tokens, out, q []float32) {
	var short []int32 // rows handled one by one
	for lo := 0; lo < t.N(); {
		hi := lo + 1
		for hi < t.N() && t.Seq[hi] == t.Seq[lo] {
			hi++
		}
		if hi-lo >= matmulRows {
			a.chunk(be, c, t, out, q, lo, hi)
		} else {
			for i := lo; i < hi; i++ {
				short = append(short, int32(i))
			}
		}
		lo = hi
	}
	if len(short) > 0 {
		a.rows(be, c, t, out, q, short)
	}
}

// rows computes the attention of the given rows, each query head on its
// own: the work is spread over rows × heads.
func (a *Attention) rows(be kernels.Backend, c *kvcache.Cache, t *Tokens, out, q []float32, rows []int32) {
	hd := a.HeadDim
	qw := a.Heads * hd
	group := a.Heads / a.KVHeads
	kw := a.KVHeads * hd
	bs := c.BlockSize()
	maxLen := 0
	for _, i := range rows {
		maxLen = max(maxLen, int(t.Pos[i])+1)
	}
	be.Parallel(len(rows)*a.Heads, func(lo, hi int) {
		scores := make([]float32, maxLen)
		for item := lo; item < hi; item++ {
			i, h := int(rows[item/a.Heads]), item%a.Heads
			kvOff := (h / group) * hd
			qv := q[i*qw+h*hd : i*qw+(h+1)*hd]
			o := out[i*qw+h*hd : i*qw+(h+1)*hd]
			blocks := t.KV[t.Seq[i]].Blocks()
			ln := int(t.Pos[i]) + 1
			sc := scores[:ln]
			for p := 0; p < ln; p += bs {
				kb := c.KBlock(a.Layer, blocks[p/bs])
				for j := 0; j < bs && p+j < ln; j++ {
					sc[p+j] = Dot(qv, kb[j*kw+kvOff:j*kw+kvOff+hd]) * a.Scale
				}
			}
			Softmax(sc)
			clear(o)
			for p := 0; p < ln; p += bs {
				vb := c.VBlock(a.Layer, blocks[p/bs])
				for j := 0; j < bs && p+j < ln; j++ {
					Axpy(o, sc[p+j], vb[j*kw+kvOff:j*kw+kvOff+hd])
				}
			}
		}
	})
}

// chunk computes the attention of rows [lo, hi), consecutive tokens of one
// sequence, with two matrix products per KV head and query tile:
// S = Q·Kᵀ over the group's stacked query heads, a causal softmax per row,
// then O = S·V. K and Vᵀ are gathered from the paged cache first.
func (a *Attention) chunk(be kernels.Backend, c *kvcache.Cache, t *Tokens, out, q []float32, lo, hi int) {
	hd := a.HeadDim
	qw := a.Heads * hd
	group := a.Heads / a.KVHeads
	kw := a.KVHeads * hd
	bs := c.BlockSize()
	blocks := t.KV[t.Seq[lo]].Blocks()
	keys := int(t.Pos[hi-1]) + 1 // keys visible to the last row
	tile := max(1, min(hi-lo, maxScores/(group*keys)))

	// Scratch is allocated per call: it is small next to the products.
	k := make([]float32, keys*hd)          // (keys, headDim) this KV head's keys
	vt := make([]float32, hd*keys)         // (headDim, keys) its values, transposed
	qs := make([]float32, group*tile*hd)   // (group·tile, headDim) stacked queries
	sc := make([]float32, group*tile*keys) // (group·tile, keys) scores, then probabilities
	os := make([]float32, group*tile*hd)   // (group·tile, headDim)
	// Transient: k and vt are refilled for every KV head.
	kMat := &kernels.Mat{DType: kernels.F32, Rows: keys, Cols: hd, Data: f32Bytes(k), Transient: true}
	vMat := &kernels.Mat{DType: kernels.F32, Rows: hd, Cols: keys, Data: f32Bytes(vt), Transient: true}
	for kvh := range a.KVHeads {
		off := kvh * hd
		for p := range keys {
			kb := c.KBlock(a.Layer, blocks[p/bs])
			vb := c.VBlock(a.Layer, blocks[p/bs])
			j := p % bs
			copy(k[p*hd:(p+1)*hd], kb[j*kw+off:j*kw+off+hd])
			for d, v := range vb[j*kw+off : j*kw+off+hd] {
				vt[d*keys+p] = v
			}
		}
		for t0 := lo; t0 < hi; t0 += tile {
			t1 := min(hi, t0+tile)
			m := group * (t1 - t0) // stacked rows: (g, i) → g·(t1−t0) + i−t0
			for g := range group {
				h := kvh*group + g
				for i := t0; i < t1; i++ {
					r := g*(t1-t0) + i - t0
					copy(qs[r*hd:(r+1)*hd], q[i*qw+h*hd:i*qw+(h+1)*hd])
				}
			}
			be.MatMul(sc, qs, kMat, m)
			be.Parallel(m, func(r0, r1 int) {
				for r := r0; r < r1; r++ {
					i := t0 + r%(t1-t0)
					row := sc[r*keys : (r+1)*keys]
					ln := int(t.Pos[i]) + 1
					for j := range ln {
						row[j] *= a.Scale
					}
					Softmax(row[:ln])
					clear(row[ln:])
				}
			})
			be.MatMul(os, sc, vMat, m)
			for g := range group {
				h := kvh*group + g
				for i := t0; i < t1; i++ {
					r := g*(t1-t0) + i - t0
					copy(out[i*qw+h*hd:i*qw+(h+1)*hd], os[r*hd:(r+1)*hd])
				}
			}
		}
	}
}

// f32Bytes views float32 values as the little-endian bytes a kernels.Mat
// holds (every platform the engine runs on is little-endian).
func f32Bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}
