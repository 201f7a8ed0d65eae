package runtime

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// Speculative decoding with the model's MTP module (see doc.go).

// maxStateVerify is the most tokens a hybrid model verifies for one
// sequence in one step. The delta rule runs its token-by-token form up to 8
// tokens (kernels.LinearAttentionOps.DeltaRule's contract), and that form
// rounds the state to float32 after every token, exactly as plain decoding
// does: a verification window this short gives the linear layers plain
// decoding's results bit for bit, and may record the state after each
// token (kernels.Recurrent.Record) for the rollback.
const maxStateVerify = kernels.RecordMaxRows

// Adaptive draft length.
const (
	acceptEMA    = 0.2  // weight of the newest outcome in a position's acceptance estimate
	minChainProb = 0.25 // draft position i only while P(drafts 0..i all accepted) is estimated at least this
	offBelow     = 0.1  // below this estimate for the first draft, a sequence stops drafting...
	probeEvery   = 8    // ...except for one probe every this many steps
)

// specSeq is one speculating sequence's drafting state. The MTP module's
// cache row at position j combines the target's hidden state at j with the
// token at j+1; rows [0, mtpDone) are filled. The target's hidden states of
// positions [mtpDone, hidEnd) wait in hid for the next MTP pass.
type specSeq struct {
	kMax    int       // most drafts per step (Options.Draft or Request.Draft)
	mtpDone int       // MTP cache rows [0, mtpDone) hold the target's hidden states
	hidEnd  int       // the target's hidden states are known up to position hidEnd-1
	hid     []float32 // (hidEnd-mtpDone, hidden) those not yet fed to the MTP module

	// The step being built or run.
	pending int         // tokens of the batch entry that are not drafts (> 1 after a hybrid's rollback)
	k       int         // drafts in the batch entry; 0: none this step
	buf     []int32     // (pending+k) the entry's tokens: tokens[computed:] then the drafts
	q       [][]float32 // (k) the distribution each draft was sampled from (sampling only)
	mtpH    []float32   // (hidden) the MTP's output hidden state of the last draft

	// Hybrid models: recs[a] receives the recurrent state after the
	// verification's row pending-1+a (the last pending token, then each
	// draft but the last), where a rejection after a accepted drafts
	// rolls back to; record is the batch entry's model.Seq.Record.
	recs   []*linattn.Snapshot // (k)
	record []*linattn.Snapshot // (pending+k)

	acc  [MaxDraft]float32 // estimated acceptance of each draft position, given the ones before were accepted
	rest int               // steps without drafts since the last probe (acc[0] < offBelow)
	n    specCounts        // this request's counters (Usage)
}

func newSpecSeq(k int) *specSeq {
	sp := &specSeq{kMax: k}
	for i := range sp.acc {
		sp.acc[i] = 1 // optimistic: start with the full draft length
	}
	return sp
}

// reset forgets everything the MTP module has seen (a new or preempted
// sequence starts over).
func (sp *specSeq) reset() {
	sp.mtpDone, sp.hidEnd, sp.hid = 0, 0, sp.hid[:0]
}

// ready reports whether s can draft this step: the target's hidden state is
// known at every position before its last token.
func (sp *specSeq) ready(s *seq) bool { return sp.hidEnd >= len(s.tokens)-1 }

// want is the draft length the acceptance estimates call for: one, then
// one more position while the chance that every draft up to it is accepted
// stays at least minChainProb; 0 (but for a probe every probeEvery calls)
// while the first draft is hardly ever accepted.
func (sp *specSeq) want() int {
	if sp.acc[0] < offBelow {
		if sp.rest++; sp.rest < probeEvery {
			return 0
		}
		sp.rest = 0
	}
	k, chain := 1, sp.acc[0]
	for k < sp.kMax {
		if chain *= sp.acc[k]; chain < minChainProb {
			break
		}
		k++
	}
	return k
}

// learn updates the acceptance estimates after k drafts were judged and
// the first a accepted.
func (sp *specSeq) learn(k, a int) {
	for i := 0; i < k && i <= a; i++ {
		hit := float32(0)
		if i < a {
			hit = 1
		}
		sp.acc[i] += acceptEMA * (hit - sp.acc[i])
	}
	if a == k && k > 0 {
		// Every draft passed: let the positions beyond drift towards the
		// last one's estimate, so that a longer draft is tried again.
		for i := k; i < sp.kMax; i++ {
			sp.acc[i] += acceptEMA / 4 * (sp.acc[i-1] - sp.acc[i])
		}
	}
}

// addHidden records the target's hidden states (width w) of positions
// [pos, pos+n) that are not known yet.
func (sp *specSeq) addHidden(pos, n int, hidden []float32, w int) {
	if pos+n <= sp.hidEnd {
		return
	}
	if pos > sp.hidEnd {
		panic(fmt.Sprintf("runtime: hidden states of positions [%d, %d) missing", sp.hidEnd, pos))
	}
	sp.hid = append(sp.hid, hidden[(sp.hidEnd-pos)*w:n*w]...)
	sp.hidEnd = pos + n
}

// scheduleDrafts gives the decoding sequences of the step (all of it so
// far) their drafts while the budget, the cache and the state pool allow,
// and returns the budget left. Drafts never preempt anyone.
func (sc *scheduler) scheduleDrafts(budget int) int {
	r := sc.r
	if r.mtp == nil || r.opts.DraftMaxSeqs > 0 && len(sc.running) > r.opts.DraftMaxSeqs {
		return budget
	}
	if !r.opts.DraftIgnoreCost && !sc.cost.allow() {
		return budget // drafting costs more than it saves (cost.go)
	}
	for i, s := range sc.step {
		sp := s.sp
		if budget == 0 {
			break
		}
		if sp == nil {
			continue
		}
		sc.cur = s
		e := &sc.batch.Seqs[i]
		n := len(e.Tokens)
		if e.Pos+n != len(s.tokens) || !sp.ready(s) {
			continue
		}
		// The verified positions run to len(tokens)+k-1 < limit, and the
		// step emits at most k+1 tokens.
		k := min(sp.want(), budget, r.limit-len(s.tokens))
		if s.req.MaxTokens > 0 {
			k = min(k, s.req.MaxTokens-s.generated()-1)
		}
		if s.slot != nil {
			k = min(k, maxStateVerify-n)
		}
		if k <= 0 {
			continue
		}
		sc.cacheRoom(r.cache.BlocksNeeded(s.kv, len(s.tokens)+k))
		free := r.cache.BlocksFree()
		for k > 0 && r.cache.BlocksNeeded(s.kv, len(s.tokens)+k) > free {
			k--
		}
		if k <= 0 {
			continue
		}
		if s.slot != nil {
			// One snapshot per row a rejection may roll back to, keeping
			// the slots that waiting requests could be admitted into;
			// the least recently used cached prefixes' checkpoints make
			// room when the free rows are too few (as for any slot).
			if k = min(k, sc.stateFree()-sc.waitingSlots()); k <= 0 || !sc.stateRoom(k, nil) {
				continue
			}
			for range k {
				snap, err := r.states.NewRecord()
				if err != nil {
					break
				}
				sp.recs = append(sp.recs, snap)
			}
			if k = len(sp.recs); k == 0 {
				continue
			}
			sp.record = append(sp.record[:0], make([]*linattn.Snapshot, n+k)...)
			copy(sp.record[n-1:], sp.recs)
			e.Record = sp.record
		}
		sc.reserve(s, len(s.tokens)+k)
		sp.pending, sp.k = n, k
		sp.buf = append(sp.buf[:0], e.Tokens...)
		for range k {
			sp.buf = append(sp.buf, -1) // drawn by draft
		}
		e.Tokens, e.Logits = sp.buf, model.AllLogits
		budget -= k
	}
	return budget
}

// endDraft drops s's drafts of the step (if any) and their snapshots.
func (sc *scheduler) endDraft(s *seq) {
	sp := s.sp
	if sp == nil {
		return
	}
	for _, snap := range sp.recs {
		if snap != nil { // nil: taken by retain
			sc.r.states.FreeSnapshot(snap)
		}
	}
	clear(sp.recs)
	clear(sp.record)
	sp.recs, sp.record = sp.recs[:0], sp.record[:0]
	sp.k, sp.pending = 0, 0
	clear(sp.q)
	sp.q, sp.mtpH = sp.q[:0], nil
}

// undraft turns s's verification entry e back into a plain one.
func (sc *scheduler) undraft(s *seq, e *model.Seq) {
	e.Tokens, e.Logits, e.Record = e.Tokens[:s.sp.pending], model.LastLogits, nil
	sc.endDraft(s)
}

// draft runs the step's MTP passes. The first feeds the MTP module the
// target's hidden states it has not seen yet, for every speculating
// sequence of the step (a prompt chunk's, or the accepted positions of the
// last verification); for a sequence drafting this step its last row is
// draft step 0 (the hidden state before the last token, with the last
// token) and gives the first draft. Each further pass is one draft step:
// the previous draft with the MTP's own output hidden state.
func (sc *scheduler) draft() (*model.Output, error) {
	r := sc.r
	if r.mtp == nil {
		return nil, nil
	}
	w := r.info.Hidden
	b := &sc.mtpBatch
	b.Seqs, sc.mtpHidden, sc.mtpSeqs = b.Seqs[:0], sc.mtpHidden[:0], sc.mtpSeqs[:0]
	defer_ := !r.opts.DraftIgnoreCost && sc.cost.deferMTP()
	sc.mtpPrompt = false
	for i, s := range sc.step {
		sp := s.sp
		if sp == nil {
			continue
		}
		end := min(sp.hidEnd, len(s.tokens)-1, s.kv.Len())
		if sp.k > 0 && (end != len(s.tokens)-1 || end <= sp.mtpDone) {
			sc.undraft(s, &sc.batch.Seqs[i]) // not expected: ready was checked
		}
		if end <= sp.mtpDone {
			continue
		}
		if sp.k == 0 && (defer_ || sp.acc[0] < offBelow) && sp.mtpDone >= s.nPrompt && end-sp.mtpDone < maxMTPBacklog {
			// Drafting is off, for everyone or for this sequence until
			// its next probe: feed the MTP module later, in one go.
			continue
		}
		if sp.mtpDone < s.nPrompt {
			sc.mtpPrompt = true // prefill work: the step is not timed (cost.go)
		}
		e := model.Seq{Tokens: s.tokens[sp.mtpDone+1 : end+1], Pos: sp.mtpDone, KV: s.kv}
		if sp.k > 0 {
			e.Logits, e.Hidden = model.LastLogits, sp.k > 1
		}
		b.Seqs = append(b.Seqs, e)
		sc.mtpHidden = append(sc.mtpHidden, sp.hid[:(end-sp.mtpDone)*w])
		sc.mtpSeqs = append(sc.mtpSeqs, s)
	}
	if sc.oneStepOK() {
		return sc.draftVerify()
	}
	for i := 0; len(b.Seqs) > 0; i++ {
		askTop(b, sc.mtpSeqs, func(int) bool { return true })
		entries := sc.pad(b, &sc.mtpHidden)
		t0 := time.Now()
		out, err := r.mtp.ForwardMTP(b, sc.mtpHidden)
		if !sc.mtpPrompt {
			sc.passes.MTP++
			sc.passes.MTPT += time.Since(t0)
		}
		sc.unpad(b, &sc.mtpHidden, out, entries)
		if err != nil {
			return nil, err
		}
		if err := sc.checkMTP(b, out); err != nil {
			return nil, err
		}
		for j, s := range sc.mtpSeqs {
			sp, o := s.sp, &out.Seqs[j]
			if i == 0 {
				rows := len(b.Seqs[j].Tokens)
				sp.hid = sp.hid[:copy(sp.hid, sp.hid[rows*w:])]
				sp.mtpDone += rows
			}
			if sp.k > i {
				sc.pickDraft(s, i, out, j)
				if o.Hidden != nil {
					sp.mtpH = o.Hidden[len(o.Hidden)-w:]
				}
			}
		}
		// The next draft step: one row per sequence wanting another draft.
		b.Seqs, sc.mtpHidden, sc.mtpSeqs = b.Seqs[:0], sc.mtpHidden[:0], sc.mtpSeqs[:0]
		for _, s := range sc.step {
			sp := s.sp
			if sp == nil || sp.k <= i+1 {
				continue
			}
			b.Seqs = append(b.Seqs, chainEntry(s, i+1))
			sc.mtpHidden = append(sc.mtpHidden, sp.mtpH)
			sc.mtpSeqs = append(sc.mtpSeqs, s)
		}
	}
	return nil, nil
}

// chainEntry is s's entry in draft pass p ≥ 1: the draft of pass p−1
// (its token in s's buffer) at its position minus one, with the MTP's own
// hidden state as the caller feeds it; it asks for its logits, and for its
// hidden state when a pass follows.
func chainEntry(s *seq, p int) model.Seq {
	sp := s.sp
	d := sp.pending + p - 1 // the draft pass p−1 made
	return model.Seq{
		Tokens: sp.buf[d : d+1],
		Pos:    len(s.tokens) - 2 + p,
		KV:     s.kv,
		Logits: model.LastLogits,
		Hidden: sp.k > p+1,
	}
}

// checkMTP checks that an MTP pass returned what b asked for.
func (sc *scheduler) checkMTP(b *model.Batch, out *model.Output) error {
	if len(out.Seqs) != len(b.Seqs) {
		return fmt.Errorf("ForwardMTP returned %d outputs for %d sequences", len(out.Seqs), len(b.Seqs))
	}
	vocab, hidden := sc.r.info.Vocab, sc.r.info.Hidden
	for i := range b.Seqs {
		e, o := &b.Seqs[i], &out.Seqs[i]
		if e.Logits == model.AllLogits {
			return fmt.Errorf("ForwardMTP sequence %d: all-rows logits asked of the MTP module", i)
		}
		if err := checkLogits(e, o, out, vocab, b.Top); err != nil {
			return fmt.Errorf("ForwardMTP sequence %d (%d tokens, vocab %d): %w", i, len(e.Tokens), vocab, err)
		}
		if e.Hidden && len(o.Hidden) != len(e.Tokens)*hidden {
			return fmt.Errorf("ForwardMTP sequence %d: %d hidden values for %d tokens (hidden %d)", i, len(o.Hidden), len(e.Tokens), hidden)
		}
	}
	return nil
}

// pickDraft draws draft i of s from the MTP's logits (entry j of out),
// with s's own sampler (greedy: its argmax), keeping the distribution for
// verification.
func (sc *scheduler) pickDraft(s *seq, i int, out *model.Output, j int) {
	sp := s.sp
	at := sp.pending + i
	hist := append(s.tokens, sp.buf[sp.pending:at]...) // the history the draft follows
	if s.sampler.Params().Temperature == 0 {
		sp.buf[at] = sc.pick(s, out, j, 0, hist)
		return
	}
	q := s.sampler.Probs(out.Seqs[j].Logits, hist) // a Full entry
	sp.buf[at] = s.sampler.SampleFrom(q)
	sp.q = append(sp.q[:i], q)
}

// verifySafe is verify, turning a panic into an Error event for s alone.
func (sc *scheduler) verifySafe(s *seq, e *model.Seq, out *model.Output, i int, now time.Time) {
	defer func() {
		if p := recover(); p != nil {
			sc.finish(s, Event{Type: EventError, Err: &PanicError{Value: p, Stack: debug.Stack()}}, now)
		}
	}()
	sc.cur = s
	sc.verify(s, e, out, i, now)
}

// verify judges s's drafts against the target's logits, in order: greedy
// accepts a draft equal to the target's choice; sampling accepts draft d
// with probability min(1, p(d)/q(d)) and on rejection draws from
// norm(max(0, p−q)), which leaves every emitted token distributed exactly
// as plain sampling's. The first rejection ends the step with the
// corrected token; if every draft passes, a bonus token is drawn from the
// last row. Then the cache is cut back to the accepted positions and a
// hybrid model's recurrent state rolled back to the one the pass recorded
// after the last accepted position (see doc.go).
func (sc *scheduler) verify(s *seq, e *model.Seq, out *model.Output, i int, now time.Time) {
	r, sp, o := sc.r, s.sp, &out.Seqs[i]
	P, k, c, vocab := sp.pending, sp.k, e.Pos, r.info.Vocab
	greedy := s.sampler.Params().Temperature == 0
	// The pending tokens' hidden states stand whatever is accepted: known
	// before a token is emitted, so that a prefix cached when the request
	// finishes here (retain, up to them) keeps its MTP rows.
	sp.addHidden(c, P, o.Hidden, r.info.Hidden)
	judged, a, alive := 0, 0, true
	for j := 0; j <= k && alive; j++ {
		var tok int32
		ok := false
		switch {
		case greedy || j == k: // every draft passed: the bonus token
			tok = sc.pick(s, out, i, P-1+j, s.tokens)
			ok = greedy && j < k && tok == sp.buf[P+j]
		default: // a Full entry
			tok, ok = sc.judge(s, o.Logits[(P-1+j)*vocab:(P+j)*vocab], j)
		}
		if j < k {
			judged++
		}
		if ok {
			a++
		}
		alive = sc.emit(s, tok, now)
		if !ok {
			break
		}
	}
	sp.n.add(judged, a)
	sc.spec.add(judged, a)
	sp.learn(judged, a)
	if !alive {
		return // finished: everything is released
	}
	// Positions [c, c+P+a) hold the pending tokens and the accepted
	// drafts; the last emitted token is the next one to run.
	valid := c + P + a
	sp.addHidden(c, P+a, o.Hidden, r.info.Hidden)
	if s.slot != nil && a < k {
		// The linear layers have run over rejected drafts too: back to the
		// state the pass recorded after the last accepted position (the
		// slot takes the snapshot's row; endDraft frees the old one).
		r.states.Adopt(s.slot, sp.recs[a])
	}
	s.computed = valid
	r.cache.Truncate(s.kv, valid)
	sc.endDraft(s)
}

// judge is the sampling acceptance test of draft j of s against the
// target's logits row.
func (sc *scheduler) judge(s *seq, row []float32, j int) (tok int32, ok bool) {
	sp := s.sp
	d := sp.buf[sp.pending+j]
	p := s.sampler.Probs(row, s.tokens)
	q := sp.q[j]
	if float64(s.sampler.Uniform())*float64(q[d]) < float64(p[d]) {
		return d, true
	}
	res := make([]float32, len(p))
	positive := false
	for i := range p {
		if v := p[i] - q[i]; v > 0 {
			res[i], positive = v, true
		}
	}
	if !positive { // p ≤ q everywhere: p = q up to rounding
		res = p
	}
	return s.sampler.SampleFrom(res), false
}
