package ui

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/aymanbagabas/go-osc52/v2"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/ferrite-llm/ferrite/internal/units"
	"github.com/ferrite-llm/ferrite/kernels"
)

// The slash commands. Each runs in Update: it changes state, and anything
// that touches a file or the terminal is a returned command.

func (m *model) cmdHelp(string) tea.Cmd {
	m.view.notice(entryNotice, m.helpText())
	return nil
}

func (m *model) cmdNew(string) tea.Cmd { return m.openTab() }

// cmdClear empties the shown chat. The cleared conversation stays
// recoverable: it is saved once more under its own name, and the tab goes
// on as a new chat (new id, new file). With autosave off there is no file
// to keep, so the first /clear only says so and a second one clears.
func (m *model) cmdClear(string) tea.Cmd {
	had := len(m.chat.Messages) > 0
	if had && m.opts.NoSave && !m.clearArmed {
		m.clearArmed = true
		m.view.notice(entryWarning, "Autosave is off, so the cleared messages could not be brought back: /clear again to clear anyway, or /save <name> first.")
		return nil
	}
	cmd := m.abandon(m.chatTab)
	note := "Cleared. The system prompt and settings are kept."
	if had && !m.opts.NoSave {
		name := m.chatName
		cmd = tea.Batch(cmd, m.saveCmd(m.chatTab, name, true))
		note = fmt.Sprintf("Cleared. The cleared chat stays saved as %s: /load %s brings it back. The system prompt and settings are kept.",
			units.ShortPath(m.store.path(name)), name)
	}
	m.chat = m.newChat(m.chat.Settings, m.chat.System)
	m.chatName = m.chat.ID
	m.view.clear()
	m.ctxUsed, m.usage = 0, nil
	m.view.notice(entryNotice, note)
	return cmd
}

func (m *model) cmdSystem(args string) tea.Cmd {
	switch args {
	case "":
		if m.chat.System == "" {
			m.view.notice(entryNotice, "No system prompt. Set one with /system <text>.")
		} else {
			m.view.notice(entryNotice, "System prompt:\n"+m.chat.System)
		}
		return nil
	case "--clear":
		m.chat.setSystem("", m.now())
		m.view.notice(entryNotice, "System prompt cleared.")
	default:
		m.chat.setSystem(args, m.now())
		m.view.notice(entryNotice, "System prompt set; it applies from the next message.")
	}
	return m.autosave()
}

func (m *model) cmdSet(args string) tea.Cmd {
	if args == "" {
		m.view.notice(entryNotice, "Settings: "+formatSettings(m.chat.Settings)+"\nChange one with /set <name> <value>: "+setRanges()+".")
		return nil
	}
	s := m.chat.Settings
	name, err := applySetting(&s, args, m.info)
	if err != nil {
		m.view.notice(entryWarning, err.Error())
		return nil
	}
	m.chat.Settings = s
	m.view.notice(entryNotice, fmt.Sprintf("Set %s. Settings: %s", name, formatSettings(s)))
	return m.autosave()
}

func (m *model) cmdStop(string) tea.Cmd {
	if m.busyCount(m.chatTab) == 0 {
		m.view.notice(entryNotice, "Nothing to stop: no reply is being generated in this chat.")
		return nil
	}
	m.stop(m.chatTab)
	return nil
}

func (m *model) cmdStats(string) tea.Cmd {
	s := m.stats
	var b strings.Builder
	fmt.Fprintf(&b, "Model: %s", m.info.Name)
	if m.info.Arch != "" {
		fmt.Fprintf(&b, " (%s)", m.info.Arch)
	}
	if m.cur.unloaded {
		b.WriteString(", unloaded to make room for another (/model NAME opens a model)")
	}
	if limit := m.info.MaxContext; limit > 0 {
		fmt.Fprintf(&b, ", context %d tokens", limit)
		if m.info.KVLimited {
			b.WriteString(" (the KV cache's size, set by kv_budget: less than the model's context)")
		}
		fmt.Fprintf(&b, "; this chat holds %d", min(m.ctxUsed, limit))
	}
	b.WriteString("\n")
	if m.info.Device != "" {
		fmt.Fprintf(&b, "Device: %s", m.info.Device)
		if m.info.DeviceNote != "" {
			fmt.Fprintf(&b, " (%s)", m.info.DeviceNote)
		}
		b.WriteString("\n")
	}
	if s.KVBlocksTotal > 0 {
		fmt.Fprintf(&b, "KV cache: %d of %d blocks (%s), %s of %s", s.KVBlocksUsed, s.KVBlocksTotal,
			percent(s.KVBlocksUsed, s.KVBlocksTotal), formatBytes(s.KVBytesUsed), formatBytes(s.KVBytesTotal))
		if s.KVBytesPerToken > 0 {
			fmt.Fprintf(&b, ", %s per token", formatBytes(s.KVBytesPerToken))
		}
		b.WriteString("\n")
	}
	if s.RecurrentBytes > 0 {
		fmt.Fprintf(&b, "Recurrent state: %s\n", formatBytes(s.RecurrentBytes))
	}
	if line := memoryLine(s); line != "" {
		b.WriteString(line + "\n")
	}
	fmt.Fprintf(&b, "Sequences: %d running, %d waiting\n", s.Running, s.Waiting)
	switch k := m.chat.Settings.effectiveDraft(m.info); {
	case !m.info.MTP:
		b.WriteString("MTP: the model has no MTP module\n")
	case k == 0:
		b.WriteString("MTP: off for this chat\n")
	default:
		fmt.Fprintf(&b, "MTP: %d draft tokens per step", k)
		if s.DraftTokens > 0 {
			fmt.Fprintf(&b, "; %d of %d drafts accepted (%.0f%%), %.2f tokens per verify step",
				s.AcceptedTokens, s.DraftTokens, 100*s.AcceptRate, 1+s.AcceptedPerStep)
		}
		b.WriteString("\n")
	}
	if r := m.chat.lastReply(); r != nil && r.Stats != nil {
		b.WriteString("Last reply: " + formatReplyStats(r.Stats) + "\n")
	}
	b.WriteString("Settings: " + formatSettings(m.chat.Settings))
	m.view.notice(entryNotice, b.String())
	return nil
}

func (m *model) cmdExport(args string) tea.Cmd {
	f := strings.Fields(args)
	if len(f) == 0 || len(f) > 2 || (f[0] != "md" && f[0] != "json") {
		m.view.notice(entryWarning, "usage: /export md|json [path]")
		return nil
	}
	if len(m.chat.Messages) == 0 {
		m.view.notice(entryWarning, "Nothing to export: the chat is empty.")
		return nil
	}
	format := f[0]
	path := "ferrite-chat-" + m.chat.ID + "." + format
	if len(f) == 2 {
		path = units.ExpandHome(f[1])
	}
	c := m.chat.clone()
	c.Updated = m.now()
	return func() tea.Msg {
		var data []byte
		if format == "md" {
			data = []byte(ExportMarkdown(c))
		} else {
			var err error
			if data, err = MarshalChat(c); err != nil {
				return exportedMsg{err: err}
			}
		}
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		return exportedMsg{path: path, given: len(f) == 2, err: writeFileAtomic(path, data, 0o644)}
	}
}

func (m *model) cmdCopy(string) tea.Cmd {
	r := m.chat.lastReply()
	if r == nil || strings.TrimSpace(r.Answer()) == "" {
		m.view.notice(entryWarning, "Nothing to copy: there is no reply yet.")
		return nil
	}
	return copyCmd(m.clip, r.Answer())
}

// copyCmd puts text on the clipboard of the terminal (and of the machine
// the terminal runs on, over SSH too) with an OSC 52 sequence.
func copyCmd(w io.Writer, text string) tea.Cmd {
	return func() tea.Msg {
		seq := osc52.New(text)
		switch {
		case os.Getenv("TMUX") != "":
			seq = seq.Tmux()
		case strings.HasPrefix(os.Getenv("TERM"), "screen"):
			seq = seq.Screen()
		}
		_, err := seq.WriteTo(w)
		return copiedMsg{n: len([]rune(text)), err: err}
	}
}

func (m *model) cmdSave(args string) tea.Cmd {
	if args == "" {
		m.view.notice(entryWarning, "usage: /save <name>")
		return nil
	}
	if err := checkChatName(args); err != nil {
		m.view.notice(entryWarning, err.Error())
		return nil
	}
	if len(m.chat.Messages) == 0 {
		m.view.notice(entryWarning, "Nothing to save: the chat is empty.")
		return nil
	}
	m.chatName = args // autosaves go there from now on
	return m.saveCmd(m.chatTab, args, false)
}

func (m *model) cmdLoad(args string) tea.Cmd {
	st := m.store
	if args == "" {
		return func() tea.Msg {
			chats, err := st.list()
			return listedMsg{chats: chats, err: err}
		}
	}
	if isChatPath(args) {
		path := units.ExpandHome(args)
		return func() tea.Msg {
			if abs, err := filepath.Abs(path); err == nil {
				path = abs
			}
			c, err := readChatFile(path)
			return loadedMsg{path: path, chat: c, err: err}
		}
	}
	if err := checkChatName(args); err != nil {
		m.view.notice(entryWarning, err.Error())
		return nil
	}
	if t := m.findTab(args); t != nil && len(t.chat.Messages) > 0 {
		for i, x := range m.tabs {
			if x == t {
				m.switchTo(i)
			}
		}
		m.view.notice(entryNotice, "Chat "+args+" is open: this is it.")
		return nil
	}
	return func() tea.Msg {
		c, err := st.load(args)
		return loadedMsg{name: args, chat: c, err: err}
	}
}

// maxListedChats is the most saved chats /load lists.
const maxListedChats = 20

func (m *model) onListed(msg listedMsg) {
	if msg.err != nil {
		m.view.notice(entryError, "listing saved chats failed: "+msg.err.Error())
		return
	}
	if len(msg.chats) == 0 {
		m.view.notice(entryNotice, "No saved chats in "+m.store.dir+".")
		return
	}
	var b strings.Builder
	b.WriteString("Saved chats, newest first (/load <name>):")
	for i, c := range msg.chats {
		if i == maxListedChats {
			fmt.Fprintf(&b, "\n  … and %d more in %s", len(msg.chats)-i, m.store.dir)
			break
		}
		fmt.Fprintf(&b, "\n  %s  (%s)", c.Name, c.ModTime.Format("2006-01-02 15:04"))
	}
	m.view.notice(entryNotice, b.String())
}

func (m *model) onLoaded(msg loadedMsg) tea.Cmd {
	if msg.err != nil {
		m.view.notice(entryError, "load failed: "+msg.err.Error())
		return nil
	}
	// An empty chat is replaced; otherwise the chat opens in a new tab.
	var cmd tea.Cmd
	if len(m.chat.Messages) > 0 || m.busyCount(m.chatTab) > 0 {
		if len(m.tabs) >= maxTabs {
			m.view.notice(entryWarning, fmt.Sprintf("%d chats are open, the most there can be: /close one first.", maxTabs))
			return nil
		}
		m.tabs = append(m.tabs, m.newTab(m.chat.Settings, m.chat.System))
		m.switchTo(len(m.tabs) - 1)
	} else {
		cmd = m.abandon(m.chatTab)
	}
	c := msg.chat
	c.Model = m.info // it continues with this model
	from := "chat " + msg.name
	if msg.path != "" {
		// A file (an export) continues as a new saved chat, so that its
		// copy in the chats directory, if any, is not overwritten.
		c.ID = newChatID(m.now())
		msg.name = c.ID
		from = msg.path
	}
	m.chat, m.chatName = c, msg.name
	m.view.setMessages(c.Messages)
	m.view.bottom()
	m.ctxUsed, m.usage = 0, nil
	if r := c.lastReply(); r != nil && r.Stats != nil {
		m.ctxUsed = r.Stats.PromptTokens + r.Stats.GeneratedTokens
	}
	note := fmt.Sprintf("Loaded %s: %d messages. Settings: %s", from, len(c.Messages), formatSettings(c.Settings))
	if msg.path != "" && !m.opts.NoSave {
		note += "\nIt is saved as chat " + msg.name + " from now on."
	}
	if c.System != "" {
		note += "\nSystem prompt: " + c.System
	}
	m.view.notice(entryNotice, note)
	return cmd
}

func (m *model) cmdQuit(string) tea.Cmd { return m.quit() }

// memoryLine is /stats' account of the memory the model holds: weights, KV
// cache and recurrent state, the backend's other tensors and step arena,
// and on a GPU the device's total and free memory. On the host the weights
// are as loaded (mapped from the file or converted in RAM). "" when the
// engine reports nothing.
func memoryLine(s Stats) string {
	u := s.Memory
	if u == (kernels.MemoryUse{}) {
		return ""
	}
	where := "host RAM"
	if u.OnDevice {
		where = "GPU"
	}
	kv := s.KVBytesTotal + s.RecurrentBytes
	parts := []string{"weights " + formatBytes(u.Weights), "KV cache " + formatBytes(s.KVBytesTotal)}
	if s.RecurrentBytes > 0 {
		parts = append(parts, "recurrent state "+formatBytes(s.RecurrentBytes))
	}
	// A model on the op set allocates its KV cache and state as backend
	// tensors; one on host slices does not.
	if other := u.Tensors - kv; other > 0 {
		parts = append(parts, "other tensors "+formatBytes(other))
	}
	if u.Arena > 0 {
		parts = append(parts, "step arena "+formatBytes(u.Arena))
	}
	line := fmt.Sprintf("Memory (%s): %s; %s in all", where, strings.Join(parts, ", "),
		formatBytes(u.Weights+max(u.Tensors, kv)+u.Arena))
	if u.Total > 0 {
		line += fmt.Sprintf("; the device has %s, %s free", formatBytes(u.Total), formatBytes(u.Free))
	}
	return line
}
