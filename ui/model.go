package ui

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/ferrite-llm/ferrite/tokenizer"

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
	Theme    string    // "dark" or "light"; "" or "auto": dark in New, detected by Run
	NoColor  bool      // no colours; also set by the NO_COLOR environment variable
	NoMouse  bool      // leave the mouse to the terminal (no wheel scrolling)

	// Models lets /models list and /model load other models; nil: only
	// the engine the chat starts with.
	Models Models
	// Model is the entry of the engine the chat starts with, so that
	// /models can mark it; the zero value is fine.
	Model ModelEntry
	// Closer releases the engine the chat starts with. When set, the chat
	// owns the engine: it closes it once it has switched to another model
	// and the replies still using it have ended, or when Run returns.
	Closer io.Closer
	// Puller lets /pull download models; nil: /pull says it cannot.
	Puller Puller

	// HistoryFile keeps the input history across sessions; "":
	// DefaultHistoryFile(). NoHistory keeps it in memory only.
	HistoryFile string
	NoHistory   bool
	// Warnings are shown when the chat opens (a configuration file that
	// was ignored, for example).
	Warnings []string
	// Notes are shown when the chat opens, after the welcome (the
	// sampling the model recommends, for example).
	Notes []string
	// SamplingFor is the sampling a chat starts with for a model that
	// recommends rec (its generation_config.json or GGUF metadata:
	// ModelInfo.Sampling), the configuration file's and the flags' values
	// kept (settings.Config.SamplingFor). With it, /model applies the new
	// model's recommendation to the open chats' settings that still have
	// the previous model's (onModelLoaded); nil: /model keeps the settings.
	SamplingFor func(rec tokenizer.Sampling) Settings
	// Log is the debug log: engine errors with their stacks, load and
	// save failures; nil: none. LogPath is its file, named in the chat's
	// error messages.
	Log     *slog.Logger
	LogPath string

	Input     io.Reader        // Run's terminal input; nil: stdin
	Output    io.Writer        // Run's terminal output; nil: stdout
	Clipboard io.Writer        // where /copy writes OSC 52; nil: Output
	Now       func() time.Time // the clock; nil: time.Now
}

// Timing of the periodic work while replies stream or a model loads.
const (
	renderInterval = 80 * time.Millisecond  // re-render of a streaming reply
	statsInterval  = 250 * time.Millisecond // engine stats poll, and the loading clock
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
	renderTickMsg struct{ id int } // time to re-render a streaming reply
	renderedMsg   struct {         // a reply's answer was rendered
		e       *entry
		version int
		width   int
		out     string
	}
	statsTickMsg struct{} // time to poll the engine's stats
	statsMsg     struct{ stats Stats }
	savedMsg     struct { // a chat was written
		tab  *chatTab
		path string
		auto bool
		err  error
	}
	exportedMsg struct {
		path  string // absolute
		given bool   // the user gave the path
		err   error
	}
	loadedMsg struct {
		name string // the saved chat's name; "" for a file
		path string // the file a chat was loaded from by its path
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
	modelsListedMsg struct { // Models.List returned
		entries []ModelEntry
		err     error
		show    bool // /models or /model asked: show the list
	}
	modelFoundMsg struct { // Models.Find returned
		name  string // as typed
		entry ModelEntry
		err   error
	}
	loadProgressMsg struct { // a loading model reached a stage
		id    int
		stage string
	}
	modelLoadedMsg struct { // Models.Load returned
		id     int
		entry  ModelEntry
		eng    Engine
		closer io.Closer
		err    error
		keep   bool       // loaded with LoadOptions.KeepDevice
		freed  *engineRef // the engine unloaded to make room for it (loadAfterUnload), or nil
		// After a failure with freed set: freed's model loaded again
		// (back, backCloser), or why not (backErr).
		back       Engine
		backCloser io.Closer
		backErr    error
	}
	engineClosedMsg struct { // an engine the chat switched away from was closed
		name string
		err  error
	}
	historyLoadedMsg struct { // the input history of earlier sessions
		entries []string
		err     error
	}
	historySavedMsg struct{ err error }
	pullMsg         struct { // a /pull's progress (done false) or its end
		id       int
		progress PullProgress
		done     bool
		res      PullResult
		err      error
	}
)

// generation is one reply being generated: a plain reply (alt < 0) or one
// of the alternatives of /regen.
type generation struct {
	id       int
	tab      *chatTab
	eng      *engineRef // the engine generating it
	entry    *entry
	msg      *Message
	text     strings.Builder // msg.Content, grown without copying
	reply    Reply           // nil until Send returns
	cancel   context.CancelFunc
	settings Settings
	stopped  bool // the user stopped it
	alt      int  // its index among the choice's options; -1 for a plain reply
}

// engineRef is an engine the chat uses or has used, and the replies that
// still run on it.
type engineRef struct {
	eng     Engine
	info    ModelInfo
	entry   ModelEntry
	closer  io.Closer // nil: not the chat's to close
	active  int       // generations in flight on it
	retired bool      // another model took over; closed once active is 0
	closed  bool
	// unloaded: closed to make room on its device for the model loading
	// (or that failed to load); no reply may start on it (engineGone).
	unloaded bool
}

// loadState is a model being loaded.
type loadState struct {
	id      int
	entry   ModelEntry
	stage   string
	started time.Time
	cancel  context.CancelFunc
	// progress carries the loader's stages (waitProgress reads it).
	progress <-chan string
}

// model is the chat: the one bubbletea model. Its components (chatView,
// input, completion, statusBar) are plain structs it drives. It embeds the
// current chat tab, so m.chat, m.view, m.gen… are the current chat's; the
// other open chats are in tabs.
type model struct {
	*chatTab

	cur     *engineRef   // the engine new replies go to
	engines []*engineRef // every engine not yet closed, cur included
	info    ModelInfo    // cur.info
	opts    Options
	keys    KeyMap
	st      *Styles
	cmds    *commandSet
	profile termenv.Profile
	now     func() time.Time
	clip    io.Writer

	width, height int
	tabs          []*chatTab
	in            *input
	comp          completion
	bar           statusBar
	md            *markdown
	store         *store
	history       *historyFile // nil: not persisted
	saveSeq       uint64
	saving        int // save commands in flight
	lastSaveErr   string

	gens      map[int]*generation // every reply being generated, by id
	genSeq    int
	stats     Stats
	ticking   bool // a stats tick is scheduled
	loading   *loadState
	loadSeq   int
	pulling   *pullState // the /pull in progress
	pullSeq   int
	modelList []ModelEntry // the last Models.List and the models in opened it lacks: what /models shows
	opened    []ModelEntry // every model the chat has run, so /models lists one opened by its folder

	hint       string // written into the rule above the input
	clearArmed bool   // /clear with autosave off warned once; the next command being /clear clears
	hintWarn   bool
	quitArmed  bool // ctrl+c was pressed once
	mouse      bool // the program captures the mouse
	quitting   bool
	fatal      error
}

// New returns the chat model for eng. Run runs it in the terminal; tests
// drive it with teatest.
func New(eng Engine, opts Options) tea.Model { return newModel(eng, opts) }

func newModel(eng Engine, opts Options) *model {
	if os.Getenv("NO_COLOR") != "" {
		opts.NoColor = true
	}
	m := &model{opts: opts, now: opts.Now, gens: map[int]*generation{}}
	m.cur = &engineRef{eng: eng, info: eng.Info(), entry: opts.Model, closer: opts.Closer}
	if m.cur.entry.Name == "" {
		m.cur.entry.Name = m.cur.info.Name
	}
	m.engines = []*engineRef{m.cur}
	m.opened = []ModelEntry{m.cur.entry}
	m.info = m.cur.info
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
	if !opts.NoHistory {
		path := opts.HistoryFile
		if path == "" {
			path = DefaultHistoryFile()
		}
		m.history = &historyFile{path: path}
	}
	m.cmds = newCommandSet()
	m.in = newInput(m.keys, m.st)
	m.bar = statusBar{st: m.st}
	m.mouse = !opts.NoMouse

	settings := DefaultSettings()
	if opts.Settings != nil {
		settings = *opts.Settings
	}
	m.chatTab = m.newTab(settings, opts.System)
	m.tabs = []*chatTab{m.chatTab}
	m.welcome()
	for _, n := range opts.Notes {
		m.view.notice(entryNotice, n)
	}
	for _, w := range opts.Warnings {
		m.view.notice(entryWarning, w)
	}
	m.resize(80, 24)
	return m
}

// newChat starts an empty conversation.
func (m *model) newChat(s Settings, system string) *Chat {
	now := m.now()
	return &Chat{Version: chatFormatVersion, ID: newChatID(now), Created: now, Updated: now, Model: m.info, System: system, Settings: s}
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
func (m *model) Init() tea.Cmd {
	return tea.Batch(m.fetchStats(), m.loadHistoryCmd(), m.listModelsCmd(false))
}

// Update implements tea.Model. A panic is turned into the error Run
// returns, and the program quits.
func (m *model) Update(msg tea.Msg) (next tea.Model, cmd tea.Cmd) {
	defer func() {
		if r := recover(); r != nil {
			// The named results are lost with the panic; both are set here.
			m.fatal = fmt.Errorf("ui: panic: %v\n%s", r, debug.Stack())
			m.quitting = true
			m.cancelAll()
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
		cmds = append(cmds, m.onStatsTick())
	case statsMsg:
		m.stats = msg.stats
	case savedMsg:
		m.onSaved(msg)
	case exportedMsg:
		if msg.err != nil {
			m.view.notice(entryError, "export failed: "+msg.err.Error())
		} else if msg.given {
			m.view.notice(entryNotice, "Exported to "+msg.path)
		} else {
			m.view.notice(entryNotice, "Exported to "+msg.path+" (the working directory; give a path to write elsewhere)")
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
	case modelsListedMsg:
		m.onModelsListed(msg)
	case modelFoundMsg:
		cmds = append(cmds, m.onModelFound(msg))
	case loadProgressMsg:
		cmds = append(cmds, m.onLoadProgress(msg))
	case pullMsg:
		cmds = append(cmds, m.onPull(msg))
	case modelLoadedMsg:
		cmds = append(cmds, m.onModelLoaded(msg))
	case engineClosedMsg:
		if msg.err != nil {
			m.view.notice(entryError, "closing "+msg.name+" failed: "+msg.err.Error())
		}
	case historyLoadedMsg:
		m.onHistoryLoaded(msg)
	case historySavedMsg:
		if msg.err != nil && m.history != nil && !m.history.warned {
			m.history.warned = true
			m.logger().Error("saving the input history failed", "err", msg.err)
			m.view.notice(entryError, "saving the input history failed: "+msg.err.Error()+m.logHint())
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

// layout sizes every chat's view to what the input, the bars and the tab
// strip leave, and makes a Markdown renderer for a new width.
func (m *model) layout() {
	h := m.height - m.in.Height() - 2 // the rule and the status bar
	if len(m.tabs) > 1 {
		h-- // the tab strip
	}
	changed := false
	for _, t := range m.tabs {
		if t.view.SetSize(m.width, h) {
			changed = true
		}
	}
	if changed || m.md == nil {
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
	parts := []string{chat, m.ruleView(), m.in.View(), m.statusView()}
	if len(m.tabs) > 1 {
		parts = append([]string{m.tabStrip()}, parts...)
	}
	return strings.Join(parts, "\n")
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
	d := statusData{
		info:    m.info,
		busy:    m.busyCount(m.chatTab),
		usage:   m.usage,
		stats:   m.stats,
		ctxUsed: m.ctxUsed,
		draft:   m.chat.Settings.effectiveDraft(m.info),
	}
	for i, t := range m.tabs {
		if t != m.chatTab && m.busyCount(t) > 0 {
			d.others = append(d.others, i+1)
		}
	}
	if l := m.loading; l != nil {
		d.loading = fmt.Sprintf("loading %s · %s · %ds", l.entry.Name, l.stage, int(m.now().Sub(l.started).Seconds()))
	}
	d.pulling = m.pullStatus()
	return m.bar.render(m.width, d)
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

// cancelAll stops every reply and a model being loaded.
func (m *model) cancelAll() {
	for _, g := range m.gens {
		g.stopped = true
		g.cancel()
	}
	if m.loading != nil {
		m.loading.cancel()
	}
	if m.pulling != nil {
		m.pulling.cancel()
	}
}

// quit stops every reply and ends the program.
func (m *model) quit() tea.Cmd {
	m.cancelAll()
	m.quitting = true
	return tea.Quit
}

// Run runs the chat in the terminal until the user quits or ctx is done.
// It uses the alternate screen and the mouse (unless Options.NoMouse),
// always gives the terminal back as it found it, and returns a panic in
// the chat as an error. Every open chat is saved once more on the way
// out, and the engines the chat owns (Options.Closer, and those /model
// loaded) are closed before Run returns. Cancelling ctx is a normal exit
// (nil error).
func Run(ctx context.Context, eng Engine, opts Options) (err error) {
	var p *tea.Program
	var m *model
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
		if m != nil {
			m.closeEngines()
		} else if opts.Closer != nil {
			_ = opts.Closer.Close()
		}
	}()
	if (opts.Theme == "" || opts.Theme == "auto") && os.Getenv("NO_COLOR") == "" && !opts.NoColor && opts.Output == nil {
		opts.Theme = "dark"
		if !lipgloss.HasDarkBackground() {
			opts.Theme = "light"
		}
	}
	m = newModel(eng, opts)
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
	m.cancelAll()
	saveErr := m.flush()
	switch {
	case m.fatal != nil:
		return m.fatal
	case saveErr != nil:
		return fmt.Errorf("saving on quit: %w", saveErr)
	case errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil && !errors.Is(err, tea.ErrProgramPanic):
		return nil
	case err != nil:
		return fmt.Errorf("ui: %w", err)
	}
	return nil
}

// flush saves every open chat and the input history synchronously; Run
// calls it after the program has stopped, since an autosave command may
// not have finished. The failures are logged and returned.
func (m *model) flush() error {
	var errs []error
	if m.history != nil {
		if err := m.history.flush(); err != nil {
			m.logger().Error("saving the input history failed", "err", err)
			errs = append(errs, err)
		}
	}
	if m.opts.NoSave {
		return errors.Join(errs...)
	}
	for _, t := range m.tabs {
		if len(t.chat.Messages) == 0 {
			continue
		}
		if t.gen != nil { // quit mid-reply: keep what was generated
			t.gen.msg.Content = t.gen.text.String()
		}
		m.saveSeq++
		if _, err := m.store.save(t.chatName, t.chat, m.saveSeq); err != nil {
			m.logger().Error("saving a chat on quit failed", "chat", t.chat.ID, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeEngines closes every engine the chat owns; Run calls it last.
func (m *model) closeEngines() {
	for _, e := range m.engines {
		if e.closer != nil && !e.closed {
			e.closed = true
			_ = e.closer.Close()
		}
	}
}
