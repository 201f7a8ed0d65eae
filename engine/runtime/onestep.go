package runtime

import (
	"fmt"
	"time"

	"github.com/ferrite-llm/ferrite/engine/model"
)

// Speculative steps in one device step (Options.OneStepDrafts): where every
// drafting sequence of the step is greedy, the MTP draft passes and the
// verification go to the model together (model.SpecModel.ForwardSpec),
// each draft fed into the passes after it on the device, and come back
// together; the host picks nothing between them. The drafts are then read
// from the passes' outputs (their argmaxes, which the device fed), and
// verification proceeds as for any step.

// oneStepPasses are the draft passes and maps of such a step, kept
// between steps.
type oneStepPasses struct {
	step  model.SpecStep
	extra []model.Batch // draft passes 1, 2, … (pass 0 is mtpBatch)
	at    []int         // (len(step)) each sequence's entry in the pass just built, or −1
	prev  []int         // the same for the pass before it
}

// oneStepOK reports whether the step's MTP passes can run with its main
// pass as one device step: the model can, the MTP module has rows to take
// (drafts, or hidden states to catch up on), and every drafting sequence
// takes the plain argmax (greedy, no penalties), which is what the device
// feeds.
func (sc *scheduler) oneStepOK() bool {
	if sc.r.spec == nil || len(sc.mtpBatch.Seqs) == 0 {
		return false
	}
	for _, s := range sc.step {
		if s.sp != nil && s.sp.k > 0 && s.candidates(true) != 1 {
			return false
		}
	}
	return true
}

// draftVerify runs the step's draft passes (pass 0 as draft built it in
// mtpBatch) and its main pass (batch: a verification where a sequence
// drafts) as one device step and returns the main pass's output, with
// every drafting sequence's drafts in its buffer.
func (sc *scheduler) draftVerify() (*model.Output, error) {
	r, o := sc.r, &sc.one
	b0 := &sc.mtpBatch
	askTop(b0, sc.mtpSeqs, func(int) bool { return true })
	o.at = append(o.at[:0], make([]int, len(sc.step))...)
	j, kMax := 0, 0
	for i, s := range sc.step {
		o.at[i] = -1
		if j < len(sc.mtpSeqs) && sc.mtpSeqs[j] == s {
			o.at[i] = j
			j++
		}
		if sp := s.sp; sp != nil && sp.k > 0 {
			kMax = max(kMax, sp.k)
			for d := range sp.k {
				sp.buf[sp.pending+d] = 0 // a placeholder: the device feeds the draft
			}
		}
	}
	st := &o.step
	st.Drafts = append(st.Drafts[:0], *b0)
	st.Hidden = sc.mtpHidden
	st.Chain = append(st.Chain[:0], nil)
	st.Feed = st.Feed[:0]
	for i, s := range sc.step {
		var f []int
		if s.sp != nil && s.sp.k > 0 {
			f = append(f, o.at[i])
		}
		st.Feed = append(st.Feed, f)
	}
	for p := 1; p < kMax; p++ {
		o.prev = append(o.prev[:0], o.at...)
		for len(o.extra) < p {
			o.extra = append(o.extra, model.Batch{Cache: r.cache, Top: 1})
		}
		b := &o.extra[p-1]
		b.Seqs, b.Top = b.Seqs[:0], 1
		var chain []int
		for i, s := range sc.step {
			o.at[i] = -1
			sp := s.sp
			if sp == nil || sp.k <= p {
				continue
			}
			o.at[i] = len(b.Seqs)
			b.Seqs = append(b.Seqs, chainEntry(s, p))
			chain = append(chain, o.prev[i])
			st.Feed[i] = append(st.Feed[i], o.at[i])
		}
		st.Drafts = append(st.Drafts, *b)
		st.Chain = append(st.Chain, chain)
	}
	askTop(&sc.batch, sc.step, func(i int) bool { return sc.step[i].sp != nil && sc.step[i].sp.k > 0 })
	st.Verify = &sc.batch
	t0 := time.Now()
	drafts, out, err := r.spec.ForwardSpec(st)
	switch d := time.Since(t0); {
	case sc.mtpPrompt:
	case kMax > 0:
		sc.passes.OneStep++
		sc.passes.OneStepT += d
	default: // a decode step that feeds the MTP module without drafting
		sc.timePass(d)
	}
	if err != nil {
		return nil, fmt.Errorf("one-step speculation: %w", err)
	}
	if len(drafts) != len(st.Drafts) {
		return nil, fmt.Errorf("ForwardSpec returned %d draft outputs for %d passes", len(drafts), len(st.Drafts))
	}
	for p := range drafts {
		if err := sc.checkMTP(&st.Drafts[p], drafts[p]); err != nil {
			return nil, fmt.Errorf("draft pass %d: %w", p, err)
		}
	}
	w := r.info.Hidden
	for j, s := range sc.mtpSeqs {
		sp, rows := s.sp, len(b0.Seqs[j].Tokens)
		sp.hid = sp.hid[:copy(sp.hid, sp.hid[rows*w:])]
		sp.mtpDone += rows
	}
	// The drafts are what the device fed: each pass's argmax.
	for i, s := range sc.step {
		sp := s.sp
		if sp == nil || sp.k == 0 {
			continue
		}
		for p, e := range st.Feed[i] {
			do := &drafts[p].Seqs[e]
			if do.Top < 1 || len(do.TopIDs) < do.Top {
				return nil, fmt.Errorf("draft pass %d entry %d: no best entries returned", p, e)
			}
			sp.buf[sp.pending+p] = do.TopIDs[len(do.TopIDs)-do.Top]
		}
	}
	return out, nil
}
