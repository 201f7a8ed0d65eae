package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/internal/hub"
)

// ggufFile writes a chat-ready F32 GGUF file of a fixture into dir.
func ggufFile(t *testing.T, fixture, dir, name string) string {
	t.Helper()
	w, err := ggufwrite.ConvertWithTokenizer(fixtures.Dir(fixture), ggufwrite.F32)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGGUFCommands runs run, tokenize, bench and the piped chat on GGUF
// files: by path, by folder, and by the name ollama gives a model in its
// store.
func TestGGUFCommands(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	store := filepath.Join(home, "ollama")
	t.Setenv("OLLAMA_MODELS", store)
	dir := t.TempDir()
	file := ggufFile(t, "qwen3", dir, "qwen3-tiny.gguf")
	for _, m := range []string{file, dir} {
		code, out, errs := runCLI(t, "", "run", "--model", m, "--temperature", "0", "--max-tokens", "3", "hello")
		if code != 0 || out == "" || !strings.Contains(errs, "decode: 3 tokens") {
			t.Fatalf("run --model %s: exit %d, stdout %q, stderr %q", m, code, out, errs)
		}
	}
	code, out, errs := runCLI(t, "", "tokenize", "--model", file, "<|im_start|>the")
	if code != 0 || strings.TrimSpace(out) != "262 116 257" {
		t.Errorf("tokenize: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = runCLI(t, "", "bench", "--model", file, "--concurrency", "1", "--prompt-len", "4", "--gen-len", "2", "--bandwidth", "10")
	if code != 0 || !strings.Contains(out, "GGUF F32") {
		t.Errorf("bench: exit %d\n%s\n%s", code, out, errs)
	}

	// A model in ollama's store, run by its ollama name.
	blob := "sha256-" + strings.Repeat("ab", 32)
	ggufFile(t, "llama", filepath.Join(store, "blobs"), blob)
	manifest := filepath.Join(store, "manifests", "registry.ollama.ai", "library", "llama-tiny", "latest")
	if err := os.MkdirAll(filepath.Dir(manifest), 0o755); err != nil {
		t.Fatal(err)
	}
	m := `{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:` + strings.Repeat("ab", 32) + `"}]}`
	if err := os.WriteFile(manifest, []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--model", "llama-tiny"}, {"run", "--model", "llama-tiny:latest"}} {
		args = append(args, "--temperature", "0", "--max-tokens", "2")
		code, out, errs = runCLI(t, "hi", args...)
		if code != 0 || out == "" || !strings.Contains(errs, "decode: 2 tokens") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	code, out, errs = runCLI(t, "", "tokenize", "--model", "llama-tiny", "<|im_end|>")
	if code != 0 || strings.TrimSpace(out) != "263" {
		t.Errorf("tokenize --model llama-tiny: exit %d, %q %q", code, out, errs)
	}
}

// TestPullSummaryGGUF checks that a pulled GGUF model is offered to chat
// with, and that one ferrite cannot run says why.
func TestPullSummaryGGUF(t *testing.T) {
	dir := t.TempDir()
	ggufFile(t, "qwen3", dir, "Tiny-Q8_0.gguf")
	ref := hub.Ref{Repo: "acme/Tiny-GGUF", Revision: "main", Quant: "Q8_0"}
	res := hub.Result{Ref: ref, Commit: strings.Repeat("c", 40), Dir: dir, Files: []string{"Tiny-Q8_0.gguf"}, GGUF: true}
	got := pullSummary(ref, res)
	if want := "chat with it: ferrite --model " + filepath.Join(dir, "Tiny-Q8_0.gguf"); !strings.Contains(got, want) || strings.Contains(got, "warning") {
		t.Errorf("summary %q, want %q", got, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "Tiny-Q8_0.gguf"), []byte("GGUF\x03\x00\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := pullSummary(ref, res); !strings.Contains(got, "warning: ") || !strings.Contains(got, "truncated") {
		t.Errorf("summary of a broken file %q", got)
	}
}
