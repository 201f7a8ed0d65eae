package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// writeModel makes a model directory: a config.json of arch and a
// safetensors file of n bytes.
func writeModel(t *testing.T, dir, arch string, n int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "config.json"), `{"model_type": "`+arch+`"}`)
	write(t, filepath.Join(dir, "model.safetensors"), strings.Repeat("x", n))
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeHubModel lays out models--org--name the way huggingface_hub does:
// blobs, a snapshot of symbolic links to them, and refs/main.
func writeHubModel(t *testing.T, hub, repo, rev, arch string, n int) string {
	t.Helper()
	base := filepath.Join(hub, "models--"+strings.ReplaceAll(repo, "/", "--"))
	blobs := filepath.Join(base, "blobs")
	snap := filepath.Join(base, "snapshots", rev)
	write(t, filepath.Join(blobs, rev+"-config"), `{"model_type": "`+arch+`"}`)
	write(t, filepath.Join(blobs, rev+"-weights"), strings.Repeat("w", n))
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	for link, blob := range map[string]string{"config.json": rev + "-config", "model.safetensors": rev + "-weights"} {
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, link)); err != nil {
			t.Fatal(err)
		}
	}
	return snap
}

func TestDiscoverEveryPlace(t *testing.T) {
	root := t.TempDir()
	hub := filepath.Join(root, "hub")
	own := filepath.Join(root, "ferrite-models")
	cfgDir := filepath.Join(root, "mine")

	// The config names one model directory and one folder of models.
	single := filepath.Join(root, "single-model")
	writeModel(t, single, "llama", 100)
	writeModel(t, filepath.Join(cfgDir, "alpha"), "qwen3", 10)
	write(t, filepath.Join(cfgDir, "notes.txt"), "not a model")
	if err := os.MkdirAll(filepath.Join(cfgDir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}

	// Two revisions in the HF cache: refs/main picks the older one.
	oldSnap := writeHubModel(t, hub, "Qwen/Qwen3-0.6B", "aaa", "qwen3", 1000)
	writeHubModel(t, hub, "Qwen/Qwen3-0.6B", "bbb", "qwen3", 2000)
	write(t, filepath.Join(hub, "models--Qwen--Qwen3-0.6B", "refs", "main"), "aaa\n")
	// No refs: the newest snapshot.
	writeHubModel(t, hub, "zai-org/GLM-4.7-Flash", "old", "glm4_moe_lite", 10)
	newSnap := writeHubModel(t, hub, "zai-org/GLM-4.7-Flash", "new", "glm4_moe_lite", 20)
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(hub, "models--zai-org--GLM-4.7-Flash", "snapshots", "old"), past, past); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(hub, "datasets--x--y", "snapshots"), 0o755); err != nil {
		t.Fatal(err)
	}

	writeModel(t, filepath.Join(own, "tiny"), "mixtral", 5)
	// A model without weights is listed with its problem.
	write(t, filepath.Join(own, "broken", "config.json"), `{"model_type": "llama"}`)

	builtin := Entry{Name: "ferrite-tiny", Arch: "glm5_next", Size: 42,
		Open: func(engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
			return nil, nil, errors.New("not here")
		}}
	got, errs := Discover(Options{
		Builtin:     []Entry{builtin},
		Dirs:        []string{single, cfgDir, filepath.Join(root, "missing")},
		HubDir:      hub,
		FerriteDir:  own,
		OllamaDir:   filepath.Join(root, "no-ollama"),
		LMStudioDir: filepath.Join(root, "no-lmstudio"),
	})
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	type row struct {
		name, arch, source, dir string
		size                    int64
		problem                 bool
	}
	want := []row{
		{"ferrite-tiny", "glm5_next", SourceBuiltin, "", 42, false},
		{"single-model", "llama", SourceConfig, single, 100 + int64(len(`{"model_type": "llama"}`)), false},
		{"alpha", "qwen3", SourceConfig, filepath.Join(cfgDir, "alpha"), 10 + int64(len(`{"model_type": "qwen3"}`)), false},
		{"Qwen/Qwen3-0.6B", "qwen3", SourceHFCache, oldSnap, 1000 + int64(len(`{"model_type": "qwen3"}`)), false},
		{"zai-org/GLM-4.7-Flash", "glm4_moe_lite", SourceHFCache, newSnap, 20 + int64(len(`{"model_type": "glm4_moe_lite"}`)), false},
		{"broken", "llama", SourceFerrite, filepath.Join(own, "broken"), int64(len(`{"model_type": "llama"}`)), true},
		{"tiny", "mixtral", SourceFerrite, filepath.Join(own, "tiny"), 5 + int64(len(`{"model_type": "mixtral"}`)), false},
	}
	if len(got) != len(want) {
		for _, e := range got {
			t.Logf("%+v", e)
		}
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i, w := range want {
		e := got[i]
		r := row{e.Name, e.Arch, e.Source, e.Dir, e.Size, e.Problem != ""}
		if r != w {
			t.Errorf("entry %d = %+v, want %+v", i, r, w)
		}
	}
	if got[0].Open == nil {
		t.Error("the built-in entry lost its Open")
	}
}

func TestDiscoverListsADirectoryOnce(t *testing.T) {
	root := t.TempDir()
	own := filepath.Join(root, "own")
	writeModel(t, filepath.Join(own, "m"), "llama", 1)
	got, _ := Discover(Options{Dirs: []string{own}, HubDir: filepath.Join(root, "nohub"), FerriteDir: own,
		OllamaDir: filepath.Join(root, "none"), LMStudioDir: filepath.Join(root, "none")})
	if len(got) != 1 || got[0].Source != SourceConfig {
		t.Fatalf("entries = %+v", got)
	}
}

func TestHubCacheDir(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "/srv/hf")
	if got := HubCacheDir(); got != "/srv/hf/hub" {
		t.Errorf("with HF_HOME: %q", got)
	}
	t.Setenv("HF_HUB_CACHE", "/srv/hub")
	if got := HubCacheDir(); got != "/srv/hub" {
		t.Errorf("with HF_HUB_CACHE: %q", got)
	}
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "/tmp/xdg-cache-test")
	xdg.Reload()
	t.Cleanup(xdg.Reload)
	if got := HubCacheDir(); got != "/tmp/xdg-cache-test/huggingface/hub" {
		t.Errorf("default: %q", got)
	}
}

func TestFind(t *testing.T) {
	list := []Entry{
		{Name: "ferrite-tiny"},
		{Name: "Qwen/Qwen3-0.6B"},
		{Name: "Qwen/Qwen3-8B"},
		{Name: "llama-2"},
	}
	for _, tc := range []struct{ q, want, err string }{
		{"ferrite-tiny", "ferrite-tiny", ""},
		{"qwen/qwen3-8b", "Qwen/Qwen3-8B", ""},
		{"Qwen3-0.6B", "Qwen/Qwen3-0.6B", ""},
		{"tiny", "ferrite-tiny", ""},
		{"2", "Qwen/Qwen3-0.6B", ""}, // its position, not the substring of llama-2
		{"qwen", "", "matches 2 models"},
		{"gpt", "", `no model "gpt"; known: Qwen/Qwen3-0.6B, Qwen/Qwen3-8B, ferrite-tiny, llama-2`},
	} {
		e, err := Find(list, tc.q)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Find(%q) = %v, %v; want error %q", tc.q, e.Name, err, tc.err)
			}
			continue
		}
		if err != nil || e.Name != tc.want {
			t.Errorf("Find(%q) = %q, %v; want %q", tc.q, e.Name, err, tc.want)
		}
	}
	if _, err := Find(nil, "x"); err == nil || !strings.Contains(err.Error(), "no models were found") {
		t.Errorf("empty list: %v", err)
	}
}

func TestProbe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	writeModel(t, dir, "qwen3", 3)
	e, err := Probe(dir)
	if err != nil || e.Name != "m" || e.Arch != "qwen3" || e.Source != SourcePath || e.Problem != "" {
		t.Fatalf("Probe = %+v, %v", e, err)
	}
	if _, err := Probe(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("Probe of an empty dir: %v", err)
	}
	if _, err := Probe(filepath.Join(dir, "model.safetensors")); err == nil {
		t.Error("Probe of a file did not fail")
	}
}

func TestLooksLikePath(t *testing.T) {
	for s, want := range map[string]bool{"/m": true, "./m": true, "../m": true, "~/m": true, ".": true, "Qwen/Qwen3": false, "tiny": false} {
		if LooksLikePath(s) != want {
			t.Errorf("LooksLikePath(%q) = %v", s, !want)
		}
	}
}

func TestLoadUsesOpen(t *testing.T) {
	called := false
	e := Entry{Name: "b", Open: func(engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
		called = true
		return nil, nil, errors.New("fake")
	}}
	if _, _, err := Load(e, engine.Options{}); err == nil || !called {
		t.Errorf("Load did not use Open: %v", err)
	}
	if _, _, err := Load(Entry{Name: "x"}, engine.Options{}); err == nil {
		t.Error("an entry with nothing to load loaded")
	}
}

// TestRecommended: the store's sampling (ollama's params) wins over what
// the model's files recommend, key by key, and a store temperature
// undoes a do_sample false (greedy: temperature 0).
func TestRecommended(t *testing.T) {
	dir := t.TempDir()
	if err := fixtures.WriteByteTokenizer(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"do_sample": false, "top_k": 5}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := (Entry{}).Recommended(tok); s.Temperature == nil || *s.Temperature != 0 || s.TopK != nil {
		t.Errorf("no store sampling: %+v, want the files' do_sample false: temperature 0", s)
	}
	temp, topP, topK := 0.6, 0.9, 7
	s := Entry{Sampling: tokenizer.Sampling{Temperature: &temp, TopP: &topP}}.Recommended(tok)
	if s.Temperature == nil || *s.Temperature != 0.6 || s.TopP == nil || *s.TopP != 0.9 {
		t.Errorf("store temperature 0.6, top_p 0.9 over the files': %+v", s)
	}
	if s := (Entry{Sampling: tokenizer.Sampling{TopK: &topK}}).Recommended(tok); s.Temperature == nil || *s.Temperature != 0 || *s.TopK != 7 {
		t.Errorf("store top_k 7 beside the files' greedy: %+v", s)
	}
}
