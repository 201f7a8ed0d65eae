package ui

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
)

// Options configure the chat. The zero value is usable.
type Options struct {
	Settings *Settings // sampling settings to start with; nil: DefaultSettings()
	System   string    // system prompt to start with
	ChatsDir string    // where chats are saved; "": DefaultChatsDir()
	NoSave   bool      // no autosave (/save and /export still write)
	KeyMap   *KeyMap   // nil: DefaultKeyMap()
	Theme    string    // "dark" or "light"; "": dark in New, detected by Run
	NoColor  bool      // no colours; also set by the NO_COLOR environment variable
	NoMouse  bool      // leave the mouse to the terminal (no wheel scrolling)

	Input     io.Reader        // Run's terminal input; nil: stdin
	Output    io.Writer        // Run's terminal output; nil: stdout
	Clipboard io.Writer        // where /copy writes OSC 52; nil: Output
	Now       func() time.Time // the clock; nil: time.Now
}

// Timing of the periodic work while a reply streams.
const (
	renderInterval = 80 * time.Millisecond  // re-render of the streaming reply
	statsInterval  = 250 * time.Millisecond // engine stats poll
)

// Messages of the model. Commands return them; only Update changes state.
type (
	replyStartedMsg struct { // Engine.Send returned
		id    int
		reply Reply
		err   error
	}
	replyEventMsg struct { // Reply.Next returned
		id int
		ev Event
		ok bool
	}
	renderTickMsg struct{ id int } // time to re-render the streaming reply
	renderedMsg   struct {         // a reply's answer was rendered
		e       *entry
		version int
		width   int
		out     string
	}
	statsTickMsg struct{ id int } // time to poll the engine's stats
	statsMsg     struct{ stats Stats }
	savedMsg     struct { // a chat was written
		path string
		auto bool
		err  error
	}
	exportedMsg struct {
		path string
		err  error
	}
	loadedMsg struct {
		name string
		chat *Chat
		err  error
	}
	listedMsg struct {
		chats []savedChat
		err   error
	}
	copiedMsg struct {
		n   int
		err error
	}
)

// generation is the reply being generated.
type generation struct {
	id       int
	entry    *entry
	msg      *Message
	text     strings.Builder // msg.Content, grown without copying
	reply    Reply           // nil until Send returns
	cancel   context.CancelFunc
	settings Settings
	stopped  bool // the user stopped it
}

// model is the chat: the one bubbletea model. Its components (chatView,
// input, completion, statusBar) are plain structs it drives.
type model struct {
	eng     Engine
	info    ModelInfo
	opts    Options
	keys    KeyMap
	st      *Styles
	cmds    *commandSet
	profile termenv.Profile
	now     func() time.Time
	clip    io.Writer

	width, height int
	chat          *Chat
	chatName      string // the file the chat saves to: its id, or the /save name
	view          *chatView
	in            *input
	comp          completion
	bar           statusBar
	md            *markdown
	store         *store
	saveSeq       uint64
	saving        int // save commands in flight
	lastSaveErr   string

	gen     *generation // nil when idle
	genSeq  int
	stats   Stats
	usage   *Usage // the current or last reply's
	ctxUsed int    // tokens the current or last request holds

	hint      string // written into the rule above the input
	hintWarn  bool
	quitArmed bool // ctrl+c was pressed once
	mouse     bool // the program captures the mouse
	quitting  bool
	fatal     error
}

// New returns the chat model for eng. Run runs it in the terminal; tests
// drive it with teatest.
func New(eng Engine, opts Options) tea.Model { return newModel(eng, opts) }

func newModel(eng Engine, opts Options) *model {
	if os.Getenv("NO_COLOR") != "" {
		opts.NoColor = true
	}
	m := &model{eng: eng, info: eng.Info(), opts: opts, now: opts.Now}
	if m.now == nil {
		m.now = time.Now
	}
	m.keys = DefaultKeyMap()
	if opts.KeyMap != nil {
		m.keys = *opts.KeyMap
	}
	pal := DefaultPalette()
	if opts.NoColor {
		pal = NoColorPalette()
	}
	st := NewStyles(pal, opts.Theme != "light", opts.NoColor)
	m.st = &st
	m.profile = lipgloss.ColorProfile()
	if opts.NoColor {
		m.profile = termenv.Ascii
	}
	m.clip = opts.Clipboard
	if m.clip == nil {
		m.clip = opts.Output
	}
	if m.clip == nil {
		m.clip = os.Stdout
	}
	dir := opts.ChatsDir
	if dir == "" {
		dir = DefaultChatsDir()
	}
	m.store = newStore(dir)
	m.cmds = newCommandSet()
	m.view = newChatView(m.st, m.info.Name)
	m.in = newInput(m.keys, m.st)
	m.bar = statusBar{st: m.st}
	m.mouse = !opts.NoMouse

	settings := DefaultSettings()
	if opts.Settings != nil {
		settings = *opts.Settings
	}
	m.chat = m.newChat(settings, opts.System)
	m.welcome()
	m.resize(80, 24)
	return m
}

// newChat starts an empty conversation.
func (m *model) newChat(s Settings, system string) *Chat {
	now := m.now()
	c := &Chat{Version: chatFormatVersion, ID: newChatID(now), Created: now, Updated: now, Model: m.info, System: system, Settings: s}
	m.chatName = c.ID
	return c
}

// newChatID is the time the chat started and a random suffix.
func newChatID(now time.Time) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return now.Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

func (m *model) welcome() {
	name := m.info.Name
	if m.info.Arch != "" {
		name += " (" + m.info.Arch + ")"
	}
	m.view.notice(entryNotice, fmt.Sprintf("Chatting with %s. Type /help for commands and keys.", name))
}

// Init implements tea.Model.
func (m *model) Init() tea.Cmd { return m.fetchStats() }

// Update implements tea.Model. A panic is turned into the error Run
// returns, and the program quits.
func (m *model) Update(msg tea.Msg) (next tea.Model, cmd tea.Cmd) {
	defer func() {
		if r := recover(); r != nil {
			// The named results are lost with the panic; both are set here.
			m.fatal = fmt.Errorf("ui: panic: %v\n%s", r, debug.Stack())
			m.quitting = true
			if m.gen != nil {
				m.gen.cancel()
			}
			next, cmd = m, tea.Quit
		}
	}()
	var cmds []tea.Cmd
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.resize(msg.Width, msg.Height)
	case tea.KeyMsg:
		cmds = append(cmds, m.handleKey(msg))
	case tea.MouseMsg:
		m.handleMouse(msg)
	case replyStartedMsg:
		cmds = append(cmds, m.onReplyStarted(msg))
	case replyEventMsg:
		cmds = append(cmds, m.onReplyEvent(msg))
	case renderTickMsg:
		cmds = append(cmds, m.onRenderTick(msg))
	case renderedMsg:
		m.onRendered(msg)
	case statsTickMsg:
		if m.gen != nil && m.gen.id == msg.id {
			cmds = append(cmds, m.fetchStats(), m.statsTick(msg.id))
		}
	case statsMsg:
		m.stats = msg.stats
	case savedMsg:
		m.onSaved(msg)
	case exportedMsg:
		if msg.err != nil {
			m.view.notice(entryError, "export failed: "+msg.err.Error())
		} else {
			m.view.notice(entryNotice, "Exported to "+msg.path)
		}
	case loadedMsg:
		cmds = append(cmds, m.onLoaded(msg))
	case listedMsg:
		m.onListed(msg)
	case copiedMsg:
		if msg.err != nil {
			m.view.notice(entryError, "copy failed: "+msg.err.Error())
		} else {
			m.view.notice(entryNotice, fmt.Sprintf("Copied the last reply (%d characters) to the clipboard.", msg.n))
		}
	}
	if m.quitting {
		return m, tea.Batch(cmds...)
	}
	cmds = append(cmds, m.renderFinished()...)
	m.layout()
	m.view.refresh()
	return m, tea.Batch(cmds...)
}

// resize lays the screen out for a new terminal size.
func (m *model) resize(w, h int) {
	m.width, m.height = max(w, 20), max(h, 6)
	m.in.SetWidth(m.width)
	m.layout()
}

// layout sizes the chat to what the input and the bars leave, and makes a
// Markdown renderer for a new width.
func (m *model) layout() {
	h := m.height - m.in.Height() - 2 // the rule and the status bar
	if m.view.SetSize(m.width, h) || m.md == nil {
		m.md = newMarkdown(m.view.contentWidth(), m.st.Markdown, m.profile)
	}
}

// View implements tea.Model.
func (m *model) View() string {
	if m.quitting {
		return ""
	}
	chat := m.view.View()
	if m.comp.open() {
		chat = overlayBottom(chat, m.comp.render(m.st, min(m.width-2, 100)), 1)
	}
	return strings.Join([]string{chat, m.ruleView(), m.in.View(), m.statusView()}, "\n")
}

// ruleView is the line above the input, with the hint in it.
func (m *model) ruleView() string {
	if m.hint == "" {
		return m.st.Input.Rule.Render(strings.Repeat("─", m.width))
	}
	style := m.st.Input.Hint
	if m.hintWarn {
		style = m.st.Input.Warning
	}
	h := truncateLines(" "+m.hint+" ", m.width-2)
	fill := max(m.width-2-lipgloss.Width(h), 0)
	return m.st.Input.Rule.Render("──") + style.Render(h) + m.st.Input.Rule.Render(strings.Repeat("─", fill))
}

func (m *model) statusView() string {
	return m.bar.render(m.width, statusData{
		info:    m.info,
		busy:    m.gen != nil,
		usage:   m.usage,
		stats:   m.stats,
		ctxUsed: m.ctxUsed,
	})
}

// overlayBottom draws box over the last lines of base, from column x.
func overlayBottom(base, box string, x int) string {
	bl := strings.Split(base, "\n")
	ol := strings.Split(box, "\n")
	start := max(len(bl)-len(ol), 0)
	for i, l := range ol {
		if start+i >= len(bl) {
			break
		}
		bl[start+i] = strings.Repeat(" ", x) + l
	}
	return strings.Join(bl, "\n")
}

func (m *model) setHint(s string, warn bool) { m.hint, m.hintWarn = s, warn }

// quit stops any reply and ends the program.
func (m *model) quit() tea.Cmd {
	if m.gen != nil {
		m.gen.stopped = true
		m.gen.cancel()
	}
	m.quitting = true
	return tea.Quit
}

// Run runs the chat in the terminal until the user quits or ctx is done.
// It uses the alternate screen and the mouse (unless Options.NoMouse),
// always gives the terminal back as it found it, and returns a panic in
// the chat as an error. The chat is saved once more on the way out.
// Cancelling ctx is a normal exit (nil error).
func Run(ctx context.Context, eng Engine, opts Options) (err error) {
	var p *tea.Program
	defer func() {
		// A panic outside the program's own recovery (bubbletea restores the
		// terminal for panics in Update, View and commands).
		if r := recover(); r != nil {
			if p != nil {
				p.Kill()
				_ = p.ReleaseTerminal()
			}
			err = fmt.Errorf("ui: panic: %v\n%s", r, debug.Stack())
		}
	}()
	if opts.Theme == "" && os.Getenv("NO_COLOR") == "" && !opts.NoColor && opts.Output == nil {
		opts.Theme = "dark"
		if !lipgloss.HasDarkBackground() {
			opts.Theme = "light"
		}
	}
	m := newModel(eng, opts)
	popts := []tea.ProgramOption{tea.WithAltScreen(), tea.WithContext(ctx)}
	if !opts.NoMouse {
		popts = append(popts, tea.WithMouseCellMotion())
	}
	if opts.Input != nil {
		popts = append(popts, tea.WithInput(opts.Input))
	}
	if opts.Output != nil {
		popts = append(popts, tea.WithOutput(opts.Output))
	}
	p = tea.NewProgram(m, popts...)
	_, err = p.Run()
	m.flush()
	switch {
	case m.fatal != nil:
		return m.fatal
	case errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil && !errors.Is(err, tea.ErrProgramPanic):
		return nil
	case err != nil:
		return fmt.Errorf("ui: %w", err)
	}
	return nil
}

// flush saves the chat synchronously; Run calls it after the program has
// stopped, since an autosave command may not have finished.
func (m *model) flush() {
	if m.opts.NoSave || len(m.chat.Messages) == 0 {
		return
	}
	if m.gen != nil { // quit mid-reply: keep what was generated
		m.gen.msg.Content = m.gen.text.String()
	}
	m.saveSeq++
	_, _ = m.store.save(m.chatName, m.chat, m.saveSeq)
}
