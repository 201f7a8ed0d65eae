package ui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fakeEngine is an Engine that streams scripted replies. A prompt's length
// is its number of words plus 4 per message, so tests can overflow a small
// context on purpose.
type fakeEngine struct {
	info  ModelInfo
	stats Stats

	mu        sync.Mutex
	script    []fakeReply // one per Send, in order; the last one repeats
	sent      []Request
	sendErr   error
	bySeed    map[uint64]fakeReply // when a request's seed is here, its reply (not the script's)
	active    int                  // streams started and not yet ended
	maxActive int                  // the most at once
}

// fakeReply is one scripted reply.
type fakeReply struct {
	chunks []string      // the text deltas
	delay  time.Duration // before each chunk
	err    error         // end with EventError instead of EventDone
	hold   chan struct{} // when set, the first chunk waits until it is closed
	usage  Usage         // when set, the usage of every event (GeneratedTokens is counted)
	limit  string        // when set, the reply ends with FinishLength and this Limit
}

func newFakeEngine(replies ...fakeReply) *fakeEngine {
	return &fakeEngine{
		info:   ModelInfo{Name: "Fake-1B", Arch: "fake", MaxContext: 4096},
		stats:  Stats{KVBlocksUsed: 3, KVBlocksTotal: 12, KVBytesUsed: 3 << 20, KVBytesTotal: 12 << 20, KVBytesPerToken: 1 << 10, Running: 0, Waiting: 0},
		script: replies,
	}
}

func (e *fakeEngine) Info() ModelInfo { return e.info }

func (e *fakeEngine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

func (e *fakeEngine) requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Request(nil), e.sent...)
}

func (e *fakeEngine) Send(ctx context.Context, req Request) (Reply, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sent = append(e.sent, req)
	if e.sendErr != nil {
		return nil, e.sendErr
	}
	n := 0
	for _, m := range req.Messages {
		n += 4 + len(strings.Fields(m.Content))
	}
	if n > e.info.MaxContext {
		return nil, &ContextError{PromptTokens: n, Limit: e.info.MaxContext}
	}
	r := fakeReply{chunks: []string{"ok"}}
	if br, ok := e.bySeed[req.Settings.Seed]; ok {
		r = br
	} else if len(e.script) > 0 {
		r = e.script[0]
		if len(e.script) > 1 {
			e.script = e.script[1:]
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	e.active++
	e.maxActive = max(e.maxActive, e.active)
	return &fakeStream{e: e, r: r, ctx: ctx, cancel: cancel, prompt: n}, nil
}

// concurrency is the most streams that were open at once.
func (e *fakeEngine) concurrency() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.maxActive
}

// fakeStream plays a fakeReply. Its usage numbers are fixed so that views
// are deterministic.
type fakeStream struct {
	e      *fakeEngine
	r      fakeReply
	ctx    context.Context
	cancel context.CancelFunc
	prompt int
	i      int
	done   bool
}

func (s *fakeStream) Cancel()           { s.cancel() }
func (s *fakeStream) PromptTokens() int { return s.prompt }

func (s *fakeStream) usage() Usage {
	if s.r.usage != (Usage{}) {
		u := s.r.usage
		u.PromptTokens, u.GeneratedTokens = s.prompt, s.i
		return u
	}
	return Usage{
		PromptTokens: s.prompt, GeneratedTokens: s.i, TimeToFirstToken: 120 * time.Millisecond,
		Total: time.Second, PromptTokensPerSec: 250, DecodeTokensPerSec: 25, Seed: 42,
	}
}

func (s *fakeStream) Next() (Event, bool) {
	if s.done {
		return Event{}, false
	}
	if s.i < len(s.r.chunks) {
		var wait <-chan time.Time
		if s.r.delay > 0 {
			wait = time.After(s.r.delay)
		} else {
			c := make(chan time.Time, 1)
			c <- time.Time{}
			wait = c
		}
		if s.i == 0 && s.r.hold != nil {
			select {
			case <-s.r.hold:
			case <-s.ctx.Done():
				return s.final(), true
			}
		}
		select {
		case <-wait:
		case <-s.ctx.Done():
			return s.final(), true
		}
		s.i++
		return Event{Kind: EventDelta, Text: s.r.chunks[s.i-1], Usage: s.usage()}, true
	}
	return s.final(), true
}

func (s *fakeStream) final() Event {
	s.done = true
	s.cancel()
	s.e.mu.Lock()
	s.e.active--
	s.e.mu.Unlock()
	switch {
	case s.r.err != nil:
		return Event{Kind: EventError, Err: s.r.err, Usage: s.usage()}
	case s.i < len(s.r.chunks):
		return Event{Kind: EventDone, Finish: FinishCancelled, Usage: s.usage()}
	case s.r.limit != "":
		return Event{Kind: EventDone, Finish: FinishLength, Limit: s.r.limit, Usage: s.usage()}
	}
	return Event{Kind: EventDone, Finish: FinishStop, Usage: s.usage()}
}

var errBoom = errors.New("boom: the engine fell over")

// fakeModels is a Models over fake engines: each entry loads the engine of
// the same name, or fails with the error set for it.
type fakeModels struct {
	mu      sync.Mutex
	entries []ModelEntry
	dirs    map[string]ModelEntry // what Find gives for a folder outside entries
	engines map[string]*fakeEngine
	fail    map[string]error
	hold    chan struct{} // when set, Load waits for it to be closed after its first stage
	closed  []string      // the engines closed, in order
	// room, when set, says whether the model named fits the device beside
	// the engines not yet closed; a Load with KeepDevice of one that does
	// not fails with ErrNoRoom.
	room  func(name string) bool
	loads []string // "NAME keep=BOOL" for each Load, in order
}

func (f *fakeModels) List(context.Context) ([]ModelEntry, error) {
	return append([]ModelEntry(nil), f.entries...), nil
}

func (f *fakeModels) Find(_ context.Context, name string) (ModelEntry, error) {
	if e, ok := f.dirs[name]; ok {
		return e, nil
	}
	for i, e := range f.entries {
		if e.Name == name || strconv.Itoa(i+1) == name {
			return e, nil
		}
	}
	return ModelEntry{}, fmt.Errorf("no model %q", name)
}

func (f *fakeModels) Load(ctx context.Context, e ModelEntry, opts LoadOptions, progress func(string)) (Engine, io.Closer, error) {
	progress("reading weights")
	f.mu.Lock()
	f.loads = append(f.loads, fmt.Sprintf("%s keep=%v", e.Name, opts.KeepDevice))
	roomy := f.room == nil || f.room(e.Name)
	f.mu.Unlock()
	if opts.KeepDevice && !roomy {
		return nil, nil, fmt.Errorf("%w: the weights take 15.0 GiB and fake-gpu:0 has 7.5 GiB free", ErrNoRoom)
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	progress("starting the runtime")
	if err := f.fail[e.Name]; err != nil {
		return nil, nil, err
	}
	eng := f.engines[e.Name]
	if eng == nil {
		return nil, nil, fmt.Errorf("no engine for %s", e.Name)
	}
	return eng, f.closer(e.Name), nil
}

// closer records closing name.
func (f *fakeModels) closer(name string) io.Closer {
	return closerFunc(func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.closed = append(f.closed, name)
		return nil
	})
}

func (f *fakeModels) closedNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.closed...)
}

type closerFunc func() error

func (c closerFunc) Close() error { return c() }
