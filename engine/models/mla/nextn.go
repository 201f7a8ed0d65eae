package mla

import (
	"fmt"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// NextN is the DeepSeek/GLM multi-token-prediction layer
// model.layers.{num_hidden_layers}.*, shared by the MLA architectures and
// glm4_moe:
//
//	x      = eh_proj([enorm(embed(tok_{p+1})) | hnorm(h_p)])     (embedding first)
//	x      = Block(x)                                             at position p, cache layer Layer
//	logits = shared_head.head(shared_head.norm(x))
//
// h_p is the main model's post-final-norm hidden state at position p. The
// post-norm output shared_head.norm(x) is what chained drafting feeds back
// as the next step's h.
type NextN struct {
	Layer  int          // cache layer (num_hidden_layers)
	ENorm  *nn.RMSNorm  // enorm (hidden)
	HNorm  *nn.RMSNorm  // hnorm (hidden)
	EHProj *nn.Linear   // eh_proj (hidden, 2·hidden)
	Block  model.Layer  // full decoder block with its own cache layer (and indexer)
	Norm   *nn.RMSNorm  // shared_head.norm (hidden)
	Head   *kernels.Mat // shared_head.head (vocab, hidden); lm_head when the checkpoint omits it

	mu  sync.Mutex
	ctx nn.Ctx // reused between passes
}

// LoadNextN loads the prologue and head of the NextN layer `layer` around
// block. The head falls back to lmHead when shared_head.head is absent
// (it is a copy of lm_head in released checkpoints). block is nil when the
// caller runs the layer itself (glm4_moe converts the weights to its
// gqa.MTPDecoder) and never calls Forward.
func LoadNextN(l *nn.Loader, layer, hidden int, eps float32, block model.Layer, lmHead *kernels.Mat) *NextN {
	pre := fmt.Sprintf("model.layers.%d.", layer)
	m := &NextN{
		Layer:  layer,
		ENorm:  l.RMSNorm(pre+"enorm", hidden, eps, false),
		HNorm:  l.RMSNorm(pre+"hnorm", hidden, eps, false),
		EHProj: l.Linear(pre+"eh_proj", hidden, 2*hidden, false),
		Block:  block,
		Norm:   l.RMSNorm(pre+"shared_head.norm", hidden, eps, false),
		Head:   lmHead,
	}
	if l.Has(pre + "shared_head.head.weight") {
		m.Head = l.Mat(pre+"shared_head.head.weight", lmHead.Rows, hidden)
	}
	return m
}

// HasNextN reports whether the config declares a NextN layer
// (num_nextn_predict_layers ≥ 1) and the checkpoint holds it.
func HasNextN(l *nn.Loader, nextn, layers int) bool {
	return nextn > 0 && l.Has(fmt.Sprintf("model.layers.%d.eh_proj.weight", layers))
}

// Forward implements model.MTPModel.ForwardMTP for the main model d, whose
// embedding, backend and cache layout the layer shares. Like Forward, it
// must not run concurrently with another pass of the same model (the
// layers share RoPE tables).
func (m *NextN) Forward(d *model.Decoder, b *model.Batch, hidden [][]float32) (*model.Output, error) {
	vocab, hs := m.Head.Rows, d.Embed.Cols
	if err := b.Validate(vocab, d.Layout); err != nil {
		return nil, err
	}
	if err := b.ValidateHidden(hidden, hs); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	c := &m.ctx
	c.Backend, c.Cache = d.Backend, b.Cache
	c.Arena.Reset()
	n := b.Tokens()
	b.FillTokens(&c.Tok)

	eh := c.Arena.Get(n * 2 * hs) // (N, 2·hidden): [enorm(embed) | hnorm(h)]
	row := 0
	for i := range b.Seqs {
		for j, tok := range b.Seqs[i].Tokens {
			e, h := eh[row*2*hs:row*2*hs+hs], eh[row*2*hs+hs:(row+1)*2*hs]
			d.Embed.RowF32(e, int(tok))
			m.ENorm.Forward(e, e, 1)
			m.HNorm.Forward(h, hidden[i][j*hs:(j+1)*hs], 1)
			row++
		}
	}
	x := c.Arena.Get(n * hs) // (N, hidden) the layer's residual stream
	m.EHProj.Forward(d.Backend, x, eh, n)
	m.Block.Forward(c, x)
	return outputs(c, b, x, m.Norm, m.Head, d.Backend), nil
}

// outputs applies norm to the rows of x (N, hidden) that want logits or
// hidden states and head to those that want logits.
func outputs(c *nn.Ctx, b *model.Batch, x []float32, norm *nn.RMSNorm, head *kernels.Mat, be kernels.Backend) *model.Output {
	hs, vocab := head.Cols, head.Rows
	out := &model.Output{Seqs: make([]model.SeqOutput, len(b.Seqs))}
	var rows []int // rows of x to norm, in output order
	nl := make([]int, len(b.Seqs))
	row := 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		ln := len(s.Tokens)
		switch {
		case s.Logits == model.AllLogits || s.Hidden:
			for j := range ln {
				rows = append(rows, row+j)
			}
		case s.Logits == model.LastLogits:
			rows = append(rows, row+ln-1)
		}
		switch s.Logits {
		case model.LastLogits:
			nl[i] = 1
		case model.AllLogits:
			nl[i] = ln
		}
		row += ln
	}
	xn := c.Arena.Get(len(rows) * hs) // (rows, hidden) normed
	for k, r := range rows {
		norm.Forward(xn[k*hs:(k+1)*hs], x[r*hs:(r+1)*hs], 1)
	}
	// Gather the logit rows: for each sequence, its last nl[i] normed rows.
	total := 0
	for _, v := range nl {
		total += v
	}
	lx := c.Arena.Get(total * hs) // (logit rows, hidden)
	k, lrow := 0, 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		cnt := len(s.Tokens)
		if s.Logits == model.LastLogits && !s.Hidden {
			cnt = 1
		} else if s.Logits == model.NoLogits && !s.Hidden {
			cnt = 0
		}
		for j := cnt - nl[i]; j < cnt; j++ {
			copy(lx[lrow*hs:(lrow+1)*hs], xn[(k+j)*hs:])
			lrow++
		}
		if s.Hidden {
			out.Seqs[i].Hidden = append([]float32(nil), xn[k*hs:(k+cnt)*hs]...)
		}
		k += cnt
	}
	logits := make([]float32, total*vocab) // (logit rows, vocab)
	if total > 0 {
		be.MatMul(logits, lx, head, total)
	}
	lrow = 0
	for i := range b.Seqs {
		out.Seqs[i].Logits = logits[lrow*vocab : (lrow+nl[i])*vocab : (lrow+nl[i])*vocab]
		lrow += nl[i]
	}
	return out
}
