package ui

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/adrg/xdg"
	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"
	"github.com/muesli/termenv"
)

func TestSplitThink(t *testing.T) {
	for _, tc := range []struct {
		in, think, answer string
		open              bool
	}{
		{"plain answer", "", "plain answer", false},
		{"<think>reason</think>answer", "reason", "answer", false},
		{"\n<think>\nreason\n</think>\n\nanswer", "reason", "answer", false},
		{"<think>still going", "still going", "", true},
		{"<think>", "", "", true},
		{"<thi", "", "", true}, // a tag arriving token by token
		{"<", "", "", true},    // ditto
		{"a < b", "", "a < b", false},
		{"reason</think>answer", "reason", "answer", false}, // the template opened the block
		{"say <think> in the middle", "", "say <think> in the middle", false},
		{"", "", "", false},
	} {
		think, answer, open := splitThink(tc.in)
		if think != tc.think || answer != tc.answer || open != tc.open {
			t.Errorf("splitThink(%q) = %q, %q, %v; want %q, %q, %v", tc.in, think, answer, open, tc.think, tc.answer, tc.open)
		}
	}
}

func TestPromptMessagesSkipEmptyReplies(t *testing.T) {
	c := &Chat{System: "sys", Messages: []*Message{
		{Role: RoleUser, Content: "a"},
		{Role: RoleAssistant, Content: "", Error: "failed"},
		{Role: RoleUser, Content: "b"},
		{Role: RoleAssistant, Content: "<think>r</think>x"},
	}}
	got := c.promptMessages()
	var roles []string
	for _, m := range got {
		roles = append(roles, m.Role+":"+m.Content+"/"+m.ReasoningContent)
	}
	want := "system:sys/ user:a/ user:b/ assistant:x/r"
	if s := strings.Join(roles, " "); s != want {
		t.Errorf("prompt = %s, want %s", s, want)
	}
}

// mtpInfo is a model with an MTP module that the engine drafts 2 tokens
// per step with.
var mtpInfo = ModelInfo{Name: "M", MTP: true, Draft: 2}

func TestApplySetting(t *testing.T) {
	for _, tc := range []struct {
		args    string
		wantErr string
		check   func(Settings) bool
	}{
		{"temperature 0", "", func(s Settings) bool { return s.Temperature == 0 }},
		{"top_p 0.5", "", func(s Settings) bool { return s.TopP == 0.5 }},
		{"top_k 0", "", func(s Settings) bool { return s.TopK == 0 }},
		{"min_p 0.1", "", func(s Settings) bool { return s.MinP == 0.1 }},
		{"repeat_penalty 1.1", "", func(s Settings) bool { return s.RepeatPenalty == 1.1 }},
		{"seed 18446744073709551615", "", func(s Settings) bool { return s.Seed == 1<<64-1 }},
		{"max_tokens 0", "", func(s Settings) bool { return s.MaxTokens == 0 }},
		{"temperature -1", "out of range", nil},
		{"temperature NaN", "NaN is out of range [0, 5]", nil},
		{"top_k 1.5", "not a whole number", nil},
		{"seed -3", "not a whole number", nil},
		{"temperature", "usage: /set", nil},
		{"temperature 1 2", "usage: /set", nil},
		{"nope 1", `unknown setting "nope"`, nil},
		{"mtp off", "", func(s Settings) bool { return s.MTP == "off" && s.effectiveDraft(mtpInfo) == 0 }},
		{"mtp auto", "", func(s Settings) bool { return s.MTP == "auto" && s.effectiveDraft(mtpInfo) == 2 }},
		{"mtp on", "", func(s Settings) bool { return s.MTP == "on" && s.effectiveDraft(mtpInfo) == 2 }}, // the engine's draft length
		{"draft 5", "", func(s Settings) bool { return s.Draft == 5 && s.MTP == "on" && s.effectiveDraft(mtpInfo) == 5 }},
		{"draft 0", "out of range [1, 16]", nil},
		{"draft 17", "out of range [1, 16]", nil},
		{"mtp maybe", `"maybe": want auto, on, off`, nil},
	} {
		s := DefaultSettings()
		_, err := applySetting(&s, tc.args, mtpInfo)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("/set %s: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("/set %s: error %v, want %q", tc.args, err, tc.wantErr)
		case tc.check != nil && !tc.check(s):
			t.Errorf("/set %s: settings %+v", tc.args, s)
		}
	}
}

func TestCommandCompletion(t *testing.T) {
	cs := newCommandSet()
	m := &model{modelList: []ModelEntry{{Name: "ferrite-tiny", Source: "built-in"}, {Name: "Qwen/Qwen3-0.6B", Arch: "qwen3", Source: "hf-cache"}}}
	labels := func(items []compItem) string {
		var out []string
		for _, it := range items {
			out = append(out, it.value)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct{ in, want string }{
		{"/", "/help,/model ,/models,/pull ,/new,/chats,/switch ,/close ,/clear,/system ,/set ,/regen ,/pick ,/stop,/stats,/export ,/copy,/save ,/load ,/quit"},
		{"/st", "/stop,/stats"},
		{"/mod", "/model ,/models"},
		{"/model q", "/model Qwen/Qwen3-0.6B"},
		{"/set t", "/set temperature ,/set top_p ,/set top_k "},
		{"/set temperature ", ""},
		{"/export j", "/export json "},
		{"/zzz", ""},
		{"/help x", ""},
	} {
		if got := labels(cs.complete(tc.in, m)); got != tc.want {
			t.Errorf("complete(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
	var c completion
	c.update("/sw", cs, m)
	if !c.open() || c.selected().value != "/switch " {
		t.Fatalf("popup for /st: open %v", c.open())
	}
	c.update("/st", cs, m)
	if !c.open() || c.selected().value != "/stop" {
		t.Fatalf("popup for /st: open %v", c.open())
	}
	c.move(1)
	if c.selected().value != "/stats" {
		t.Errorf("after down: %q", c.selected().value)
	}
	c.move(1) // wraps
	if c.selected().value != "/stop" {
		t.Errorf("after wrapping: %q", c.selected().value)
	}
	c.close()
	if c.open() {
		t.Error("open after close")
	}
	c.update("/sta", cs, m)
	if !c.open() {
		t.Error("closed after typing on")
	}
	c.update("/stats", cs, m) // an exact match needs no popup
	if c.open() {
		t.Error("open on an exact match")
	}
	c.update("hello", cs, m)
	if c.open() {
		t.Error("open on a message")
	}
}

func TestInputHistory(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	in := newInput(DefaultKeyMap(), &st)
	in.SetWidth(40)
	if in.prev() {
		t.Fatal("prev with no history")
	}
	in.remember("one")
	in.remember("two")
	in.remember("two") // no duplicates in a row
	in.SetValue("draft")
	if !in.prev() || in.Value() != "two" {
		t.Fatalf("prev: %q", in.Value())
	}
	if !in.prev() || in.Value() != "one" {
		t.Fatalf("prev: %q", in.Value())
	}
	if in.prev() {
		t.Fatal("prev past the oldest")
	}
	if !in.next() || in.Value() != "two" {
		t.Fatalf("next: %q", in.Value())
	}
	if !in.next() || in.Value() != "draft" {
		t.Fatalf("next to the draft: %q", in.Value())
	}
	if in.next() {
		t.Fatal("next past the draft")
	}
}

func TestInputGrowsWithText(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	in := newInput(DefaultKeyMap(), &st)
	in.SetWidth(20)
	if in.Height() != 1 {
		t.Fatalf("empty input height %d", in.Height())
	}
	in.SetValue("a\nb\nc")
	if in.Height() != 3 {
		t.Errorf("three lines: height %d", in.Height())
	}
	in.SetValue(strings.Repeat("x\n", 40))
	if in.Height() != maxInputLines {
		t.Errorf("many lines: height %d, want %d", in.Height(), maxInputLines)
	}
	// The newline key inserts a newline rather than sending.
	in.SetValue("a")
	in.Update(tea.KeyMsg{Type: tea.KeyEnter, Alt: true})
	in.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("b")})
	if in.Value() != "a\nb" {
		t.Errorf("after alt+enter: %q", in.Value())
	}
}

func TestStatusBar(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	bar := statusBar{st: &st}
	d := statusData{
		info:    ModelInfo{Name: "Qwen3-0.6B", Arch: "qwen3", MaxContext: 40960},
		busy:    1,
		usage:   &Usage{GeneratedTokens: 10, DecodeTokensPerSec: 23.44, TimeToFirstToken: 1500 * time.Millisecond},
		stats:   Stats{KVBlocksUsed: 7, KVBlocksTotal: 16, KVBytesUsed: 7 << 26, KVBytesTotal: 1 << 30, Running: 1, Waiting: 2},
		ctxUsed: 39000,
	}
	var b strings.Builder
	for _, w := range []int{160, 100, 60, 30} {
		line := bar.render(w, d)
		if got := lipgloss.Width(line); got != w {
			t.Errorf("width %d: the bar is %d wide", w, got)
		}
		b.WriteString(xansi.Strip(line) + "\n")
	}
	golden.RequireEqual(t, b.String())
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 1536 << 20: "1.5 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestNoColorStyles(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	m := newModel(newFakeEngine(), Options{ChatsDir: t.TempDir()})
	if !m.opts.NoColor {
		t.Fatal("NO_COLOR not noticed")
	}
	if _, ok := m.st.Chat.AssistantLabel.GetForeground().(lipgloss.NoColor); !ok {
		t.Errorf("assistant label has a colour: %v", m.st.Chat.AssistantLabel.GetForeground())
	}
	if m.st.Markdown.Document.Color != nil {
		t.Errorf("Markdown has a document colour")
	}
}

func TestExportMarkdownGolden(t *testing.T) {
	at := fixedNow
	c := &Chat{
		Version: chatFormatVersion, ID: "c1", Created: at, Updated: at,
		Model:    ModelInfo{Name: "Qwen3-0.6B", Arch: "qwen3", MaxContext: 40960},
		System:   "Be brief.",
		Settings: Settings{Temperature: 0.7, TopP: 0.95, TopK: 40, MinP: 0.05, RepeatPenalty: 1, MaxTokens: 512},
		Messages: []*Message{
			{Role: RoleUser, Content: "Hi", Time: at},
			{Role: RoleAssistant, Content: "<think>greet back</think>Hello!", Time: at.Add(time.Second),
				Stats: newReplyStats(Usage{PromptTokens: 12, GeneratedTokens: 3, TimeToFirstToken: 80 * time.Millisecond,
					Total: 300 * time.Millisecond, PromptTokensPerSec: 150, DecodeTokensPerSec: 9.5, Seed: 99}, FinishStop, "",
					Settings{Temperature: 0.7, TopP: 0.95, TopK: 40, MinP: 0.05, RepeatPenalty: 1, Seed: 5, MaxTokens: 512})},
			{Role: RoleUser, Content: "Again", Time: at.Add(2 * time.Second)},
			{Role: RoleAssistant, Content: "Hel", Time: at.Add(3 * time.Second), Error: "engine closed"},
		},
	}
	golden.RequireEqual(t, ExportMarkdown(c))

	// And the JSON round-trips.
	data, err := MarshalChat(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalChat(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := MarshalChat(back)
	if string(again) != string(data) {
		t.Errorf("JSON does not round-trip:\n%s\n---\n%s", data, again)
	}
}

func TestUnmarshalChatErrors(t *testing.T) {
	for in, want := range map[string]string{
		`nope`:                               "not a ferrite chat",
		`{}`:                                 "no version",
		`{"version": 99}`:                    "newer than",
		`{"version": 1, "messages": [null]}`: "message 0 is null",
		`{"version": 1, "messages": [{"role": "tool"}]}`: `role "tool"`,
	} {
		_, err := UnmarshalChat([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("UnmarshalChat(%s) = %v, want %q", in, err, want)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("content %q", b)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want 1", len(ents))
	}
	// A failed write leaves the old file and no temporary file.
	if err := writeFileAtomic(filepath.Join(dir, "missing", "y.json"), []byte("z"), 0o600); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries after a failure", len(ents))
	}
}

func TestStoreDropsStaleSaves(t *testing.T) {
	s := newStore(t.TempDir())
	newer := &Chat{Version: 1, ID: "a", Messages: []*Message{{Role: RoleUser, Content: "newer"}}}
	older := &Chat{Version: 1, ID: "a", Messages: []*Message{{Role: RoleUser, Content: "older"}}}
	if _, err := s.save("a", newer, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := s.save("a", older, 1); err != nil {
		t.Fatal(err)
	}
	c, err := s.load("a")
	if err != nil {
		t.Fatal(err)
	}
	if c.Messages[0].Content != "newer" {
		t.Errorf("a stale save overwrote a newer one")
	}
	// Concurrent saves never leave a torn file.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.save("b", newer, uint64(i))
		}()
	}
	wg.Wait()
	if _, err := s.load("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.load("../etc/passwd"); err == nil || !strings.Contains(err.Error(), "not a valid chat name") {
		t.Errorf("load of a path: %v", err)
	}
	if _, err := s.load("missing"); err == nil || !strings.Contains(err.Error(), "no saved chat") {
		t.Errorf("load of a missing chat: %v", err)
	}
}

func TestDefaultChatsDirFollowsXDG(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", dir)
	xdg.Reload()
	t.Cleanup(xdg.Reload)
	if got, want := DefaultChatsDir(), filepath.Join(dir, "ferrite", "chats"); got != want {
		t.Errorf("DefaultChatsDir() = %q, want %q", got, want)
	}
}

func TestInputShowsAllLinesAfterNewline(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	in := newInput(DefaultKeyMap(), &st)
	in.SetWidth(30)
	for _, k := range []tea.KeyMsg{
		{Type: tea.KeyRunes, Runes: []rune("one")},
		{Type: tea.KeyEnter, Alt: true},
		{Type: tea.KeyRunes, Runes: []rune("two")},
		{Type: tea.KeyCtrlJ},
		{Type: tea.KeyRunes, Runes: []rune("three")},
	} {
		in.Update(k)
	}
	v := xansi.Strip(in.View())
	for _, want := range []string{"one", "two", "three"} {
		if !strings.Contains(v, want) {
			t.Errorf("the input view lacks %q:\n%s", want, v)
		}
	}
	if in.Height() != 3 {
		t.Errorf("height %d, want 3", in.Height())
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain\ntext":         "plain\ntext",
		"a\tb":                "a    b",
		"esc\x1b[2Jx":         "esc␛[2Jx",
		"cr\rbell\a":          "cr␍bell␇",
		"del\x7f c1\u0085 ok": "del␡ c1\uFFFD ok",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
	// A reply full of control bytes keeps the view's size.
	st := NewStyles(NoColorPalette(), true, true)
	v := newChatView(&st, "m")
	v.SetSize(40, 10)
	v.add(&entry{kind: entryAssistant, msg: &Message{Role: RoleAssistant, Content: "\x1b[H\x1b[2J\r\x0b\x0c\x08 evil"}})
	v.refresh()
	for _, l := range strings.Split(v.View(), "\n") {
		if strings.ContainsAny(l, "\x1b\r\x0b\x0c\x08") {
			t.Errorf("a control character reached the screen: %q", l)
		}
	}
}

// TestKVBarAgreesWithItsPercentage: the bar has a filled cell exactly when
// the percentage is not 0 %.
func TestKVBarAgreesWithItsPercentage(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	bar := statusBar{st: &st}
	for _, tc := range []struct {
		used, total int
		want        string
	}{
		{0, 1000, "KV ░░░░░░░░░░ 0%"},
		{1, 1000, "KV █░░░░░░░░░ <1%"},
		{4, 1000, "KV █░░░░░░░░░ <1%"},
		{5, 1000, "KV █░░░░░░░░░ 1%"},
		{500, 1000, "KV █████░░░░░ 50%"},
		{1000, 1000, "KV ██████████ 100%"},
	} {
		line := xansi.Strip(bar.render(160, statusData{info: ModelInfo{Name: "m"}, stats: Stats{KVBlocksUsed: tc.used, KVBlocksTotal: tc.total}}))
		if !strings.Contains(line, tc.want) {
			t.Errorf("%d of %d blocks: %q, want %q", tc.used, tc.total, line, tc.want)
		}
	}
}

// TestRestoredInputIsDimmed: a message put back is drawn in its own style
// until it is edited.
func TestRestoredInputIsDimmed(t *testing.T) {
	lipgloss.SetColorProfile(termenv.ANSI256)
	defer lipgloss.SetColorProfile(termenv.Ascii)
	st := NewStyles(DefaultPalette(), true, false)
	in := newInput(DefaultKeyMap(), &st)
	in.SetWidth(40)
	in.SetValue("hello")
	plain := in.View()
	in.restore("hello")
	if in.View() == plain {
		t.Error("restored text looks like typed text")
	}
	in.Update(tea.KeyMsg{Type: tea.KeyLeft})
	if in.restored || in.Value() != "hello" {
		t.Errorf("after an edit key: restored %v, value %q", in.restored, in.Value())
	}
	in.SetValue("hello")
	if in.View() != plain {
		t.Error("text set again is still drawn as restored")
	}
}

// TestOpeningNotes: Options.Notes show as notices after the welcome,
// before the warnings.
func TestOpeningNotes(t *testing.T) {
	m := newModel(newFakeEngine(), Options{ChatsDir: t.TempDir(), Notes: []string{"Sampling as m recommends: temperature 0."},
		Warnings: []string{"config.toml: ignored"}})
	var got []string
	for _, e := range m.view.entries {
		got = append(got, fmt.Sprintf("%d %s", e.kind, e.text))
	}
	want := []string{
		fmt.Sprintf("%d Chatting with Fake-1B (fake). Type /help for commands and keys.", entryNotice),
		fmt.Sprintf("%d Sampling as m recommends: temperature 0.", entryNotice),
		fmt.Sprintf("%d config.toml: ignored", entryWarning),
	}
	if !slices.Equal(got, want) {
		t.Errorf("opening entries\n%q\nwant\n%q", got, want)
	}
}
