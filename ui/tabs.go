package ui

import (
	"fmt"
	"strconv"
	"strings"

	tea "github.com/charmbracelet/bubbletea"
	xansi "github.com/charmbracelet/x/ansi"
)

// maxTabs is the most chats open at once.
const maxTabs = 9

// chatTab is one open chat: its conversation, its view, and the replies
// it is generating. Every open chat keeps generating while another is
// shown; the engine batches their requests.
type chatTab struct {
	chat     *Chat
	chatName string    // the file the chat saves to: its id, or the /save name
	view     *chatView // laid out again only while shown
	gen      *generation
	choice   *choice // the alternatives of /regen being compared; nil when none
	usage    *Usage  // the current or last reply's
	ctxUsed  int     // tokens the current or last request holds
	unseen   bool    // a reply ended while the chat was in the background
}

// newTab makes an empty chat; the caller adds it to tabs.
func (m *model) newTab(s Settings, system string) *chatTab {
	c := m.newChat(s, system)
	v := newChatView(m.st, m.info.Name)
	if m.chatTab != nil {
		v.showThink = m.view.showThink
	}
	return &chatTab{chat: c, chatName: c.ID, view: v}
}

// busyCount is the number of replies t is generating.
func (m *model) busyCount(t *chatTab) int {
	n := 0
	if t.gen != nil {
		n++
	}
	if t.choice != nil {
		n += t.choice.running
	}
	return n
}

// busy reports whether any reply is being generated or a model loaded.
func (m *model) busy() bool { return len(m.gens) > 0 || m.loading != nil }

// openTab adds a new empty chat after the others and shows it.
func (m *model) openTab() tea.Cmd {
	if len(m.tabs) >= maxTabs {
		m.view.notice(entryWarning, fmt.Sprintf("%d chats are open, the most there can be: /close one first.", maxTabs))
		return nil
	}
	t := m.newTab(m.chat.Settings, m.chat.System)
	m.tabs = append(m.tabs, t)
	m.switchTo(len(m.tabs) - 1)
	m.view.notice(entryNotice, fmt.Sprintf(
		"New chat %d of %d. The others stay open (and keep generating): %s switches, /chats lists them.",
		len(m.tabs), len(m.tabs), keyPair(m.keys.Chats.Prev, m.keys.Chats.Next)))
	return nil
}

// switchTo shows chat i.
func (m *model) switchTo(i int) {
	if i < 0 || i >= len(m.tabs) {
		return
	}
	m.chatTab = m.tabs[i]
	m.unseen = false
	m.clearArmed = false
	m.layout()
	m.view.dirty = true
	m.comp.close()
	m.setHint("", false)
	if ch := m.choice; ch != nil && ch.running == 0 {
		m.setHint("alternatives ready", false)
	}
}

// index is the position of the shown chat.
func (m *model) index() int {
	for i, t := range m.tabs {
		if t == m.chatTab {
			return i
		}
	}
	return 0
}

// cycle shows the next (d = 1) or previous (d = -1) chat.
func (m *model) cycle(d int) {
	if len(m.tabs) < 2 {
		m.setHint(fmt.Sprintf("only one chat is open: %s opens another", m.keys.Chats.New.Help().Key), false)
		return
	}
	n := len(m.tabs)
	m.switchTo((m.index() + d + n) % n)
}

// title is a chat's name in the tab strip and /chats: its /save name,
// else the start of its first message.
func (t *chatTab) title() string {
	if t.chatName != t.chat.ID {
		return t.chatName
	}
	for _, msg := range t.chat.Messages {
		if msg.Role == RoleUser {
			return strings.Join(strings.Fields(msg.Content), " ")
		}
	}
	return "new chat"
}

// tabStrip is the line above the chat when several are open: each chat's
// number and title, ● while it generates, * when a reply ended unseen.
// The shown chat is in brackets.
func (m *model) tabStrip() string {
	const titleWidth = 18
	parts := make([]string, len(m.tabs))
	for i, t := range m.tabs {
		label := strconv.Itoa(i+1) + " " + xansi.Truncate(t.title(), titleWidth, "…")
		switch {
		case m.busyCount(t) > 0:
			label += " " + m.st.Tabs.Busy.Render("●")
		case t.unseen:
			label += " *"
		}
		if t == m.chatTab {
			parts[i] = m.st.Tabs.Active.Render("[" + label + "]")
		} else {
			parts[i] = m.st.Tabs.Tab.Render(" " + label + " ")
		}
	}
	line := strings.Join(parts, m.st.Tabs.Sep.Render("│"))
	return xansi.Truncate(line, m.width, "…")
}

func (m *model) cmdChats(string) tea.Cmd {
	var b strings.Builder
	b.WriteString("Open chats (/switch N shows one):")
	for i, t := range m.tabs {
		mark := "  "
		if t == m.chatTab {
			mark = "▸ "
		}
		state := fmt.Sprintf("%d messages", len(t.chat.Messages))
		if n := m.busyCount(t); n > 0 {
			state += fmt.Sprintf(", generating %d", n)
		}
		fmt.Fprintf(&b, "\n%s%d  %s  (%s; %s)", mark, i+1, t.title(), state, t.chatName)
	}
	m.view.notice(entryNotice, b.String())
	return nil
}

func (m *model) cmdSwitch(args string) tea.Cmd {
	n, err := strconv.Atoi(args)
	if err != nil || n < 1 || n > len(m.tabs) {
		m.view.notice(entryWarning, fmt.Sprintf("usage: /switch N, with N from 1 to %d (/chats lists them)", len(m.tabs)))
		return nil
	}
	m.switchTo(n - 1)
	return nil
}

func (m *model) cmdClose(args string) tea.Cmd {
	i := m.index()
	if args != "" {
		n, err := strconv.Atoi(args)
		if err != nil || n < 1 || n > len(m.tabs) {
			m.view.notice(entryWarning, fmt.Sprintf("usage: /close [N], with N from 1 to %d", len(m.tabs)))
			return nil
		}
		i = n - 1
	}
	if len(m.tabs) == 1 {
		m.view.notice(entryWarning, "This is the only open chat: /clear empties it, /new opens another.")
		return nil
	}
	t := m.tabs[i]
	m.abandon(t)
	cmd := m.autosaveTab(t)
	m.tabs = append(m.tabs[:i], m.tabs[i+1:]...)
	if t == m.chatTab {
		m.switchTo(min(i, len(m.tabs)-1))
	}
	m.layout()
	note := fmt.Sprintf("Closed chat %d (%s).", i+1, t.title())
	if len(t.chat.Messages) > 0 && !m.opts.NoSave {
		note += " It is saved: /load " + t.chatName + " opens it again."
	}
	m.view.notice(entryNotice, note)
	return cmd
}

// findTab is the open chat saved as name, or nil.
func (m *model) findTab(name string) *chatTab {
	for _, t := range m.tabs {
		if t.chatName == name {
			return t
		}
	}
	return nil
}
