package qwen3next

import (
	"slices"

	"github.com/ferrite-llm/ferrite/engine/gqa"
	"github.com/ferrite-llm/ferrite/kernels"
)

// gdn loads the Gated DeltaNet under prefix ("model.layers.0.linear_attn.")
// as state layer slot. Dimensions: Hk key heads and Hv value heads (r =
// Hv/Hk per key head) of sizes dk and dv; keyDim = Hk·dk, valueDim = Hv·dv,
// convDim = 2·keyDim + valueDim.
//
// The checkpoint groups in_proj_qkvz per key head ([q dk | k dk | v r·dv |
// z r·dv]) and in_proj_ba likewise ([b r | a r]); their rows are
// rearranged here into [q | k | v] (the convolution's input, value head j
// of key head g at j = g·r + i), z, b and a, so that each projection lands
// in the layout the ops read.
func (l *loader) gdn(prefix string, slot int) *gqa.LinearAttention {
	p, u := l.p, l.u
	hk, hv, dk, dv := p.keyHeads, p.valueHeads, p.keyDim, p.valueDim
	r := hv / hk
	keyDim, valueDim := hk*dk, hv*dv
	convDim := 2*keyDim + valueDim
	group := 2*dk + 2*r*dv // one key head's rows of in_proj_qkvz

	// rows lists, for every key head g, n rows from offset off of its group.
	rows := func(groupRows, off, n int) []int {
		var idx []int
		for g := range hk {
			for i := range n {
				idx = append(idx, g*groupRows+off+i)
			}
		}
		return idx
	}
	qkvz := l.Mat(prefix+"in_proj_qkvz.weight", 2*keyDim+2*valueDim, p.Hidden)
	ba := l.Mat(prefix+"in_proj_ba.weight", 2*hv, p.Hidden)
	qkv := slices.Concat(rows(group, 0, dk), rows(group, dk, dk), rows(group, 2*dk, r*dv))
	conv := l.Tensor(prefix+"conv1d.weight", convDim, 1, p.convK) // (convDim, 1, K)
	return &gqa.LinearAttention{
		Slot:  slot,
		QKV:   gqa.Linear{W: l.selectRows(qkvz, qkv)},
		Z:     gqa.Proj{{W: l.selectRows(qkvz, rows(group, 2*dk+r*dv, r*dv))}},
		A:     gqa.Proj{{W: l.selectRows(ba, rows(2*r, r, r))}},
		B:     gqa.Linear{W: l.selectRows(ba, rows(2*r, 0, r))},
		Conv:  u.Tensor(conv, convDim),
		Width: p.convK,
		Net: kernels.DeltaNet{
			Heads: hv, KeyHeads: hk, DK: dk, DV: dv,
			ALog:   u.Vec(l.Tensor(prefix+"A_log", hv)),
			DtBias: u.Vec(l.Tensor(prefix+"dt_bias", hv)),
		},
		Norm: &gqa.Norm{W: u.Vec(l.Tensor(prefix+"norm.weight", dv)), Eps: p.Eps},
		Gate: kernels.GateSiLU,
		Out:  gqa.Linear{W: l.Mat(prefix+"out_proj.weight", p.Hidden, valueDim)},
	}
}
