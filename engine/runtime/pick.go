package runtime

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/sample"
)

// Sampling from a forward pass's output. A sequence whose sampler can
// draw from a row's best entries (sample.Sampler.Candidates) asks the
// model for those only (model.Batch.Top): a device model then reduces its
// logit rows on the device and sends back a few values per row instead of
// the vocabulary. The rows come back whole for the others (model.Seq.Full),
// and on demand (model.Output.Logits) in the rare step where the entries
// cannot decide (sample.Sampler.SampleTop). Whole rows that plain decoding
// samples (a pass over the vocabulary each) are drawn on several
// goroutines before the step's tokens are emitted in order (presample);
// each sampler still draws on one goroutine. Tokens are the same either
// way.

// candidates is how many best entries of a logit row s needs (0: the whole
// row); spec: for a draft or its verification, where sampling (not
// greedy) needs the whole distribution.
func (s *seq) candidates(spec bool) int {
	if spec && s.sampler.Params().Temperature != 0 {
		return 0
	}
	return s.sampler.Candidates()
}

// askTop sets b.Top and every entry's Full for the sequences seqs (one per
// entry): Top is 1 when every sequence that can use best entries is greedy,
// sample.MaxCandidates when one samples (fixed sizes: a device that replays
// repeated steps keeps replaying, and the margin over top-k makes
// undecided rows rare), 0 when none can.
func askTop(b *model.Batch, seqs []*seq, spec func(i int) bool) {
	need := 0
	for i := range b.Seqs {
		e := &b.Seqs[i]
		e.Full = false
		if e.LogitRows() == 0 {
			continue
		}
		n := seqs[i].candidates(spec(i))
		e.Full = n == 0
		need = max(need, n)
	}
	switch {
	case need == 0:
		b.Top = 0
	case need == 1:
		b.Top = 1
	default:
		b.Top = sample.MaxCandidates
	}
}

// pick samples s's next token from logit row r of batch entry i of out,
// after history: from the row's best entries when the model returned them
// and they decide, from the row otherwise (fetched once from the device
// and kept in the entry).
func (sc *scheduler) pick(s *seq, out *model.Output, i, r int, history []int32) int32 {
	o, vocab := &out.Seqs[i], sc.r.info.Vocab
	if o.Top > 0 && o.Logits == nil {
		vals, ids := o.TopRow(r)
		if tok, ok := s.sampler.SampleTop(vals, ids, vocab); ok {
			sc.topRows++
			return tok
		}
		sc.topMisses++
		o.Logits = out.Logits(i)
	}
	return s.sampler.Sample(o.Logits[r*vocab:(r+1)*vocab], history)
}

// checkLogits checks the logits of entry e in o: its rows' best entries
// (not for a Full entry, and only with a way to fetch the rows), or the
// rows.
func checkLogits(e *model.Seq, o *model.SeqOutput, out *model.Output, vocab, top int) error {
	rows := e.LogitRows()
	if o.Top > 0 {
		if e.Full || out.Logits == nil || o.Top > min(top, vocab) || len(o.TopVals) != rows*o.Top || len(o.TopIDs) != rows*o.Top {
			return fmt.Errorf("%d best entries (%d values, %d ids, full %v) for %d rows (Top %d)", o.Top, len(o.TopVals), len(o.TopIDs), e.Full, rows, top)
		}
		for _, id := range o.TopIDs {
			if id < 0 || int(id) >= vocab {
				return fmt.Errorf("best entry id %d outside the vocabulary", id)
			}
		}
		return nil
	}
	if len(o.Logits) != rows*vocab {
		return fmt.Errorf("%d logits for %d rows", len(o.Logits), rows)
	}
	return nil
}

// drawn is a token presample drew for a step entry.
type drawn struct {
	tok   int32
	done  bool
	panic any    // what the sampler panicked with, if it did
	stack []byte // and where
}

// presample draws the next token of every entry of the step that samples
// a whole logit row (no drafts to verify, no best entries) into sc.drawn,
// on up to GOMAXPROCS goroutines when there are two or more; advanceSafe
// emits them. A sampler's panic is kept for its entry alone.
func (sc *scheduler) presample(out *model.Output) {
	n := len(sc.step)
	sc.drawn = slices.Grow(sc.drawn[:0], n)[:n]
	clear(sc.drawn)
	todo := sc.todo[:0]
	for i, s := range sc.step {
		if sc.batch.Seqs[i].Logits == model.LastLogits && (s.sp == nil || s.sp.k == 0) && out.Seqs[i].Top == 0 {
			todo = append(todo, i)
		}
	}
	sc.todo = todo
	if len(todo) < 2 {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(goruntime.GOMAXPROCS(0), len(todo)) {
		wg.Go(func() {
			for j := int(next.Add(1)) - 1; j < len(todo); j = int(next.Add(1)) - 1 {
				sc.drawOne(todo[j], out)
			}
		})
	}
	wg.Wait()
}

// drawOne draws entry i's token into sc.drawn[i].
func (sc *scheduler) drawOne(i int, out *model.Output) {
	d := &sc.drawn[i]
	defer func() {
		if p := recover(); p != nil {
			d.panic, d.stack = p, debug.Stack()
		}
	}()
	s := sc.step[i]
	d.tok = s.sampler.Sample(out.Seqs[i].Logits, s.tokens)
	d.done = true
}
