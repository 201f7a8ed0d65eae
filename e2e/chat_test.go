package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
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

// terminalBinary is build for a test that drives the binary in tmux,
// which -short skips.
func terminalBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and drives it in tmux")
	}
	return build(t)
}

// term is one tmux session running a command, on a tmux server of its
// own: sessions that share a server race with its exit when the last one
// ends ("server exited unexpectedly").
type term struct {
	t    *testing.T
	name string // the session
	sock string // the server's socket name (short: socket paths are limited)
}

// terms numbers the sessions of this test process, so that two terms of
// one test never share a name.
var terms atomic.Int64

func newTerm(t *testing.T, env []string, argv ...string) *term {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (.ci/run installs it)")
	}
	n := terms.Add(1)
	name := fmt.Sprintf("ferrite-e2e-%d-%s", n, strings.ReplaceAll(t.Name(), "/", "-"))
	tm := &term{t: t, name: name, sock: fmt.Sprintf("fe2e-%d-%d", os.Getpid(), n)}
	args := []string{"new-session", "-d", "-s", name, "-x", "110", "-y", "32", "env"}
	args = append(args, env...)
	args = append(args, argv...)
	if out, err := tm.tmux(args...).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v\n%s", err, out)
	}
	// The cleanup waits for the program to be gone: the test's TempDir is
	// removed after it, and a ferrite still saving its transcript on the way
	// out would write into a folder being removed ("directory not empty").
	t.Cleanup(func() {
		pids := tm.processes()
		_ = tm.tmux("kill-server").Run()
		waitGone(t, pids, 20*time.Second)
	})
	return tm
}

// processes is the pane's process and its descendants, found through
// /proc (nil where the session has already ended).
func (tm *term) processes() []int {
	out, err := tm.tmux("display-message", "-p", "-t", tm.name, "#{pane_pid}").Output()
	if err != nil {
		return nil
	}
	root, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				children[ppid] = append(children[ppid], pid)
			}
		}
	}
	pids := []int{root}
	for i := 0; i < len(pids); i++ {
		pids = append(pids, children[pids[i]]...)
	}
	return pids
}

// waitGone waits until none of pids is a live process (a zombie counts as
// gone: it has finished writing).
func waitGone(t *testing.T, pids []int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Logf("process %d still running %v after the terminal was closed", pid, limit)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// alive reports whether pid is a running process (not a zombie).
func alive(pid int) bool {
	f := procStat(pid)
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// procStat is the fields of /proc/PID/stat after the command's name
// (state, ppid, …), nil where the process is gone. The name, in
// parentheses, may hold spaces, so the fields start after its last ')'.
func procStat(pid int) []string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
}

// tmux is a tmux command addressed to this term's own server.
func (tm *term) tmux(args ...string) *exec.Cmd {
	return exec.Command("tmux", append([]string{"-L", tm.sock}, args...)...)
}

// screen is the visible terminal; "" once the session has ended (the
// program exited).
func (tm *term) screen() string {
	out, err := tm.tmux("capture-pane", "-p", "-t", tm.name).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func (tm *term) send(keys ...string) {
	if out, err := tm.tmux(append([]string{"send-keys", "-t", tm.name}, keys...)...).CombinedOutput(); err != nil {
		tm.t.Fatalf("send-keys: %v\n%s", err, out)
	}
}

// line types text and then presses Enter as a separate keystroke, as a
// person does: text and Enter arriving in one read look like a paste, whose
// newline the input keeps instead of sending.
func (tm *term) line(text string) {
	tm.send(text)
	time.Sleep(150 * time.Millisecond)
	tm.send("Enter")
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

// models puts two fixture models with a byte tokenizer into one folder
// (for config.toml's model_dirs) and returns it.
func models(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, fixture := range map[string]string{"tiny-qwen3": "qwen3", "tiny-llama": "llama"} {
		if err := os.Rename(fixtures.ChatModel(t, fixture), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// env is a fresh XDG and Hugging Face environment under dir.
func env(dir string) []string {
	return []string{"XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "XDG_CACHE_HOME=" + dir,
		"HF_HOME=" + filepath.Join(dir, "hf"), "HF_HUB_CACHE=", "NO_COLOR=1"}
}

func writeConfig(t *testing.T, data, text string) {
	t.Helper()
	path := filepath.Join(data, "ferrite", "config.toml")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestChatInTerminal(t *testing.T) {
	bin := terminalBinary(t)
	folder := models(t)
	model := filepath.Join(folder, "tiny-qwen3")
	data := t.TempDir()
	writeConfig(t, data, "model_dirs = [\""+folder+"\"]\n[sampling]\nseed = 7\n")
	tm := newTerm(t, env(data), bin, "--model", model, "--max-tokens", "24", "--temperature", "0")

	s := tm.waitFor("the chat to open", func(s string) bool { return strings.Contains(s, "Type /help") })
	if s == "" {
		t.Fatal("ferrite exited at start")
	}
	tm.line("hello ferrite")
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
	tm.line("/export md " + out)
	tm.waitFor("the export message", func(s string) bool { return strings.Contains(s, "Exported") })
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{"## User", "hello ferrite", "## Assistant", "qwen3", "temperature=0", "seed=7"} {
		if !strings.Contains(md, want) {
			t.Errorf("transcript lacks %q:\n%s", want, md)
		}
	}

	// The chat was autosaved.
	chats, _ := filepath.Glob(filepath.Join(data, "ferrite", "chats", "*.json"))
	if len(chats) == 0 {
		t.Error("no autosaved chat")
	}

	// /models lists the config's folder, the current model marked.
	tm.line("/models")
	s = tm.waitFor("the model list", func(s string) bool { return strings.Contains(s, "tiny-llama") })
	for _, want := range []string{"● tiny-qwen3", "llama", "config"} {
		if !strings.Contains(s, want) {
			t.Errorf("the list lacks %q:\n%s", want, s)
		}
	}

	// Two alternatives, generated at once, compared and one kept.
	tm.line("/set temperature 0.9")
	tm.line("/regen 2")
	s = tm.waitFor("the alternatives", func(s string) bool { return strings.Contains(s, "alternatives ready") })
	if !strings.Contains(s, "Alternatives:  previous │[1]│ 2") {
		t.Errorf("no alternatives strip:\n%s", s)
	}
	tm.send("S-Right")
	tm.waitFor("alternative 2 shown", func(s string) bool { return strings.Contains(s, "│[2]") })
	tm.send("Enter")
	tm.waitFor("the kept alternative", func(s string) bool { return strings.Contains(s, "kept alternative 2") })

	// A second chat; the first stays open.
	tm.send("C-n")
	tm.waitFor("the second chat", func(s string) bool { return strings.Contains(s, "[2 new chat]") })
	tm.line("second chat here")
	tm.waitFor("its reply", func(s string) bool { return strings.Contains(s, "24 tokens") })
	tm.send("C-Left")
	tm.waitFor("the first chat again", func(s string) bool { return strings.Contains(s, "[1 hello ferrite]") })

	// Switch model without leaving.
	tm.line("/model tiny-llama")
	s = tm.waitFor("the switch", func(s string) bool { return strings.Contains(s, "Switched to tiny-llama") })
	if !strings.Contains(s, "tiny-llama llama") {
		t.Errorf("the status bar does not show the new model:\n%s", s)
	}

	tm.line("/quit")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })

	// The input history is kept for the next session.
	hist, err := os.ReadFile(filepath.Join(data, "ferrite", "history"))
	if err != nil || !strings.Contains(string(hist), `"hello ferrite"`) || !strings.Contains(string(hist), `"/regen 2"`) {
		t.Errorf("history %q, %v", hist, err)
	}
}

func TestBadConfigIsReported(t *testing.T) {
	bin := terminalBinary(t)
	model := fixtures.ChatModel(t, "qwen3")
	data := t.TempDir()
	writeConfig(t, data, "[sampling]\ntemperature = \"hot\"\n")
	tm := newTerm(t, env(data), bin, "--model", model)
	s := tm.waitFor("the warning", func(s string) bool { return strings.Contains(s, "is ignored") })
	if !strings.Contains(s, "line 2") || !strings.Contains(s, "sampling.temperature") || !strings.Contains(s, "Type /help") {
		t.Errorf("the warning lacks the line and key:\n%s", s)
	}
	tm.line("/quit")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })
}

func TestPipedBehavesLikeRun(t *testing.T) {
	bin := build(t)
	model := fixtures.ChatModel(t, "llama")
	cmd := exec.Command(bin, "--model", model, "--max-tokens", "5", "--temperature", "0")
	cmd.Stdin = strings.NewReader("hi\n")
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

// TestBuiltinModelAnswers is the README's main command: plain `ferrite`
// opens the chat on the built-in model, which answers an in-domain question.
func TestBuiltinModelAnswers(t *testing.T) {
	bin := terminalBinary(t)
	data := t.TempDir()
	tm := newTerm(t, []string{"XDG_DATA_HOME=" + data, "XDG_CONFIG_HOME=" + data, "NO_COLOR=1"},
		bin, "--temperature", "0")
	// Wait for the chat itself, not just the name (the loading line names the
	// model too): keys typed before the terminal is in raw mode arrive as a
	// cooked line whose Enter reads as a newline.
	tm.waitFor("the chat to open", func(s string) bool {
		return strings.Contains(s, "Chatting with ferrite-tiny") && strings.Contains(s, "Type /help")
	})
	tm.line("What does ephemeral mean?")
	tm.waitFor("the definition", func(s string) bool { return strings.Contains(s, "lasting a very short time") })
	tm.send("C-c")
	tm.send("C-c")
}

// TestNoLoadingLineAfterQuit: the "loading …" line printed before the chat
// opens is gone from the terminal once the chat has ended.
func TestNoLoadingLineAfterQuit(t *testing.T) {
	bin := terminalBinary(t)
	model := fixtures.ChatModel(t, "qwen3")
	data := t.TempDir()
	// A shell keeps the pane open after ferrite exits, to see what it left.
	tm := newTerm(t, env(data), "sh", "-c", bin+" --model "+model+"; echo ferrite-exited; sleep 60")
	tm.waitFor("the chat to open", func(s string) bool { return strings.Contains(s, "Type /help") })
	tm.line("/quit")
	s := tm.waitFor("the shell after ferrite", func(s string) bool { return strings.Contains(s, "ferrite-exited") })
	if strings.Contains(s, "loading") {
		t.Errorf("the loading line stayed on the terminal:\n%s", s)
	}
}

// TestModelNumberInTerminal: with several models in model_dirs, /model N
// (typed, with the completion popup open) loads entry N of /models, not a
// model whose name holds the digit.
func TestModelNumberInTerminal(t *testing.T) {
	bin := terminalBinary(t)
	folder := t.TempDir()
	for _, name := range []string{"glm5_next", "llama", "mixtral", "qwen3"} {
		if err := os.Rename(fixtures.ChatModel(t, name), filepath.Join(folder, name)); err != nil {
			t.Fatal(err)
		}
	}
	data := t.TempDir()
	writeConfig(t, data, "model_dirs = [\""+folder+"\"]\n")
	tm := newTerm(t, env(data), bin, "--model", filepath.Join(folder, "llama"))
	tm.waitFor("the chat to open", func(s string) bool { return strings.Contains(s, "Type /help") })
	tm.line("/models")
	s := tm.waitFor("the model list", func(s string) bool { return strings.Contains(s, "mixtral") && strings.Contains(s, "qwen3") })
	var want string // the name of entry 5
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "5" {
			want = f[1]
			if want == "●" {
				want = f[2]
			}
		}
	}
	if want == "" || strings.Contains(want, "5") {
		t.Fatalf("entry 5 is %q; the test needs a fifth model without a 5 in its name:\n%s", want, s)
	}
	tm.send("/model 5")
	tm.waitFor("the popup on entry 5", func(s string) bool { return strings.Contains(s, "5 "+want) })
	time.Sleep(150 * time.Millisecond)
	tm.send("Enter")
	s = tm.waitFor("the switch", func(s string) bool { return strings.Contains(s, "Switched to ") })
	if !strings.Contains(s, "Switched to "+want) {
		t.Errorf("/model 5 did not load entry 5 (%s):\n%s", want, s)
	}
	tm.line("/quit")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })
}

// TestKVBudgetInTerminal: with a KV budget smaller than the model's
// context, a reply cut by it says so under the reply, the context counter
// names the KV budget and stops at its limit, and a message that does not
// fit goes back to the input, where a command typed next replaces it.
func TestKVBudgetInTerminal(t *testing.T) {
	bin := terminalBinary(t)
	model := fixtures.ChatModel(t, "qwen3")
	data := t.TempDir()
	// 4 blocks of 16 tokens (3 layers · K and V · 2 heads · 32 dims · 2 bytes:
	// qwen3 keeps a BF16 cache).
	tm := newTerm(t, env(data), bin, "--model", model, "--kv-budget", "49152", "--max-tokens", "0", "--temperature", "0")
	tm.waitFor("the chat to open", func(s string) bool { return strings.Contains(s, "Type /help") })
	tm.line("hi")
	// The status bar shows tok/s while the reply streams; the reply's own
	// stats line (and its cut reason) comes when it ends.
	s := tm.waitFor("the cut reply", func(s string) bool {
		return strings.Contains(strings.Join(strings.Fields(s), " "), "cut:")
	})
	flat := strings.Join(strings.Fields(s), " ")
	if !strings.Contains(flat, "cut: the KV cache is full (raise kv_budget)") {
		t.Errorf("the reply does not say the KV cache cut it:\n%s", s)
	}
	if !strings.Contains(flat, "ctx 64/64 (KV budget)") {
		t.Errorf("the status bar lacks ⚠ ctx 64/64 (KV budget):\n%s", s)
	}
	if !strings.Contains(flat, "has filled the KV cache (64 tokens; kv_budget sets its size)") {
		t.Errorf("no notice naming the KV cache:\n%s", s)
	}
	tm.send("C-n") // a new chat: its context is empty
	tm.waitFor("the second chat", func(s string) bool { return strings.Contains(s, "New chat 2 of 2") })
	tm.line("Give me a synonym for happy, and explain it in detail with examples please.")
	tm.waitFor("the message put back", func(s string) bool { return strings.Contains(s, "does not fit the context") })
	tm.line("/quit")
	tm.waitFor("the program to exit", func(s string) bool { return s == "" })
}
