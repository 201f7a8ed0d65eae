package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// build compiles the ferrite binary into a temp dir.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferrite")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// modelDir copies a reference fixture and gives it a byte-level tokenizer
// (the fixtures' vocabulary is 512 ids: 256 bytes and ChatML specials fit).
func modelDir(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixtures.Dir(name), f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vocab := map[string]int{}
	next := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
		r := rune(b)
		if !printable {
			r = rune(256 + next)
			next++
		}
		vocab[string(r)] = b
	}
	var added []map[string]any
	for i, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		added = append(added, map[string]any{"id": 256 + i, "content": s, "special": true})
	}
	write := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", map[string]any{
		"version":       "1.0",
		"added_tokens":  added,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	})
	write("tokenizer_config.json", map[string]any{
		"eos_token": "<|im_end|>",
		"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
			"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
	})
	return dir
}

// term is one tmux session running a command.
type term struct {
	t    *testing.T
	name string
}

func newTerm(t *testing.T, env []string, argv ...string) *term {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (.ci/run installs it)")
	}
	name := "ferrite-e2e-" + strings.ReplaceAll(t.Name(), "/", "-")
	_ = exec.Command("tmux", "kill-session", "-t", name).Run()
	args := []string{"new-session", "-d", "-s", name, "-x", "110", "-y", "32", "env"}
	args = append(args, env...)
	args = append(args, argv...)
	if out, err := exec.Command("tmux", args...).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v\n%s", err, out)
	}
	tm := &term{t: t, name: name}
	t.Cleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", name).Run() })
	return tm
}

// screen is the visible terminal; "" once the session has ended (the
// program exited).
func (tm *term) screen() string {
	out, err := exec.Command("tmux", "capture-pane", "-p", "-t", tm.name).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func (tm *term) send(keys ...string) {
	if out, err := exec.Command("tmux", append([]string{"send-keys", "-t", tm.name}, keys...)...).CombinedOutput(); err != nil {
		tm.t.Fatalf("send-keys: %v\n%s", err, out)
	}
}

// waitFor polls the screen until cond holds or the deadline passes.
func (tm *term) waitFor(what string, cond func(string) bool) string {
	tm.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := tm.screen()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestChatInTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and drives it in tmux")
	}
	bin := build(t)
	model := modelDir(t, "qwen3")
	data := t.TempDir()
	tm := newTerm(t, []string{"XDG_DATA_HOME=" + data, "XDG_CONFIG_HOME=" + data, "NO_COLOR=1"},
		bin, "--model", model, "--max-tokens", "24", "--temperature", "0")

	s := tm.waitFor("the chat to open", func(s string) bool { return strings.Contains(s, "Type /help") })
	if s == "" {
		t.Fatal("ferrite exited at start")
	}
	tm.send("hello ferrite", "Enter")
	s = tm.waitFor("a finished reply with stats", func(s string) bool {
		return strings.Contains(s, "tok/s") && strings.Contains(s, "24 tokens")
	})
	if !strings.Contains(s, "hello ferrite") {
		t.Fatalf("the message is not on screen:\n%s", s)
	}
	// The status bar shows the model, its architecture, KV use and context.
	for _, want := range []string{"qwen3", "KV", "ctx "} {
		if !strings.Contains(s, want) {
			t.Errorf("status bar lacks %q:\n%s", want, s)
		}
	}

	out := filepath.Join(data, "transcript.md")
	tm.send("/export md "+out, "Enter")
	tm.waitFor("the export message", func(s string) bool { return strings.Contains(s, "Exported") })
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{"## User", "hello ferrite", "## Assistant", "qwen3", "temperature=0"} {
		if !strings.Contains(md, want) {
			t.Errorf("transcript lacks %q:\n%s", want, md)
		}
	}

	// The chat was autosaved.
	chats, _ := filepath.Glob(filepath.Join(data, "ferrite", "chats", "*.json"))
	if len(chats) == 0 {
		t.Error("no autosaved chat")
	}

	tm.send("/quit", "Enter")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })
}

func TestPipedBehavesLikeRun(t *testing.T) {
	bin := build(t)
	model := modelDir(t, "llama")
	cmd := exec.Command(bin, "--model", model, "--max-tokens", "5", "--temperature", "0", "hi")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if len(out) == 0 || !strings.Contains(stderr.String(), "decode:") {
		t.Fatalf("stdout %q, stderr %q", out, stderr.String())
	}
}
