package ui

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runChat runs Run in the background with a pipe as the terminal's input.
func runChat(t *testing.T, ctx context.Context, eng Engine, opts Options) (in *io.PipeWriter, out *syncBuffer, done chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	out = &syncBuffer{}
	opts.Input, opts.Output = pr, out
	done = make(chan error, 1)
	go func() { done <- Run(ctx, eng, opts) }()
	t.Cleanup(func() { pw.Close() })
	return pw, out, done
}

func wait(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func TestRunRestoresTerminalAndSaves(t *testing.T) {
	opts := testOptions(t)
	opts.NoMouse = false
	in, out, done := runChat(t, context.Background(), newFakeEngine(fakeReply{chunks: []string{"hi back"}}), opts)
	_, _ = io.WriteString(in, "hello\r")
	// The autosave after the reply shows it was received.
	var path string
	deadline := time.Now().Add(5 * time.Second)
	for path == "" && time.Now().Before(deadline) {
		matches, _ := filepath.Glob(filepath.Join(opts.ChatsDir, "*.json"))
		for _, p := range matches {
			if c, err := newStore(opts.ChatsDir).load(strings.TrimSuffix(filepath.Base(p), ".json")); err == nil &&
				len(c.Messages) == 2 && c.Messages[1].Stats != nil {
				path = p
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if path == "" {
		t.Fatal("the chat was not saved")
	}
	_, _ = io.WriteString(in, "/quit\r")
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	o := out.String()
	for _, seq := range []string{"\x1b[?1049h", "\x1b[?1049l", "\x1b[?1002h", "\x1b[?1002l"} {
		if !strings.Contains(o, seq) {
			t.Errorf("output lacks %q (alternate screen / mouse on and off)", seq)
		}
	}
	if strings.LastIndex(o, "\x1b[?1049l") < strings.LastIndex(o, "\x1b[?1049h") {
		t.Error("the alternate screen was not left last")
	}
}

func TestRunContextCancelIsCleanExit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	_, _, done := runChat(t, ctx, newFakeEngine(), testOptions(t))
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := wait(t, done); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
}

// panicEngine panics in Info, before the program starts.
type panicEngine struct{ *fakeEngine }

func (panicEngine) Info() ModelInfo { panic("no model") }

func TestRunRecoversPanics(t *testing.T) {
	_, _, done := runChat(t, context.Background(), panicEngine{newFakeEngine()}, testOptions(t))
	if err := wait(t, done); err == nil || !strings.Contains(err.Error(), "panic: no model") {
		t.Fatalf("Run = %v, want the panic as an error", err)
	}

	// A panic inside Update (here the clock) quits the program with the
	// panic as Run's error.
	calls := 0
	opts := testOptions(t)
	opts.Now = func() time.Time {
		if calls++; calls > 2 {
			panic("clock broke")
		}
		return fixedNow
	}
	in, out, done := runChat(t, context.Background(), newFakeEngine(), opts)
	_, _ = io.WriteString(in, "hello\r")
	err := wait(t, done)
	if err == nil || !strings.Contains(err.Error(), "clock broke") {
		t.Fatalf("Run = %v, want the panic as an error", err)
	}
	if !strings.Contains(out.String(), "\x1b[?1049l") {
		t.Error("the terminal was not restored after the panic")
	}
}

// enginePanics panics while sending and while streaming.
type enginePanics struct{ *fakeEngine }

func (enginePanics) Send(context.Context, Request) (Reply, error) { panic("send exploded") }

func TestEnginePanicIsShownNotFatal(t *testing.T) {
	h := start(t, enginePanics{newFakeEngine()}, testOptions(t))
	h.line("hello")
	h.waitFor("engine panic: send exploded")
	m := h.final()
	if m.fatal != nil || m.quitting {
		t.Errorf("the chat ended: %v", m.fatal)
	}
	if m.in.Value() != "hello" {
		t.Errorf("input = %q, want the message back", m.in.Value())
	}
}
