package runtime

import (
	"fmt"
	"sync"
	"time"

	"github.com/ferrite-llm/ferrite/engine/sample"
)

// Request is one generation job.
type Request struct {
	Prompt    []int32       // token ids; at least one
	MaxTokens int           // most tokens to generate; 0 means until the context is full
	Sampling  sample.Params // this request's sampler (its own RNG, seeded by Sampling.Seed)
	Stop      []int32       // ids that end generation (EOS); the stop id itself is not emitted

	// Draft overrides Options.Draft for this request: 0 keeps the
	// runtime's setting, a positive value sets the most draft tokens per
	// step (capped at MaxDraft), a negative one turns speculation off. It
	// has no effect with a model without an MTP module.
	Draft int
}

// EventType says what an Event carries.
type EventType uint8

const (
	EventDelta EventType = iota // new tokens (and their text)
	EventDone                   // final: generation ended normally or was cancelled
	EventError                  // final: generation failed
)

func (t EventType) String() string {
	switch t {
	case EventDelta:
		return "delta"
	case EventDone:
		return "done"
	case EventError:
		return "error"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// FinishReason says why a request ended.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"      // a Stop id was sampled
	FinishLength    FinishReason = "length"    // MaxTokens reached, or the context (or whole cache) is full
	FinishCancelled FinishReason = "cancelled" // the context was cancelled or Stream.Cancel called
)

// LengthLimit says which limit ended a request with FinishLength, so that
// a caller can tell the user why a reply was cut.
type LengthLimit string

const (
	LimitMaxTokens LengthLimit = "max_tokens" // Request.MaxTokens was reached
	LimitContext   LengthLimit = "context"    // the model's context is full
	LimitKVCache   LengthLimit = "kv_cache"   // the whole KV cache (Options.KVBudget), smaller than the model's context, is full
)

// Event is one message of a Stream.
type Event struct {
	Type   EventType
	Text   string  // EventDelta: new text, valid UTF-8 (empty while a character is incomplete)
	Tokens []int32 // EventDelta: ids generated since the previous event, in order
	Finish FinishReason
	Limit  LengthLimit // EventDone with FinishLength: the limit reached; "" otherwise
	Usage  Usage       // counts and timing as of this event (final on EventDone and EventError)
	Err    error       // EventError: the cause
}

// Usage is one request's accounting.
type Usage struct {
	PromptTokens    int    // len(Request.Prompt)
	CachedTokens    int    // prompt tokens whose K/V (and state) came from the prefix cache, not computed, when the request was first admitted
	GeneratedTokens int    // tokens emitted (a sampled stop id is not counted)
	Preemptions     int    // times the request was evicted from the cache and recomputed
	Seed            uint64 // the sampler's seed (drawn at random for Sampling.Seed 0): replays the request

	Queued           time.Duration // from Generate until the first step that ran the request
	TimeToFirstToken time.Duration // from Generate until the first sampled token
	Total            time.Duration // from Generate until this event

	PromptTokensPerSec float64 // computed prompt tokens (PromptTokens − CachedTokens) / (first token − first scheduled)
	DecodeTokensPerSec float64 // (generated − 1) / (last token − first token)

	// Speculative decoding (all zero without it).
	VerifySteps     int       // steps that verified drafts of this request
	DraftTokens     int       // draft tokens verified
	AcceptedTokens  int       // draft tokens accepted (each verify step also emits one target token)
	AcceptedPerStep float64   // AcceptedTokens / VerifySteps
	AcceptRate      []float64 // [i]: share of the drafts at position i (0 first) that were accepted
}

// Stream is the consumer side of one request. Next is meant for one
// goroutine at a time; Cancel may be called from any goroutine.
type Stream struct {
	id     uint64
	cancel func() // cancels the request's context

	notify chan struct{} // (cap 1) poked whenever something is posted
	done   chan struct{} // closed when the final event is posted

	mu        sync.Mutex
	text      []byte  // undelivered text (valid UTF-8)
	tokens    []int32 // undelivered ids
	usage     Usage   // latest usage, attached to the next delta
	final     *Event  // the final event once posted
	finalSent bool    // Next has returned the final event
}

func newStream(id uint64, cancel func()) *Stream {
	return &Stream{id: id, cancel: cancel, notify: make(chan struct{}, 1), done: make(chan struct{})}
}

// ID is the request's arrival number, unique within its Runtime.
func (s *Stream) ID() uint64 { return s.id }

// Cancel ends the request as its context's cancellation would: the
// stream's final event is Done with FinishCancelled (unless the request
// had already finished). Safe to call more than once.
func (s *Stream) Cancel() { s.cancel() }

// Next blocks until an event is available and returns it. After the final
// event (Done or Error) has been returned it returns ok == false.
func (s *Stream) Next() (ev Event, ok bool) {
	for {
		s.mu.Lock()
		switch {
		case len(s.tokens) > 0 || len(s.text) > 0:
			ev = Event{Type: EventDelta, Text: string(s.text), Tokens: s.tokens, Usage: s.usage}
			s.text, s.tokens = s.text[:0], nil
			s.mu.Unlock()
			return ev, true
		case s.final != nil && !s.finalSent:
			s.finalSent = true
			ev = *s.final
			s.mu.Unlock()
			return ev, true
		case s.finalSent:
			s.mu.Unlock()
			return Event{}, false
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-s.done:
		}
	}
}

// Done is closed once the final event has been posted (it may still be
// waiting in the stream for Next).
func (s *Stream) Done() <-chan struct{} { return s.done }

// Result is a whole request's outcome, as Collect gathers it.
type Result struct {
	Tokens []int32
	Text   string
	Finish FinishReason // empty when Err is set
	Limit  LengthLimit  // with FinishLength: the limit reached
	Usage  Usage
	Err    error
}

// Collect reads the stream to its end and returns everything it carried.
func (s *Stream) Collect() Result {
	var r Result
	var text []byte
	for {
		ev, ok := s.Next()
		if !ok {
			r.Text = string(text)
			return r
		}
		r.Tokens = append(r.Tokens, ev.Tokens...)
		text = append(text, ev.Text...)
		switch ev.Type {
		case EventDone:
			r.Finish, r.Limit, r.Usage = ev.Finish, ev.Limit, ev.Usage
		case EventError:
			r.Err, r.Usage = ev.Err, ev.Usage
		}
	}
}

// ** producer side (the scheduler goroutine) **

// post appends generated ids and text to the pending delta. It never blocks.
func (s *Stream) post(text string, tokens []int32, u Usage) {
	s.mu.Lock()
	if s.final != nil {
		s.mu.Unlock()
		return
	}
	s.text = append(s.text, text...)
	s.tokens = append(s.tokens, tokens...)
	s.usage = u
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// finish posts the final event; later posts and finishes are ignored.
func (s *Stream) finish(ev Event) {
	s.mu.Lock()
	if s.final != nil {
		s.mu.Unlock()
		return
	}
	s.final = &ev
	s.mu.Unlock()
	close(s.done)
}
