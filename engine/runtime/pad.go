package runtime

import (
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Padding decode steps to a batch bucket. A device that replays repeated
// steps as graphs (kernels.StepGrapher: CUDA) replays a step only when it
// launches exactly what an earlier one did, and the batch size is in
// nearly every launch; under continuous batching it changes whenever a
// sequence finishes or arrives. So a forward pass whose entries are all one
// token (a decode step; an MTP draft pass) gets inert pad entries up to the
// next bucket (padBucket: 1, 2, 4, 8, 16, 32, 48, 64, then multiples of
// 32), and the batch sizes of one bucket run one graph.
//
// A pad entry runs token 0 at position 0 of its own fork of a one-block
// scratch sequence, asking for the last row's logits as decode entries do
// (the logit-row count is in the launches too); its output is dropped. The
// scratch block is taken from the free blocks for the pass and given back
// after it, so padding never holds cache room; the pad entries write their
// keys and values into it only, and only they read it. No real entry's
// rows depend on the other entries of the batch (batched = alone: the
// runtime tests check it exactly on the strict backend), so padding leaves
// the real entries' outputs as they were. Models with recurrent state are
// not padded: a pad entry would need a state slot of its own.

// padBucket is the batch size a pass of n one-token entries is padded to.
func padBucket(n int) int {
	switch {
	case n <= 8:
		b := 1
		for b < n {
			b *= 2
		}
		return b
	case n <= 64:
		return (n + 15) / 16 * 16
	}
	return (n + 31) / 32 * 32
}

// padOn settles Options.PadBatch for m: on (1) when it is positive, or when
// it is 0 and m's device replays steps as graphs; never for a model with
// recurrent state (states).
func padOn(m model.Model, opts *Options, stateful bool) {
	switch {
	case stateful || opts.PadBatch < 0:
		opts.PadBatch = -1
	case opts.PadBatch == 0:
		opts.PadBatch = -1
		if dm := model.AsDevice(m); dm != nil {
			if _, ok := dm.Device().(kernels.StepGrapher); ok {
				opts.PadBatch = 1
			}
		}
	default:
		opts.PadBatch = 1
	}
}

// padder makes a pass's pad entries; the scheduler owns it.
type padder struct {
	scratch *kvcache.Seq   // the pass's scratch sequence; nil between passes
	forks   []*kvcache.Seq // its forks, one per pad entry
	zero    []float32      // (hidden) a pad entry's MTP input hidden state
	tok     [1]int32       // a pad entry's token
}

// pad appends pad entries to b up to its bucket when padding is on and
// every entry is one token, and a zero hidden row each to *hidden when it
// is not nil (an MTP pass). It returns the number of real entries, for
// unpad.
func (sc *scheduler) pad(b *model.Batch, hidden *[][]float32) int {
	n := len(b.Seqs)
	if sc.r.opts.PadBatch <= 0 || n == 0 {
		return n
	}
	for i := range b.Seqs {
		if len(b.Seqs[i].Tokens) != 1 {
			return n
		}
	}
	want := padBucket(n)
	if want == n {
		return n
	}
	c, p := sc.r.cache, &sc.pads
	if c.BlocksFree() == 0 {
		return n // no room for the scratch block: run unpadded
	}
	p.scratch = c.NewSeq()
	if err := c.Reserve(p.scratch, 1); err != nil {
		c.Free(p.scratch)
		p.scratch = nil
		return n
	}
	if hidden != nil && len(p.zero) != sc.r.info.Hidden {
		p.zero = make([]float32, sc.r.info.Hidden)
	}
	for range want - n {
		kv, err := c.Fork(p.scratch, 1)
		if err != nil {
			break
		}
		p.forks = append(p.forks, kv)
		b.Seqs = append(b.Seqs, model.Seq{Tokens: p.tok[:], KV: kv, Logits: model.LastLogits})
		if hidden != nil {
			*hidden = append(*hidden, p.zero)
		}
	}
	return n
}

// unpad drops the pad entries (past the first n) from b, *hidden (when not
// nil) and out (when not nil), and gives the scratch block back.
func (sc *scheduler) unpad(b *model.Batch, hidden *[][]float32, out *model.Output, n int) {
	p := &sc.pads
	if p.scratch == nil {
		return
	}
	b.Seqs = b.Seqs[:n]
	if hidden != nil {
		clear((*hidden)[n:])
		*hidden = (*hidden)[:n]
	}
	if out != nil && len(out.Seqs) > n {
		out.Seqs = out.Seqs[:n]
	}
	c := sc.r.cache
	for _, kv := range p.forks {
		c.Free(kv)
	}
	c.Free(p.scratch)
	clear(p.forks)
	p.forks, p.scratch = p.forks[:0], nil
}
