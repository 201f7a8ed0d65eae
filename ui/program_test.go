package ui

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/adrg/xdg"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/teatest"
	"github.com/muesli/termenv"
)

// fixedNow is the clock of every test, so that views are deterministic.
var fixedNow = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func TestMain(m *testing.M) {
	lipgloss.SetColorProfile(termenv.Ascii) // no colours: views are plain text
	// Nothing a test forgets to point elsewhere lands in the real data
	// directory (chats, input history).
	data, err := os.MkdirTemp("", "ferrite-ui-xdg-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", data)
	xdg.Reload()
	code := m.Run()
	os.RemoveAll(data)
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for a command goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harness runs the chat as a program against a fake engine.
type harness struct {
	t    *testing.T
	tm   *teatest.TestModel
	eng  Engine
	dir  string // the chats directory
	clip *syncBuffer
	out  []byte // the program's output so far
	pos  int    // the end of the last match in out

	timeout time.Duration // of waits; 0: 5s
}

func (h *harness) waitTimeout() time.Duration {
	if h.timeout > 0 {
		return h.timeout
	}
	return 5 * time.Second
}

func testOptions(t *testing.T) Options {
	return Options{ChatsDir: tempDir(t), HistoryFile: filepath.Join(tempDir(t), "history"), Now: func() time.Time { return fixedNow }}
}

// tempDir is a t.TempDir that tolerates a save command still finishing
// when the test ends (a program does not wait for its commands).
func tempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "ferrite-ui-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return dir
}

// readChat waits until the chat file at path exists and satisfies ok (an
// autosave may still be in flight), and returns it.
func readChat(t *testing.T, path string, ok func(*Chat) bool) *Chat {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			c, err := UnmarshalChat(data)
			if err != nil {
				t.Fatalf("%s: %v", path, err) // an atomic write is never seen half done
			}
			if ok(c) {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not written as expected after 5s (last error %v):\n%s", path, err, data)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func start(t *testing.T, eng Engine, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, eng: eng, dir: opts.ChatsDir, clip: &syncBuffer{}}
	opts.Clipboard = h.clip
	m := newModel(eng, opts)
	m.chat.ID, m.chatName = "test-chat", "test-chat"
	h.tm = teatest.NewTestModel(t, probeModel{m}, teatest.WithInitialTermSize(80, 24))
	t.Cleanup(func() {
		_ = h.tm.Quit()
		h.tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
	})
	return h
}

func (h *harness) typeText(s string) { h.tm.Type(s) }

func (h *harness) key(t tea.KeyType) { h.tm.Send(tea.KeyMsg{Type: t}) }

// line types s and presses Enter.
func (h *harness) line(s string) {
	h.tm.Type(s)
	h.key(tea.KeyEnter)
}

// waitFor waits until the program's output holds s after the end of the
// previous match, so that successive waits follow the order of events.
func (h *harness) waitFor(s string) {
	h.t.Helper()
	deadline := time.Now().Add(h.waitTimeout())
	for {
		var chunk bytes.Buffer
		_, _ = chunk.ReadFrom(h.tm.Output())
		h.out = append(h.out, chunk.Bytes()...)
		if i := bytes.Index(h.out[h.pos:], []byte(s)); i >= 0 {
			h.pos += i + len(s)
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("waiting for %q: not in the output after %s; the output since the last match:\n%s", s, h.waitTimeout(), h.out[h.pos:])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// final quits and returns the model as the program left it.
func (h *harness) final() *model {
	h.t.Helper()
	_ = h.tm.Quit()
	return h.finalModel()
}

// finalModel waits for the program to end and returns its model.
func (h *harness) finalModel() *model {
	h.t.Helper()
	return h.tm.FinalModel(h.t, teatest.WithFinalTimeout(5*time.Second)).(probeModel).model
}

// probeModel lets a test look at the model from inside the program's
// event loop, where reading it does not race with Update.
type probeModel struct{ *model }

// probeMsg runs f on the model.
type probeMsg struct {
	f    func(*model)
	done chan struct{}
}

func (p probeModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if pm, ok := msg.(probeMsg); ok {
		pm.f(p.model)
		close(pm.done)
		return p, nil
	}
	_, cmd := p.model.Update(msg)
	return p, cmd
}

// until waits until cond holds for the model.
func (h *harness) until(what string, cond func(*model) bool) {
	h.t.Helper()
	deadline := time.Now().Add(h.waitTimeout())
	for {
		var ok bool
		pm := probeMsg{f: func(m *model) { ok = cond(m) }, done: make(chan struct{})}
		h.tm.Send(pm)
		select {
		case <-pm.done:
		case <-time.After(5 * time.Second):
			h.t.Fatalf("waiting for %s: the program does not answer", what)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("waiting for %s: not after %s", what, h.waitTimeout())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// untilNotice waits until a notice of the chat holds s.
func (h *harness) untilNotice(s string) {
	h.t.Helper()
	h.until("a notice with "+s, func(m *model) bool {
		for _, e := range m.view.entries {
			if e.msg == nil && strings.Contains(e.text, s) {
				return true
			}
		}
		return false
	})
}

// lastNotice is the last notice of the shown chat that holds s; "" when
// there is none.
func lastNotice(m *model, s string) string {
	var text string
	for _, e := range m.view.entries {
		if e.msg == nil && strings.Contains(e.text, s) {
			text = e.text
		}
	}
	return text
}

// settle waits until no reply is being generated and every reply is
// rendered at the current width.
func (h *harness) settle() {
	h.t.Helper()
	h.until("the chat to settle", func(m *model) bool {
		if len(m.gens) > 0 || m.loading != nil || m.saving > 0 {
			return false
		}
		for _, e := range m.view.replies() {
			if e.rendering || e.needsRender(m.md.width) {
				return false
			}
		}
		return true
	})
}

func TestStreamingReply(t *testing.T) {
	eng := newFakeEngine(fakeReply{chunks: []string{"Hello ", "from ", "the **fake** engine."}, delay: 5 * time.Millisecond})
	h := start(t, eng, testOptions(t))
	h.line("Hi there")
	h.waitFor("engine.")
	h.waitFor("25.0 tok/s")
	h.settle()
	m := h.final()

	if got := len(m.chat.Messages); got != 2 {
		t.Fatalf("messages: got %d, want 2", got)
	}
	reply := m.chat.Messages[1]
	if reply.Content != "Hello from the **fake** engine." {
		t.Errorf("reply content = %q", reply.Content)
	}
	if reply.Stats == nil || reply.Stats.Finish != FinishStop || reply.Stats.GeneratedTokens != 3 {
		t.Errorf("reply stats = %+v", reply.Stats)
	}
	reqs := eng.requests()
	if len(reqs) != 1 || reqs[0].Messages[len(reqs[0].Messages)-1].Content != "Hi there" {
		t.Fatalf("requests = %+v", reqs)
	}
	if m.gen != nil {
		t.Error("a generation is still active")
	}
	if v := xansi.Strip(m.View()); !strings.Contains(v, "Hello from the fake engine.") {
		t.Errorf("view lacks the rendered reply:\n%s", v)
	}
	if strings.Contains(m.View(), "**fake**") {
		t.Errorf("the reply was not rendered as Markdown:\n%s", m.View())
	}
}

func TestConversationIsSentWhole(t *testing.T) {
	eng := newFakeEngine(
		fakeReply{chunks: []string{"<think>hmm</think>first answer"}},
		fakeReply{chunks: []string{"second answer"}},
	)
	opts := testOptions(t)
	opts.System = "Be brief."
	h := start(t, eng, opts)
	h.line("one")
	h.waitFor("first answer")
	h.line("two")
	h.waitFor("second answer")
	h.final()

	reqs := eng.requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests", len(reqs))
	}
	msgs := reqs[1].Messages
	want := []struct{ role, content, reasoning string }{
		{"system", "Be brief.", ""},
		{"user", "one", ""},
		{"assistant", "first answer", "hmm"},
		{"user", "two", ""},
	}
	if len(msgs) != len(want) {
		t.Fatalf("second request has %d messages: %+v", len(msgs), msgs)
	}
	for i, w := range want {
		if msgs[i].Role != w.role || msgs[i].Content != w.content || msgs[i].ReasoningContent != w.reasoning {
			t.Errorf("message %d = %+v, want %+v", i, msgs[i], w)
		}
	}
}

func TestSlashCommands(t *testing.T) {
	eng := newFakeEngine()
	h := start(t, eng, testOptions(t))

	h.line("/help")
	h.waitFor("/export md|json [path]")

	h.line("/set temperature 0.2")
	h.waitFor("Set temperature.")
	h.line("/set temperature hot")
	h.waitFor(`"hot" is not a number`)
	h.line("/set top_p 2")
	h.waitFor("out of range")
	h.line("/set warmth 1")
	h.waitFor(`unknown setting "warmth"`)
	h.line("/set seed 7")
	h.waitFor("Set seed.")

	h.line("/system You are a pirate.")
	h.waitFor("System prompt set")
	h.line("/frobnicate")
	h.waitFor("Unknown command /frobnicate")
	h.line("/stop")
	h.waitFor("Nothing to stop")
	h.line("/export pdf")
	h.waitFor("usage: /export md|json [path]")
	h.line("/stats")
	h.waitFor("3 of 12 blocks")
	h.line("/copy")
	h.waitFor("Nothing to copy")

	m := h.final()
	s := m.chat.Settings
	if s.Temperature != 0.2 || s.Seed != 7 || s.TopP != DefaultSettings().TopP {
		t.Errorf("settings = %+v", s)
	}
	if m.chat.System != "You are a pirate." {
		t.Errorf("system = %q", m.chat.System)
	}
}

func TestSettingsReachTheEngine(t *testing.T) {
	eng := newFakeEngine(fakeReply{chunks: []string{"done-reply"}})
	h := start(t, eng, testOptions(t))
	h.line("/set top_k 5")
	h.waitFor("Set top_k.")
	h.line("/set max_tokens 99")
	h.waitFor("Set max_tokens.")
	h.line("go")
	h.waitFor("done-reply")
	h.final()
	reqs := eng.requests()
	if len(reqs) != 1 || reqs[0].Settings.TopK != 5 || reqs[0].Settings.MaxTokens != 99 {
		t.Fatalf("requests = %+v", reqs)
	}
}

func TestCompletionPopup(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.typeText("/ex")
	h.waitFor("export the chat as Markdown or JSON")
	h.key(tea.KeyTab)
	h.typeText("m")
	h.waitFor("Markdown: roles")
	h.key(tea.KeyEsc) // closes the popup; the input stays
	h.key(tea.KeyBackspace)
	h.typeText("js")
	h.key(tea.KeyTab)
	m := h.final()
	if got := m.in.Value(); got != "/export json " {
		t.Errorf("input = %q, want %q", got, "/export json ")
	}
}

func TestCompletionEnterRunsCommandWithoutArgs(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/hel") // completes to /help and runs it
	h.waitFor("ctrl+c stop; twice: quit")
	m := h.final()
	if m.in.Value() != "" {
		t.Errorf("input = %q, want empty", m.in.Value())
	}
}

func TestExport(t *testing.T) {
	eng := newFakeEngine(fakeReply{chunks: []string{"<think>Let me see.</think>", "The answer is **42**."}})
	h := start(t, eng, testOptions(t))
	h.line("/set seed 3")
	h.waitFor("Set seed.")
	h.line("What is the answer?")
	h.waitFor("answer is")
	h.waitFor("25.0 tok/s")
	out := t.TempDir()
	mdPath := filepath.Join(out, "chat.md")
	jsonPath := filepath.Join(out, "chat.json")
	h.line("/export md " + mdPath)
	h.untilNotice("Exported to " + mdPath)
	h.line("/export json " + jsonPath)
	h.untilNotice("Exported to " + jsonPath)
	m := h.final()

	md, err := os.ReadFile(mdPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Chat test-chat",
		"- Model: Fake-1B (fake)",
		"seed=3",
		"## User · 2026-03-14T15:09:26Z",
		"What is the answer?",
		"## Assistant · 2026-03-14T15:09:26Z",
		"<details><summary>Thinking</summary>\n\nLet me see.\n\n</details>",
		"The answer is **42**.",
		"TTFT 120 ms · 25.0 tok/s",
		"finish stop",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("Markdown export lacks %q:\n%s", want, md)
		}
	}

	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := UnmarshalChat(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Messages) != 2 || c.Messages[1].Content != m.chat.Messages[1].Content || c.Settings.Seed != 3 {
		t.Fatalf("JSON export = %+v", c)
	}
	if st := c.Messages[1].Stats; st == nil || st.TTFTMillis != 120 || st.Seed != 42 || st.Settings.Seed != 3 {
		t.Errorf("JSON reply stats = %+v", st)
	}
}

func TestAutosave(t *testing.T) {
	eng := newFakeEngine(fakeReply{chunks: []string{"saved reply"}})
	opts := testOptions(t)
	h := start(t, eng, opts)
	h.line("remember this")
	h.waitFor("saved reply")
	h.settle()
	h.final()

	path := filepath.Join(opts.ChatsDir, "test-chat.json")
	c := readChat(t, path, func(c *Chat) bool { return len(c.Messages) == 2 && c.Messages[1].Stats != nil })
	if len(c.Messages) != 2 || c.Messages[0].Content != "remember this" || c.Messages[1].Content != "saved reply" {
		t.Fatalf("saved chat = %+v", c.Messages)
	}
	if c.Messages[1].Stats == nil {
		t.Error("the saved reply has no stats")
	}
	ents, _ := os.ReadDir(opts.ChatsDir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", info.Mode().Perm())
	}

	// Load it back into a fresh chat.
	h2 := start(t, newFakeEngine(fakeReply{chunks: []string{"continued"}}), opts)
	h2.line("/load")
	h2.waitFor("test-chat")
	h2.line("/load test-chat")
	h2.waitFor("Loaded chat test-chat")
	h2.line("and then?")
	h2.waitFor("continued")
	m2 := h2.final()
	if len(m2.chat.Messages) != 4 {
		t.Fatalf("after load and a reply: %d messages", len(m2.chat.Messages))
	}
}

func TestSaveUnderName(t *testing.T) {
	opts := testOptions(t)
	h := start(t, newFakeEngine(), opts)
	h.line("/save ../evil")
	h.waitFor("not a valid chat name")
	h.line("hello")
	h.settle()
	h.line("/save my-chat")
	h.untilNotice("my-chat.json")
	h.final()
	readChat(t, filepath.Join(opts.ChatsDir, "my-chat.json"), func(c *Chat) bool { return len(c.Messages) == 2 })
}

func TestResize(t *testing.T) {
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"A reply that is long enough to wrap at a narrow width, surely."}}), testOptions(t))
	h.line("hi")
	h.waitFor("surely")
	h.tm.Send(tea.WindowSizeMsg{Width: 40, Height: 16})
	h.waitFor("a narrow width")
	h.settle()
	m := h.final()
	v := m.View()
	lines := strings.Split(v, "\n")
	if len(lines) != 16 {
		t.Errorf("view has %d lines, want 16", len(lines))
	}
	for _, l := range lines {
		if w := lipgloss.Width(l); w > 40 {
			t.Errorf("line wider than 40 (%d): %q", w, l)
		}
	}
	if m.md.width != m.view.contentWidth() {
		t.Errorf("markdown width %d, content width %d", m.md.width, m.view.contentWidth())
	}
}

func TestContextOverflowWarning(t *testing.T) {
	eng := newFakeEngine()
	eng.info.MaxContext = 12
	h := start(t, eng, testOptions(t))
	h.line("this message has far too many words to fit into twelve tokens")
	h.waitFor("does not fit the context")
	m := h.final()
	if len(m.chat.Messages) != 0 {
		t.Errorf("the message stayed in the chat: %+v", m.chat.Messages)
	}
	if got := m.in.Value(); !strings.HasPrefix(got, "this message") {
		t.Errorf("input = %q, want the message back", got)
	}
}

func TestEngineErrorShown(t *testing.T) {
	eng := newFakeEngine(fakeReply{chunks: []string{"partial "}, err: errBoom})
	h := start(t, eng, testOptions(t))
	h.line("hi")
	h.waitFor("boom: the engine fell over")
	m := h.final()
	r := m.chat.lastReply()
	if r == nil || r.Error != errBoom.Error() || r.Content != "partial " {
		t.Fatalf("reply = %+v", r)
	}
}

func TestSendErrorShown(t *testing.T) {
	eng := newFakeEngine()
	eng.sendErr = errBoom
	h := start(t, eng, testOptions(t))
	h.line("hi")
	h.waitFor("could not start a reply")
	m := h.final()
	if len(m.chat.Messages) != 0 || m.in.Value() != "hi" {
		t.Fatalf("messages %+v, input %q", m.chat.Messages, m.in.Value())
	}
}

func TestCtrlCStopsThenQuits(t *testing.T) {
	hold := make(chan struct{})
	eng := newFakeEngine(fakeReply{chunks: []string{"never shown"}, hold: hold})
	h := start(t, eng, testOptions(t))
	h.line("hi")
	h.waitFor("generating")
	h.key(tea.KeyCtrlC)
	h.waitFor("press ctrl+c again to quit")
	h.key(tea.KeyCtrlC)
	m := h.finalModel()
	if !m.quitting {
		t.Error("the program did not quit through the model")
	}
	r := m.chat.lastReply()
	if r == nil || r.Stats == nil || r.Stats.Finish != FinishCancelled {
		t.Fatalf("reply = %+v", r)
	}
}

func TestCtrlCIdleNeedsTwoPresses(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.key(tea.KeyCtrlC)
	h.waitFor("press ctrl+c again to quit")
	h.typeText("x") // any other key disarms
	h.waitFor("› x")
	h.key(tea.KeyCtrlC)
	h.waitFor("press ctrl+c again to quit")
	h.key(tea.KeyCtrlC)
	if m := h.finalModel(); !m.quitting {
		t.Error("did not quit")
	}
}

func TestEscStopsReply(t *testing.T) {
	hold := make(chan struct{})
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"x"}, hold: hold}), testOptions(t))
	h.line("hi")
	h.waitFor("generating")
	h.key(tea.KeyEsc)
	h.waitFor("stopped")
	m := h.final()
	if r := m.chat.lastReply(); r == nil || r.Stats == nil || r.Stats.Finish != FinishCancelled {
		t.Fatalf("reply = %+v", r)
	}
}

func TestCopyUsesOSC52(t *testing.T) {
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"<think>private</think>copy me"}}), testOptions(t))
	h.line("hi")
	h.waitFor("copy me")
	h.line("/copy")
	h.waitFor("Copied the last reply")
	h.final()
	want := "\x1b]52;c;" + base64.StdEncoding.EncodeToString([]byte("copy me")) + "\x07"
	if got := h.clip.String(); !strings.Contains(got, want) {
		t.Errorf("clipboard output = %q, want %q", got, want)
	}
}

func TestNewAndClear(t *testing.T) {
	opts := testOptions(t)
	h := start(t, newFakeEngine(), opts)
	h.line("first")
	h.settle()
	h.line("/clear")
	h.untilNotice("Cleared. The cleared chat stays saved as " + filepath.Join(opts.ChatsDir, "test-chat.json") + ": /load test-chat brings it back.")
	h.line("second")
	h.settle()
	var cleared string // the id the cleared tab goes on with
	h.until("the new id", func(m *model) bool { cleared = m.chat.ID; return true })
	h.line("/new")
	h.waitFor("New chat 2 of 2")
	m := h.final()
	if len(m.chat.Messages) != 0 || m.chat.ID == "test-chat" {
		t.Errorf("after /new: id %q, %d messages", m.chat.ID, len(m.chat.Messages))
	}
	// The cleared conversation is still in its file; the chat after /clear
	// is saved apart.
	c := readChat(t, filepath.Join(opts.ChatsDir, "test-chat.json"), func(c *Chat) bool { return len(c.Messages) == 2 })
	if c.Messages[0].Content != "first" {
		t.Errorf("the cleared chat's file = %+v", c.Messages)
	}
	if cleared == "test-chat" {
		t.Fatal("the chat goes on under the cleared chat's id")
	}
	c = readChat(t, filepath.Join(opts.ChatsDir, cleared+".json"), func(c *Chat) bool { return len(c.Messages) == 2 })
	if c.Messages[0].Content != "second" {
		t.Errorf("the chat after /clear = %+v", c.Messages)
	}

	// /load brings the cleared chat back.
	h2 := start(t, newFakeEngine(), opts)
	h2.line("/load test-chat")
	h2.untilNotice("Loaded chat test-chat: 2 messages")
	h2.final()
}

func TestClearWithoutAutosaveAsksOnce(t *testing.T) {
	opts := testOptions(t)
	opts.NoSave = true
	h := start(t, newFakeEngine(), opts)
	h.line("first")
	h.settle()
	h.line("/clear")
	h.untilNotice("Autosave is off, so the cleared messages could not be brought back: /clear again")
	h.until("the chat kept", func(m *model) bool { return len(m.chat.Messages) == 2 })
	h.line("/clear")
	h.untilNotice("Cleared. The system prompt")
	if m := h.final(); len(m.chat.Messages) != 0 {
		t.Errorf("not cleared: %+v", m.chat.Messages)
	}
	if ents, _ := os.ReadDir(opts.ChatsDir); len(ents) != 0 {
		t.Errorf("autosave is off, yet %d files were written", len(ents))
	}
}

func TestHistory(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/set seed 1")
	h.waitFor("Set seed.")
	h.line("/set seed 2")
	h.waitFor("Set seed.")
	h.typeText("draft")
	h.key(tea.KeyUp) // the cursor is on the only line: history
	h.key(tea.KeyUp)
	h.key(tea.KeyDown)
	h.key(tea.KeyDown) // back to the draft
	h.key(tea.KeyUp)
	m := h.final()
	if got := m.in.Value(); got != "/set seed 2" {
		t.Errorf("input = %q", got)
	}
}

func TestThinkingToggle(t *testing.T) {
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"<think>secret musings</think>visible answer"}}), testOptions(t))
	h.line("hi")
	h.waitFor("visible answer")
	h.tm.Send(tea.KeyMsg{Type: tea.KeyCtrlT})
	h.waitFor("secret musings")
	m := h.final()
	if !m.view.showThink {
		t.Error("thinking is not shown")
	}
}

func TestContextNearlyFullHint(t *testing.T) {
	// A model whose whole context is below max_tokens: a short first
	// message leaves most of the context free, so no warning.
	eng := newFakeEngine()
	eng.info.MaxContext = 100
	h := start(t, eng, testOptions(t))
	h.line("hi")
	h.waitFor("ok")
	if m := h.final(); strings.Contains(m.hint, "nearly full") {
		t.Errorf("warned with 95 of 100 tokens free: %q", m.hint)
	}

	// Less than a quarter of the context left, and less than max_tokens.
	eng = newFakeEngine()
	eng.info.MaxContext = 40
	h = start(t, eng, testOptions(t))
	h.line(strings.Repeat("word ", 30))
	h.waitFor("context nearly full: the reply can use only 6 of max_tokens")
}

func TestCutReplySaysWhy(t *testing.T) {
	for _, tc := range []struct {
		limit     string
		kv        bool
		line      string // under the reply
		notice    string // "" for none
		statsLine string // in /stats
	}{
		{LimitMaxTokens, false, "cut at max_tokens (2048)", "", "finish length (max_tokens)"},
		{LimitContext, false, "cut: the model's context is full", "has filled the model's context (4096 tokens)", "finish length (context)"},
		{LimitKVCache, true, "cut: the KV cache is full (raise kv_budget)", "has filled the KV cache (4096 tokens; kv_budget sets its size)", "finish length (kv_cache)"},
	} {
		t.Run(tc.limit, func(t *testing.T) {
			eng := newFakeEngine(fakeReply{chunks: []string{"cut ", "short"}, limit: tc.limit})
			eng.info.KVLimited = tc.kv
			h := start(t, eng, testOptions(t))
			h.line("hi")
			h.until("the reply's stats line", func(m *model) bool { return strings.Contains(flatView(m), tc.line) })
			if tc.notice != "" {
				h.untilNotice(tc.notice)
			}
			h.line("/stats")
			h.untilNotice(tc.statsLine)
			m := h.final()
			if st := m.chat.lastReply().Stats; st.Finish != FinishLength || st.Limit != tc.limit {
				t.Errorf("stats = %+v", st)
			}
			for _, e := range m.view.entries {
				if tc.notice == "" && e.msg == nil && strings.Contains(e.text, "has filled") {
					t.Errorf("a reply cut by max_tokens says the context is full: %q", e.text)
				}
			}
		})
	}
}

func TestContextCounterNeverPassesItsLimit(t *testing.T) {
	// A reply that fills the context ends with one token the context does
	// not hold: prompt 5 + 8 generated with a limit of 12.
	eng := newFakeEngine(fakeReply{chunks: strings.Split("a b c d e f g h", " "), limit: LimitKVCache})
	eng.info.MaxContext, eng.info.KVLimited = 12, true
	h := start(t, eng, testOptions(t))
	h.line("hi")
	h.until("the reply's stats line", func(m *model) bool { return strings.Contains(flatView(m), "KV cache is full") })
	h.settle()
	h.line("/stats")
	h.untilNotice("context 12 tokens (the KV cache's size, set by kv_budget")
	m := h.final()
	bar := m.statusView()
	if !strings.Contains(bar, "⚠ ctx 12/12 (KV budget)") || strings.Contains(bar, "13/12") {
		t.Errorf("status bar %q: want ⚠ ctx 12/12 (KV budget)", bar)
	}
	for _, e := range m.view.entries {
		if strings.Contains(e.text, "has filled the model's context") || strings.Contains(e.text, "holds 13") {
			t.Errorf("notice %q: the limit is the KV cache's", e.text)
		}
	}
}

// flatView is the chat's view with its lines joined and runs of spaces
// collapsed, so that a test finds a phrase the view wrapped.
func flatView(m *model) string {
	return strings.Join(strings.Fields(xansi.Strip(m.View())), " ")
}

// TestRejectedMessageIsReplacedByTyping: a message put back in the input
// after it could not be sent is replaced by what is typed next, so that a
// command typed then runs; an arrow key keeps it for editing.
func TestRejectedMessageIsReplacedByTyping(t *testing.T) {
	long := "Give me a synonym for happy, in far more words than twelve tokens can hold."
	eng := newFakeEngine()
	eng.info.MaxContext = 12
	h := start(t, eng, testOptions(t))
	h.line(long)
	h.untilNotice("does not fit the context")
	h.until("the message back in the input", func(m *model) bool { return m.in.Value() == long && m.in.restored })
	h.key(tea.KeyLeft) // editing keeps it
	h.typeText("!")
	h.until("the edit", func(m *model) bool { return m.in.Value() == long[:len(long)-1]+"!." })
	h.key(tea.KeyEnter)
	h.until("the edited message back", func(m *model) bool { return m.in.restored })
	h.line("/quit")
	m := h.finalModel()
	if !m.quitting {
		t.Errorf("/quit typed after a rejected message did not quit; input %q", m.in.Value())
	}
	for _, r := range eng.requests() {
		if strings.Contains(r.Messages[len(r.Messages)-1].Content, "/quit") {
			t.Errorf("sent %q", r.Messages[len(r.Messages)-1].Content)
		}
	}
}

func TestExportWithoutPathSaysWhere(t *testing.T) {
	dir := tempDir(t)
	t.Chdir(dir)
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("hi")
	h.settle()
	h.line("/export md")
	h.untilNotice("ferrite-chat-test-chat.md (the working directory; give a path to write elsewhere)")
	note := lastNotice(h.final(), "Exported to ")
	path := strings.Fields(note)[2]
	if !filepath.IsAbs(path) {
		t.Errorf("the message %q does not give the full path", note)
	}
	if _, err := os.Stat(filepath.Join(dir, "ferrite-chat-test-chat.md")); err != nil {
		t.Error(err)
	}
}

// TestLoadExportedJSON: /load takes the path of a chat exported as JSON;
// it continues as a new saved chat, leaving the original's file alone.
func TestLoadExportedJSON(t *testing.T) {
	opts := testOptions(t)
	h := start(t, newFakeEngine(fakeReply{chunks: []string{"exported reply"}}), opts)
	h.line("keep this")
	h.settle()
	out := filepath.Join(tempDir(t), "chat.json")
	h.line("/export json " + out)
	h.untilNotice("Exported to " + out)
	h.final()

	h2 := start(t, newFakeEngine(fakeReply{chunks: []string{"continued"}}), opts)
	h2.line("/load " + out)
	h2.untilNotice("Loaded " + out + ": 2 messages")
	h2.untilNotice("It is saved as chat ")
	h2.line("and then?")
	h2.waitFor("continued")
	h2.settle()
	m := h2.final()
	if len(m.chat.Messages) != 4 || m.chat.Messages[1].Content != "exported reply" {
		t.Fatalf("messages = %+v", m.chat.Messages)
	}
	if m.chat.ID == "test-chat" || m.chatName != m.chat.ID {
		t.Errorf("the loaded file continues as %q (file %q), want a new id", m.chat.ID, m.chatName)
	}
	readChat(t, filepath.Join(opts.ChatsDir, m.chat.ID+".json"), func(c *Chat) bool { return len(c.Messages) == 4 })
	readChat(t, filepath.Join(opts.ChatsDir, "test-chat.json"), func(c *Chat) bool { return len(c.Messages) == 2 })

	h3 := start(t, newFakeEngine(), opts)
	h3.line("/load " + filepath.Join(filepath.Dir(out), "missing.json"))
	h3.untilNotice("load failed: open ")
	h3.final()
}

// TestPastedTabStaysATab: the textarea's sanitizer turns a tab into spaces;
// a tab in a paste reaches the engine as a tab, and the input shows it.
func TestPastedTabStaysATab(t *testing.T) {
	eng := newFakeEngine()
	h := start(t, eng, testOptions(t))
	h.tm.Send(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("col1\tcol2\n\tindented"), Paste: true})
	h.waitFor("› col1→col2")
	h.key(tea.KeyEnter)
	h.settle()
	h.key(tea.KeyUp) // the history gives it back whole
	m := h.final()
	reqs := eng.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	if got := reqs[0].Messages[len(reqs[0].Messages)-1].Content; got != "col1\tcol2\n\tindented" {
		t.Errorf("sent %q", got)
	}
	if got := m.in.Value(); got != "col1\tcol2\n\tindented" {
		t.Errorf("recalled %q", got)
	}
}

// TestExportSystemPromptWhereSet: a system prompt set mid-chat is in the
// Markdown export where it was set; the one the chat started with is at
// the top.
func TestExportSystemPromptWhereSet(t *testing.T) {
	opts := testOptions(t)
	opts.System = "Be brief."
	h := start(t, newFakeEngine(), opts)
	h.line("one")
	h.settle()
	h.line("/system Talk like a pirate.")
	h.untilNotice("System prompt set")
	h.line("two")
	h.settle()
	h.line("/system --clear")
	h.untilNotice("System prompt cleared")
	out := tempDir(t)
	h.line("/export md " + filepath.Join(out, "chat.md"))
	h.untilNotice("Exported to")
	h.line("/export json " + filepath.Join(out, "chat.json"))
	h.untilNotice("chat.json")
	h.final()

	md, err := os.ReadFile(filepath.Join(out, "chat.md"))
	if err != nil {
		t.Fatal(err)
	}
	order := []string{"## System\n\nBe brief.", "## User", "one", "## Assistant", "## System · 2026-03-14T15:09:26Z\n\nTalk like a pirate.",
		"## User", "two", "## Assistant", "## System · 2026-03-14T15:09:26Z\n\n_(the system prompt was cleared)_"}
	rest := string(md)
	for _, want := range order {
		i := strings.Index(rest, want)
		if i < 0 {
			t.Fatalf("the export lacks %q after the parts before it:\n%s", want, md)
		}
		rest = rest[i+len(want):]
	}
	if strings.Count(string(md), "pirate") != 1 {
		t.Errorf("the mid-chat prompt appears more than once:\n%s", md)
	}
	data, err := os.ReadFile(filepath.Join(out, "chat.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := UnmarshalChat(data)
	if err != nil {
		t.Fatal(err)
	}
	if ExportMarkdown(c) != string(md) {
		t.Error("the JSON export loses where the system prompt changed")
	}
}

// TestSendRejectedWhileGeneratingIsReplacedByTyping: Enter while a reply
// is generated leaves the message in the input, selected: a command typed
// next runs instead of joining it.
func TestSendRejectedWhileGeneratingIsReplacedByTyping(t *testing.T) {
	hold := make(chan struct{})
	eng := newFakeEngine(fakeReply{chunks: []string{"slow"}, hold: hold})
	h := start(t, eng, testOptions(t))
	h.line("first")
	h.waitFor("generating")
	h.line("Give me a synonym for happy.")
	h.waitFor("typing replaces the message")
	h.line("/stop")
	h.until("the reply stopped", func(m *model) bool { return m.gen == nil })
	m := h.final()
	if got := m.in.Value(); got != "" {
		t.Errorf("input %q: /stop was appended to the message instead of running", got)
	}
	if n := len(eng.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}
