package ui

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

func TestHistoryPersistsAcrossSessions(t *testing.T) {
	opts := testOptions(t)
	h := start(t, newFakeEngine(), opts)
	h.line("first session")
	h.settle()
	h.line("/set seed 4")
	h.untilNotice("Set seed.")
	h.typeText("line one")
	h.tm.Send(tea.KeyMsg{Type: tea.KeyEnter, Alt: true})
	h.line("line two")
	h.settle()
	h.final()

	want := []string{"first session", "/set seed 4", "line one\nline two"}
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		got, _ = (&historyFile{path: opts.HistoryFile}).load()
		if slices.Equal(got, want) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("history file holds %q, want %q", got, want)
	}
	if info, err := os.Stat(opts.HistoryFile); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("history file: %v, %v", info, err)
	}

	// The next session recalls them, newest first.
	h2 := start(t, newFakeEngine(), opts)
	h2.until("the history loaded", func(m *model) bool { return len(m.in.history) == 3 })
	h2.key(tea.KeyUp)
	h2.key(tea.KeyUp)
	m := h2.final()
	if got := m.in.Value(); got != "/set seed 4" {
		t.Errorf("input = %q", got)
	}
}

func TestHistoryFileIsCompacted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history")
	var b strings.Builder
	for i := range 2*maxHistory + 5 {
		fmt.Fprintf(&b, "%q\n", fmt.Sprint("entry ", i))
	}
	b.WriteString("\"cut by a cra") // a torn last line is skipped
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	hf := &historyFile{path: path}
	got, err := hf.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != maxHistory || got[len(got)-1] != fmt.Sprint("entry ", 2*maxHistory+4) {
		t.Fatalf("%d entries, last %q", len(got), got[len(got)-1])
	}
	again, err := hf.load()
	if err != nil || !slices.Equal(again, got) {
		t.Fatalf("after compaction: %d entries, %v", len(again), err)
	}
	data, _ := os.ReadFile(path)
	if n := strings.Count(string(data), "\n"); n != maxHistory {
		t.Errorf("the file has %d lines after compaction", n)
	}
}

func TestInputPrependKeepsBrowsing(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	in := newInput(DefaultKeyMap(), &st)
	in.remember("b")
	in.remember("c")
	in.prepend([]string{"a", "b"}) // the seam repeats "b"
	if !slices.Equal(in.history, []string{"a", "b", "c"}) || in.histPos != 3 {
		t.Fatalf("history %q, pos %d", in.history, in.histPos)
	}
	in.prev() // "c"
	in.prepend([]string{"x"})
	if in.histPos != 3 || in.history[in.histPos] != "c" {
		t.Errorf("browsing position moved: %d", in.histPos)
	}
}

func TestNoHistory(t *testing.T) {
	opts := testOptions(t)
	opts.NoHistory = true
	h := start(t, newFakeEngine(), opts)
	h.line("secret")
	h.settle()
	h.final()
	if _, err := os.Stat(opts.HistoryFile); !os.IsNotExist(err) {
		t.Errorf("history written with NoHistory: %v", err)
	}
}
