package qwen3next

import (
	"math"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/kernels"
)

// gdn is a Gated DeltaNet layer (linear_attn.*). Dimensions: Hk key heads
// and Hv value heads (r = Hv/Hk per key head) of sizes dk and dv;
// keyDim = Hk·dk, valueDim = Hv·dv, convDim = 2·keyDim + valueDim.
type gdn struct {
	slot           int // this layer's index in a state slot (StateLayout order)
	hk, hv, dk, dv int

	qkvz   *nn.Linear        // (2·keyDim + 2·valueDim, hidden): per key head [q dk | k dk | v r·dv | z r·dv]
	ba     *nn.Linear        // (2·Hv, hidden): per key head [b r | a r]
	conv   linattn.Conv      // depthwise causal conv over [q | k | v]: Weight (convDim, 1, K), no bias
	aLog   []float32         // (Hv) A_log; the decay rate is exp(A_log)
	dtBias []float32         // (Hv) dt_bias
	normW  []float32         // (dv) gated RMSNorm weight (plain w, not 1+w)
	eps    float32           // gated RMSNorm epsilon (rms_norm_eps)
	out    *nn.Linear        // (hidden, valueDim) out_proj
	rule   linattn.DeltaRule // Hv value heads over Hk key heads; state S (Hv, dk, dv) in the slot
	qScale float32           // dk^-½
}

// loadGDN loads the linear-attention layer under prefix ("model.layers.0.linear_attn.").
func loadGDN(l *nn.Loader, p *params, prefix string, slot int, be kernels.Backend) *gdn {
	hk, hv, dk, dv := p.keyHeads, p.valueHeads, p.keyDim, p.valueDim
	keyDim, valueDim := hk*dk, hv*dv
	convDim := 2*keyDim + valueDim
	g := &gdn{
		slot: slot, hk: hk, hv: hv, dk: dk, dv: dv,
		qkvz: l.Linear(prefix+"in_proj_qkvz", 2*keyDim+2*valueDim, p.Hidden, false),
		ba:   l.Linear(prefix+"in_proj_ba", 2*hv, p.Hidden, false),
		conv: linattn.Conv{
			Channels: convDim,
			K:        p.convK,
			Weight:   l.Tensor(prefix+"conv1d.weight", convDim, 1, p.convK), // (convDim, 1, K)
		},
		aLog:   l.Tensor(prefix+"A_log", hv),
		dtBias: l.Tensor(prefix+"dt_bias", hv),
		normW:  l.Tensor(prefix+"norm.weight", dv),
		eps:    p.Eps,
		out:    l.Linear(prefix+"out_proj", p.Hidden, valueDim, false),
		rule:   linattn.DeltaRule{Heads: hv, KeyHeads: hk, DK: dk, DV: dv, Parallel: be.Parallel},
		qScale: float32(1 / math.Sqrt(float64(dk))),
	}
	g.conv.Parallel = be.Parallel
	return g
}

// shape is the layer's per-sequence state.
func (g *gdn) shape() linattn.LayerShape {
	return linattn.LayerShape{Heads: g.hv, DK: g.dk, DV: g.dv, ConvK: g.conv.K, ConvChannels: g.conv.Channels}
}

// forward sets y (N, hidden) = GatedDeltaNet(x (N, hidden)), continuing
// every sequence from its slot's state and leaving the new state there.
func (g *gdn) forward(p *pass, y, x []float32) {
	be, a, n := p.Backend, &p.Arena, p.N()
	hk, hv, dk, dv := g.hk, g.hv, g.dk, g.dv
	r := hv / hk
	keyDim, valueDim := hk*dk, hv*dv
	convDim := g.conv.Channels
	group := 2*dk + 2*r*dv // one key head's block of in_proj_qkvz

	mark := a.Mark()
	qkvz := a.Get(n * g.qkvz.Out()) // (N, 2·keyDim + 2·valueDim), grouped per key head
	ba := a.Get(n * 2 * hv)         // (N, 2·Hv), grouped per key head
	g.qkvz.Forward(be, qkvz, x, n)
	g.ba.Forward(be, ba, x, n)

	mixed := a.Get(n * convDim) // (N, convDim) [q | k | v]; conv + SiLU in place, then q/k L2-normed
	z := a.Get(n * valueDim)    // (N, Hv·dv) output gate
	beta := a.Get(n * hv)       // (N, Hv) b, then β = sigmoid(b)
	decay := a.Get(n * hv)      // (N, Hv) a, then log decay g
	be.Parallel(n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			src := qkvz[i*g.qkvz.Out() : (i+1)*g.qkvz.Out()]
			dst := mixed[i*convDim : (i+1)*convDim]
			zr := z[i*valueDim : (i+1)*valueDim]
			for h := range hk {
				blk := src[h*group : (h+1)*group]
				copy(dst[h*dk:(h+1)*dk], blk[:dk])
				copy(dst[keyDim+h*dk:keyDim+(h+1)*dk], blk[dk:2*dk])
				copy(dst[2*keyDim+h*r*dv:2*keyDim+(h+1)*r*dv], blk[2*dk:2*dk+r*dv])
				copy(zr[h*r*dv:(h+1)*r*dv], blk[2*dk+r*dv:])
				bab := ba[i*2*hv+h*2*r : i*2*hv+(h+1)*2*r]
				copy(beta[i*hv+h*r:i*hv+(h+1)*r], bab[:r])
				copy(decay[i*hv+h*r:i*hv+(h+1)*r], bab[r:])
			}
		}
	})
	linattn.GDNGates(decay, beta, decay, beta, g.aLog, g.dtBias, n, hv)

	// Convolution, per sequence from its rolling state.
	g.perSeq(p, func(s int, par linattn.ParallelFunc) {
		lo, hi := p.seqRows(s)
		c := g.conv
		c.Parallel = par
		st := mixed[lo*convDim : hi*convDim]
		c.Forward(st, st, hi-lo, p.states.Conv(p.slots[s], g.slot), linattn.ActSiLU)
	})
	be.Parallel(n, func(lo, hi int) {
		rows := mixed[lo*convDim:]
		linattn.L2Norm(rows, hi-lo, hk, dk, convDim, g.qScale)   // q
		linattn.L2Norm(rows[keyDim:], hi-lo, hk, dk, convDim, 1) // k
	})

	// The delta rule, per sequence from its state.
	o := a.Get(n * valueDim) // (N, Hv·dv) rule output, then gated-normed
	g.perSeq(p, func(s int, par linattn.ParallelFunc) {
		lo, hi := p.seqRows(s)
		rule := g.rule
		rule.Parallel = par
		base := mixed[lo*convDim:]
		rule.Forward(&linattn.Seq{
			T: hi - lo,
			Q: base, K: base[keyDim:], V: base[2*keyDim:],
			QStride: convDim, KStride: convDim, VStride: convDim,
			Beta: beta[lo*hv:], G: decay[lo*hv:],
			Out:   o[lo*valueDim:],
			State: p.states.S(p.slots[s], g.slot),
		})
	})

	be.Parallel(n, func(lo, hi int) {
		ob := o[lo*valueDim : hi*valueDim]
		linattn.GatedRMSNorm(ob, ob, z[lo*valueDim:hi*valueDim], g.normW, dv, g.eps, linattn.GateSiLU)
	})
	g.out.Forward(be, y, o, n)
	a.Release(mark)
}

// perSeq calls fn for every sequence of the pass. When every sequence is
// short (decode, short verification) and there are several, the sequences
// run in parallel and fn gets a serial ParallelFunc; otherwise they run in
// turn and fn may spread each one over the backend's workers.
func (g *gdn) perSeq(p *pass, fn func(s int, par linattn.ParallelFunc)) {
	seqs := len(p.start) - 1
	short := seqs > 1
	for s := 0; s < seqs && short; s++ {
		lo, hi := p.seqRows(s)
		short = hi-lo <= shortSeq
	}
	if short {
		p.Backend.Parallel(seqs, func(lo, hi int) {
			for s := lo; s < hi; s++ {
				fn(s, linattn.Serial)
			}
		})
		return
	}
	for s := range seqs {
		fn(s, p.Backend.Parallel)
	}
}

// shortSeq is the longest chunk perSeq treats as short.
const shortSeq = 8
