package ui

import (
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/exp/golden"
)

// The golden files under testdata/ hold whole screens; regenerate them with
// go test ./ui/ -run TestViewGolden -update and review the diff.

const goldenReply = "<think>The user wants a summary. Keep it short.</think>" +
	"## Summary\n\nFerrite runs the model **in-process**:\n\n" +
	"- no server\n- streaming replies\n\n```go\nfmt.Println(\"hi\")\n```\n"

func goldenHarness(t *testing.T, width, height int) *harness {
	return goldenHarnessOn(t, newFakeEngine(fakeReply{chunks: strings.SplitAfter(goldenReply, " ")}), width, height)
}

// goldenHarnessOn is goldenHarness with the engine set up by the caller.
func goldenHarnessOn(t *testing.T, eng *fakeEngine, width, height int) *harness {
	h := start(t, eng, testOptions(t))
	if width != 80 || height != 24 {
		h.tm.Send(tea.WindowSizeMsg{Width: width, Height: height})
	}
	h.line("Summarize ferrite.")
	h.waitFor("tok/s")
	h.settle()
	return h
}

func TestViewGolden(t *testing.T) {
	t.Run("Reply", func(t *testing.T) {
		h := goldenHarness(t, 80, 24)
		golden.RequireEqual(t, h.final().View())
	})
	t.Run("ThinkingShown", func(t *testing.T) {
		h := goldenHarness(t, 80, 24)
		h.tm.Send(tea.KeyMsg{Type: tea.KeyCtrlT})
		h.until("thinking shown", func(m *model) bool { return m.view.showThink })
		golden.RequireEqual(t, h.final().View())
	})
	t.Run("GPU", func(t *testing.T) {
		// At 80 columns the GPU's memory outlives the device's name.
		eng := newFakeEngine(fakeReply{chunks: strings.SplitAfter(goldenReply, " ")})
		eng.info.Device = "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139 GiB)"
		eng.stats.Memory = gpuMemoryUse
		golden.RequireEqual(t, goldenHarnessOn(t, eng, 80, 24).final().View())
	})
	t.Run("Narrow", func(t *testing.T) {
		h := goldenHarness(t, 44, 18)
		golden.RequireEqual(t, h.final().View())
	})
	t.Run("Completion", func(t *testing.T) {
		h := start(t, newFakeEngine(), testOptions(t))
		h.typeText("/s")
		h.waitFor("/stats")
		golden.RequireEqual(t, h.final().View())
	})
	t.Run("Streaming", func(t *testing.T) {
		hold := make(chan struct{})
		h := start(t, newFakeEngine(fakeReply{chunks: []string{"never"}, hold: hold}), testOptions(t))
		h.line("Hello?")
		h.waitFor("reading the prompt")
		golden.RequireEqual(t, h.final().View())
	})
}

func TestStreamingDoesNotJumpWhenScrolledUp(t *testing.T) {
	chunks := make([]string, 60)
	for i := range chunks {
		chunks[i] = "line\n\n"
	}
	eng := newFakeEngine(fakeReply{chunks: chunks, delay: 3 * time.Millisecond})
	h := start(t, eng, testOptions(t))
	h.line("lots of lines please")
	h.until("the reply to overflow the view", func(m *model) bool {
		return m.view.vp.TotalLineCount() > m.view.vp.Height+10
	})
	h.key(tea.KeyPgUp)
	var offset int
	h.until("scrolled up", func(m *model) bool {
		offset = m.view.vp.YOffset
		return !m.view.follow
	})
	h.settle()
	m := h.final()
	if m.view.vp.YOffset != offset {
		t.Errorf("the view moved while streaming: offset %d, was %d", m.view.vp.YOffset, offset)
	}
	if m.view.vp.AtBottom() {
		t.Error("the view followed the stream to the bottom")
	}
}

func TestFollowsStreamAtBottom(t *testing.T) {
	chunks := make([]string, 40)
	for i := range chunks {
		chunks[i] = "line\n\n"
	}
	h := start(t, newFakeEngine(fakeReply{chunks: chunks, delay: time.Millisecond}), testOptions(t))
	h.line("go")
	h.settle()
	m := h.final()
	if !m.view.vp.AtBottom() || !m.view.follow {
		t.Errorf("not at the bottom after the reply: offset %d of %d lines", m.view.vp.YOffset, m.view.vp.TotalLineCount())
	}
}

func TestMouseWheelScrolls(t *testing.T) {
	h := start(t, newFakeEngine(), testOptions(t))
	h.line("/help")
	h.waitFor("twice: quit")
	h.tm.Send(tea.MouseMsg{Button: tea.MouseButtonWheelUp, Action: tea.MouseActionPress})
	h.until("scrolled by the wheel", func(m *model) bool { return !m.view.follow })
	h.tm.Send(tea.MouseMsg{Button: tea.MouseButtonWheelDown, Action: tea.MouseActionPress})
	h.until("back at the bottom", func(m *model) bool { return m.view.follow })
	h.final()
}
