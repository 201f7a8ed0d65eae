package qwen3next

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// mtp is the multi-token-prediction head (mtp.*).
type mtp struct {
	embed   *kernels.Mat // (vocab, hidden) embed_tokens (the main model's unless mtp_use_dedicated_embeddings)
	embNorm *nn.RMSNorm  // (hidden) pre_fc_norm_embedding, 1+w
	hidNorm *nn.RMSNorm  // (hidden) pre_fc_norm_hidden, 1+w
	fc      *nn.Linear   // (hidden, 2·hidden) over [embedding | hidden]
	layer   *layer       // mtp.layers.0: full attention on cache layer Info().Layers, MoE or dense FFN
	norm    *nn.RMSNorm  // (hidden) mtp.norm, 1+w; the shared lm_head follows
}

// loadMTP loads mtp.* with its attention on cache layer cacheLayer. Only
// mtp.layers.0 is used: further MTP layers (mtp_num_hidden_layers > 1) are
// separate draft steps, not a stack, and are not loaded.
func loadMTP(l *nn.Loader, p *params, embed *kernels.Mat, cacheLayer int, rope *nn.RoPE) *mtp {
	const pre = "mtp.layers.0."
	if p.mtpOwnEmbed {
		embed = l.Mat("mtp.embed_tokens.weight", p.Vocab, p.Hidden)
	}
	// The checkpoint decides the FFN: Qwen3-Next's MTP layer is sparse.
	sparse := p.experts > 0 && l.Has(pre+"mlp.gate.weight")
	return &mtp{
		embed:   embed,
		embNorm: l.RMSNorm("mtp.pre_fc_norm_embedding", p.Hidden, p.Eps, true),
		hidNorm: l.RMSNorm("mtp.pre_fc_norm_hidden", p.Hidden, p.Eps, true),
		fc:      l.Linear("mtp.fc", p.Hidden, 2*p.Hidden, false),
		layer: &layer{
			attnNorm: l.RMSNorm(pre+"input_layernorm", p.Hidden, p.Eps, true),
			mix:      loadAttention(l, p, pre+"self_attn.", cacheLayer, rope),
			ffnNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.Hidden, p.Eps, true),
			ffn:      loadFFN(l, p, pre+"mlp", sparse),
		},
		norm: l.RMSNorm("mtp.norm", p.Hidden, p.Eps, true),
	}
}

// ForwardMTP implements model.MTPModel. Row i of sequence s combines
// hidden[s] row i (the main model's post-final-norm hidden state at
// position Pos+i) with the embedding of Tokens[i] (the token at Pos+i+1)
// and runs the MTP layer at position Pos+i against its own cache layer;
// the logits predict the token at Pos+i+2, and Hidden returns the MTP's
// post-norm output (the hidden input of the next draft step). The batch's
// States are not used.
func (w withMTP) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	m := w.Model
	if err := b.Validate(m.vocab, m.layout); err != nil {
		return nil, err
	}
	if len(hidden) != len(b.Seqs) {
		return nil, fmt.Errorf("qwen3_next: ForwardMTP got %d hidden-state blocks for %d sequences", len(hidden), len(b.Seqs))
	}
	for i := range b.Seqs {
		if want := len(b.Seqs[i].Tokens) * m.hidden; len(hidden[i]) != want {
			return nil, fmt.Errorf("qwen3_next: ForwardMTP sequence %d: %d hidden values, want %d (%d tokens × hidden %d)",
				i, len(hidden[i]), want, len(b.Seqs[i].Tokens), m.hidden)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.begin(b)
	defer m.end()
	p.states = nil // the MTP layer has no linear attention

	mt := m.mtp
	n, h := p.N(), m.hidden
	cat := p.Arena.Get(n * 2 * h) // (N, 2·hidden) [normed embedding | normed hidden]
	row := 0
	for i := range b.Seqs {
		for j, tok := range b.Seqs[i].Tokens {
			e, hh := cat[row*2*h:row*2*h+h], cat[row*2*h+h:(row+1)*2*h]
			mt.embed.RowF32(e, int(tok))
			mt.embNorm.Forward(e, e, 1)
			mt.hidNorm.Forward(hh, hidden[i][j*h:(j+1)*h], 1)
			row++
		}
	}
	x := p.Arena.Get(n * h) // (N, hidden)
	mt.fc.Forward(p.Backend, x, cat, n)
	mt.layer.forward(p, x)
	return m.output(p, b.Seqs, x, mt.norm), nil
}
