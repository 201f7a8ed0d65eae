package qwen3next

import (
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// mtp loads the multi-token-prediction head (mtp.*) as a gqa.NextN with
// its attention on cache layer cacheLayer:
//
//	x      = fc([pre_fc_norm_embedding(embed(tok_{p+1})) | pre_fc_norm_hidden(h_p)])
//	x      = mtp.layers.0(x)   gated attention, MoE (or dense) FFN
//	logits = head(mtp.norm(x))
//
// fc is kept as its two column halves. Only mtp.layers.0 is used: further
// MTP layers (mtp_num_hidden_layers > 1) are separate draft steps, not a
// stack, and are not loaded.
func (l *loader) mtp(embed, head *kernels.Mat, cacheLayer int, rope *kernels.Rotary) *gqa.NextN {
	const pre = "mtp.layers.0."
	p, u := l.p, l.u
	nx := &gqa.NextN{
		ENorm: u.Norm(l.RMSNorm("mtp.pre_fc_norm_embedding", p.Hidden, p.Eps, true)),
		HNorm: u.Norm(l.RMSNorm("mtp.pre_fc_norm_hidden", p.Hidden, p.Eps, true)),
		Norm:  u.Norm(l.RMSNorm("mtp.norm", p.Hidden, p.Eps, true)),
		Head:  head,
	}
	if p.mtpOwnEmbed {
		nx.Embed = l.Mat("mtp.embed_tokens.weight", p.Vocab, p.Hidden)
	}
	if fc := l.Mat("mtp.fc.weight", p.Hidden, 2*p.Hidden); fc.Rows > 0 {
		e, h, err := gqa.SplitCols(fc)
		if err != nil {
			l.Fail(err)
		}
		nx.EH, nx.HH = gqa.Linear{W: e}, gqa.Linear{W: h}
	}
	// The checkpoint decides the FFN: Qwen3-Next's MTP layer is sparse.
	sparse := p.experts > 0 && l.Has(pre+"mlp.gate.weight")
	nx.Block = l.block(pre, l.attention(pre+"self_attn.", cacheLayer, rope), sparse)
	return nx
}
