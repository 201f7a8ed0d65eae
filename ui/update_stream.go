package ui

import (
	"context"
	"errors"
	"fmt"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// send adds the user's message to the shown chat and starts a reply.
func (m *model) send(text string) tea.Cmd {
	t := m.chatTab
	now := m.now()
	um := &Message{Role: RoleUser, Content: text, Time: now}
	t.chat.Messages = append(t.chat.Messages, um)
	req := Request{Messages: t.chat.promptMessages(), Settings: t.chat.Settings}

	am := &Message{Role: RoleAssistant, Time: now}
	ue := &entry{kind: entryUser, msg: um}
	ae := &entry{kind: entryAssistant, msg: am, streaming: true}
	t.view.add(ue)
	t.view.add(ae)
	t.view.bottom()
	m.setHint("", false)
	t.usage = nil
	g, ctx := m.newGeneration(t, ae, req.Settings, -1)
	t.gen = g
	return tea.Batch(m.startReply(ctx, g, req), m.autosave(), m.startTicking())
}

// newGeneration registers a reply of tab t shown by e, on the current
// engine, and returns it with the context that ends it.
func (m *model) newGeneration(t *chatTab, e *entry, s Settings, alt int) (*generation, context.Context) {
	m.genSeq++
	ctx, cancel := context.WithCancel(context.Background())
	e.msg.Model = m.info.Name
	g := &generation{id: m.genSeq, tab: t, eng: m.cur, entry: e, msg: e.msg, cancel: cancel, settings: s, alt: alt}
	m.gens[g.id] = g
	m.cur.active++
	return g, ctx
}

// startReply calls Engine.Send, which may render and tokenize the prompt.
func (m *model) startReply(ctx context.Context, g *generation, req Request) tea.Cmd {
	eng, id := g.eng.eng, g.id
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
	g := m.gens[msg.id]
	if g == nil {
		if msg.reply != nil {
			msg.reply.Cancel() // a reply nobody waits for any more
		}
		return nil
	}
	if msg.err != nil {
		m.logger().Warn("sending failed", "model", g.eng.info.Name, "err", msg.err)
		if _, ok := msg.err.(*enginePanic); ok && m.opts.LogPath != "" {
			msg.err = fmt.Errorf("%w%s", msg.err, m.logHint())
		}
		return m.unsend(g, msg.err)
	}
	t := g.tab
	g.reply = msg.reply
	if g.alt < 0 {
		t.chat.Messages = append(t.chat.Messages, g.msg)
	}
	n := msg.reply.PromptTokens()
	t.ctxUsed = n
	// Warn when the reply will be cut by the context rather than by
	// max_tokens and less than a quarter of the context is left: a model
	// whose context is below max_tokens is not "nearly full" on turn one.
	if limit := g.eng.info.MaxContext; t == m.chatTab && limit > 0 && g.settings.MaxTokens > 0 &&
		n+g.settings.MaxTokens > limit && 4*(limit-n) < limit {
		m.setHint(fmt.Sprintf("context nearly full: the reply can use only %d of max_tokens %d", limit-n, g.settings.MaxTokens), true)
	}
	return tea.Batch(waitForEvent(g.id, msg.reply), m.renderTick(g.id))
}

// unsend handles a reply that could not start. A plain reply takes its
// message back: it leaves the chat, returns to the input (when the chat
// is shown and the input empty), and a warning says why. An alternative
// of /regen shows the error in its place.
func (m *model) unsend(g *generation, err error) tea.Cmd {
	t := g.tab
	var ce *ContextError
	why := err.Error()
	if errors.As(err, &ce) {
		why = fmt.Sprintf("this conversation does not fit the context: %s", ce)
	}
	if g.alt >= 0 {
		g.msg.Error = "could not start: " + why
		cmd := m.endGen(g)
		t.view.changed(g.entry)
		return tea.Batch(cmd, m.onAltDone(t))
	}
	cmd := m.endGen(g)
	// Drop the user's turn and both entries.
	if n := len(t.chat.Messages); n > 0 && t.chat.Messages[n-1].Role == RoleUser {
		um := t.chat.Messages[n-1]
		t.chat.Messages = t.chat.Messages[:n-1]
		t.view.removeMsg(um)
		if t == m.chatTab && m.in.Value() == "" {
			m.in.restore(um.Content)
		}
	}
	t.view.removeEntry(g.entry)
	switch {
	case g.stopped:
		t.view.notice(entryNotice, "Stopped before the reply started; your message is back in the input (typing replaces it, an arrow key edits it).")
	case ce != nil:
		t.view.notice(entryWarning, fmt.Sprintf(
			"This message does not fit the context: %s. It is back in the input (typing replaces it, an arrow key edits it): shorten it, or start a /new chat (or /clear this one).", ce))
	default:
		t.view.notice(entryError, "The engine could not start a reply: "+err.Error())
	}
	return tea.Batch(cmd, m.autosaveTab(t))
}

func (m *model) onReplyEvent(msg replyEventMsg) tea.Cmd {
	g := m.gens[msg.id]
	if g == nil {
		return nil
	}
	if !msg.ok {
		return m.finish(g, Event{Kind: EventError, Err: errors.New("the reply ended without a final event")})
	}
	t := g.tab
	ev := msg.ev
	if ev.Text != "" {
		g.text.WriteString(ev.Text)
		g.msg.Content = g.text.String()
		t.view.changed(g.entry)
	}
	u := ev.Usage
	t.usage = &u
	if u.PromptTokens > 0 {
		t.ctxUsed = u.PromptTokens + u.GeneratedTokens
	}
	if ev.Kind == EventDelta {
		return waitForEvent(g.id, g.reply)
	}
	return m.finish(g, ev)
}

// finish ends a reply with its final event.
func (m *model) finish(g *generation, ev Event) tea.Cmd {
	t := g.tab
	cmd := m.endGen(g)
	finish := ev.Finish
	if ev.Kind == EventError {
		finish = "error"
		msg := "engine error"
		if ev.Err != nil {
			msg = ev.Err.Error()
		}
		m.logger().Error("reply failed", "model", g.eng.info.Name, "err", ev.Err)
		g.msg.Error = msg + m.logHint()
	}
	g.msg.Stats = newReplyStats(ev.Usage, finish, ev.Limit, g.settings)
	t.view.changed(g.entry)
	if t != m.chatTab {
		t.unseen = true
	}
	if g.alt >= 0 {
		return tea.Batch(cmd, m.fetchStats(), m.onAltDone(t))
	}
	if info := g.eng.info; ev.Kind == EventDone && ev.Finish == FinishLength && info.MaxContext > 0 &&
		(ev.Limit == LimitContext || ev.Limit == LimitKVCache || ev.Limit == "" && t.ctxUsed >= info.MaxContext) {
		t.view.notice(entryWarning, fmt.Sprintf(
			"The conversation has filled %s. Start a /new chat or /clear this one to continue.", info.contextLimit()))
	}
	return tea.Batch(cmd, m.autosaveTab(t), m.fetchStats())
}

// endGen forgets a reply that has ended (or that nobody waits for any
// more): its engine may then be closed.
func (m *model) endGen(g *generation) tea.Cmd {
	if m.gens[g.id] != g {
		return nil
	}
	delete(m.gens, g.id)
	g.cancel()
	g.entry.streaming = false
	g.tab.view.changed(g.entry)
	if g.alt < 0 {
		if g.tab.gen == g {
			g.tab.gen = nil
		}
	} else if c := g.tab.choice; c != nil {
		c.running--
	}
	g.eng.active--
	return m.maybeClose(g.eng)
}

// stop cancels every reply chat t is generating; their final events
// follow.
func (m *model) stop(t *chatTab) {
	for _, g := range m.gens {
		if g.tab == t {
			g.stopped = true
			g.cancel()
		}
	}
}

// abandon stops chat t's replies and forgets them at once (for /clear,
// /load, /close): their remaining events are ignored, and the
// alternatives of /regen are dropped.
func (m *model) abandon(t *chatTab) tea.Cmd {
	var cmds []tea.Cmd
	for _, g := range m.gens {
		if g.tab == t {
			g.stopped = true
			cmds = append(cmds, m.endGen(g))
		}
	}
	t.choice = nil
	return tea.Batch(cmds...)
}

func (m *model) renderTick(id int) tea.Cmd {
	return tea.Tick(renderInterval, func(time.Time) tea.Msg { return renderTickMsg{id: id} })
}

// onRenderTick re-renders a streaming reply of the shown chat if it
// changed, at most once per renderInterval. Replies of chats in the
// background are rendered when their chat is shown.
func (m *model) onRenderTick(msg renderTickMsg) tea.Cmd {
	g := m.gens[msg.id]
	if g == nil {
		return nil
	}
	var cmd tea.Cmd
	if g.tab == m.chatTab && g.entry.needsRender(m.md.width) {
		cmd = m.renderEntry(g.entry)
	}
	return tea.Batch(cmd, m.renderTick(msg.id))
}

// renderFinished renders every reply of the shown chat that is not
// streaming and whose rendering is stale (a reply just finished, or the
// width changed).
func (m *model) renderFinished() []tea.Cmd {
	var cmds []tea.Cmd
	for _, e := range m.view.replies() {
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
	for _, t := range m.tabs {
		t.view.dirty = true
	}
}

// startTicking starts polling the engine's stats unless it already is; it
// goes on while replies are generated or a model loads.
func (m *model) startTicking() tea.Cmd {
	if m.ticking {
		return nil
	}
	m.ticking = true
	return m.statsTick()
}

func (m *model) statsTick() tea.Cmd {
	return tea.Tick(statsInterval, func(time.Time) tea.Msg { return statsTickMsg{} })
}

func (m *model) onStatsTick() tea.Cmd {
	if !m.busy() {
		m.ticking = false
		return m.fetchStats()
	}
	return tea.Batch(m.fetchStats(), m.statsTick())
}

func (m *model) fetchStats() tea.Cmd {
	if m.cur.unloaded {
		return nil
	}
	eng, last := m.cur.eng, m.stats
	return func() (msg tea.Msg) {
		defer func() {
			if recover() != nil {
				msg = statsMsg{stats: last}
			}
		}()
		return statsMsg{stats: eng.Stats()}
	}
}

// autosave writes the shown chat in a command.
func (m *model) autosave() tea.Cmd { return m.autosaveTab(m.chatTab) }

// autosaveTab writes chat t in a command, unless autosave is off or the
// chat is empty.
func (m *model) autosaveTab(t *chatTab) tea.Cmd {
	if m.opts.NoSave || len(t.chat.Messages) == 0 {
		return nil
	}
	return m.saveCmd(t, t.chatName, true)
}

// saveCmd writes a copy of chat t as name.
func (m *model) saveCmd(t *chatTab, name string, auto bool) tea.Cmd {
	t.chat.Updated = m.now()
	m.saveSeq++
	m.saving++
	c, seq, st := t.chat.clone(), m.saveSeq, m.store
	return func() tea.Msg {
		path, err := st.save(name, c, seq)
		return savedMsg{tab: t, path: path, auto: auto, err: err}
	}
}

func (m *model) onSaved(msg savedMsg) {
	m.saving--
	switch {
	case msg.err != nil && msg.auto:
		if msg.err.Error() != m.lastSaveErr { // say it once, not after every message
			m.logger().Error("autosave failed", "err", msg.err)
			m.view.notice(entryError, "autosave failed: "+msg.err.Error()+m.logHint())
		}
		m.lastSaveErr = msg.err.Error()
	case msg.err != nil:
		m.logger().Error("save failed", "err", msg.err)
		m.view.notice(entryError, "save failed: "+msg.err.Error()+m.logHint())
	case msg.auto:
		m.lastSaveErr = ""
	default:
		m.view.notice(entryNotice, "Saved to "+msg.path)
	}
}
