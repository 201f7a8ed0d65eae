package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/settings"
)

// panicModel is a model whose forward pass panics.
type panicModel struct{ model.Model }

func (panicModel) Forward(*model.Batch) (*model.Output, error) { panic("forward exploded") }

// Unwrap returns the wrapped model (model.NewCache finds its device).
func (p panicModel) Unwrap() model.Model { return p.Model }

// TestEnginePanicStackReachesTheLog: a panic the runtime recovers in a
// step reaches the debug log with the panicking goroutine's stack.
func TestEnginePanicStackReachesTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "debug.log")
	log, gotPath, closeLog, err := openLog(path, false)
	if err != nil || gotPath != path {
		t.Fatalf("openLog: %q, %v", gotPath, err)
	}
	cfg := settings.Default()
	cfg.Sampling.MaxTokens = 4
	c := &chatModels{cfg: cfg, log: log}
	e, err := catalog.Probe(fixtureModel(t, "llama"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.openSession(context.Background(), e, openMode{strict: true}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.rt.Close()
	if s.rt, err = runtime.New(panicModel{s.lm.Model}, runtime.Options{KVBudget: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	var out, errs strings.Builder
	err = generate(context.Background(), s, &cfg, true, "hello", &out, &errs, log)
	closeLog()
	if err == nil || !strings.Contains(err.Error(), "forward exploded") {
		t.Fatalf("generate = %v", err)
	}
	data, rerr := os.ReadFile(path)
	if rerr != nil {
		t.Fatal(rerr)
	}
	text := string(data)
	for _, want := range []string{"model loaded", "weights=", "engine error", "forward exploded", "goroutine ", "panicModel.Forward"} {
		if !strings.Contains(text, want) {
			t.Errorf("the log lacks %q:\n%s", want, text)
		}
	}
}

// TestLogFlagAndConfig: --log FILE records load failures and the error
// message points to it; debug_log = true writes under $XDG_STATE_HOME.
func TestLogFlagAndConfig(t *testing.T) {
	broken := t.TempDir()
	byteTokenizer(t, broken)
	if err := os.WriteFile(filepath.Join(broken, "config.json"), []byte(`{"model_type": "llama"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sub", "ferrite.log")
	code, _, errs := runCLI(t, "hi", "run", "--log", path, "--model", broken)
	if code != 1 || !strings.Contains(errs, "(details in "+path+")") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if data, err := os.ReadFile(path); err != nil || !strings.Contains(string(data), "model load failed") {
		t.Fatalf("log %q, %v", data, err)
	}

	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte("debug_log = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(DefaultLogPath(), os.Getenv("XDG_STATE_HOME")+"/ferrite/") {
		t.Fatalf("DefaultLogPath() = %s", DefaultLogPath())
	}
	os.Remove(DefaultLogPath())
	if code, _, errs := runCLI(t, "hi", "run", "--config", cfgPath, "--max-tokens", "2"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if data, err := os.ReadFile(DefaultLogPath()); err != nil || !strings.Contains(string(data), `msg="model loaded" model=ferrite-tiny`) {
		t.Fatalf("log %q, %v", data, err)
	}
}
