package runtime

import (
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/sample"
)

// seqState is where a sequence is in its life.
type seqState uint8

const (
	seqWaiting  seqState = iota // in scheduler.waiting, no cache handle
	seqRunning                  // in scheduler.running, holds a cache handle
	seqFinished                 // final event posted, everything released
)

// seq is one request as the scheduler sees it. Fields other than cancelled
// belong to the loop goroutine.
type seq struct {
	id      uint64 // arrival order: a larger id is newer
	req     Request
	stream  *Stream
	sampler *sample.Sampler
	dec     TextDecoder // nil: no text

	tokens   []int32       // (nPrompt + generated) prompt then every emitted token
	nPrompt  int           // len(req.Prompt)
	kv       *kvcache.Seq  // the cache handle while running
	slot     *linattn.Slot // the recurrent-state slot while running (StateModel), at position computed-1
	computed int           // tokens[:computed] have K/V in kv (kv may hold more); the pending work is tokens[computed:]
	sp       *specSeq      // speculative decoding; nil when the request does not speculate
	state    seqState
	inStep   bool   // scheduled in the step being built or run
	text     []byte // decoder output not yet posted: an incomplete trailing UTF-8 character

	// Conversation reuse (prefix.go).
	cached       int               // tokens[:cached] came from the prefix cache at the last admission
	admitted     bool              // admitted once: promptCached is set
	promptCached int               // prompt tokens taken from the prefix cache at the first admission (Usage)
	mtpRows      int               // MTP cache rows valid (a sequence that does not speculate: those of its cached prefix)
	promptDue    bool              // the prompt is computed and becomes a cached prefix
	promptSnap   *linattn.Snapshot // hybrid models: the state after the prompt, for that prefix

	cancelled atomic.Bool // set by the context's AfterFunc
	stopWatch func() bool // stops that AfterFunc
	cancelCtx func()      // releases the request's context

	preemptions int
	arrived     time.Time
	firstSched  time.Time // first step that ran this request
	firstTok    time.Time
	lastTok     time.Time
}

func (s *seq) generated() int { return len(s.tokens) - s.nPrompt }

// usage is the request's accounting as of now.
func (s *seq) usage(now time.Time) Usage {
	u := Usage{
		PromptTokens:    s.nPrompt,
		CachedTokens:    s.promptCached,
		GeneratedTokens: s.generated(),
		Preemptions:     s.preemptions,
		Total:           now.Sub(s.arrived),
	}
	if s.sampler != nil {
		u.Seed = s.sampler.Seed()
	}
	if !s.firstSched.IsZero() {
		u.Queued = s.firstSched.Sub(s.arrived)
	}
	if !s.firstTok.IsZero() {
		u.TimeToFirstToken = s.firstTok.Sub(s.arrived)
		if d := s.firstTok.Sub(s.firstSched).Seconds(); d > 0 {
			u.PromptTokensPerSec = float64(s.nPrompt-u.CachedTokens) / d
		}
		if d := s.lastTok.Sub(s.firstTok).Seconds(); d > 0 && u.GeneratedTokens > 1 {
			u.DecodeTokensPerSec = float64(u.GeneratedTokens-1) / d
		}
	}
	if sp := s.sp; sp != nil && sp.n.steps > 0 {
		u.VerifySteps, u.DraftTokens, u.AcceptedTokens = int(sp.n.steps), int(sp.n.drafted), int(sp.n.accepted)
		u.AcceptedPerStep = float64(sp.n.accepted) / float64(sp.n.steps)
		u.AcceptRate = sp.n.rates()
	}
	return u
}

// takeText appends decoder output to s's held-back bytes and returns the
// part that is complete UTF-8; with final it returns everything, invalid
// bytes replaced.
func (s *seq) takeText(add string, final bool) string {
	if len(s.text) == 0 && !final && utf8.ValidString(add) {
		return add
	}
	s.text = append(s.text, add...)
	n := len(s.text)
	if !final {
		// Hold back an incomplete character at the end (at most 3 bytes).
		for k := 1; k <= min(utf8.UTFMax-1, n); k++ {
			if utf8.RuneStart(s.text[n-k]) {
				if !utf8.FullRune(s.text[n-k:]) {
					n -= k
				}
				break
			}
		}
	}
	out := strings.ToValidUTF8(string(s.text[:n]), "\uFFFD")
	s.text = append(s.text[:0], s.text[n:]...)
	return out
}
