package ui

import (
	"context"
	"errors"
	"fmt"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// Downloading models. /pull NAME runs Puller.Pull in a command; the
// download reports its progress through a one-slot progress channel (a
// newer report replaces one not yet read) that a self-re-issuing command reads,
// and the status bar shows it. The chat stays usable; one pull runs at a
// time; /pull --stop (or quitting) cancels it, and the next /pull of the
// same model resumes it.

// Puller downloads models for /pull. The command line implements it on
// internal/hub; tests use a fake.
type Puller interface {
	// Pull downloads the model name names (ORG/NAME[@REVISION][:QUANT])
	// into the cache the catalog reads. progress may be called from any
	// goroutine, but not after Pull returns. Cancelling ctx stops it.
	Pull(ctx context.Context, name string, progress func(PullProgress)) (PullResult, error)
}

// PullProgress is a pull's progress, for the status bar.
type PullProgress struct {
	Fraction float64 // done, in [0, 1]; 0 also before the size is known
	Text     string  // the speed and time left ("40.0 MiB/s · ETA 38s"), or the stage ("listing files")
}

// PullResult is a finished pull.
type PullResult struct {
	Model   string // what /model takes to open it; "" when it cannot
	Summary string // one line: files, size, where
}

// pullState is the pull in progress.
type pullState struct {
	id      int
	name    string
	last    PullProgress
	started time.Time
	cancel  context.CancelFunc
	ch      <-chan PullProgress
}

func (m *model) cmdPull(args string) tea.Cmd {
	switch {
	case m.opts.Puller == nil:
		m.view.notice(entryWarning, "This chat cannot download models: it was started without a Hugging Face client.")
		return nil
	case args == "--stop":
		if m.pulling == nil {
			m.view.notice(entryNotice, "No pull is running.")
			return nil
		}
		m.pulling.cancel()
		return nil
	case args == "":
		m.view.notice(entryNotice, "Usage: /pull ORG/NAME[@REVISION][:QUANT], e.g. /pull Qwen/Qwen3-0.6B; /pull --stop stops a pull (the next one resumes it).")
		return nil
	case m.pulling != nil:
		m.view.notice(entryWarning, fmt.Sprintf("Still pulling %s: wait for it, or /pull --stop.", m.pulling.name))
		return nil
	}
	return m.startPull(args)
}

func (m *model) startPull(name string) tea.Cmd {
	m.pullSeq++
	ctx, cancel := context.WithCancel(context.Background())
	p := newProgress[PullProgress](1) // the newest report is enough
	m.pulling = &pullState{id: m.pullSeq, name: name, started: m.now(), cancel: cancel, ch: p.ch,
		last: PullProgress{Text: "starting"}}
	id, puller := m.pullSeq, m.opts.Puller
	pull := func() (msg tea.Msg) {
		defer p.close()
		defer func() {
			if r := recover(); r != nil {
				msg = pullMsg{id: id, done: true, err: fmt.Errorf("panic: %v", r)}
			}
		}()
		res, err := puller.Pull(ctx, name, p.report)
		return pullMsg{id: id, done: true, res: res, err: err}
	}
	m.view.notice(entryNotice, fmt.Sprintf("Pulling %s in the background (the status bar shows its progress; /pull --stop stops it).", name))
	return tea.Batch(pull, waitPull(id, p.ch))
}

// waitPull reads the next progress report; it ends (a nil message) once
// the pull is over.
func waitPull(id int, ch <-chan PullProgress) tea.Cmd {
	return receive(ch, func(p PullProgress) tea.Msg { return pullMsg{id: id, progress: p} })
}

func (m *model) onPull(msg pullMsg) tea.Cmd {
	p := m.pulling
	if p == nil || p.id != msg.id {
		return nil
	}
	if !msg.done {
		p.last = msg.progress
		return waitPull(p.id, p.ch)
	}
	m.pulling = nil
	p.cancel()
	took := m.now().Sub(p.started).Round(time.Second)
	switch {
	case errors.Is(msg.err, context.Canceled):
		m.view.notice(entryWarning, fmt.Sprintf("Stopped pulling %s after %s; /pull %s resumes it.", p.name, took, p.name))
		return nil
	case msg.err != nil:
		m.view.notice(entryError, fmt.Sprintf("Could not pull %s: %v", p.name, msg.err))
		return nil
	}
	text := fmt.Sprintf("Pulled %s in %s: %s", p.name, took, msg.res.Summary)
	if msg.res.Model != "" {
		text += fmt.Sprintf(" /model %s switches to it.", msg.res.Model)
	}
	m.view.notice(entryNotice, text)
	return m.listModelsCmd(false) // /model completes the new name
}

// pullStatus is the status bar's text for the pull in progress; "" when
// none runs.
func (m *model) pullStatus() string {
	if m.pulling == nil {
		return ""
	}
	p := m.pulling.last
	s := "pull " + m.pulling.name
	if p.Fraction > 0 {
		s += fmt.Sprintf(" %.0f%%", 100*p.Fraction)
	}
	if p.Text != "" {
		s += " · " + p.Text
	}
	return s
}
