package model

import (
	"sync"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Layer is one decoder layer. It updates the residual stream x (N, hidden)
// in place (mla.Block is the one in use).
type Layer interface {
	Forward(c *nn.Ctx, x []float32)
}

// Decoder is a decoder-only transformer: token embedding, a stack of
// layers, a final norm and the LM head. Architectures fill one in and
// return it as their Model.
type Decoder struct {
	Arch       string
	Embed      *kernels.Mat // (vocab, hidden) token embedding, rows gathered per token
	Layers     []Layer      // (layers)
	Norm       *nn.RMSNorm  // (hidden) final norm
	LMHead     *kernels.Mat // (vocab, hidden); Embed itself when tied
	Layout     kvcache.Layout
	MaxContext int
	Backend    kernels.Backend

	mu  sync.Mutex
	ctx nn.Ctx // reused between passes (scratch arena, row maps)
}

// Info implements Model.
func (d *Decoder) Info() Info {
	return Info{
		Arch:            d.Arch,
		Vocab:           d.LMHead.Rows,
		Hidden:          d.Embed.Cols,
		Layers:          len(d.Layers),
		MaxContext:      d.MaxContext,
		KVBytesPerToken: d.Layout.BytesPerToken(),
	}
}

// CacheLayout implements Model.
func (d *Decoder) CacheLayout() kvcache.Layout { return d.Layout }

// Forward implements Model.
func (d *Decoder) Forward(b *Batch) (*Output, error) {
	if err := b.Validate(d.LMHead.Rows, d.Layout); err != nil {
		return nil, err
	}
	if len(b.Seqs) == 0 {
		return &Output{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()

	hidden, vocab := d.Embed.Cols, d.LMHead.Rows
	c := &d.ctx
	c.Backend, c.Cache = d.Backend, b.Cache
	c.Arena.Reset()
	n := b.Tokens()
	b.FillTokens(&c.Tok)

	x := c.Arena.Get(n * hidden) // (N, hidden) residual stream
	row := 0
	for i := range b.Seqs {
		for _, tok := range b.Seqs[i].Tokens {
			d.Embed.RowF32(x[row*hidden:(row+1)*hidden], int(tok))
			row++
		}
	}
	for _, l := range d.Layers {
		l.Forward(c, x)
	}

	// Final norm over the rows anyone wants, then the LM head over the
	// rows that want logits.
	out := &Output{Seqs: make([]SeqOutput, len(b.Seqs))}
	var normRows, logitRows []int // row indices into x
	row = 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		ln := len(s.Tokens)
		switch {
		case s.Hidden:
			for j := range ln {
				normRows = append(normRows, row+j)
			}
		case s.Logits == LastLogits:
			normRows = append(normRows, row+ln-1)
		case s.Logits == AllLogits:
			for j := range ln {
				normRows = append(normRows, row+j)
			}
		}
		switch s.Logits {
		case LastLogits:
			logitRows = append(logitRows, row+ln-1)
		case AllLogits:
			for j := range ln {
				logitRows = append(logitRows, row+j)
			}
		}
		row += ln
	}
	// xn holds the normed rows in normRows order; where[r] is r's index.
	xn := c.Arena.Get(len(normRows) * hidden) // (normRows, hidden)
	where := make(map[int]int, len(normRows))
	for k, r := range normRows {
		where[r] = k
		d.Norm.Forward(xn[k*hidden:(k+1)*hidden], x[r*hidden:(r+1)*hidden], 1)
	}
	lx := c.Arena.Get(len(logitRows) * hidden) // (logitRows, hidden)
	for k, r := range logitRows {
		copy(lx[k*hidden:(k+1)*hidden], xn[where[r]*hidden:])
	}
	logits := make([]float32, len(logitRows)*vocab) // (logitRows, vocab)
	if len(logitRows) > 0 {
		d.Backend.MatMul(logits, lx, d.LMHead, len(logitRows))
	}

	row, lrow := 0, 0
	for i := range b.Seqs {
		s := &b.Seqs[i]
		ln := len(s.Tokens)
		nl := 0
		switch s.Logits {
		case LastLogits:
			nl = 1
		case AllLogits:
			nl = ln
		}
		out.Seqs[i].Logits = logits[lrow*vocab : (lrow+nl)*vocab : (lrow+nl)*vocab]
		lrow += nl
		if s.Hidden {
			h := make([]float32, ln*hidden)
			for j := range ln {
				copy(h[j*hidden:(j+1)*hidden], xn[where[row+j]*hidden:])
			}
			out.Seqs[i].Hidden = h
		}
		row += ln
	}
	return out, nil
}
