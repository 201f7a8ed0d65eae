package ui

import (
	"fmt"
	"slices"
	"strings"

	"github.com/charmbracelet/bubbles/viewport"
	xansi "github.com/charmbracelet/x/ansi"
)

// entryKind is what a chat entry shows.
type entryKind uint8

const (
	entryUser      entryKind = iota // a user turn (msg)
	entryAssistant                  // a reply (msg)
	entryNotice                     // command output (text)
	entryWarning                    // something the user should fix (text)
	entryError                      // an engine or IO error (text)
	entryChoice                     // the alternatives of /regen (choice)
)

// entry is one block of the chat: a conversation message or a notice that
// only the screen shows (notices are not saved).
type entry struct {
	kind      entryKind
	msg       *Message // entryUser, entryAssistant
	text      string   // notices
	choice    *choice  // entryChoice
	streaming bool     // the reply is being generated
	version   int      // bumped whenever msg changes

	// The glamour rendering of the reply's answer, for mdVersion at
	// mdWidth; rendering is set while a render command is in flight.
	md        string
	mdVersion int
	mdWidth   int
	rendering bool

	// The whole block as last laid out, and what it was laid out for.
	block    string
	blockKey blockKey
}

// blockKey is everything an entry's block depends on.
type blockKey struct {
	width, version, mdVersion, mdWidth int
	think, streaming                   bool
}

// chatView is the scrollable conversation. It lays entries out into a
// viewport and remembers whether to follow new output: it follows until
// the user scrolls up, and again once they scroll back to the bottom, so a
// streaming reply never moves the text someone is reading.
type chatView struct {
	st        *Styles
	vp        viewport.Model
	entries   []*entry
	modelName string
	showThink bool // <think> blocks expanded
	follow    bool // keep the bottom in view
	dirty     bool // entries changed since the viewport's content was set
}

func newChatView(st *Styles, modelName string) *chatView {
	vp := viewport.New(0, 0)
	vp.KeyMap = viewport.KeyMap{} // the model handles keys and the mouse
	vp.MouseWheelEnabled = false
	return &chatView{st: st, vp: vp, modelName: modelName, follow: true}
}

// contentWidth is the width messages are laid out at: the view less a
// one-column margin on each side.
func (c *chatView) contentWidth() int { return max(c.vp.Width-2, 10) }

// SetSize resizes the view; it reports whether the width changed (every
// reply must then be rendered again).
func (c *chatView) SetSize(width, height int) bool {
	height = max(height, 1)
	changed := width != c.vp.Width
	if changed || height != c.vp.Height {
		c.vp.Width, c.vp.Height = width, height
		c.dirty = true
	}
	return changed
}

func (c *chatView) add(e *entry) {
	c.entries = append(c.entries, e)
	c.dirty = true
}

// notice adds a line of command output, a warning or an error.
func (c *chatView) notice(kind entryKind, text string) {
	c.add(&entry{kind: kind, text: text})
}

func (c *chatView) clear() {
	c.entries = nil
	c.follow = true
	c.dirty = true
}

// removeEntry drops e from the view.
func (c *chatView) removeEntry(e *entry) {
	c.entries = slices.DeleteFunc(c.entries, func(x *entry) bool { return x == e })
	c.dirty = true
}

// removeMsg drops the entry showing msg.
func (c *chatView) removeMsg(msg *Message) {
	c.entries = slices.DeleteFunc(c.entries, func(x *entry) bool { return x.msg == msg })
	c.dirty = true
}

// replaceEntry puts e in old's place.
func (c *chatView) replaceEntry(old, e *entry) {
	if i := slices.Index(c.entries, old); i >= 0 {
		c.entries[i] = e
	} else {
		c.entries = append(c.entries, e)
	}
	c.dirty = true
}

// replies is every assistant entry, the options of a choice included.
func (c *chatView) replies() []*entry {
	var out []*entry
	for _, e := range c.entries {
		switch e.kind {
		case entryAssistant:
			out = append(out, e)
		case entryChoice:
			out = append(out, e.choice.opts...)
		}
	}
	return out
}

// setMessages replaces the entries by those of a conversation.
func (c *chatView) setMessages(msgs []*Message) {
	c.clear()
	for _, msg := range msgs {
		kind := entryUser
		if msg.Role == RoleAssistant {
			kind = entryAssistant
		}
		c.add(&entry{kind: kind, msg: msg})
	}
}

// changed marks e as modified.
func (c *chatView) changed(e *entry) {
	e.version++
	c.dirty = true
}

func (c *chatView) toggleThinking() {
	c.showThink = !c.showThink
	c.dirty = true
}

// Scrolling. Each updates follow: scrolled to the bottom means follow.

func (c *chatView) scroll(lines int) {
	if lines < 0 {
		c.vp.ScrollUp(-lines)
	} else {
		c.vp.ScrollDown(lines)
	}
	c.follow = c.vp.AtBottom()
}

func (c *chatView) pageUp()   { c.scroll(-max(c.vp.Height-1, 1)) }
func (c *chatView) pageDown() { c.scroll(max(c.vp.Height-1, 1)) }

func (c *chatView) top() {
	c.vp.GotoTop()
	c.follow = c.vp.AtBottom()
}

func (c *chatView) bottom() {
	c.vp.GotoBottom()
	c.follow = true
}

// refresh lays the entries out into the viewport if they changed.
func (c *chatView) refresh() {
	if !c.dirty {
		return
	}
	c.dirty = false
	blocks := make([]string, 0, len(c.entries))
	for _, e := range c.entries {
		blocks = append(blocks, c.layout(e))
	}
	c.vp.SetContent(strings.Join(blocks, "\n\n"))
	if c.follow {
		c.vp.GotoBottom()
	}
}

func (c *chatView) View() string { return c.vp.View() }

// layout returns e's block, laid out again only when something it depends
// on changed.
func (c *chatView) layout(e *entry) string {
	if e.kind == entryChoice {
		return c.layoutChoice(e.choice)
	}
	key := blockKey{
		width: c.contentWidth(), version: e.version, mdVersion: e.mdVersion, mdWidth: e.mdWidth,
		think: c.showThink, streaming: e.streaming,
	}
	if e.block != "" && e.blockKey == key {
		return e.block
	}
	w := key.width
	var b strings.Builder
	switch e.kind {
	case entryUser:
		b.WriteString(c.st.Chat.UserLabel.Render("You"))
		b.WriteString(c.st.Chat.Time.Render(" · " + e.msg.Time.Format("15:04")))
		b.WriteString("\n")
		b.WriteString(c.st.Chat.UserBody.Render(wrapText(e.msg.Content, w-2)))
	case entryAssistant:
		c.layoutReply(&b, e, w)
	case entryNotice:
		b.WriteString(c.st.Chat.Notice.Render(wrapText(e.text, w)))
	case entryWarning:
		b.WriteString(c.st.Chat.Warning.Render(wrapText("⚠ "+e.text, w)))
	case entryError:
		b.WriteString(c.st.Chat.Error.Render(wrapText("✗ "+e.text, w)))
	}
	e.block = indent(b.String(), " ")
	e.blockKey = key
	return e.block
}

// layoutReply writes an assistant block: label, thinking (collapsed or
// dimmed), the rendered answer, and a status or statistics line.
func (c *chatView) layoutReply(b *strings.Builder, e *entry, w int) {
	m := e.msg
	name := c.modelName
	if m.Model != "" {
		name = m.Model
	}
	b.WriteString(c.st.Chat.AssistantLabel.Render(name))
	b.WriteString(c.st.Chat.Time.Render(" · " + m.Time.Format("15:04")))
	think, answer, open := splitThink(m.Content)
	if think != "" || open {
		b.WriteString("\n")
		words := len(strings.Fields(think))
		verb := "Thought"
		if open && e.streaming {
			verb = "Thinking…"
		}
		if c.showThink {
			b.WriteString(c.st.Chat.ThinkHeader.Render(fmt.Sprintf("▾ %s (%d words)", verb, words)))
			if think != "" {
				b.WriteString("\n")
				b.WriteString(c.st.Chat.Think.Render(indent(wrapText(think, w-2), "┊ ")))
			}
		} else {
			b.WriteString(c.st.Chat.ThinkHeader.Render(fmt.Sprintf("▸ %s (%d words, ctrl+t to show)", verb, words)))
		}
	}
	if answer != "" {
		b.WriteString("\n")
		if e.mdWidth > 0 && e.md != "" {
			b.WriteString(e.md)
		} else {
			b.WriteString(wrapText(answer, w)) // until the first rendering arrives
		}
	}
	switch {
	case e.streaming && m.Content == "":
		b.WriteString("\n")
		b.WriteString(c.st.Chat.ReplyStats.Render("⋯ reading the prompt"))
	case e.streaming:
		b.WriteString("\n")
		b.WriteString(c.st.Chat.ReplyStats.Render("⋯"))
	default:
		if m.Error != "" {
			b.WriteString("\n")
			b.WriteString(c.st.Chat.Error.Render(wrapText("✗ "+m.Error, w)))
		}
		if m.Stats != nil {
			b.WriteString("\n")
			b.WriteString(c.st.Chat.ReplyStats.Render(wrapText(shortReplyStats(m.Stats), w)))
		}
	}
}

// layoutChoice lays out the alternatives of /regen: a line naming them
// (the shown one in brackets, ● while generating, ✗ when failed), the keys,
// and the shown one. It is not cached: the options' blocks are.
func (c *chatView) layoutChoice(ch *choice) string {
	w := c.contentWidth()
	names := make([]string, len(ch.opts))
	for i, o := range ch.opts {
		label := ch.label(i)
		switch {
		case o.streaming:
			label += " ●"
		case o.msg.Error != "":
			label += " ✗"
		}
		if i == ch.sel {
			names[i] = c.st.Choice.Selected.Render("[" + label + "]")
		} else {
			names[i] = c.st.Choice.Option.Render(" " + label + " ")
		}
	}
	head := c.st.Choice.Header.Render("Alternatives: ") + strings.Join(names, c.st.Choice.Header.Render("│"))
	keys := c.st.Choice.Header.Render(wrapText(ch.keysHelp, w))
	return indent(truncateLines(head, w)+"\n"+keys, " ") + "\n\n" + c.layout(ch.opts[ch.sel])
}

// shortReplyStats is the line under a finished reply.
func shortReplyStats(st *ReplyStats) string {
	s := fmt.Sprintf("%d tokens · %.1f tok/s · TTFT %s", st.GeneratedTokens, st.DecodeTokensPerSec, formatMillis(st.TTFTMillis))
	if st.DraftTokens > 0 {
		s += fmt.Sprintf(" · MTP %.0f%%, %.1f tok/step", 100*float64(st.AcceptedTokens)/float64(st.DraftTokens), 1+st.AcceptedPerStep)
	}
	switch st.Finish {
	case FinishLength:
		s += " · " + cutReason(st)
	case FinishCancelled:
		s += " · stopped"
	}
	return s
}

// cutReason says why a reply ended with FinishLength.
func cutReason(st *ReplyStats) string {
	switch st.Limit {
	case LimitMaxTokens:
		return fmt.Sprintf("cut at max_tokens (%d)", st.Settings.MaxTokens)
	case LimitContext:
		return "cut: the model's context is full"
	case LimitKVCache:
		return "cut: the KV cache is full (raise kv_budget)"
	}
	return "cut at the length limit"
}

// indent prefixes every line of s.
func indent(s, prefix string) string {
	if s == "" {
		return prefix
	}
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// needsRender says whether e's answer must be (re-)rendered at width.
func (e *entry) needsRender(width int) bool {
	return e.kind == entryAssistant && !e.rendering && (e.mdVersion != e.version || e.mdWidth != width)
}

// truncateLines cuts every line of s to width columns.
func truncateLines(s string, width int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if xansi.StringWidth(l) > width {
			lines[i] = xansi.Truncate(l, width, "")
		}
	}
	return strings.Join(lines, "\n")
}
