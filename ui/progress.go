package ui

import "sync"

// progress carries the reports of work running in a command (a model
// loading, a model downloading) to the chat, where a self-re-issuing
// command reads them from ch. A report that finds ch full drops the
// oldest one waiting, so that the reader, when behind, gets the newest
// state; reports after close are dropped.
type progress[T any] struct {
	mu     sync.Mutex
	ch     chan T
	closed bool
}

// newProgress buffers up to n reports.
func newProgress[T any](n int) *progress[T] { return &progress[T]{ch: make(chan T, n)} }

func (p *progress[T]) report(v T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for {
		select {
		case p.ch <- v:
			return
		default:
		}
		select { // full: drop the oldest (the reader may just have taken it)
		case <-p.ch:
		default:
		}
	}
}

// close ends the reports; the reader then gets a closed channel.
func (p *progress[T]) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.ch)
	}
}
