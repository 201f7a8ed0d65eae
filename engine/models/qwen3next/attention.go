package qwen3next

import (
	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// attention loads Qwen3-Next's gated full attention under prefix
// ("model.layers.3.self_attn.") on cache layer cacheLayer: GQA with the
// zero-centred per-head QK norm and partial NeoX RoPE, whose output is
// gated per channel by sigmoid of a second half of q_proj. q_proj holds,
// per head, [query headDim | gate headDim]; its rows are split here into
// the query and the gate projections.
func (l *loader) attention(prefix string, cacheLayer int, rope *kernels.Rotary) *gqa.Attention {
	p, u := l.p, l.u
	hd, qw, kvw := p.HeadDim, p.Heads*p.HeadDim, p.KVHeads*p.HeadDim
	half := func(off int) []int { // each head's rows [off, off+hd) of its 2·hd
		var idx []int
		for h := range p.Heads {
			for i := range hd {
				idx = append(idx, h*2*hd+off+i)
			}
		}
		return idx
	}
	q := l.Linear(prefix+"q_proj", 2*qw, p.Hidden, p.attnBias)
	k := l.Linear(prefix+"k_proj", kvw, p.Hidden, p.attnBias)
	v := l.Linear(prefix+"v_proj", kvw, p.Hidden, p.attnBias)
	gate := &gqa.Linear{W: l.selectRows(q.W, half(hd)), B: u.Vec(pick(q.B, half(hd)))}
	return &gqa.Attention{
		Layer: cacheLayer,
		Q:     gqa.Linear{W: l.selectRows(q.W, half(0))},
		K:     gqa.Linear{W: k.W},
		V:     gqa.Linear{W: v.W},
		QKVB:  u.CatVec([]int{qw, kvw, kvw}, pick(q.B, half(0)), k.B, v.B),
		O:     u.Linear(l.Linear(prefix+"o_proj", p.Hidden, qw, p.attnBias)),
		QNorm: u.Norm(l.RMSNorm(prefix+"q_norm", hd, p.Eps, true)),
		KNorm: u.Norm(l.RMSNorm(prefix+"k_norm", hd, p.Eps, true)),
		Rope:  rope,
		Shape: kernels.AttnShape{Heads: p.Heads, KVHeads: p.KVHeads, HeadDim: hd, Scale: nn.NewAttention(cacheLayer, p.Heads, p.KVHeads, hd).Scale},
		Gate:  gate,
	}
}

// pick returns v's elements idx; nil for nil v (no bias).
func pick(v []float32, idx []int) []float32 {
	if v == nil {
		return nil
	}
	out := make([]float32, len(idx))
	for i, j := range idx {
		out[i] = v[j]
	}
	return out
}
