package ui

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// logger is the debug log of Options.Log, or one that drops everything.
func (m *model) logger() *slog.Logger {
	if m.opts.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.opts.Log
}

// logHint points to the debug log after an error message, when there is
// one.
func (m *model) logHint() string {
	if m.opts.LogPath == "" {
		return ""
	}
	return " (details in " + m.opts.LogPath + ")"
}

// panicError is a panic of the engine, recovered in a command so that the
// chat survives it; it keeps the stack for the debug log.
func panicError(r any) error {
	return &enginePanic{value: r, stack: debug.Stack()}
}

// enginePanic is panicError's error.
type enginePanic struct {
	value any
	stack []byte
}

func (e *enginePanic) Error() string { return fmt.Sprintf("engine panic: %v", e.value) }

// LogValue makes the debug log carry the stack.
func (e *enginePanic) LogValue() slog.Value {
	return slog.GroupValue(slog.String("msg", e.Error()), slog.String("stack", string(e.stack)))
}
