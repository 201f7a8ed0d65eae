package ui

import (
	"context"
	"errors"
	"fmt"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// send adds the user's message and starts a reply.
func (m *model) send(text string) tea.Cmd {
	now := m.now()
	um := &Message{Role: RoleUser, Content: text, Time: now}
	m.chat.Messages = append(m.chat.Messages, um)
	req := Request{Messages: m.chat.promptMessages(), Settings: m.chat.Settings}

	am := &Message{Role: RoleAssistant, Time: now}
	ue := &entry{kind: entryUser, msg: um}
	ae := &entry{kind: entryAssistant, msg: am, streaming: true}
	m.view.add(ue)
	m.view.add(ae)
	m.view.bottom()
	m.setHint("", false)

	m.genSeq++
	ctx, cancel := context.WithCancel(context.Background())
	g := &generation{id: m.genSeq, entry: ae, msg: am, cancel: cancel, settings: m.chat.Settings}
	m.gen = g
	m.usage = nil
	return tea.Batch(m.startReply(ctx, g.id, req), m.autosave(), m.statsTick(g.id))
}

// startReply calls Engine.Send, which may render and tokenize the prompt.
func (m *model) startReply(ctx context.Context, id int, req Request) tea.Cmd {
	eng := m.eng
	return func() (msg tea.Msg) {
		defer func() {
			if r := recover(); r != nil {
				msg = replyStartedMsg{id: id, err: panicError(r)}
			}
		}()
		r, err := eng.Send(ctx, req)
		return replyStartedMsg{id: id, reply: r, err: err}
	}
}

// panicError is a panic of the engine, recovered in a command so that the
// chat survives it.
func panicError(r any) error {
	return fmt.Errorf("engine panic: %v", r)
}

// waitForEvent pulls the reply's next event; Update issues it again after
// every delta, so the stream is read one event per command.
func waitForEvent(id int, r Reply) tea.Cmd {
	return func() (msg tea.Msg) {
		defer func() {
			if p := recover(); p != nil {
				r.Cancel()
				msg = replyEventMsg{id: id, ok: true, ev: Event{Kind: EventError, Err: panicError(p)}}
			}
		}()
		ev, ok := r.Next()
		return replyEventMsg{id: id, ev: ev, ok: ok}
	}
}

func (m *model) onReplyStarted(msg replyStartedMsg) tea.Cmd {
	g := m.gen
	if g == nil || g.id != msg.id {
		if msg.reply != nil {
			msg.reply.Cancel() // a reply nobody waits for any more
		}
		return nil
	}
	if msg.err != nil {
		return m.unsend(g, msg.err)
	}
	g.reply = msg.reply
	m.chat.Messages = append(m.chat.Messages, g.msg)
	n := msg.reply.PromptTokens()
	m.ctxUsed = n
	if limit := m.info.MaxContext; limit > 0 && g.settings.MaxTokens > 0 && n+g.settings.MaxTokens > limit {
		m.setHint(fmt.Sprintf("context nearly full: the reply can use only %d of max_tokens %d", limit-n, g.settings.MaxTokens), true)
	}
	return tea.Batch(waitForEvent(g.id, msg.reply), m.renderTick(g.id))
}

// unsend takes back a message that could not be sent: it leaves the chat,
// returns to the input, and a warning says why.
func (m *model) unsend(g *generation, err error) tea.Cmd {
	m.gen = nil
	g.cancel()
	// Drop the user's turn and both entries.
	if n := len(m.chat.Messages); n > 0 && m.chat.Messages[n-1].Role == RoleUser {
		um := m.chat.Messages[n-1]
		m.chat.Messages = m.chat.Messages[:n-1]
		m.view.removeMsg(um)
		if m.in.Value() == "" {
			m.in.SetValue(um.Content)
		}
	}
	m.view.removeEntry(g.entry)
	var ce *ContextError
	switch {
	case g.stopped:
		m.view.notice(entryNotice, "Stopped before the reply started; your message is back in the input.")
	case errors.As(err, &ce):
		m.view.notice(entryWarning, fmt.Sprintf(
			"This message does not fit the context: %s. It is back in the input: shorten it, or start a /new chat (or /clear this one).", ce))
	default:
		m.view.notice(entryError, "The engine could not start a reply: "+err.Error())
	}
	return m.autosave()
}

func (m *model) onReplyEvent(msg replyEventMsg) tea.Cmd {
	g := m.gen
	if g == nil || g.id != msg.id {
		return nil
	}
	if !msg.ok {
		return m.finish(g, Event{Kind: EventError, Err: errors.New("the reply ended without a final event")})
	}
	ev := msg.ev
	if ev.Text != "" {
		g.text.WriteString(ev.Text)
		g.msg.Content = g.text.String()
		m.view.changed(g.entry)
	}
	u := ev.Usage
	m.usage = &u
	if u.PromptTokens > 0 {
		m.ctxUsed = u.PromptTokens + u.GeneratedTokens
	}
	if ev.Kind == EventDelta {
		return waitForEvent(g.id, g.reply)
	}
	return m.finish(g, ev)
}

// finish ends the reply with its final event.
func (m *model) finish(g *generation, ev Event) tea.Cmd {
	m.gen = nil
	g.cancel()
	g.entry.streaming = false
	finish := ev.Finish
	if ev.Kind == EventError {
		finish = "error"
		msg := "engine error"
		if ev.Err != nil {
			msg = ev.Err.Error()
		}
		g.msg.Error = msg
	}
	g.msg.Stats = newReplyStats(ev.Usage, finish, g.settings)
	m.view.changed(g.entry)
	if ev.Kind == EventDone && ev.Finish == FinishLength && m.info.MaxContext > 0 && m.ctxUsed >= m.info.MaxContext {
		m.view.notice(entryWarning, fmt.Sprintf(
			"The conversation has filled the model's context (%d tokens). Start a /new chat or /clear this one to continue.", m.info.MaxContext))
	}
	return tea.Batch(m.autosave(), m.fetchStats())
}

// stop cancels the reply being generated; its final event follows.
func (m *model) stop() {
	if m.gen == nil {
		return
	}
	m.gen.stopped = true
	m.gen.cancel()
}

// abandon stops the reply and forgets it at once (for /new, /clear,
// /load): its remaining events are ignored.
func (m *model) abandon() {
	g := m.gen
	if g == nil {
		return
	}
	m.stop()
	m.gen = nil
	g.entry.streaming = false
}

func (m *model) renderTick(id int) tea.Cmd {
	return tea.Tick(renderInterval, func(time.Time) tea.Msg { return renderTickMsg{id: id} })
}

// onRenderTick re-renders the streaming reply if it changed, at most once
// per renderInterval.
func (m *model) onRenderTick(msg renderTickMsg) tea.Cmd {
	g := m.gen
	if g == nil || g.id != msg.id {
		return nil
	}
	var cmd tea.Cmd
	if g.entry.needsRender(m.md.width) {
		cmd = m.renderEntry(g.entry)
	}
	return tea.Batch(cmd, m.renderTick(msg.id))
}

// renderFinished renders every reply that is not streaming and whose
// rendering is stale (a reply just finished, or the width changed).
func (m *model) renderFinished() []tea.Cmd {
	var cmds []tea.Cmd
	for _, e := range m.view.entries {
		if !e.streaming && e.needsRender(m.md.width) {
			cmds = append(cmds, m.renderEntry(e))
		}
	}
	return cmds
}

// renderEntry renders e's answer with glamour in a command.
func (m *model) renderEntry(e *entry) tea.Cmd {
	e.rendering = true
	md, version, text := m.md, e.version, e.msg.Answer()
	return func() tea.Msg {
		return renderedMsg{e: e, version: version, width: md.width, out: md.render(text)}
	}
}

func (m *model) onRendered(msg renderedMsg) {
	e := msg.e
	e.rendering = false
	if msg.width != m.md.width {
		return // rendered for an old width: renderFinished or the tick asks again
	}
	e.md, e.mdVersion, e.mdWidth = msg.out, msg.version, msg.width
	m.view.dirty = true
}

func (m *model) statsTick(id int) tea.Cmd {
	return tea.Tick(statsInterval, func(time.Time) tea.Msg { return statsTickMsg{id: id} })
}

func (m *model) fetchStats() tea.Cmd {
	eng, last := m.eng, m.stats
	return func() (msg tea.Msg) {
		defer func() {
			if recover() != nil {
				msg = statsMsg{stats: last}
			}
		}()
		return statsMsg{stats: eng.Stats()}
	}
}

// autosave writes the chat in a command, unless autosave is off or the
// chat is empty.
func (m *model) autosave() tea.Cmd {
	if m.opts.NoSave || len(m.chat.Messages) == 0 {
		return nil
	}
	return m.saveCmd(m.chatName, true)
}

// saveCmd writes a copy of the chat as name.
func (m *model) saveCmd(name string, auto bool) tea.Cmd {
	m.chat.Updated = m.now()
	m.saveSeq++
	m.saving++
	c, seq, st := m.chat.clone(), m.saveSeq, m.store
	return func() tea.Msg {
		path, err := st.save(name, c, seq)
		return savedMsg{path: path, auto: auto, err: err}
	}
}

func (m *model) onSaved(msg savedMsg) {
	m.saving--
	switch {
	case msg.err != nil && msg.auto:
		if msg.err.Error() != m.lastSaveErr { // say it once, not after every message
			m.view.notice(entryError, "autosave failed: "+msg.err.Error())
		}
		m.lastSaveErr = msg.err.Error()
	case msg.err != nil:
		m.view.notice(entryError, "save failed: "+msg.err.Error())
	case msg.auto:
		m.lastSaveErr = ""
	default:
		m.view.notice(entryNotice, "Saved to "+msg.path)
	}
}
