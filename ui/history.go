package ui

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/adrg/xdg"
	tea "github.com/charmbracelet/bubbletea"
)

// maxHistory is the most inputs kept across sessions.
const maxHistory = 1000

// DefaultHistoryFile is where the input history is kept:
// $XDG_DATA_HOME/ferrite/history.
func DefaultHistoryFile() string {
	return filepath.Join(xdg.DataHome, "ferrite", "history")
}

// historyFile is the input history on disk: one JSON string per line
// (so that multi-line inputs stay one entry), oldest first, appended to
// after every input. Loading keeps the newest maxHistory entries and
// rewrites the file when it has grown to twice that. Update queues each
// input in order; the command that writes takes the whole queue, so the
// file keeps the order however the commands run.
type historyFile struct {
	path    string
	mu      sync.Mutex // guards pending and the file
	pending []string   // inputs not yet written
	warned  bool       // a failed save was reported (touched in Update only)
}

// load reads the entries; a missing file is an empty history.
func (h *historyFile) load() ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, err := os.Open(h.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	lines := 0
	for sc.Scan() {
		lines++
		var s string
		if json.Unmarshal(sc.Bytes(), &s) != nil || s == "" {
			continue // a line cut by a crash, or not ours
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) > maxHistory {
		out = out[len(out)-maxHistory:]
	}
	if lines >= 2*maxHistory {
		var data []byte
		for _, s := range out {
			b, _ := json.Marshal(s)
			data = append(append(data, b...), '\n')
		}
		if err := writeFileAtomic(h.path, data, 0o600); err != nil {
			return out, err
		}
	}
	return out, nil
}

// queue adds an entry to write; it is cheap (Update calls it).
func (h *historyFile) queue(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending = append(h.pending, s)
}

// flush appends the queued entries to the file.
func (h *historyFile) flush() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pending) == 0 {
		return nil
	}
	var data []byte
	for _, s := range h.pending {
		b, err := json.Marshal(s)
		if err != nil {
			return err
		}
		data = append(append(data, b...), '\n')
	}
	h.pending = nil
	if err := os.MkdirAll(filepath.Dir(h.path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(h.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (m *model) loadHistoryCmd() tea.Cmd {
	h := m.history
	if h == nil {
		return nil
	}
	return func() tea.Msg {
		entries, err := h.load()
		return historyLoadedMsg{entries: entries, err: err}
	}
}

// onHistoryLoaded puts the earlier sessions' inputs before this one's.
func (m *model) onHistoryLoaded(msg historyLoadedMsg) {
	if msg.err != nil {
		m.view.notice(entryError, "reading the input history failed: "+msg.err.Error())
	}
	m.in.prepend(msg.entries)
}

// remember adds a sent input to the history, and to the file.
func (m *model) remember(s string) tea.Cmd {
	if !m.in.remember(s) || m.history == nil {
		return nil
	}
	h := m.history
	h.queue(s)
	return func() tea.Msg { return historySavedMsg{err: h.flush()} }
}
