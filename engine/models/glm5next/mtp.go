package glm5next

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// mtp is the NextN layer (layers.{num_hidden_layers}.*): a plain residual
// block without hyper-connections.
type mtp struct {
	enorm    *nn.RMSNorm  // (hidden) enorm, on the embedding
	hnorm    *nn.RMSNorm  // (hidden) hnorm, on the main model's hidden
	eh       *nn.Linear   // (hidden, 2·hidden) eh_proj over [embedding | hidden]
	attnNorm *nn.RMSNorm  // (hidden) input_layernorm
	attn     *dsa         // NoPE MLA with its own k-pool indexer, cache layer num_hidden_layers
	ffnNorm  *nn.RMSNorm  // (hidden) post_attention_layernorm
	ffn      nn.FFN       // *moe (or *mlp when the checkpoint has no router)
	headNorm *nn.RMSNorm  // (hidden) shared_head.norm
	head     *kernels.Mat // (vocab, hidden) shared_head.head, else lm_head
}

func loadMTP(l *nn.Loader, p *params, pre string, cacheLayer int, lmHead *kernels.Mat) *mtp {
	t := &mtp{
		enorm:    l.RMSNorm(pre+"enorm", p.hidden, p.eps, false),
		hnorm:    l.RMSNorm(pre+"hnorm", p.hidden, p.eps, false),
		eh:       l.Linear(pre+"eh_proj", p.hidden, 2*p.hidden, false),
		attnNorm: l.RMSNorm(pre+"input_layernorm", p.hidden, p.eps, false),
		attn:     loadDSA(l, p, pre+"self_attn.", cacheLayer, true),
		ffnNorm:  l.RMSNorm(pre+"post_attention_layernorm", p.hidden, p.eps, false),
		headNorm: l.RMSNorm(pre+"shared_head.norm", p.hidden, p.eps, false),
		head:     lmHead,
	}
	if l.Has(pre + "mlp.gate.weight") {
		t.ffn = loadMoE(l, p, pre+"mlp")
	} else {
		t.ffn = loadMLP(l, pre+"mlp", p.hidden, p.inter, p.limit)
	}
	if l.Has(pre + "shared_head.head.weight") {
		t.head = l.Mat(pre+"shared_head.head.weight", p.vocab, p.hidden)
	}
	return t
}

// ForwardMTP implements model.MTPModel. Row i of sequence s combines
// hidden[s] row i (the main model's post-final-norm hidden state at
// position Pos+i) with the embedding of Tokens[i] (the token at Pos+i+1):
//
//	x = eh_proj([enorm(embed(tok)) | hnorm(h)])
//	x = x + Attn(input_layernorm(x));  x = x + FFN(post_attention_layernorm(x))
//	logits = shared_head.head(shared_head.norm(x))
//
// at position Pos+i against the MTP layer's own cache (latents and index
// keys, cache layer Info().Layers). The logits predict the token at Pos+i+2;
// Hidden returns shared_head.norm(x), the hidden input of a further draft
// step. The batch's States are not used.
func (w withMTP) ForwardMTP(b *model.Batch, hidden [][]float32) (*model.Output, error) {
	m := w.Model
	if err := b.Validate(m.p.vocab, m.layout); err != nil {
		return nil, err
	}
	H := m.p.hidden
	if len(hidden) != len(b.Seqs) {
		return nil, fmt.Errorf("glm5_next: ForwardMTP got %d hidden-state blocks for %d sequences", len(hidden), len(b.Seqs))
	}
	for i := range b.Seqs {
		if want := len(b.Seqs[i].Tokens) * H; len(hidden[i]) != want {
			return nil, fmt.Errorf("glm5_next: ForwardMTP sequence %d: %d hidden values, want %d (%d tokens × hidden %d)",
				i, len(hidden[i]), want, len(b.Seqs[i].Tokens), H)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.begin(b)
	defer m.end()
	p.states = nil

	t := m.mtp
	n := p.N()
	cat := p.Arena.Get(n * 2 * H) // (N, 2·hidden) [normed embedding | normed hidden]
	r := 0
	for i := range b.Seqs {
		for j, tok := range b.Seqs[i].Tokens {
			e, h := cat[r*2*H:r*2*H+H], cat[r*2*H+H:(r+1)*2*H]
			m.embed.RowF32(e, int(tok))
			t.enorm.Forward(e, e, 1)
			t.hnorm.Forward(h, hidden[i][j*H:(j+1)*H], 1)
			r++
		}
	}
	x := p.Arena.Get(n * H) // (N, hidden) residual
	t.eh.Forward(p.Backend, x, cat, n)
	y := p.Arena.Get(n * H) // (N, hidden) normed input
	o := p.Arena.Get(n * H) // (N, hidden) sublayer output
	t.attnNorm.Forward(y, x, n)
	t.attn.forward(p, o, y)
	for i, v := range o {
		x[i] += v
	}
	t.ffnNorm.Forward(y, x, n)
	t.ffn.Forward(p.Backend, &p.Arena, o, y, n)
	for i, v := range o {
		x[i] += v
	}
	return m.output(p, b.Seqs, x, t.headNorm, t.head), nil
}
