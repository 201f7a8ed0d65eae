package gqa

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Speculative steps in one device step (model.SpecModel): the MTP draft
// passes of a model.SpecStep, prepared by PrepareDrafts before the step
// (every input uploaded), queued by Launch inside it, each pass's drafts
// fed into the next pass's ids (kernels.DraftOps.FeedIDs) and its hidden
// rows gathered as the next pass's input on the device; the main model's
// verification then takes its drafts with FeedVerify, in the same step.

// specInputs are an MTPDecoder's buffers for SpecDrafts, kept between
// steps so that a repeated step repeats its launches (graph replay).
type specInputs struct {
	passes []*Inputs        // one per draft pass
	aux    kernels.Tensor   // (cap, 1) I32 the feed and chain maps, one upload
	hAux   []int32          // host staging
	st     []*Step          // the passes' steps
	tops   []kernels.Tensor // the passes' Head reductions, once launched
	hout   []kernels.Tensor // the passes' hidden rows, once launched
	logits []kernels.Tensor // the passes' logits, once launched
}

// SpecDrafts is a speculative step's draft passes ready to launch; the
// MTPDecoder's mutex is held from PrepareDrafts to Release.
type SpecDrafts struct {
	m     *MTPDecoder
	s     *model.SpecStep
	hid0  kernels.Tensor     // (N0, hidden) pass 0's hidden rows
	chain []kernels.Tensor   // [i ≥ 1] (N_i, 1) I32 rows of pass i−1's hidden output that pass i continues
	idx   []kernels.Tensor   // [i ≥ 1] (N_i, 1) I32 flat indices into pass i−1's Head reduction
	vidx  [][]kernels.Tensor // [r][i] (verify tokens·reps[r], 1) I32 flat indices into pass i's Head reduction
	fed   []bool             // [i]: pass i feeds the verification
	reps  []int
}

// specMaps are the host-side maps of a SpecStep: for each pass the flat
// index into its Head reduction of each entry's last logit row (−1 for
// none) and the row of each entry's last hidden row in its hidden output.
func specMaps(s *model.SpecStep, vocab int) (top, hid [][]int32) {
	top, hid = make([][]int32, len(s.Drafts)), make([][]int32, len(s.Drafts))
	for i := range s.Drafts {
		b := &s.Drafts[i]
		k := min(b.Top, vocab)
		lrow, hrow := 0, 0
		for j := range b.Seqs {
			e := &b.Seqs[j]
			t, h := int32(-1), int32(-1)
			if n := e.LogitRows(); n > 0 && k > 0 {
				lrow += n
				t = int32((lrow-1)*2*k + k)
			}
			if e.Hidden {
				hrow += len(e.Tokens)
				h = int32(hrow - 1)
			}
			top[i], hid[i] = append(top[i], t), append(hid[i], h)
		}
	}
	return top, hid
}

// PrepareDrafts checks s's draft passes and uploads their inputs and the
// maps that feed them into each other and into the verification (s.Verify,
// whose token ids the caller's model keeps once per entry of reps: 1 for
// plain ids, h for ids repeated h times). It locks m until Release.
func (m *MTPDecoder) PrepareDrafts(s *model.SpecStep, reps ...int) (*SpecDrafts, error) {
	d, hs, vocab := m.Decoder, m.Embed.Cols, m.MTP.Head.Rows
	if s.Verify == nil {
		return nil, fmt.Errorf("gqa: speculative step without a verification batch")
	}
	if len(s.Drafts) == 0 || len(s.Chain) != len(s.Drafts) || len(s.Feed) != len(s.Verify.Seqs) {
		return nil, fmt.Errorf("gqa: speculative step: %d draft passes, %d chains, %d feeds for %d verify entries",
			len(s.Drafts), len(s.Chain), len(s.Feed), len(s.Verify.Seqs))
	}
	for i := range s.Drafts {
		b := &s.Drafts[i]
		if err := d.check(b, vocab); err != nil {
			return nil, err
		}
		if i == 0 {
			if err := b.ValidateHidden(s.Hidden, hs); err != nil {
				return nil, fmt.Errorf("gqa: %w", err)
			}
		}
		if len(b.Seqs) == 0 {
			return nil, fmt.Errorf("gqa: speculative step: draft pass %d is empty", i)
		}
	}
	top, hid := specMaps(s, vocab)
	// The host maps: pass i's chain rows and ids indices, then per rep the
	// verification's index per draft pass.
	h := s.Verify.Tokens()
	aux := m.spec.hAux[:0]
	for i := 1; i < len(s.Drafts); i++ {
		b := &s.Drafts[i]
		if len(s.Chain[i]) != len(b.Seqs) {
			return nil, fmt.Errorf("gqa: speculative step: pass %d has %d entries, %d chained", i, len(b.Seqs), len(s.Chain[i]))
		}
		for j, src := range s.Chain[i] {
			if len(b.Seqs[j].Tokens) != 1 || src < 0 || src >= len(hid[i-1]) || hid[i-1][src] < 0 || top[i-1][src] < 0 {
				return nil, fmt.Errorf("gqa: speculative step: pass %d entry %d continues pass %d entry %d, which has no logits or hidden rows", i, j, i-1, src)
			}
			aux = append(aux, hid[i-1][src])
		}
		for _, src := range s.Chain[i] {
			aux = append(aux, top[i-1][src])
		}
	}
	fed := make([]bool, len(s.Drafts))
	for _, rep := range reps {
		for i := range s.Drafts {
			for e := range s.Verify.Seqs {
				toks, feed := len(s.Verify.Seqs[e].Tokens), s.Feed[e]
				if len(feed) > toks || len(feed) > len(s.Drafts) {
					return nil, fmt.Errorf("gqa: speculative step: verify entry %d: %d drafts fed into %d tokens", e, len(feed), toks)
				}
				for t := range toks {
					v := int32(-1)
					if f := t - (toks - len(feed)); f == i {
						src := feed[f]
						if src < 0 || src >= len(top[i]) || top[i][src] < 0 {
							return nil, fmt.Errorf("gqa: speculative step: verify entry %d takes a draft from pass %d entry %d, which has no logits", e, i, src)
						}
						v, fed[i] = top[i][src], true
					}
					for range rep {
						aux = append(aux, v)
					}
				}
			}
		}
	}
	d.mu.Lock()
	ok := false
	defer func() {
		if !ok {
			d.mu.Unlock()
		}
	}()
	m.spec.hAux = aux
	all, err := EnsureI32(d.Dev, &m.spec.aux, max(len(aux), 1))
	if err != nil {
		return nil, fmt.Errorf("gqa: speculative step: %w", err)
	}
	if len(aux) > 0 {
		d.Dev.WriteI32(all.Slice(0, len(aux)), aux)
	}
	sd := &SpecDrafts{m: m, s: s, reps: reps, fed: fed}
	off := 0
	take := func(n int) kernels.Tensor {
		t := all.Slice(off, off+n)
		off += n
		return t
	}
	sd.chain, sd.idx = make([]kernels.Tensor, len(s.Drafts)), make([]kernels.Tensor, len(s.Drafts))
	for i := 1; i < len(s.Drafts); i++ {
		n := len(s.Drafts[i].Seqs)
		sd.chain[i], sd.idx[i] = take(n), take(n)
	}
	sd.vidx = make([][]kernels.Tensor, len(reps))
	for r, rep := range reps {
		for range s.Drafts {
			sd.vidx[r] = append(sd.vidx[r], take(h*rep))
		}
	}
	for len(m.spec.passes) < len(s.Drafts) {
		m.spec.passes = append(m.spec.passes, &Inputs{})
	}
	m.spec.st = m.spec.st[:0]
	for i := range s.Drafts {
		b := &s.Drafts[i]
		st, err := m.spec.passes[i].Upload(d.Dev, b)
		if err != nil {
			return nil, fmt.Errorf("gqa: speculative step: %w", err)
		}
		st.Top = b.Top
		m.spec.st = append(m.spec.st, st)
	}
	if sd.hid0, err = m.spec.passes[0].uploadHidden(d.Dev, s.Hidden, s.Drafts[0].Tokens(), hs); err != nil {
		return nil, fmt.Errorf("gqa: speculative step: %w", err)
	}
	ok = true
	return sd, nil
}

// Launch queues the draft passes inside the step, each after the one it
// continues.
func (sd *SpecDrafts) Launch() {
	m, s := sd.m, sd.s
	dev, hs := m.Dev, m.Embed.Cols
	do := dev.(kernels.DraftOps)
	sp := &m.spec
	sp.tops, sp.hout, sp.logits = sp.tops[:0], sp.hout[:0], sp.logits[:0]
	kernels.SetRowExact(dev, false)
	for i := range s.Drafts {
		b, st := &s.Drafts[i], sp.st[i]
		hid := sd.hid0
		if i > 0 {
			do.FeedIDs(st.IDs, sp.tops[i-1], sd.idx[i])
			hid = dev.Scratch(kernels.F32, b.Tokens(), hs) // (N_i, hidden) the previous pass's own output
			dev.GatherRows(hid, sp.hout[i-1], sd.chain[i])
		}
		logits, hout := m.launchMTP(b, st, hid)
		sp.tops, sp.hout, sp.logits = append(sp.tops, st.top), append(sp.hout, hout), append(sp.logits, logits)
	}
}

// FeedVerify queues, inside the step and after Launch, the feeding of the
// drafts into the verification's ids dst ((tokens·reps[r], 1) I32: each
// token's id reps[r] times).
func (sd *SpecDrafts) FeedVerify(dst kernels.Tensor, r int) {
	do := sd.m.Dev.(kernels.DraftOps)
	for i, idx := range sd.vidx[r] {
		if sd.fed[i] {
			do.FeedIDs(dst, sd.m.spec.tops[i], idx)
		}
	}
}

// OutputReads adds the draft passes' read-backs to r and returns what
// builds their outputs once r was read (after the step, before Release).
func (sd *SpecDrafts) OutputReads(r *Reads) (finish func() []*model.Output) {
	m := sd.m
	sp := &m.spec
	fs := make([]func() *model.Output, len(sd.s.Drafts))
	for i := range sd.s.Drafts {
		fs[i] = sp.st[i].OutputReads(r, m.Dev, &sd.s.Drafts[i], sp.logits[i], sp.hout[i])
	}
	return func() []*model.Output {
		outs := make([]*model.Output, len(fs))
		for i, f := range fs {
			outs[i] = f()
		}
		return outs
	}
}

// Release unlocks the decoder: after the outputs were read, or when the
// step failed.
func (sd *SpecDrafts) Release() { sd.m.mu.Unlock() }

// SpecReady reports whether dev can run speculative steps in one device
// step: it feeds drafts (kernels.DraftOps) and reduces logit rows
// (kernels.SampleOps).
func SpecReady(dev kernels.Device) bool {
	_, ok := dev.(kernels.DraftOps)
	_, ok2 := dev.(kernels.SampleOps)
	return ok && ok2
}

var _ model.SpecModel = (*MTPDecoder)(nil)

// SpecReady implements model.SpecModel.
func (m *MTPDecoder) SpecReady() bool { return SpecReady(m.Dev) }

// ForwardSpec implements model.SpecModel: the NextN layer's draft passes
// and the decoder's verification pass in one device step.
func (m *MTPDecoder) ForwardSpec(s *model.SpecStep) ([]*model.Output, *model.Output, error) {
	d, b := m.Decoder, s.Verify
	if b == nil {
		return nil, nil, fmt.Errorf("gqa: speculative step without a verification batch")
	}
	if !m.SpecReady() {
		return nil, nil, fmt.Errorf("gqa: the %T backend cannot feed drafts on the device", d.Dev)
	}
	if err := d.check(b, d.LMHead.Rows); err != nil {
		return nil, nil, err
	}
	if err := CheckStates(b, d.States, d.Dev); err != nil {
		return nil, nil, fmt.Errorf("gqa: %w", err)
	}
	sd, err := m.PrepareDrafts(s, 1) // holds d.mu, which the verification's inputs need too
	if err != nil {
		return nil, nil, err
	}
	defer sd.Release()
	st, err := d.in.Upload(d.Dev, b)
	if err == nil && len(d.States) > 0 {
		err = d.in.UploadStates(d.Dev, b, st)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("gqa: %w", err)
	}
	st.Top = b.Top
	var logits, hid kernels.Tensor
	InStep(d.Dev, func() {
		sd.Launch()
		sd.FeedVerify(st.IDs, 0)
		kernels.SetRowExact(d.Dev, st.Exact)
		embed := func(c *Ctx, x kernels.Tensor) { c.Dev.Embed(x, d.Embed, st.IDs) }
		logits, hid = d.launch(b, st, embed, d.Blocks, d.Norm, d.LMHead)
	})
	var r Reads // everything in one wait
	drafts := sd.OutputReads(&r)
	out := st.OutputReads(&r, d.Dev, b, logits, hid)
	r.Read(d.Dev)
	return drafts(), out(), nil
}
