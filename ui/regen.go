package ui

import (
	"fmt"
	"strconv"

	tea "github.com/charmbracelet/bubbletea"
)

// maxAlternatives is the most replies one /regen generates.
const maxAlternatives = 8

// choice is what /regen shows in place of the last reply: the previous
// reply (when there was one) and N alternatives, generated at the same
// time (the engine batches them). One option is shown at a time; the user
// compares them with the Choice keys and keeps one (Enter on an empty
// input, /pick N, or sending the next message), which becomes the reply
// in the conversation. Until then the conversation keeps the previous
// reply, so an autosave never loses it.
type choice struct {
	opts     []*entry // the options; opts[0] is the previous reply when prev
	prev     bool
	sel      int      // the option shown
	running  int      // alternatives still being generated
	entry    *entry   // the chat view's entry of the choice
	replaces *Message // the reply a kept alternative replaces; nil: it is appended
	keysHelp string   // the line of keys under the names
}

// label is option i's name: "previous", or the alternative's number.
func (ch *choice) label(i int) string {
	if ch.prev && i == 0 {
		return "previous"
	}
	return strconv.Itoa(ch.number(i))
}

// number is what /pick takes for option i: 0 for the previous reply, the
// alternatives from 1.
func (ch *choice) number(i int) int {
	if ch.prev {
		return i
	}
	return i + 1
}

// index is the option /pick n means.
func (ch *choice) index(n int) (int, bool) {
	i := n - 1
	if ch.prev {
		i = n
	}
	return i, i >= 0 && i < len(ch.opts)
}

func (m *model) cmdRegen(args string) tea.Cmd {
	n := 1
	if args != "" {
		v, err := strconv.Atoi(args)
		if err != nil || v < 1 || v > maxAlternatives {
			m.view.notice(entryWarning, fmt.Sprintf("usage: /regen [N], with N from 1 to %d alternatives (default 1)", maxAlternatives))
			return nil
		}
		n = v
	}
	t := m.chatTab
	if m.busyCount(t) > 0 {
		m.view.notice(entryWarning, "A reply is being generated: wait for it, or stop it with esc, then /regen.")
		return nil
	}
	if why := m.engineGone(); why != "" {
		m.view.notice(entryWarning, "Cannot regenerate now: "+why+".")
		return nil
	}
	var cmds []tea.Cmd
	if t.choice != nil { // keep the option shown, then start again from it
		cmds = append(cmds, m.pick(t, t.choice.sel))
		if t.choice != nil {
			return tea.Batch(cmds...)
		}
	}
	u := -1
	for i, msg := range t.chat.Messages {
		if msg.Role == RoleUser {
			u = i
		}
	}
	if u < 0 {
		m.view.notice(entryWarning, "Nothing to regenerate: send a message first.")
		return tea.Batch(cmds...)
	}
	ch := &choice{}
	ch.keysHelp = fmt.Sprintf("%s compare · %s keeps the one shown · /pick N",
		keyPair(m.keys.Choice.Prev, m.keys.Choice.Next), m.keys.Choice.Keep.Help().Key)
	ch.entry = &entry{kind: entryChoice, choice: ch}
	if u+1 < len(t.chat.Messages) && t.chat.Messages[u+1].Role == RoleAssistant {
		ch.replaces = t.chat.Messages[u+1]
		var pe *entry
		for _, e := range t.view.entries {
			if e.msg == ch.replaces {
				pe = e
			}
		}
		if pe == nil {
			pe = &entry{kind: entryAssistant, msg: ch.replaces}
		}
		ch.opts, ch.prev = []*entry{pe}, true
		t.view.replaceEntry(pe, ch.entry)
	} else {
		t.view.add(ch.entry)
	}
	req := Request{
		Messages: (&Chat{System: t.chat.System, Messages: t.chat.Messages[:u+1]}).promptMessages(),
		Settings: t.chat.Settings,
	}
	now := m.now()
	t.choice = ch
	t.usage = nil
	for i := range n {
		s := t.chat.Settings
		if s.Seed != 0 {
			s.Seed += uint64(i + 1) // reproducible, and different from the previous reply
		}
		e := &entry{kind: entryAssistant, msg: &Message{Role: RoleAssistant, Time: now}, streaming: true}
		ch.opts = append(ch.opts, e)
		g, ctx := m.newGeneration(t, e, s, len(ch.opts)-1)
		ch.running++
		r := req
		r.Settings = s
		cmds = append(cmds, m.startReply(ctx, g, r))
	}
	ch.sel = len(ch.opts) - n // the first alternative
	t.view.bottom()
	if t.chat.Settings.Temperature == 0 {
		m.view.notice(entryWarning, "The temperature is 0 (greedy decoding): every alternative will be the same. /set temperature 0.8 gives different ones.")
	}
	m.setHint(fmt.Sprintf("generating %d alternatives at once", n), false)
	if n == 1 {
		m.setHint("generating an alternative", false)
	}
	return tea.Batch(append(cmds, m.startTicking())...)
}

// onAltDone runs after an alternative of chat t ended.
func (m *model) onAltDone(t *chatTab) tea.Cmd {
	ch := t.choice
	if ch == nil || ch.running > 0 {
		return nil
	}
	ok := 0
	for i, o := range ch.opts {
		if (!ch.prev || i > 0) && o.msg.Error == "" {
			ok++
		}
	}
	if ok == 0 { // nothing to compare: back to what was there
		if ch.prev {
			t.view.replaceEntry(ch.entry, ch.opts[0])
		} else {
			t.view.removeEntry(ch.entry)
		}
		t.choice = nil
		why := ch.opts[len(ch.opts)-1].msg.Error
		t.view.notice(entryError, "No alternative could be generated: "+why)
		return nil
	}
	if t == m.chatTab {
		m.setHint("alternatives ready", false)
	}
	return nil
}

// browse shows the next (d = 1) or previous (d = -1) option.
func (m *model) browse(d int) {
	ch := m.choice
	n := len(ch.opts)
	ch.sel = (ch.sel + d + n) % n
	m.view.dirty = true
	m.view.bottom()
}

func (m *model) cmdPick(args string) tea.Cmd {
	ch := m.choice
	if ch == nil {
		m.view.notice(entryWarning, "Nothing to pick: /regen generates alternatives to choose from.")
		return nil
	}
	i := ch.sel
	if args != "" {
		n, err := strconv.Atoi(args)
		j, ok := ch.index(n)
		if err != nil || !ok {
			lo := 1
			if ch.prev {
				lo = 0
			}
			m.view.notice(entryWarning, fmt.Sprintf("usage: /pick [N], with N from %d to %d (0 is the previous reply)", lo, ch.number(len(ch.opts)-1)))
			return nil
		}
		i = j
	}
	return m.pick(m.chatTab, i)
}

// pick keeps option i of chat t's choice as the reply: the alternatives
// still being generated are stopped and dropped. An option still being
// generated or one that failed cannot be kept.
func (m *model) pick(t *chatTab, i int) tea.Cmd {
	ch := t.choice
	o := ch.opts[i]
	switch {
	case o.streaming:
		m.setHint(fmt.Sprintf("%s is still being generated: wait, or stop it with esc", ch.label(i)), true)
		return nil
	case o.msg.Error != "" && o.msg.Content == "":
		m.setHint(fmt.Sprintf("%s failed: keep another one", ch.label(i)), true)
		return nil
	}
	var cmds []tea.Cmd
	for _, g := range m.gens {
		if g.tab == t && g.alt >= 0 {
			g.stopped = true
			cmds = append(cmds, m.endGen(g))
		}
	}
	keep := o.msg
	if !(ch.prev && i == 0) {
		replaced := false
		for j, msg := range t.chat.Messages {
			if msg == ch.replaces {
				t.chat.Messages[j], replaced = keep, true
			}
		}
		if !replaced {
			t.chat.Messages = append(t.chat.Messages, keep)
		}
	}
	t.view.replaceEntry(ch.entry, o)
	t.choice = nil
	if st := keep.Stats; st != nil {
		t.ctxUsed = st.PromptTokens + st.GeneratedTokens
	}
	if t == m.chatTab {
		if ch.prev && i == 0 {
			m.setHint("kept the previous reply", false)
		} else {
			m.setHint("kept alternative "+ch.label(i), false)
		}
	}
	return tea.Batch(append(cmds, m.autosaveTab(t))...)
}
