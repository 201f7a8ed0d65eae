package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"
)

// mtpEngine is a fake model with an MTP module whose replies report
// speculative decoding.
func mtpEngine() *fakeEngine {
	eng := newFakeEngine(fakeReply{
		chunks: []string{"drafted ", "and verified"},
		usage: Usage{
			TimeToFirstToken: 100 * time.Millisecond, DecodeTokensPerSec: 40,
			VerifySteps: 10, DraftTokens: 30, AcceptedTokens: 24, AcceptedPerStep: 2.4,
		},
	})
	eng.info.MTP, eng.info.Draft = true, 3
	eng.stats.DraftTokens, eng.stats.AcceptedTokens, eng.stats.AcceptRate, eng.stats.AcceptedPerStep = 30, 24, 0.8, 2.4
	return eng
}

func TestMTPSettingsReachTheEngine(t *testing.T) {
	eng := mtpEngine()
	h := start(t, eng, testOptions(t))
	h.line("/set mtp off")
	h.untilNotice("mtp=off")
	h.line("one")
	h.settle()
	h.line("/set draft 5")
	h.untilNotice("mtp=on draft=5")
	h.line("two")
	h.settle()
	h.line("/set mtp auto")
	h.line("three")
	h.settle()
	m := h.final()
	var drafts []int
	for _, r := range eng.requests() {
		drafts = append(drafts, r.Settings.Draft)
	}
	if len(drafts) != 3 || drafts[0] != -1 || drafts[1] != 5 || drafts[2] != 0 {
		t.Errorf("Request drafts = %v, want [-1 5 0]", drafts)
	}
	if st := m.chat.Messages[1].Stats; st == nil || st.Settings.Draft != -1 || st.DraftTokens != 30 {
		t.Errorf("reply stats = %+v", st)
	}
}

func TestMTPWithoutModule(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/set mtp on")
	h.untilNotice("mtp: Fake-1B has no MTP module")
	h.line("/set draft 2")
	h.untilNotice("draft: Fake-1B has no MTP module")
	h.line("/stats")
	h.untilNotice("MTP: the model has no MTP module")
	h.final()
}

func TestMTPInStatusBarAndStats(t *testing.T) {
	eng := mtpEngine()
	eng.stats.DraftTokens = 0 // nothing drafted yet
	h := start(t, eng, testOptions(t))
	h.waitFor("MTP on, 3 drafts") // before any reply
	h.line("hi")
	h.waitFor("MTP 80% · 3.4/step")
	h.settle()
	h.line("/stats")
	h.untilNotice("MTP: 3 draft tokens per step\n")
	eng.mu.Lock()
	eng.stats.DraftTokens = 30
	eng.mu.Unlock()
	h.line("again")
	h.settle()
	h.line("/stats")
	h.untilNotice("MTP: 3 draft tokens per step; 24 of 30 drafts accepted (80%), 3.40 tokens per verify step")
	m := h.final()
	if !strings.Contains(m.View(), "MTP 80%, 3.4 tok/step") {
		t.Errorf("the reply's line lacks the MTP acceptance:\n%s", m.View())
	}
}

func TestStatusBarSegments(t *testing.T) {
	st := NewStyles(DefaultPalette(), true, false)
	bar := statusBar{st: &st}
	line := xansi.Strip(bar.render(160, statusData{
		info:    ModelInfo{Name: "M", MaxContext: 100},
		busy:    3,
		others:  []int{2, 4},
		loading: "loading Qwen3 · mapping the weights · 4s",
		stats:   Stats{DraftTokens: 10, AcceptRate: 0.5, AcceptedPerStep: 1},
		draft:   2,
	}))
	for _, want := range []string{"⟳ loading Qwen3 · mapping the weights · 4s", "● generating 3", "● chats 2,4", "MTP 50% · 2.0/step"} {
		if !strings.Contains(line, want) {
			t.Errorf("status bar lacks %q: %s", want, line)
		}
	}
	if w := lipgloss.Width(bar.render(30, statusData{info: ModelInfo{Name: "M"}, loading: "loading a very long model name · stage · 1s"})); w != 30 {
		t.Errorf("narrow bar is %d wide", w)
	}
}

func TestWarningsShownAtStart(t *testing.T) {
	opts := testOptions(t)
	opts.Warnings = []string{"config.toml is ignored: line 3: sampling.temperature: 9 is out of range [0, 5]"}
	h := start(t, newFakeEngine(), opts)
	h.untilNotice("line 3: sampling.temperature")
	h.waitFor("⚠ config.toml is ignored")
	h.final()
}
