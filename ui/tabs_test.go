package ui

import (
	"path/filepath"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
)

func TestSeveralChatsGenerateAtOnce(t *testing.T) {
	hold := make(chan struct{})
	eng := newFakeEngine(
		fakeReply{chunks: []string{"the long answer of chat one"}, hold: hold},
		fakeReply{chunks: []string{"the quick answer of chat two"}},
	)
	opts := testOptions(t)
	h := start(t, eng, opts)
	h.line("first question")
	h.waitFor("generating")

	// A new chat while the first one generates; the user writes there.
	h.key(tea.KeyCtrlN)
	h.until("two chats", func(m *model) bool { return len(m.tabs) == 2 && m.index() == 1 })
	h.waitFor("[2 new chat]")
	h.waitFor("● chat 1") // the status bar names the chat still generating
	h.line("second question")
	h.waitFor("the quick answer of chat two")
	h.until("chat 2 done, chat 1 still generating", func(m *model) bool {
		return m.tabs[1].gen == nil && m.tabs[0].gen != nil
	})
	if got := eng.concurrency(); got != 2 {
		t.Errorf("%d replies at once, want both chats'", got)
	}

	// Chat one finishes in the background, and is marked until shown.
	close(hold)
	h.until("chat 1 done", func(m *model) bool { return m.tabs[0].gen == nil && m.tabs[0].unseen })
	h.waitFor(" 1 first question * ")
	h.tm.Send(tea.KeyMsg{Type: tea.KeyCtrlLeft})
	h.waitFor("the long answer of chat one")
	h.settle()
	m := h.final()
	if m.index() != 0 || m.tabs[0].unseen {
		t.Errorf("shown %d, unseen %v", m.index(), m.tabs[0].unseen)
	}
	for i, want := range []string{"the long answer of chat one", "the quick answer of chat two"} {
		c := m.tabs[i].chat
		if len(c.Messages) != 2 || c.Messages[1].Content != want {
			t.Errorf("chat %d: %+v", i+1, c.Messages)
		}
		readChat(t, filepath.Join(opts.ChatsDir, m.tabs[i].chatName+".json"), func(c *Chat) bool {
			return len(c.Messages) == 2 && c.Messages[1].Stats != nil
		})
	}
}

func TestChatsSwitchAndClose(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("one")
	h.settle()
	h.line("/new")
	h.line("two")
	h.settle()
	h.line("/chats")
	h.untilNotice("▸ 2  two  (2 messages")
	h.line("/switch 1")
	h.until("chat 1 shown", func(m *model) bool { return m.index() == 0 })
	h.line("/switch 5")
	h.untilNotice("usage: /switch N, with N from 1 to 2")
	h.tm.Send(tea.KeyMsg{Type: tea.KeyCtrlRight})
	h.until("chat 2 shown", func(m *model) bool { return m.index() == 1 })
	h.tm.Send(tea.KeyMsg{Type: tea.KeyCtrlRight}) // wraps around
	h.until("chat 1 shown again", func(m *model) bool { return m.index() == 0 })
	h.line("/close 2")
	h.untilNotice("Closed chat 2 (two). It is saved: /load")
	h.line("/close")
	h.untilNotice("This is the only open chat")
	m := h.final()
	if len(m.tabs) != 1 || m.chat.Messages[0].Content != "one" {
		t.Fatalf("tabs %d, chat %+v", len(m.tabs), m.chat.Messages)
	}
	if strings.Contains(m.View(), "[1") {
		t.Error("the tab strip is shown with one chat")
	}
}

func TestLoadOpensANewTab(t *testing.T) {
	opts := testOptions(t)
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"saved answer"}}), opts)
	h.line("keep me")
	h.settle()
	h.line("/save kept")
	h.untilNotice("kept.json")
	h.line("/new")
	h.line("another")
	h.settle()
	h.line("/load kept") // open already: shown
	h.untilNotice("Chat kept is open")
	h.until("chat 1 shown", func(m *model) bool { return m.index() == 0 })
	h.line("/close")
	h.untilNotice("Closed chat 1")
	h.line("/load kept") // not open, and this chat has messages: a new tab
	h.untilNotice("Loaded chat kept")
	m := h.final()
	if len(m.tabs) != 2 || m.index() != 1 || m.chat.Messages[1].Content != "saved answer" {
		t.Fatalf("tabs %d, shown %d, chat %+v", len(m.tabs), m.index(), m.chat.Messages)
	}
}

func TestTabsGolden(t *testing.T) {
	hold := make(chan struct{})
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"answer"}}, fakeReply{chunks: []string{"x"}, hold: hold}), testOptions(t))
	h.line("What is a ferrite core?")
	h.settle()
	h.key(tea.KeyCtrlN)
	h.line("And a toroid?")
	h.waitFor("reading the prompt")
	h.key(tea.KeyCtrlN)
	h.waitFor("New chat 3 of 3")
	golden.RequireEqual(t, h.final().View())
}
