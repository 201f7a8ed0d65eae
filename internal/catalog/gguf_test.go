package catalog

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// ggufModel returns the bytes of a chat-ready GGUF file of a fixture.
func ggufModel(t *testing.T, fixture string, typ uint32) []byte {
	t.Helper()
	w, err := ggufwrite.ConvertWithTokenizer(fixtures.Dir(fixture), typ)
	if err != nil {
		t.Fatal(err)
	}
	return w.Bytes()
}

// writeBytes writes data to path, making its folders.
func writeBytes(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ollamaModel lays out one model in a fake ollama store: its blobs and the
// manifest manifests/<host>/<ns>/<model>/<tag> naming them.
func ollamaModel(t *testing.T, store, host, ns, model, tag string, layers map[string][]byte) {
	t.Helper()
	var ls []string
	for media, data := range layers {
		sum := sha256.Sum256(append([]byte(model+tag+media), data...))
		hex := fmt.Sprintf("%x", sum)
		if data != nil {
			writeBytes(t, filepath.Join(store, "blobs", "sha256-"+hex), data)
		}
		ls = append(ls, `{"mediaType":"`+media+`","digest":"sha256:`+hex+`","size":1}`)
	}
	manifest := `{"schemaVersion":2,"layers":[` + strings.Join(ls, ",") + `]}`
	writeBytes(t, filepath.Join(store, "manifests", host, ns, model, tag), []byte(manifest))
}

// unsupportedGGUF is a valid GGUF file of an architecture ferrite lacks.
func unsupportedGGUF(arch string) []byte {
	w := &ggufwrite.Writer{}
	w.Add("general.architecture", arch)
	w.Tensors = []ggufwrite.Tensor{{Name: "token_embd.weight", Type: ggufwrite.F32, Dims: []uint64{4, 2}, Data: make([]byte, 32)}}
	return w.Bytes()
}

// greedy runs a few greedy steps of a chat prompt through a loaded model.
func greedy(t *testing.T, l *engine.Loaded, tok *tokenizer.Tokenizer, steps int) []int32 {
	t.Helper()
	text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "hi there"}}, tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(text, false)
	c, err := l.NewCache(1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSeq()
	var out []int32
	step := func(s *kvcache.Seq, toks []int32) int32 {
		pos := s.Len()
		if err := c.Reserve(s, pos+len(toks)); err != nil {
			t.Fatal(err)
		}
		o, err := l.Model.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: s, Logits: model.LastLogits}}})
		if err != nil {
			t.Fatal(err)
		}
		best := 0
		for i, v := range o.Seqs[0].Logits {
			if v > o.Seqs[0].Logits[best] {
				best = i
			}
		}
		return int32(best)
	}
	next := step(s, ids)
	for range steps {
		out = append(out, next)
		next = step(s, []int32{next})
	}
	return out
}

// TestDiscoverOtherTools builds a fake ollama store, LM Studio folder, HF
// cache with GGUF repositories and model_dirs holding GGUF files, and
// checks what is listed and that every runnable entry loads and generates.
func TestDiscoverOtherTools(t *testing.T) {
	root := t.TempDir()
	qwen := ggufModel(t, "qwen3", ggufwrite.F16)
	llama := ggufModel(t, "llama", ggufwrite.F32)

	ollama := filepath.Join(root, "ollama")
	ollamaModel(t, ollama, "registry.ollama.ai", "library", "qwen3-tiny", "latest", map[string][]byte{
		"application/vnd.ollama.image.model":    qwen,
		"application/vnd.ollama.image.template": []byte("{{ .Prompt }}"),
		"application/vnd.ollama.image.params":   []byte(`{"repeat_penalty":1,"stop":["<|im_start|>","<|im_end|>"],"temperature":0.6,"top_k":20,"top_p":0.95}`),
	})
	ollamaModel(t, ollama, "registry.ollama.ai", "someone", "llama-tiny", "1b", map[string][]byte{
		"application/vnd.ollama.image.model": llama,
	})
	ollamaModel(t, ollama, "hf.co", "org", "repo", "Q4", map[string][]byte{
		"application/vnd.ollama.image.tensor": []byte("not gguf"),
	})
	ollamaModel(t, ollama, "registry.ollama.ai", "library", "gone", "latest", map[string][]byte{
		"application/vnd.ollama.image.model": nil, // blob missing
	})

	lms := filepath.Join(root, "lmstudio")
	writeBytes(t, filepath.Join(lms, "pub", "Qwen3-Tiny-GGUF", "Qwen3-Tiny-F16.gguf"), qwen)
	writeBytes(t, filepath.Join(lms, "pub", "Qwen3-Tiny-GGUF", "mmproj-Qwen3-Tiny-F16.gguf"), unsupportedGGUF("clip"))
	writeBytes(t, filepath.Join(lms, "pub", "Gemma-GGUF", "gemma.gguf"), unsupportedGGUF("gemma3"))

	hub := filepath.Join(root, "hub")
	snap := filepath.Join(hub, "models--org--Llama-Tiny-GGUF", "snapshots", "rev1")
	writeBytes(t, filepath.Join(hub, "models--org--Llama-Tiny-GGUF", "blobs", "b1"), llama)
	if err := os.MkdirAll(filepath.Join(snap, "F32"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", "..", "..", "blobs", "b1"), filepath.Join(snap, "F32", "llama-tiny-f32.gguf")); err != nil {
		t.Fatal(err)
	}
	writeBytes(t, filepath.Join(hub, "models--org--Llama-Tiny-GGUF", "refs", "main"), []byte("rev1"))

	mine := filepath.Join(root, "mine")
	writeBytes(t, filepath.Join(mine, "qwen3-f16.gguf"), qwen)
	writeBytes(t, filepath.Join(mine, "truncated.gguf"), qwen[:1000])
	writeBytes(t, filepath.Join(mine, "folder", "llama.gguf"), llama)

	got, errs := Discover(Options{Dirs: []string{mine}, HubDir: hub, FerriteDir: filepath.Join(root, "none"), OllamaDir: ollama, LMStudioDir: lms})
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	type row struct{ name, arch, quant, source, problem string }
	want := []row{
		{"folder/llama", "llama", "F32", SourceConfig, ""},
		{"qwen3-f16", "qwen3", "F16", SourceConfig, ""},
		{"truncated", "", "", SourceConfig, "truncated"},
		{"org/Llama-Tiny-GGUF/F32/llama-tiny-f32", "llama", "F32", SourceHFCache, ""},
		{"hf.co/org/repo:Q4", "", "", SourceOllama, "per-tensor format"},
		{"gone:latest", "", "", SourceOllama, "missing or not a GGUF file"},
		{"qwen3-tiny:latest", "qwen3", "F16", SourceOllama, ""},
		{"someone/llama-tiny:1b", "llama", "F32", SourceOllama, ""},
		{"pub/Gemma-GGUF/gemma", "gemma3", "", SourceLMStudio, `architecture "gemma3" is not supported`},
		{"pub/Qwen3-Tiny-GGUF/Qwen3-Tiny-F16", "qwen3", "F16", SourceLMStudio, ""},
		{"pub/Qwen3-Tiny-GGUF/mmproj-Qwen3-Tiny-F16", "clip", "", SourceLMStudio, "vision projector"},
	}
	index := map[string]Entry{}
	for _, e := range got {
		index[e.Name] = e
		t.Logf("%-42s %-10s %-5s %-9s %s", e.Name, e.Arch, e.Quant, e.Source, e.Problem)
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for _, w := range want {
		e, ok := index[w.name]
		if !ok {
			t.Errorf("no entry %q", w.name)
			continue
		}
		if e.Arch != w.arch || (w.problem == "" && e.Quant != w.quant) || e.Source != w.source ||
			(w.problem == "") != (e.Problem == "") || !strings.Contains(e.Problem, w.problem) {
			t.Errorf("%s = %+v, want %+v", w.name, e, w)
		}
	}
	// ollama's params layer is the entry's recommended sampling; a model
	// without one recommends what its tokenizer does.
	if sm := index["qwen3-tiny:latest"].Sampling; sm.Temperature == nil || *sm.Temperature != 0.6 ||
		sm.TopP == nil || *sm.TopP != 0.95 || sm.TopK == nil || *sm.TopK != 20 {
		t.Errorf("qwen3-tiny:latest: sampling %+v, want ollama's params 0.6 / 0.95 / 20", sm)
	}
	if sm := index["someone/llama-tiny:1b"].Sampling; sm.Temperature != nil || sm.TopP != nil || sm.TopK != nil {
		t.Errorf("someone/llama-tiny:1b has no params layer: sampling %+v", sm)
	}
	// Names resolve as ollama users type them.
	for q, name := range map[string]string{"qwen3-tiny": "qwen3-tiny:latest", "someone/llama-tiny:1b": "someone/llama-tiny:1b", "Qwen3-Tiny-F16": "pub/Qwen3-Tiny-GGUF/Qwen3-Tiny-F16"} {
		if e, err := Find(got, q); err != nil || e.Name != name {
			t.Errorf("Find(%q) = %q, %v; want %q", q, e.Name, err, name)
		}
	}
	// Every runnable entry loads in place and generates; the others fail
	// with their reason, not a crash.
	for _, e := range got {
		l, tok, err := Load(e, engine.Options{Threads: 1})
		if e.Problem != "" {
			if err == nil {
				l.Close()
				t.Errorf("%s loaded despite %q", e.Name, e.Problem)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", e.Name, err)
			continue
		}
		if ids := greedy(t, l, tok, 3); len(ids) != 3 {
			t.Errorf("%s: generated %v", e.Name, ids)
		}
		if l.GGUF == nil || l.GGUF.Path != e.Dir {
			t.Errorf("%s: not loaded from its file in place", e.Name)
		}
		l.Close()
	}
}

func TestProbeGGUF(t *testing.T) {
	dir := t.TempDir()
	writeBytes(t, filepath.Join(dir, "m.gguf"), ggufModel(t, "qwen3", ggufwrite.F32))
	for _, p := range []string{dir, filepath.Join(dir, "m.gguf")} {
		e, err := Probe(p)
		if err != nil || e.Name != "m" || e.Arch != "qwen3" || e.Quant != "F32" || e.Dir != filepath.Join(dir, "m.gguf") {
			t.Errorf("Probe(%s) = %+v, %v", p, e, err)
		}
	}
	writeBytes(t, filepath.Join(dir, "n.gguf"), ggufModel(t, "qwen3", ggufwrite.F32))
	if _, err := Probe(dir); err == nil || !strings.Contains(err.Error(), "2 GGUF models") {
		t.Errorf("Probe of a folder of two models: %v", err)
	}
}

func TestStoreDirs(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("OLLAMA_MODELS", "")
	if got, want := OllamaModelsDir(), filepath.Join(home, ".ollama", "models"); got != want {
		t.Errorf("OllamaModelsDir() = %q, want %q", got, want)
	}
	t.Setenv("OLLAMA_MODELS", "/srv/ollama")
	if got := OllamaModelsDir(); got != "/srv/ollama" {
		t.Errorf("with OLLAMA_MODELS: %q", got)
	}
	if got, want := LMStudioModelsDir(), filepath.Join(home, ".lmstudio", "models"); got != want {
		t.Errorf("LMStudioModelsDir() = %q, want %q", got, want)
	}
	old := filepath.Join(home, ".cache", "lm-studio", "models")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := LMStudioModelsDir(); got != old {
		t.Errorf("with only the older folder: %q, want %q", got, old)
	}
}
