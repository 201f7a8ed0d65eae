package runtime

import (
	"slices"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
)

// Conversation reuse: computed prefixes kept for later requests (see doc.go).

// DefaultPrefixCache is the most cached prefixes kept when
// Options.PrefixCache is 0.
const DefaultPrefixCache = 64

// maxHidRows is the most target hidden states a cached prefix keeps for the
// MTP rows it has not covered yet (they lag the target by a step or so).
const maxHidRows = 32

// prefix is one cached prefix: the K/V of tokens[:n] in kv and, for a
// hybrid model, the recurrent state after them (the checkpoint: a slot or
// a snapshot). Nothing writes what a prefix uses: a sequence forked from
// it shares its blocks read-only (kvcache copies a shared partial block
// before writing into it, and attachPrefix the blocks of MTP rows to
// recompute), and the sequence it was forked from writes only past n (and
// MTP rows from mtp on).
type prefix struct {
	tokens []int32      // ids of the sequence; tokens[:n] are cached, the rest only sharpen matching (MTP rows)
	n      int          // cached length: kv.Len()
	kv     *kvcache.Seq // the blocks of positions [0, n)
	// mtp is how many MTP cache rows are valid (models with an MTP module):
	// rows [0, mtp), where row j depends on tokens[j+1] as well.
	mtp int
	// hid holds the target's hidden states of positions [hidAt, n): what a
	// forked speculating sequence feeds its MTP module first.
	hidAt int
	hid   []float32
	slot  *linattn.Slot     // hybrid models: the state after n tokens, in a slot...
	snap  *linattn.Snapshot // ...or in a snapshot
}

// prefixCache is the scheduler's list of cached prefixes.
type prefixCache struct {
	max     int       // most entries; 0: conversation reuse is off
	entries []*prefix // least recently used first

	blocks int    // distinct cache blocks the entries reference
	dirty  bool   // blocks must be counted again
	mark   []bool // scratch for counting blocks

	hits, tokens uint64 // admissions that reused a prefix, and the tokens they reused
}

func (p *prefixCache) on() bool { return p.max > 0 }

// checkpoints is the number of state checkpoints held.
func (p *prefixCache) checkpoints() int {
	n := 0
	for _, e := range p.entries {
		if e.slot != nil || e.snap != nil {
			n++
		}
	}
	return n
}

// touch marks e as the most recently used.
func (p *prefixCache) touch(e *prefix) {
	if i := slices.Index(p.entries, e); i >= 0 {
		p.entries = append(slices.Delete(p.entries, i, i+1), e)
	}
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// hasPrefix reports whether b is a prefix of a.
func hasPrefix(a, b []int32) bool { return len(a) >= len(b) && slices.Equal(a[:len(b)], b) }

// covers reports whether a serves every request that b serves, as far
// (the MTP's reach aside, at most one token) as b does.
func (sc *scheduler) covers(a, b *prefix) bool {
	if !hasPrefix(a.tokens, b.tokens) || a.mtp < b.mtp {
		return false
	}
	if sc.r.states != nil || a.n == b.n {
		// A hybrid's prefix is usable only at its checkpoint.
		return a.n == b.n && a.hidAt <= b.hidAt
	}
	return a.n > b.n
}

// match finds the cached prefix that serves the most of s.tokens: it
// returns the entry, the length d to fork and the MTP rows m ≤ d that stay
// valid; nil when none serves a token. The last token is always computed
// (its logits are needed). A hybrid's prefix serves only its whole length,
// where its checkpoint is. A speculating sequence needs the MTP rows of
// [0, d) too: those from m on are recomputed from the entry's hidden
// states, or d is cut to m.
func (sc *scheduler) match(s *seq) (best *prefix, d, m int) {
	r := sc.r
	last := len(s.tokens) - 1
	for i := len(sc.prefix.entries) - 1; i >= 0; i-- { // most recent first: it wins ties
		e := sc.prefix.entries[i]
		lcp := commonPrefix(e.tokens, s.tokens)
		n := min(lcp, e.n, last)
		if n <= d || r.states != nil && n < e.n {
			continue
		}
		k := 0
		if r.mtp != nil {
			// Row j holds the MTP's view of tokens j and j+1.
			k = max(0, min(e.mtp, n, lcp-1))
			if s.sp != nil && k < n && k < e.hidAt {
				if r.states != nil {
					continue
				}
				n = k
			}
		}
		if n > d {
			best, d, m = e, n, k
		}
	}
	return best, d, m
}

// attachPrefix gives s, being admitted, the first d tokens of the cached
// prefix e (see match) while the cache has room: a fork of its blocks, its
// checkpoint (copied into the slot of s, or with steal, that slot itself
// is taken over and e dropped), and the MTP's progress. With steal s gets
// the slot even when the prefix cannot be used.
func (sc *scheduler) attachPrefix(s *seq, e *prefix, d, m int, steal bool) {
	r := sc.r
	c := r.cache
	defer func() {
		if steal {
			s.slot, e.slot = e.slot, nil
			if s.kv == nil {
				r.states.Reset(s.slot)
			}
			sc.prefix.entries = slices.DeleteFunc(sc.prefix.entries, func(o *prefix) bool { return o == e })
			sc.freePrefix(e)
		}
	}()
	var kv *kvcache.Seq
	if s.sp != nil && m < d {
		// The MTP rows [m, d) are written again: copy the blocks that
		// hold them rather than share them.
		bs := c.BlockSize()
		base := m / bs * bs
		kv, _ = c.Fork(e.kv, base)
		if err := c.Reserve(kv, d); err != nil {
			c.Free(kv)
			if r.states != nil {
				return
			}
			kv, d = nil, m
		} else {
			src, dst := e.kv.Blocks(), kv.Blocks()
			for i := base / bs; i < len(dst); i++ {
				c.CopyBlock(dst[i], src[i])
			}
		}
	}
	if d == 0 {
		return
	}
	if kv == nil {
		kv, _ = c.Fork(e.kv, d) // d ≤ e.n: cannot fail
	}
	switch {
	case steal: // the slot is e's
	case e.slot != nil:
		r.states.Copy(s.slot, e.slot)
	case e.snap != nil:
		r.states.Restore(s.slot, e.snap)
	}
	s.kv, s.computed, s.cached = kv, d, d
	if sp := s.sp; sp != nil {
		w := r.info.Hidden
		sp.mtpDone, sp.hidEnd, sp.hid = m, d, sp.hid[:0]
		if m < d {
			sp.hid = append(sp.hid, e.hid[(m-e.hidAt)*w:(d-e.hidAt)*w]...)
		}
	} else {
		s.mtpRows = m
	}
	sc.prefix.touch(e)
}

// mtpValid is how many MTP cache rows of s are valid.
func (s *seq) mtpValid() int {
	if s.sp != nil {
		return s.sp.mtpDone
	}
	return s.mtpRows
}

// newPrefix describes tokens[:n] of the running sequence s as a prefix
// (without blocks or checkpoint): the MTP's progress and the hidden states
// it has not seen.
func (sc *scheduler) newPrefix(s *seq, tokens []int32, n int) *prefix {
	e := &prefix{tokens: tokens, n: n, hidAt: n}
	if sc.r.mtp == nil {
		return e
	}
	e.mtp = min(s.mtpValid(), n)
	if sp := s.sp; sp != nil && sp.mtpDone < n && n-sp.mtpDone <= maxHidRows && sp.hidEnd >= n {
		w := sc.r.info.Hidden
		e.hidAt = sp.mtpDone
		e.hid = slices.Clone(sp.hid[:(n-sp.mtpDone)*w])
	}
	return e
}

// promptDone is called when s has computed its whole prompt: for a hybrid
// model it takes the state checkpoint there (if the pool has room that no
// waiting request could use), and the prompt becomes a cached prefix once
// the MTP module (if s speculates) has caught up with it.
func (sc *scheduler) promptDone(s *seq) {
	r := sc.r
	if !sc.prefix.on() || s.promptDue {
		return
	}
	if r.states != nil {
		if sc.stateFree() <= sc.waitingSlots() || !sc.stateRoom(1, nil) {
			return
		}
		snap, err := r.states.NewSnapshot()
		if err != nil {
			return
		}
		r.states.Snapshot(snap, s.slot)
		s.promptSnap = snap
	}
	s.promptDue = true
}

// cachePrompt makes the prompt of s a cached prefix (promptDone was
// called). The token sampled after it, when known, is kept for matching.
func (sc *scheduler) cachePrompt(s *seq) {
	n := s.nPrompt
	s.promptDue = false
	kv, err := sc.r.cache.Fork(s.kv, n)
	if err != nil {
		panic(err) // n ≤ computed ≤ kv.Len()
	}
	t := min(len(s.tokens), n+1)
	e := sc.newPrefix(s, s.tokens[:t:t], n)
	e.kv, e.snap, s.promptSnap = kv, s.promptSnap, nil
	sc.addPrefix(e)
}

// retain keeps what s, ending normally, has computed as a cached prefix:
// its blocks (cut to the computed tokens) and, for a hybrid model, its
// state as the checkpoint. The prompt becomes a prefix as well if it was
// due. release frees what retain leaves.
func (sc *scheduler) retain(s *seq) {
	n := s.computed
	sp := s.sp
	verifying := sc.r.states != nil && sp != nil && sp.k > 0
	if verifying {
		// Finished while verifying drafts: the slot has run over them; the
		// pass recorded the state after the pending tokens, whose K/V it
		// wrote.
		n += sp.pending
	}
	if !sc.prefix.on() || s.kv == nil || n == 0 {
		return
	}
	if s.promptDue && n > s.nPrompt {
		sc.cachePrompt(s)
	}
	e := sc.newPrefix(s, s.tokens, n)
	if sc.r.states != nil {
		if verifying {
			e.snap, sp.recs[0] = sp.recs[0], nil
		} else {
			e.slot, s.slot = s.slot, nil
		}
		if e.snap == nil && e.slot == nil {
			return
		}
	}
	sc.r.cache.Truncate(s.kv, n)
	e.kv, s.kv = s.kv, nil
	sc.addPrefix(e)
}

// addPrefix puts e in the cache as its most recent entry, unless an entry
// covers it; entries it covers go, and the shorter prefixes of its own
// conversation (a hybrid's earlier checkpoints: the prompt, the turns
// before) become the least recently used, the first to go for room: they
// serve only a branch of the conversation.
func (sc *scheduler) addPrefix(e *prefix) {
	p := &sc.prefix
	for _, o := range p.entries {
		if sc.covers(o, e) {
			p.touch(o)
			sc.freePrefix(e)
			return
		}
	}
	var older []*prefix
	p.entries = slices.DeleteFunc(p.entries, func(o *prefix) bool {
		switch {
		case sc.covers(e, o):
			sc.freePrefix(o)
			return true
		case o.n < e.n && hasPrefix(e.tokens, o.tokens[:o.n]):
			older = append(older, o)
			return true
		}
		return false
	})
	p.entries = append(append(older, p.entries...), e)
	p.dirty = true
	for len(p.entries) > p.max {
		sc.evictPrefix()
	}
}

// freePrefix returns what e holds to the pools.
func (sc *scheduler) freePrefix(e *prefix) {
	sc.r.cache.Free(e.kv)
	if e.slot != nil {
		sc.r.states.Free(e.slot)
	}
	if e.snap != nil {
		sc.r.states.FreeSnapshot(e.snap)
	}
	*e = prefix{}
	sc.prefix.dirty = true
}

// evictPrefix drops the least recently used entry; false when there is
// none.
func (sc *scheduler) evictPrefix() bool {
	p := &sc.prefix
	if len(p.entries) == 0 {
		return false
	}
	e := p.entries[0]
	p.entries = slices.Delete(p.entries, 0, 1)
	sc.freePrefix(e)
	return true
}

// dropPrefixes empties the cache.
func (sc *scheduler) dropPrefixes() {
	for sc.evictPrefix() {
	}
}

// stateRoom evicts the least recently used checkpoints (but keep's) until
// the state pool has room for n more slots or snapshots, and reports
// whether it has.
func (sc *scheduler) stateRoom(n int, keep *prefix) bool {
	st, p := sc.r.states, &sc.prefix
	for st.Available() < n {
		i := slices.IndexFunc(p.entries, func(e *prefix) bool { return e != keep && (e.slot != nil || e.snap != nil) })
		if i < 0 {
			return false
		}
		e := p.entries[i]
		p.entries = slices.Delete(p.entries, i, i+1)
		sc.freePrefix(e)
	}
	return true
}

// stateFree is the number of slots or snapshots the state pool can give,
// evicting checkpoints if need be.
func (sc *scheduler) stateFree() int { return sc.r.states.Available() + sc.prefix.checkpoints() }

// waitingSlots is the number of state slots that waiting requests could be
// admitted into now.
func (sc *scheduler) waitingSlots() int {
	return min(len(sc.waiting), sc.r.opts.MaxSeqs-len(sc.running))
}

// cacheRoom evicts the least recently used entries until need blocks are
// free, and reports whether they are.
func (sc *scheduler) cacheRoom(need int) bool {
	for sc.r.cache.BlocksFree() < need {
		if !sc.evictPrefix() {
			return false
		}
	}
	return true
}

// prefixBlocks is the number of distinct cache blocks the entries
// reference.
func (sc *scheduler) prefixBlocks() int {
	p := &sc.prefix
	if !p.dirty {
		return p.blocks
	}
	if total := sc.r.cache.Stats().BlocksTotal; len(p.mark) < total {
		p.mark = make([]bool, total)
	}
	p.blocks = 0
	for _, e := range p.entries {
		for _, b := range e.kv.Blocks() {
			if !p.mark[b] {
				p.mark[b] = true
				p.blocks++
			}
		}
	}
	for _, e := range p.entries {
		for _, b := range e.kv.Blocks() {
			p.mark[b] = false
		}
	}
	p.dirty = false
	return p.blocks
}
