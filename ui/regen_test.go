package ui

import (
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
)

// regenHarness has a chat with one finished reply, and a script for the
// alternatives that holds them until release is closed.
func regenHarness(t *testing.T, alts ...string) (h *harness, eng *fakeEngine, release chan struct{}) {
	release = make(chan struct{})
	eng = newFakeEngine(fakeReply{chunks: []string{"the first answer"}})
	// The alternatives are sent at once, in any order: their seeds say
	// which is which.
	eng.bySeed = map[uint64]fakeReply{}
	for i, a := range alts {
		eng.bySeed[100+uint64(i+1)] = fakeReply{chunks: []string{a}, hold: release}
	}
	opts := testOptions(t)
	opts.Settings = &Settings{Temperature: 0.8, Seed: 100, MaxTokens: 50}
	h = start(t, eng, opts)
	h.line("tell me something")
	h.waitFor("the first answer")
	h.settle()
	return h, eng, release
}

func TestRegenGeneratesAtOnceAndPicks(t *testing.T) {
	h, eng, release := regenHarness(t, "alt one", "alt two", "alt three")
	h.line("/regen 3")
	h.until("three alternatives running", func(m *model) bool { return m.choice != nil && m.choice.running == 3 })
	h.until("all three sent", func(*model) bool { return len(eng.requests()) == 4 })
	close(release)
	h.settle()
	if got := eng.concurrency(); got != 3 {
		t.Errorf("%d streams at once, want the 3 alternatives together", got)
	}
	// Each alternative has its own seed, and the same conversation (without
	// the reply they replace).
	seeds := map[uint64]bool{}
	for _, r := range eng.requests()[1:] {
		seeds[r.Settings.Seed] = true
		if n := len(r.Messages); n != 1 || r.Messages[0].Content != "tell me something" {
			t.Errorf("alternative with seed %d: prompt %+v", r.Settings.Seed, r.Messages)
		}
	}
	if !seeds[101] || !seeds[102] || !seeds[103] {
		t.Errorf("seeds %v, want 101, 102, 103", seeds)
	}
	h.until("the first alternative shown", func(m *model) bool { return m.choice != nil && m.choice.sel == 1 })
	h.tm.Send(tea.KeyMsg{Type: tea.KeyShiftRight})
	h.until("the second shown", func(m *model) bool { return m.choice.sel == 2 })
	h.waitFor("alt two")
	h.key(tea.KeyEnter) // the input is empty: keep the one shown
	h.waitFor("kept alternative 2")
	h.settle()
	m := h.final()
	if m.choice != nil {
		t.Fatal("the choice is still open")
	}
	msgs := m.chat.Messages
	if len(msgs) != 2 || msgs[1].Content != "alt two" || msgs[1].Stats == nil {
		t.Fatalf("conversation = %+v", msgs)
	}
	for _, e := range m.view.entries {
		if e.msg != nil && strings.HasPrefix(e.msg.Content, "alt ") && e.msg.Content != "alt two" {
			t.Errorf("a dropped alternative is still shown: %q", e.msg.Content)
		}
	}
	path := h.dir + "/test-chat.json"
	readChat(t, path, func(c *Chat) bool { return len(c.Messages) == 2 && c.Messages[1].Content == "alt two" })
}

func TestRegenKeepsThePrevious(t *testing.T) {
	h, _, release := regenHarness(t, "an alternative")
	close(release)
	h.line("/regen")
	h.settle()
	h.line("/pick 0")
	h.waitFor("kept the previous reply")
	m := h.final()
	if msgs := m.chat.Messages; len(msgs) != 2 || msgs[1].Content != "the first answer" {
		t.Fatalf("conversation = %+v", msgs)
	}
}

func TestSendingKeepsTheShownAlternative(t *testing.T) {
	h, eng, release := regenHarness(t, "alt A", "alt B")
	close(release)
	h.line("/regen 2")
	h.settle()
	h.tm.Send(tea.KeyMsg{Type: tea.KeyShiftLeft}) // from 1 back to the previous reply…
	h.tm.Send(tea.KeyMsg{Type: tea.KeyShiftLeft}) // …and around to 2
	h.until("alternative 2 shown", func(m *model) bool { return m.choice.sel == 2 })
	h.line("and then?")
	h.waitFor("and then?")
	h.settle()
	m := h.final()
	msgs := m.chat.Messages
	if len(msgs) != 4 || msgs[1].Content != "alt B" {
		t.Fatalf("conversation = %+v", msgs)
	}
	last := eng.requests()[len(eng.requests())-1]
	if got := last.Messages[1].Content; got != "alt B" {
		t.Errorf("the next prompt holds %q, want the kept alternative", got)
	}
}

func TestRegenErrors(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/regen")
	h.untilNotice("Nothing to regenerate")
	h.line("/regen 99")
	h.untilNotice("usage: /regen [N], with N from 1 to 8")
	h.line("/pick")
	h.untilNotice("Nothing to pick")
	h.line("hi")
	h.settle()
	h.line("/set temperature 0")
	h.line("/regen")
	h.untilNotice("every alternative will be the same")
	h.settle()
	h.line("/pick 7")
	h.untilNotice("usage: /pick [N], with N from 0 to 1")
	h.final()
}

func TestRegenStopWithEsc(t *testing.T) {
	h, _, _ := regenHarness(t, "never", "never either")
	h.line("/regen 2")
	h.until("running", func(m *model) bool { return m.choice != nil && m.choice.running == 2 })
	h.key(tea.KeyEsc)
	h.settle()
	m := h.final()
	for _, o := range m.choice.opts[1:] {
		if o.msg.Stats == nil || o.msg.Stats.Finish != FinishCancelled {
			t.Errorf("alternative %+v not stopped", o.msg)
		}
	}
}

func TestRegenGolden(t *testing.T) {
	h, _, release := regenHarness(t, "Second **take**.", "Third take.")
	h.line("/regen 2")
	h.until("running", func(m *model) bool { return m.choice != nil && m.choice.running == 2 })
	close(release)
	h.settle()
	h.waitFor("alternatives ready")
	time.Sleep(20 * time.Millisecond)
	golden.RequireEqual(t, h.final().View())
}
