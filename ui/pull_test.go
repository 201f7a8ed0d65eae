package ui

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// fakePuller reports the progress the test feeds it, and finishes when
// the test closes steps (or fails with err).
type fakePuller struct {
	steps chan PullProgress
	err   error

	mu    sync.Mutex
	names []string
}

func newFakePuller() *fakePuller { return &fakePuller{steps: make(chan PullProgress)} }

func (f *fakePuller) Pull(ctx context.Context, name string, progress func(PullProgress)) (PullResult, error) {
	f.mu.Lock()
	f.names = append(f.names, name)
	f.mu.Unlock()
	for {
		select {
		case p, ok := <-f.steps:
			if !ok {
				if f.err != nil {
					return PullResult{}, f.err
				}
				return PullResult{Model: name, Summary: "3 files, 1.2 GiB."}, nil
			}
			progress(p)
		case <-ctx.Done():
			return PullResult{}, ctx.Err()
		}
	}
}

func TestPullInTheBackground(t *testing.T) {
	a := newFakeEngine(fakeReply{chunks: []string{"answer while pulling"}})
	f := newFakePuller()
	opts := testOptions(t)
	opts.Puller = f
	models, _ := twoModels(a)
	opts.Models = models
	h := start(t, a, opts)
	h.line("/pull acme/Tiny-1B")
	h.untilNotice("Pulling acme/Tiny-1B in the background")
	f.steps <- PullProgress{Text: "listing files"}
	h.waitFor("⇣ pull acme/Tiny-1B · listing files")
	f.steps <- PullProgress{Fraction: 0.25, Text: "40.0 MiB/s · ETA 38s"}
	h.waitFor("⇣ pull acme/Tiny-1B 25% · 40.0 MiB/s · ETA 38s")

	// The chat stays usable, and a second pull waits its turn.
	h.line("hello")
	h.waitFor("answer while pulling")
	h.line("/pull other/Model")
	h.untilNotice("Still pulling acme/Tiny-1B")

	close(f.steps)
	h.untilNotice("Pulled acme/Tiny-1B in 0s: 3 files, 1.2 GiB. /model acme/Tiny-1B switches to it.")
	h.until("the pull to end", func(m *model) bool { return m.pulling == nil && m.pullStatus() == "" })
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.names) != 1 {
		t.Fatalf("pulls %v, want one", f.names)
	}
}

func TestPullStopAndFailure(t *testing.T) {
	a := newFakeEngine()
	f := newFakePuller()
	opts := testOptions(t)
	opts.Puller = f
	h := start(t, a, opts)
	h.line("/pull acme/Tiny-1B")
	f.steps <- PullProgress{Fraction: 0.5}
	h.waitFor("⇣ pull acme/Tiny-1B 50%")
	h.line("/pull --stop")
	h.untilNotice("Stopped pulling acme/Tiny-1B after 0s; /pull acme/Tiny-1B resumes it.")

	f.err = errors.New("acme/Gated is gated: accept its conditions")
	h.line("/pull acme/Gated")
	close(f.steps)
	h.untilNotice("Could not pull acme/Gated: acme/Gated is gated: accept its conditions")
}

func TestPullWithoutAPuller(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/pull acme/Tiny-1B")
	h.untilNotice("This chat cannot download models")
	h.line("/pull --stop")
	h.untilNotice("This chat cannot download models")
}

func TestProgressKeepsTheNewest(t *testing.T) {
	p := newProgress[int](2)
	for i := range 5 {
		p.report(i)
	}
	p.close()
	p.report(9) // after close: dropped
	var got []int
	for v := range p.ch {
		got = append(got, v)
	}
	if len(got) != 2 || got[0] != 3 || got[1] != 4 {
		t.Fatalf("read %v, want the newest two [3 4]", got)
	}
}
