package ui

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	xansi "github.com/charmbracelet/x/ansi"

	"github.com/ferrite-llm/ferrite/internal/settings"
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
	// A draft length leaves the mode as it is.
	h.line("/set draft 5")
	h.untilNotice("mtp=off draft=5")
	h.line("/set mtp on")
	h.untilNotice("mtp=on draft=5")
	h.line("two")
	h.settle()
	h.line("/set mtp auto")
	h.untilNotice("mtp=auto draft=5")
	h.line("three")
	h.settle()
	m := h.final()
	var drafts []int
	for _, r := range eng.requests() {
		drafts = append(drafts, r.Settings.effectiveDraft(eng.info))
	}
	if len(drafts) != 3 || drafts[0] != 0 || drafts[1] != 5 || drafts[2] != 5 {
		t.Errorf("Request drafts = %v, want [0 5 5]", drafts)
	}
	if st := m.chat.Messages[1].Stats; st == nil || st.Settings.MTP != "off" || st.DraftTokens != 30 {
		t.Errorf("reply stats = %+v", st)
	}
}

// TestDraftAfterMTPAutoKeepsAuto is issue 11's /set draft 4 after /set
// mtp auto, which showed mtp=on.
func TestDraftAfterMTPAutoKeepsAuto(t *testing.T) {
	h := start(t, mtpEngine(), testOptions(t))
	h.line("/set mtp auto")
	h.untilNotice("Set mtp.")
	h.line("/set draft 4")
	h.untilNotice("mtp=auto draft=4")
	h.final()
}

// TestSetListsTheTablesRanges: /set alone shows the values each setting
// takes, from settings.Table.
func TestSetListsTheTablesRanges(t *testing.T) {
	h := start(t, mtpEngine(), testOptions(t))
	h.line("/set")
	h.untilNotice("temperature (0–5), top_p (0–1), top_k (≥ 0), min_p (0–1), repeat_penalty (0–10), seed (≥ 0), max_tokens (≥ 0), mtp (auto, on, off), draft (1–16).")
	h.final()
}

// TestSetAgreesWithTheTable: every /set name is a row of settings.Table
// with a field of the row's type, takes the row's range, and starts at
// the row's default.
func TestSetAgreesWithTheTable(t *testing.T) {
	d, def := DefaultSettings(), settings.Default()
	for _, name := range settings.ChatNames() {
		row := settings.ByChat(name)
		if d.field(name) == nil {
			t.Errorf("/set %s has no field in Settings", name)
			continue
		}
		if name != "mtp" && name != "draft" && d.get(name) != row.Get(&def) { // MTP starts as the engine's
			t.Errorf("/set %s starts at %v, the table's default is %v", name, d.get(name), row.Get(&def))
		}
		s := DefaultSettings()
		if _, err := applySetting(&s, name+" "+row.Format(row.Default), mtpInfo); err != nil || s.get(name) != row.Default {
			t.Errorf("/set %s %s: %v, %v", name, row.Format(row.Default), s.get(name), err)
		}
		if row.Kind == settings.Int || row.Kind == settings.Float {
			over := strconv.FormatFloat(row.Max+1, 'f', -1, 64)
			if _, err := applySetting(&s, name+" "+over, mtpInfo); err == nil || !strings.Contains(err.Error(), "out of range") {
				t.Errorf("/set %s %s: %v, want out of range", name, over, err)
			}
		}
	}
	if got := strings.Join(settings.ChatNames(), ", "); paramNames() != got {
		t.Errorf("/set names %s, the table's %s", paramNames(), got)
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
