package runtime

import (
	"cmp"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
)

// scheduler is the loop goroutine's state.
type scheduler struct {
	r       *Runtime
	waiting []*seq // sorted by id (preempted sequences go back to their place)
	running []*seq // sorted by id; the last is the newest, the first to preempt

	batch    model.Batch // the step being built; batch.Seqs[i] belongs to step[i]
	step     []*seq      // (len(batch.Seqs)) the sequence of each batch entry
	cur      *seq        // the sequence being scheduled or sampled, for panic blame
	drawn    []drawn     // (len(step)) tokens drawn ahead by presample (pick.go)
	todo     []int       // presample's scratch: the entries it draws
	preempts int         // preemptions in the step being built

	// The MTP passes of the step (spec.go).
	mtpBatch  model.Batch
	mtpHidden [][]float32   // (len(mtpBatch.Seqs)) the hidden-state input of each entry
	mtpSeqs   []*seq        // (len(mtpBatch.Seqs)) the sequence of each entry
	mtpPrompt bool          // the step's MTP passes fed the module prompt rows
	one       oneStepPasses // a speculative step run as one device step (onestep.go)

	pads padder // pad entries of a pass (pad.go)

	// Engine-wide counters, published in Stats.
	steps, promptToks, genToks, preemptTotal, failed uint64
	lastSeqs, lastToks                               int
	lastStep                                         time.Duration
	passes                                           PassTimes // Stats.Passes
	winStart                                         time.Time // start of the steps/s window
	winSteps                                         int       // steps in the window
	stepsPerSec                                      float64
	topRows, topMisses                               uint64     // rows sampled from their best entries; rows those could not decide
	lastDrafts                                       int        // draft tokens verified in the last step
	spec                                             specCounts // speculative decoding since New
	cost                                             draftCost  // cost of drafting vs plain steps (cost.go)

	prefix prefixCache // cached prefixes (prefix.go)
}

func (sc *scheduler) init(r *Runtime) {
	sc.r = r
	sc.batch.Cache = r.cache
	sc.batch.States = r.states
	sc.mtpBatch.Cache = r.cache // the MTP layer has no recurrent state: no States
	sc.prefix.max = max(r.opts.PrefixCache, 0)
}

// loop is the scheduler goroutine. When it ends (Close) every sequence
// has been finished, and it releases the cache and the state pool, once.
func (r *Runtime) loop() {
	defer close(r.loopDone)
	for r.sched.iterate() {
	}
	r.cache.Release()
	if r.states != nil {
		r.states.Release()
	}
}

// iterate runs one turn of the loop and reports whether to go on. Panics
// inside a step are handled by runStep; one anywhere else in the turn
// (a bug in the bookkeeping) fails every request rather than the process.
func (sc *scheduler) iterate() (more bool) {
	r := sc.r
	defer func() {
		if p := recover(); p != nil {
			sc.failAll(&PanicError{Value: p, Stack: debug.Stack()})
			r.publish()
			more = true
		}
	}()
	if closed := sc.intake(); closed {
		sc.failAll(ErrClosed)
		sc.dropPrefixes()
		r.publish()
		return false
	}
	sc.reap()
	if len(sc.running) == 0 && len(sc.waiting) == 0 {
		sc.stepsPerSec, sc.winSteps = 0, 0
		r.publish()
		select {
		case <-r.wake:
		case <-r.quit:
		}
		return true
	}
	sc.runStep()
	r.publish()
	return true
}

// intake moves new requests into the waiting queue and reports whether the
// runtime is closing.
func (sc *scheduler) intake() (closed bool) {
	r := sc.r
	r.mu.Lock()
	in, drops := r.incoming, r.drops
	r.incoming, r.drops = nil, nil
	closed = r.closed
	r.mu.Unlock()
	for _, s := range in {
		sc.wait(s) // ids grow, so this appends
	}
	if len(drops) > 0 {
		sc.dropPrefixes()
		r.publish()
		for _, done := range drops {
			close(done)
		}
	}
	return closed
}

// reap ends cancelled requests, returning their blocks at once.
func (sc *scheduler) reap() {
	now := time.Now()
	for _, list := range []*[]*seq{&sc.running, &sc.waiting} {
		for i := len(*list) - 1; i >= 0; i-- { // finish removes (*list)[i]
			if s := (*list)[i]; s.cancelled.Load() {
				sc.finish(s, Event{Type: EventDone, Finish: FinishCancelled}, now)
			}
		}
	}
}

// failAll ends every request with err.
func (sc *scheduler) failAll(err error) {
	now := time.Now()
	for _, list := range []*[]*seq{&sc.running, &sc.waiting} {
		for i := len(*list) - 1; i >= 0; i-- {
			sc.finish((*list)[i], Event{Type: EventError, Err: err}, now)
		}
	}
}

// runStep builds and runs one batch and samples its results. A panic
// anywhere inside fails the requests in the step (and the one being looked
// at) and nothing else.
func (sc *scheduler) runStep() {
	start := time.Now()
	defer func() {
		sc.unpad(&sc.batch, nil, nil, len(sc.step)) // after a panic in a padded pass
		for _, s := range sc.step {
			s.inStep = false
			sc.endDraft(s)
		}
		sc.batch.Seqs, sc.step, sc.cur = sc.batch.Seqs[:0], sc.step[:0], nil
		clear(sc.mtpHidden)
		clear(sc.mtpSeqs)
	}()
	defer func() {
		if p := recover(); p != nil {
			sc.failStep(&PanicError{Value: p, Stack: debug.Stack()})
		}
	}()

	sc.schedule()
	sc.cur = nil // from here on, a panic is the step's
	if len(sc.step) == 0 {
		return
	}
	out, err := sc.draft() // out: the verification too, in one device step
	if err != nil {
		sc.failStep(fmt.Errorf("runtime: MTP draft: %w", err))
		return
	}
	if out == nil {
		askTop(&sc.batch, sc.step, func(i int) bool { return sc.step[i].sp != nil && sc.step[i].sp.k > 0 })
		entries := sc.pad(&sc.batch, nil)
		t0 := time.Now()
		out, err = sc.r.m.Forward(&sc.batch)
		sc.timePass(time.Since(t0))
		sc.unpad(&sc.batch, nil, out, entries)
	}
	if err == nil {
		err = sc.checkOutput(out)
	}
	if err == nil && sc.r.opts.DeviceErr != nil {
		err = sc.r.opts.DeviceErr()
	}
	if err != nil {
		sc.failStep(fmt.Errorf("runtime: forward: %w", err))
		return
	}
	now := time.Now()
	sc.account(start, now)
	sc.presample(out)
	gen, timed, specs := sc.genToks, true, false // timed: a decode step, for the drafting cost
	for i, s := range sc.step {
		e, o := &sc.batch.Seqs[i], &out.Seqs[i]
		specs = specs || s.sp != nil
		if s.sp != nil && s.sp.k > 0 {
			sc.verifySafe(s, e, out, i, now)
			continue
		}
		n := len(e.Tokens)
		if n > 1 || s.computed < s.nPrompt {
			sc.promptToks += uint64(n) // a prompt chunk or a recomputation
			timed = false
		}
		if s.sp != nil {
			s.sp.addHidden(e.Pos, n, o.Hidden, sc.r.info.Hidden)
		}
		s.computed += n
		if e.Pos < s.nPrompt && s.computed == s.nPrompt {
			sc.promptDone(s)
		}
		if e.Logits == model.LastLogits {
			sc.advanceSafe(s, out, i, now)
		}
	}
	if timed && specs && !sc.mtpPrompt && !sc.r.opts.DraftIgnoreCost {
		sc.cost.observe(sc.lastDrafts > 0, time.Since(start), int(sc.genToks-gen))
	}
	// Prompts become cached prefixes once the MTP module has seen them.
	for _, s := range sc.step {
		if s.promptDue && s.state == seqRunning && (s.sp == nil || s.sp.mtpDone >= s.nPrompt) {
			sc.cachePrompt(s)
		}
	}
}

// timePass adds the main model's pass of the step, d long, to
// Stats.Passes: a verification when a sequence has drafts in it, a decode
// pass when every entry is one token past its prompt, else nothing.
func (sc *scheduler) timePass(d time.Duration) {
	verify := false
	for i, s := range sc.step {
		e := &sc.batch.Seqs[i]
		switch {
		case s.sp != nil && s.sp.k > 0:
			verify = true
		case len(e.Tokens) != 1 || e.Pos < s.nPrompt:
			return
		}
	}
	if verify {
		sc.passes.Verify++
		sc.passes.VerifyT += d
	} else {
		sc.passes.Decode++
		sc.passes.DecodeT += d
	}
}

// checkOutput checks that the model returned what the step asked for.
func (sc *scheduler) checkOutput(out *model.Output) error {
	if len(out.Seqs) != len(sc.batch.Seqs) {
		return fmt.Errorf("model returned %d outputs for %d sequences", len(out.Seqs), len(sc.batch.Seqs))
	}
	vocab, hidden := sc.r.info.Vocab, sc.r.info.Hidden
	for i := range sc.batch.Seqs {
		e, o := &sc.batch.Seqs[i], &out.Seqs[i]
		if err := checkLogits(e, o, out, vocab, sc.batch.Top); err != nil {
			return fmt.Errorf("sequence %d (%d tokens, vocab %d): %w", i, len(e.Tokens), vocab, err)
		}
		if e.Hidden && len(o.Hidden) != len(e.Tokens)*hidden {
			return fmt.Errorf("sequence %d: %d hidden values for %d tokens (hidden %d)", i, len(o.Hidden), len(e.Tokens), hidden)
		}
	}
	return nil
}

// account updates the engine-wide step counters.
func (sc *scheduler) account(start, now time.Time) {
	sc.steps++
	sc.lastSeqs, sc.lastToks = len(sc.batch.Seqs), sc.batch.Tokens()
	sc.lastDrafts = 0
	for _, s := range sc.step {
		if s.sp != nil {
			sc.lastDrafts += s.sp.k
		}
	}
	sc.lastStep = now.Sub(start)
	if sc.winSteps == 0 {
		sc.winStart = start
	}
	sc.winSteps++
	if d := now.Sub(sc.winStart); d >= time.Second {
		sc.stepsPerSec = float64(sc.winSteps) / d.Seconds()
		sc.winSteps = 0
	} else if sc.stepsPerSec == 0 && d > 0 {
		sc.stepsPerSec = float64(sc.winSteps) / d.Seconds()
	}
}

// failStep ends with err every unfinished request of the step being built
// or run, and the one being looked at when it failed (so a request that
// makes scheduling panic cannot fail step after step).
func (sc *scheduler) failStep(err error) {
	victims := slices.Clone(sc.step)
	if sc.cur != nil && !sc.cur.inStep {
		victims = append(victims, sc.cur)
	}
	now := time.Now()
	for _, s := range victims {
		sc.finish(s, Event{Type: EventError, Err: err}, now)
	}
}

// ** building a step **

// schedule fills sc.batch: decode tokens first, then prompt chunks of
// running sequences, then chunks of newly admitted ones.
func (sc *scheduler) schedule() {
	sc.preempts = 0
	for {
		budget := sc.r.opts.MaxBatchTokens
		budget = sc.scheduleDecodes(budget)
		budget = sc.scheduleDrafts(budget)
		budget = sc.schedulePrefills(budget)
		// After a preemption the cache is tight: admit nobody new, unless
		// nothing runs at all.
		if sc.preempts == 0 || len(sc.running) == 0 {
			sc.admit(budget)
		}
		switch {
		case len(sc.step) > 0 || len(sc.running) == 0 && len(sc.waiting) == 0:
			return
		case len(sc.running) > 0:
			// The running sequences hold the whole cache and none can take
			// a step (all are mid-prefill): evict the newest, try again.
			sc.preempt(sc.running[len(sc.running)-1])
		default:
			// Nothing runs and the head of the queue does not fit in the
			// empty cache: it never will.
			s := sc.waiting[0]
			err := fmt.Errorf("%w: %d tokens do not fit in the empty cache", ErrPromptTooLong, len(s.tokens))
			sc.finish(s, Event{Type: EventError, Err: err}, time.Now())
		}
	}
}

// scheduleDecodes adds one token for each running sequence with exactly one
// pending, preempting the newest sequences when the cache is full, and
// returns the budget left. A speculating sequence of a hybrid model that
// rolled back its recurrent state after a rejected draft counts as decoding
// too, with the tokens to recompute in front of its last one.
func (sc *scheduler) scheduleDecodes(budget int) int {
	for i := 0; i < len(sc.running) && budget > 0; i++ {
		s := sc.running[i]
		sc.cur = s
		n := len(s.tokens) - s.computed
		if n != 1 && (n < 1 || n > budget || s.sp == nil || !s.sp.ready(s)) {
			continue
		}
		if !sc.reserveOrPreempt(s, s.computed+n) {
			break // s itself was the newest and is preempted; so are all after it
		}
		sc.add(s, n)
		budget -= n
	}
	return budget
}

// schedulePrefills adds a prompt chunk for each running sequence with more
// than one token pending, as far as the budget and the free blocks go.
func (sc *scheduler) schedulePrefills(budget int) int {
	for _, s := range sc.running {
		if budget == 0 {
			break
		}
		sc.cur = s
		if s.inStep || len(s.tokens)-s.computed < 1 {
			continue
		}
		n := sc.fit(s, min(len(s.tokens)-s.computed, budget), 0)
		if n == 0 {
			continue
		}
		sc.reserve(s, s.computed+n)
		sc.add(s, n)
		budget -= n
	}
	return budget
}

// admit moves waiting requests into the running set in arrival order while
// the budget, MaxSeqs and the cache allow, scheduling their first chunk.
func (sc *scheduler) admit(budget int) {
	for budget > 0 && len(sc.waiting) > 0 && len(sc.running) < sc.r.opts.MaxSeqs {
		s := sc.waiting[0]
		sc.cur = s
		if !sc.attach(s) {
			sc.release(s)
			if len(sc.running) > 0 {
				return // a running sequence will free a slot
			}
			st := sc.r.states
			err := fmt.Errorf("%w: no state slot free with no sequence running (%d of %d bytes in use, %d per sequence)",
				ErrStateBudget, st.Used(), st.Budget(), st.BytesPerSeq())
			sc.finish(s, Event{Type: EventError, Err: err}, time.Now())
			continue
		}
		// Keep a block of headroom per running sequence, so admitting
		// does not immediately force a preemption on the next decode.
		n := sc.fit(s, min(len(s.tokens)-s.computed, budget), len(sc.running))
		if n == 0 {
			sc.release(s)
			s.cached = 0
			return
		}
		if s.cached > 0 {
			sc.prefix.hits++
			sc.prefix.tokens += uint64(s.cached)
		}
		if !s.admitted {
			s.admitted, s.promptCached = true, min(s.cached, s.nPrompt)
		}
		sc.waiting = slices.Delete(sc.waiting, 0, 1)
		sc.insertRunning(s)
		sc.reserve(s, s.computed+n)
		sc.add(s, n)
		budget -= n
	}
}

// attach gives a sequence being admitted its cache handle and, for a
// hybrid model, a recurrent-state slot; it reports false when the state
// pool is full even without cached checkpoints (the caller releases s).
// With the prefix cache on, the handle is a fork of the longest cached
// prefix of the sequence's tokens (the slot holds its checkpoint) and only
// the rest is computed.
func (sc *scheduler) attach(s *seq) bool {
	r := sc.r
	s.computed, s.cached, s.mtpRows = 0, 0, 0
	if s.sp != nil {
		s.sp.reset()
	}
	var e *prefix
	var d, m int
	if sc.prefix.on() {
		e, d, m = sc.match(s)
	}
	steal := false
	if r.states != nil {
		if !sc.stateRoom(1, e) {
			// Only e's checkpoint is left to evict: take its slot over,
			// or start from scratch.
			if e != nil && e.slot != nil {
				steal = true
			} else if e = nil; !sc.stateRoom(1, nil) {
				return false
			}
		}
		if !steal {
			slot, err := r.states.Alloc()
			if err != nil {
				return false
			}
			s.slot = slot
		}
	}
	if e != nil {
		sc.attachPrefix(s, e, d, m, steal)
	}
	if s.kv == nil {
		s.kv = r.cache.NewSeq()
	}
	return true
}

// release returns a sequence's cache handle and state slot (what retain
// has not kept), and forgets what its MTP module had seen.
func (sc *scheduler) release(s *seq) {
	if s.kv != nil {
		sc.r.cache.Free(s.kv)
		s.kv = nil
	}
	sc.endDraft(s)
	if s.slot != nil {
		sc.r.states.Free(s.slot)
		s.slot = nil
	}
	if s.promptSnap != nil {
		sc.r.states.FreeSnapshot(s.promptSnap)
		s.promptSnap = nil
	}
	s.promptDue = false
	if s.sp != nil {
		s.sp.reset()
	}
	s.computed = 0
}

// fit is the largest n ≤ want such that reserving tokens [computed,
// computed+n) of s leaves at least headroom blocks free, evicting cached
// prefixes for room first.
func (sc *scheduler) fit(s *seq, want, headroom int) int {
	c := sc.r.cache
	sc.cacheRoom(c.BlocksNeeded(s.kv, s.computed+want) + headroom)
	free := c.BlocksFree() - headroom
	if free < 0 {
		return 0
	}
	if c.BlocksNeeded(s.kv, s.computed+want) <= free {
		return want
	}
	bs := c.BlockSize()
	n := min(want, (len(s.kv.Blocks())+free)*bs-s.computed)
	for n > 0 && c.BlocksNeeded(s.kv, s.computed+n) > free {
		n -= bs
	}
	return max(n, 0)
}

// reserve grows s's cache to n tokens; fit has checked that it can.
func (sc *scheduler) reserve(s *seq, n int) {
	if err := sc.r.cache.Reserve(s.kv, n); err != nil {
		panic("runtime: reserve after fit failed")
	}
}

// reserveOrPreempt grows s's cache to n tokens, evicting cached prefixes
// and then preempting the newest running sequences until it fits. It
// returns false when s itself had to be preempted.
func (sc *scheduler) reserveOrPreempt(s *seq, n int) bool {
	for {
		err := sc.r.cache.Reserve(s.kv, n)
		if err == nil {
			return true
		}
		if !errors.Is(err, kvcache.ErrCacheFull) {
			panic(err)
		}
		if sc.evictPrefix() {
			continue
		}
		victim := sc.running[len(sc.running)-1]
		sc.preempt(victim)
		if victim == s {
			return false
		}
	}
}

// add appends tokens [computed, computed+n) of s to the batch. Logits are
// requested when the chunk reaches the sequence's last token.
func (sc *scheduler) add(s *seq, n int) {
	if s.kv.Len() < s.computed+n {
		panic("runtime: cache not reserved for the scheduled chunk")
	}
	mode := model.NoLogits
	if s.computed+n == len(s.tokens) {
		mode = model.LastLogits
	}
	sc.batch.Seqs = append(sc.batch.Seqs, model.Seq{
		Tokens: s.tokens[s.computed : s.computed+n],
		Pos:    s.computed,
		KV:     s.kv,
		Logits: mode,
		Hidden: s.sp != nil, // the MTP module's input
		State:  s.slot,
	})
	sc.step = append(sc.step, s)
	s.inStep = true
	if s.firstSched.IsZero() {
		s.firstSched = time.Now()
	}
}

// preempt frees a running sequence's blocks and puts it back in the
// waiting queue with everything it has generated, to be recomputed.
func (sc *scheduler) preempt(s *seq) {
	if s.inStep {
		panic("runtime: preempting a sequence already in the step")
	}
	sc.release(s)
	sc.running = remove(sc.running, s)
	sc.wait(s)
	s.preemptions++
	sc.preempts++
	sc.preemptTotal++
}

// ** after the forward pass **

// advanceSafe samples the next token of s from its entry i of out,
// turning a panic (sampler, decoder) into an Error event for s alone.
func (sc *scheduler) advanceSafe(s *seq, out *model.Output, i int, now time.Time) {
	defer func() {
		if p := recover(); p != nil {
			sc.finish(s, Event{Type: EventError, Err: &PanicError{Value: p, Stack: debug.Stack()}}, now)
		}
	}()
	sc.cur = s
	tok := int32(0)
	switch d := &sc.drawn[i]; {
	case d.panic != nil:
		sc.finish(s, Event{Type: EventError, Err: &PanicError{Value: d.panic, Stack: d.stack}}, now)
		return
	case d.done:
		tok = d.tok
	default:
		tok = sc.pick(s, out, i, 0, s.tokens)
	}
	sc.emit(s, tok, now)
}

// emit appends tok to s's output and posts it, and ends the request when a
// stop id, MaxTokens or the length limit is reached. It reports whether s
// goes on.
func (sc *scheduler) emit(s *seq, tok int32, now time.Time) bool {
	sc.genToks++
	if s.firstTok.IsZero() {
		s.firstTok = now
	}
	s.lastTok = now
	if slices.Contains(s.req.Stop, tok) {
		sc.finish(s, Event{Type: EventDone, Finish: FinishStop}, now)
		return false
	}
	s.tokens = append(s.tokens, tok)
	var text string
	if s.dec != nil {
		text = s.takeText(s.dec.Add(tok), false)
	}
	s.stream.post(text, []int32{tok}, s.usage(now))
	// The next step would compute position len(tokens)-1: it must exist.
	limit := LengthLimit("")
	switch {
	case s.req.MaxTokens > 0 && s.generated() >= s.req.MaxTokens:
		limit = LimitMaxTokens
	case len(s.tokens) > sc.r.limit:
		limit = sc.r.SeqLimit()
	default:
		return true
	}
	sc.finish(s, Event{Type: EventDone, Finish: FinishLength, Limit: limit}, now)
	return false
}

// finish ends s with ev (Usage is filled in): s leaves its queue, its
// cache blocks return to the pool, its context is released, and its final
// event is posted after any text still held back.
func (sc *scheduler) finish(s *seq, ev Event, now time.Time) {
	switch s.state {
	case seqFinished:
		return
	case seqRunning:
		sc.running = remove(sc.running, s)
	case seqWaiting:
		sc.waiting = remove(sc.waiting, s)
	}
	s.state = seqFinished
	if ev.Type == EventDone {
		sc.retain(s)
	}
	sc.release(s)
	s.stopWatch()
	s.cancelCtx()
	if ev.Type == EventError {
		sc.failed++
	}
	if ev.Type == EventDone && ev.Finish != FinishCancelled && s.dec != nil {
		sc.flushText(s, now)
	}
	ev.Usage = s.usage(now)
	s.stream.finish(ev)
}

// flushText posts what the decoder and s still hold back. A panicking
// decoder loses only its tail.
func (sc *scheduler) flushText(s *seq, now time.Time) {
	defer func() { _ = recover() }()
	var tail string
	if f, ok := s.dec.(flusher); ok {
		tail = f.Flush()
	}
	if text := s.takeText(tail, true); text != "" {
		s.stream.post(text, nil, s.usage(now))
	}
}

// ** queues **

// wait puts s in the waiting queue at its arrival position.
func (sc *scheduler) wait(s *seq) {
	s.state = seqWaiting
	i, _ := slices.BinarySearchFunc(sc.waiting, s.id, func(e *seq, id uint64) int { return cmp.Compare(e.id, id) })
	sc.waiting = slices.Insert(sc.waiting, i, s)
}

// insertRunning puts s in the running set at its arrival position.
func (sc *scheduler) insertRunning(s *seq) {
	s.state = seqRunning
	i, _ := slices.BinarySearchFunc(sc.running, s.id, func(e *seq, id uint64) int { return cmp.Compare(e.id, id) })
	sc.running = slices.Insert(sc.running, i, s)
}

// remove deletes s from list, keeping the order.
func remove(list []*seq, s *seq) []*seq {
	if i := slices.Index(list, s); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}
