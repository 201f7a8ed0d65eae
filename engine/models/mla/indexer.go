package mla

import (
	"slices"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Indexer is the DSA lightning indexer of one layer (self_attn.indexer.*).
// Its per-token key lives in the layer's V cache slot.
type Indexer struct {
	Shape kernels.IndexerShape // Scale = (index_head_dim·index_n_heads)^-½

	WQ     gqa.Linear      // wq_b (Heads·Dim, q_lora_rank), input: the normed q latent
	WK     gqa.Linear      // wk (Dim, hidden), input: the layer input after input_layernorm
	KNormW kernels.Tensor  // k_norm.weight (1, Dim), LayerNorm eps 1e-6
	KNormB kernels.Tensor  // k_norm.bias (1, Dim)
	W      gqa.Linear      // weights_proj (Heads, hidden)
	Rope   *kernels.Rotary // on the first Rope.Dim dims of every query head and of the key

	ops    ops
	scores kernels.Tensor // (N, L) F32 the last pass's scores when it scored every row at once; else zero
}

// keyEps is k_norm's eps (transformers' nn.LayerNorm default).
const keyEps = 1e-6

// scoreBudget is the most scores (rows × context) the indexer holds at once;
// a longer step scores its rows in chunks (a variable for tests).
var scoreBudget = 1 << 22

// scoreWidthStep rounds up the scores' width, max(Pos)+1: the width is a
// launch parameter, and one that changed every token would make every
// decode step's launches new, so a device that replays repeated steps as
// graphs (CUDA) never could. The extra columns score −∞ (IndexerScores'
// contract), so no selection changes.
const scoreWidthStep = 64

// Forward stores the step's index keys in keys (the layer's V cache) and
// returns every row's selection (N, TopK) I32, or the zero Tensor when no
// row of the step sees more than TopK positions (they all attend densely).
// h (N, hidden) is the normed layer input, qr (N, q_lora_rank) the normed q
// latent.
func (ix *Indexer) Forward(c *gqa.Ctx, keys, h, qr kernels.Tensor) kernels.Tensor {
	dev, n, s := c.Dev, c.N, ix.Shape
	k := dev.Scratch(kernels.F32, n, s.Dim) // (N, Dim) index keys
	ix.WK.Forward(dev, k, h, false)
	ix.ops.sp.StoreIndexKey(keys, k, ix.KNormW, ix.KNormB, keyEps, ix.Rope, &c.Paged)
	ix.scores = kernels.Tensor{}
	maxLen := int(slices.Max(c.Pos)) + 1
	if maxLen <= s.TopK {
		return kernels.Tensor{}
	}

	q := dev.Scratch(kernels.F32, n, s.Heads*s.Dim) // (N, Heads·Dim) index queries
	ix.WQ.Forward(dev, q, qr, false)
	dev.RoPE(q, s.Heads, s.Dim, c.Paged.Pos, ix.Rope)
	w := dev.Scratch(kernels.F32, n, s.Heads) // (N, Heads) head weights
	ix.W.Forward(dev, w, h, false)
	sel := dev.Scratch(kernels.I32, n, s.TopK) // (N, TopK)
	// Rows in chunks of at most scoreBudget scores, into one buffer.
	width := (maxLen + scoreWidthStep - 1) / scoreWidthStep * scoreWidthStep
	per := max(1, min(n, scoreBudget/width))
	scores := dev.Scratch(kernels.F32, per, width) // (rows of a chunk, width ≥ maxLen)
	for r0 := 0; r0 < n; r0 += per {
		r1 := min(n, r0+per)
		p := c.Paged
		p.Pos, p.Seq, p.Slot = p.Pos.Slice(r0, r1), p.Seq.Slice(r0, r1), p.Slot.Slice(r0, r1)
		sc := scores.Slice(0, r1-r0)
		ix.ops.sp.IndexerScores(sc, q.Slice(r0, r1), w.Slice(r0, r1), keys, &p, s)
		ix.ops.sp.TopK(sel.Slice(r0, r1), sc)
	}
	if per == n {
		ix.scores = scores
	}
	return sel
}

// Scores reads back the last forward pass's indexer scores (N rows of
// max(Pos)+1 rounded up to scoreWidthStep; a row's columns past its Pos
// are unspecified), or nil when
// that pass attended densely or scored its rows in chunks. Outside a step
// only; for tests and inspection.
func (ix *Indexer) Scores() [][]float32 {
	if !ix.scores.Valid() {
		return nil
	}
	flat := make([]float32, ix.scores.Elems())
	ix.ops.dev.ReadF32(flat, ix.scores)
	rows := make([][]float32, ix.scores.Rows)
	for i := range rows {
		rows[i] = flat[i*ix.scores.Cols : (i+1)*ix.scores.Cols]
	}
	return rows
}
