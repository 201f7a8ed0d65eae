package ui

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnginePanicReachesTheLog: a panic of the engine is logged with its
// stack, and the chat says where the log is.
func TestEnginePanicReachesTheLog(t *testing.T) {
	var log syncBuffer
	opts := testOptions(t)
	opts.Log, opts.LogPath = slog.New(slog.NewTextHandler(&log, nil)), "/tmp/ferrite-test.log"
	h := start(t, enginePanics{newFakeEngine()}, opts)
	h.line("hello")
	h.untilNotice("engine panic: send exploded (details in /tmp/ferrite-test.log)")
	h.final()
	for _, want := range []string{"sending failed", "send exploded", "goroutine ", "enginePanics.Send"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, log.String())
		}
	}
}

// TestSaveFailureOnQuitIsReported: a chat that cannot be saved when the
// chat ends makes Run fail, and the log says why.
func TestSaveFailureOnQuitIsReported(t *testing.T) {
	var log syncBuffer
	opts := testOptions(t)
	notDir := filepath.Join(tempDir(t), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	opts.ChatsDir, opts.Log = notDir, slog.New(slog.NewTextHandler(&log, nil))
	in, _, done := runChat(t, context.Background(), newFakeEngine(fakeReply{chunks: []string{"hi back"}}), opts)
	_, _ = io.WriteString(in, "hello\r")
	_, _ = io.WriteString(in, "/quit\r")
	err := wait(t, done)
	if err == nil || !strings.Contains(err.Error(), "saving on quit") {
		t.Errorf("Run = %v, want the save failure", err)
	}
	if !strings.Contains(log.String(), "saving a chat on quit failed") {
		t.Errorf("the log lacks the save failure:\n%s", log.String())
	}
}
