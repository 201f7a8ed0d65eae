package ui

import (
	"strings"

	"github.com/charmbracelet/bubbles/key"
	tea "github.com/charmbracelet/bubbletea"
)

// mouseWheelLines is how far one wheel step scrolls.
const mouseWheelLines = 3

// handleKey routes a key: quit and stop first, then the completion popup,
// then sending, scrolling and history, and everything else to the input.
func (m *model) handleKey(k tea.KeyMsg) tea.Cmd {
	km := &m.keys
	if !key.Matches(k, km.Quit) && m.quitArmed {
		m.quitArmed = false
		m.setHint("", false)
	}
	var cmd tea.Cmd
	switch {
	case key.Matches(k, km.Quit):
		return m.onCtrlC()
	case m.comp.open() && key.Matches(k, km.Complete.Close):
		m.comp.close()
		return nil
	case m.comp.open() && key.Matches(k, km.Complete.Next):
		m.comp.move(1)
		return nil
	case m.comp.open() && key.Matches(k, km.Complete.Prev):
		m.comp.move(-1)
		return nil
	case m.comp.open() && key.Matches(k, km.Complete.Accept):
		m.in.SetValue(m.comp.selected().value)
	case key.Matches(k, km.Stop) && m.busyCount(m.chatTab) > 0:
		m.stop(m.chatTab)
		return nil
	case key.Matches(k, km.Chats.New):
		cmd = m.openTab()
	case key.Matches(k, km.Chats.Prev):
		m.cycle(-1)
	case key.Matches(k, km.Chats.Next):
		m.cycle(1)
	case m.choice != nil && key.Matches(k, km.Choice.Prev):
		m.browse(-1)
	case m.choice != nil && key.Matches(k, km.Choice.Next):
		m.browse(1)
	case m.choice != nil && key.Matches(k, km.Choice.Keep) && strings.TrimSpace(m.in.Value()) == "" && !m.comp.open():
		cmd = m.pick(m.chatTab, m.choice.sel)
	case key.Matches(k, km.Input.Send):
		cmd = m.onEnter()
	case key.Matches(k, km.Chat.PageUp):
		m.view.pageUp()
	case key.Matches(k, km.Chat.PageDown):
		m.view.pageDown()
	case key.Matches(k, km.Chat.LineUp):
		m.view.scroll(-1)
	case key.Matches(k, km.Chat.LineDown):
		m.view.scroll(1)
	case key.Matches(k, km.Chat.Top):
		m.view.top()
	case key.Matches(k, km.Chat.Bottom):
		m.view.bottom()
	case key.Matches(k, km.Chat.Thinking):
		m.view.toggleThinking()
	case key.Matches(k, km.Chat.Mouse):
		cmd = m.toggleMouse()
	case key.Matches(k, km.Input.HistPrv) && m.in.onFirstRow() && m.in.prev():
	case key.Matches(k, km.Input.HistNxt) && m.in.onLastRow() && m.in.next():
	default:
		cmd = m.in.Update(k)
	}
	m.comp.update(m.in.Value(), m.cmds, m)
	return cmd
}

// onCtrlC stops the reply being generated; otherwise the first press arms
// and the second quits.
func (m *model) onCtrlC() tea.Cmd {
	if m.busyCount(m.chatTab) > 0 {
		m.stop(m.chatTab)
		m.quitArmed = true
		m.setHint("stopped · press ctrl+c again to quit", false)
		return nil
	}
	if m.quitArmed {
		return m.quit()
	}
	m.quitArmed = true
	m.setHint("press ctrl+c again to quit", false)
	return nil
}

// onEnter sends the input, or, with the popup open on a partly typed
// command or argument, completes it first (and runs a command that takes
// no arguments).
func (m *model) onEnter() tea.Cmd {
	if m.comp.open() {
		it := m.comp.selected()
		if strings.TrimRight(it.value, " ") != strings.TrimRight(m.in.Value(), " ") {
			m.in.SetValue(it.value)
			if strings.HasSuffix(it.value, " ") {
				return nil // arguments come next
			}
		}
	}
	return m.submit()
}

// submit runs a slash command or sends a message.
func (m *model) submit() tea.Cmd {
	text := m.in.Value()
	if strings.TrimSpace(text) == "" {
		return nil
	}
	if strings.HasPrefix(text, "/") {
		hist := m.remember(text)
		m.in.Reset()
		return tea.Batch(hist, m.runCommand(text))
	}
	if m.gen != nil {
		m.reject("a reply is being generated (esc stops it) · typing replaces the message")
		return nil
	}
	if why := m.engineGone(); why != "" {
		m.reject(why)
		return nil
	}
	var keep tea.Cmd
	if ch := m.choice; ch != nil { // sending keeps the alternative shown
		if ch.opts[ch.sel].streaming {
			m.reject("alternative still generating: wait, esc or /pick · typing replaces it")
			return nil
		}
		if keep = m.pick(m.chatTab, ch.sel); m.choice != nil {
			return keep
		}
	}
	hist := m.remember(text)
	m.in.Reset()
	m.clearArmed = false
	return tea.Batch(keep, hist, m.send(text))
}

// reject refuses to send the input now, saying why. The message stays in
// the input as selected text, so that what is typed next (a command, say)
// replaces it instead of being appended to it.
func (m *model) reject(hint string) {
	m.in.setRestored(true)
	m.setHint(hint, true)
}

// runCommand runs "/name args"; an unknown name gets a message.
func (m *model) runCommand(text string) tea.Cmd {
	name, args, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(text), "/"), " ")
	if name != "clear" {
		m.clearArmed = false
	}
	c, ok := m.cmds.lookup(name)
	if !ok {
		m.view.notice(entryWarning, "Unknown command /"+name+". Type /help for the list.")
		return nil
	}
	return c.run(m, strings.TrimSpace(args))
}

func (m *model) handleMouse(msg tea.MouseMsg) {
	if msg.Action != tea.MouseActionPress {
		return
	}
	switch msg.Button {
	case tea.MouseButtonWheelUp:
		m.view.scroll(-mouseWheelLines)
	case tea.MouseButtonWheelDown:
		m.view.scroll(mouseWheelLines)
	}
}

// toggleMouse gives the mouse to the terminal (to select and copy text)
// or takes it back (to scroll with the wheel).
func (m *model) toggleMouse() tea.Cmd {
	m.mouse = !m.mouse
	if m.mouse {
		m.setHint("mouse wheel scrolls the chat · ctrl+o to select text", false)
		return tea.EnableMouseCellMotion
	}
	m.setHint("the terminal has the mouse: select text to copy · ctrl+o to scroll again", false)
	return tea.DisableMouse
}
