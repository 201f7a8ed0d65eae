package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// DefaultLogPath is the debug log that debug_log = true in the
// configuration turns on: $XDG_STATE_HOME/ferrite/ferrite.log.
func DefaultLogPath() string {
	return filepath.Join(xdg.StateHome, "ferrite", "ferrite.log")
}

// discardLog is the logger of no debug log.
var discardLog = slog.New(slog.DiscardHandler)

// openLog opens the debug log: the file --log names, else DefaultLogPath
// when the configuration's debug_log is on, else none (a logger that
// drops everything, and path ""). Records are appended as slog text lines,
// to a file only its owner may read.
func openLog(flagPath string, enabled bool) (log *slog.Logger, path string, closeLog func(), err error) {
	path = flagPath
	if path == "" && enabled {
		path = DefaultLogPath()
	}
	if path == "" {
		return discardLog, "", func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, "", nil, fmt.Errorf("debug log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, "", nil, fmt.Errorf("debug log: %w", err)
	}
	log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log.Info("ferrite started", "pid", os.Getpid())
	return log, path, func() { f.Close() }, nil
}

// logEngineError records an engine error; a panic the runtime recovered
// (*runtime.PanicError, a slog.LogValuer) comes with its stack.
func logEngineError(log *slog.Logger, model string, err error) {
	var pe *runtime.PanicError
	if errors.As(err, &pe) {
		log.Error("engine error", "model", model, "err", pe)
		return
	}
	log.Error("engine error", "model", model, "err", err)
}
