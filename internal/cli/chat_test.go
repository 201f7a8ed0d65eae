package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/tokenizer"
	"github.com/ferrite-llm/ferrite/ui"
)

func TestHelpListsEverything(t *testing.T) {
	code, out, _ := runCLI(t, "", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"ferrite run", "-model", "-temperature", "-mtp", "-draft", "-kv-budget", "-threads",
		"-batch-tokens", "-max-seqs", "-config", "-no-save", "-no-history", "-no-mouse", "-theme",
		"config.toml", "[sampling]", "/model", "/models", "/regen", "/pick", "/chats", "/set names:",
		"ctrl+n new chat", "shift+← previous alternative",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// parseChat parses chat flags over a configuration file's contents.
func parseChat(t *testing.T, config string, args ...string) (settings.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var f cmdFlags
	fs := newFlagSet("ferrite", chatScope, &f)
	if err := fs.Parse(append([]string{"--config", path}, args...)); err != nil {
		return settings.Config{}, err
	}
	cfg, warn, err := f.loadConfig(fs)
	if warn != nil {
		t.Fatal(warn)
	}
	return cfg, err
}

func TestFlagsWinOverTheConfig(t *testing.T) {
	conf := `
default_model = "from-config"
mouse = true
[sampling]
temperature = 0.2
top_k = 5
max_tokens = 100
[mtp]
mode = "off"
draft = 4
[engine]
kv_budget = "256MiB"
max_seqs = 4
quant = "q4_k"
`
	cfg, err := parseChat(t, conf, "--temperature", "0.9", "--kv-budget", "1GiB", "--max-seqs", "2", "--no-mouse", "--mtp", "on", "--quant", "q8_0")
	if err != nil {
		t.Fatal(err)
	}
	// Set flags win; the others keep the file's values, not the flags' defaults.
	if cfg.Sampling.Temperature != 0.9 || cfg.Sampling.TopK != 5 || cfg.Sampling.MaxTokens != 100 {
		t.Errorf("sampling = %+v", cfg.Sampling)
	}
	if cfg.Engine.KVBudget != 1<<30 || cfg.Engine.MaxSeqs != 2 || cfg.Mouse || cfg.MTP.Mode != "on" || cfg.MTP.Draft != 4 || cfg.DefaultModel != "from-config" {
		t.Errorf("config = %+v", cfg)
	}
	if cfg.Engine.Quant != "q8_0" {
		t.Errorf("--quant q8_0 lost: engine = %+v", cfg.Engine)
	}
	if cfg, err := parseChat(t, conf); err != nil || cfg.Engine.Quant != "q4_k" {
		t.Errorf("[engine] quant lost: engine = %+v, %v", cfg.Engine, err)
	}
	for _, bad := range [][]string{{"--theme", "pink"}, {"--kv-budget", "lots"}, {"--temperature", "9"}, {"--draft", "0"}, {"--quant", "q3_k"}} {
		if _, err := parseChat(t, "", bad...); err == nil || !strings.Contains(err.Error(), bad[0][2:]) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// TestFlagsAgreeWithTheTable: every flag of a setting, in the chat and in
// run, shows the table's default, and reads values with the table's
// parser; the help shows the same defaults.
func TestFlagsAgreeWithTheTable(t *testing.T) {
	for _, sc := range []scope{chatScope, runScope} {
		var f cmdFlags
		fs := newFlagSet("x", sc, &f)
		n := 0
		fs.VisitAll(func(fl *flag.Flag) {
			s := settings.ByFlag(fl.Name)
			if s == nil {
				if !slices.Contains([]string{"config", "log", "raw", "endpoint"}, fl.Name) {
					t.Errorf("flag --%s is neither a setting nor a known command flag", fl.Name)
				}
				return
			}
			n++
			if s.Kind != settings.Bool && fl.DefValue != s.Format(s.Default) {
				t.Errorf("--%s default %q, table %q", fl.Name, fl.DefValue, s.Format(s.Default))
			}
			if _, ok := fl.Value.(settingFlag); !ok {
				t.Errorf("--%s does not use the table's parser", fl.Name)
			}
		})
		want := 0
		for _, s := range settings.Table {
			if s.Flag != "" && (sc == chatScope || s.Run) {
				want++
			}
		}
		if n != want {
			t.Errorf("scope %d: %d setting flags, the table has %d", sc, n, want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"run", "--help"}} {
		code, out, _ := runCLI(t, "", args...)
		if code != 0 || !strings.Contains(out, "--max-tokens N\n        longest reply in tokens; 0 is until the context is full (≥ 0; default 2048)") {
			t.Errorf("%v: exit %d, help lacks max-tokens' default 2048:\n%s", args, code, out)
		}
	}
	_, out, _ := runCLI(t, "", "run", "--help")
	if !strings.HasPrefix(out, "usage: ferrite run [flags] [TEXT]") || strings.Contains(out, "run --model DIR") {
		t.Errorf("run's usage:\n%s", out)
	}
}

func TestPipedChatUsesTheConfig(t *testing.T) {
	dir := fixtureModel(t, "llama")
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte("default_model = \""+dir+"\"\n[sampling]\ntemperature = 0\nmax_tokens = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "hello", "--config", cfgPath)
	if code != 0 || out == "" || !strings.Contains(errs, "decode: 3 tokens") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// So does run.
	code, _, errs = runCLI(t, "hello", "run", "--config", cfgPath)
	if code != 0 || !strings.Contains(errs, "decode: 3 tokens") {
		t.Fatalf("run: exit %d, stderr %q", code, errs)
	}

	// A bad file is reported with its line and key, and ignored.
	if err := os.WriteFile(cfgPath, []byte("[sampling]\ntemperature = \"hot\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI(t, "hello", "--config", cfgPath, "--model", dir, "--max-tokens", "2")
	if code != 0 || !strings.Contains(errs, "warning: "+cfgPath+" is ignored: line 2: sampling.temperature") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	// A file --config names must exist.
	missing := filepath.Join(t.TempDir(), "nope.toml")
	for _, cmd := range [][]string{{"run"}, {}, {"tokenize"}} {
		code, _, errs = runCLI(t, "hello", append(cmd, "--config", missing)...)
		if code != 2 || !strings.Contains(errs, "--config "+missing+": no such file") {
			t.Errorf("%v: exit %d, stderr %q", cmd, code, errs)
		}
	}
}

func TestNoModelSaysWhatToDo(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("OLLAMA_MODELS", t.TempDir())
	t.Setenv("HOME", t.TempDir()) // no LM Studio folder
	c := &chatModels{cfg: settings.Default()}
	if _, err := c.resolve(""); err == nil || !strings.Contains(err.Error(), "no model: give --model") {
		t.Errorf("err = %v", err)
	}
	c.builtin = []catalog.Entry{{Name: "ferrite-tiny", Source: catalog.SourceBuiltin}}
	if e, err := c.resolve(""); err != nil || e.Name != "ferrite-tiny" {
		t.Errorf("default without a name: %+v, %v", e, err)
	}
}

// TestQuantReachesTheEngine: engine.quant is the engine's Options.Quant
// for the built-in model and a model directory alike (run and the chat
// both load through chatModels), and its choices are the engine's.
func TestQuantReachesTheEngine(t *testing.T) {
	if want := append([]string{""}, engine.QuantTypes...); !slices.Equal(settings.Lookup("engine.quant").Choices, want) {
		t.Errorf("engine.quant's choices %q, the engine's %q", settings.Lookup("engine.quant").Choices, want)
	}
	cfg := settings.Default()
	cfg.Engine.Quant = "int4" // the flags and the file reject it: only the engine can have said so
	c := &chatModels{cfg: cfg}
	for _, e := range []catalog.Entry{builtinEntry(), {Name: "qwen3", Dir: fixtureModel(t, "qwen3")}} {
		if _, err := c.openSession(context.Background(), e, openMode{strict: true}, func(string) {}); err == nil || !strings.Contains(err.Error(), `unknown quantization "int4"`) {
			t.Errorf("%s with quant int4: %v, want the engine's error", e.Name, err)
		}
	}
}

func TestChatModelsListsAndLoads(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("OLLAMA_MODELS", t.TempDir())
	t.Setenv("HOME", t.TempDir()) // no LM Studio folder
	root := t.TempDir()
	for _, name := range []string{"qwen3", "qwen3_next"} {
		if err := os.Rename(fixtureModel(t, name), filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	broken := filepath.Join(root, "broken")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "config.json"), []byte(`{"model_type": "llama"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := settings.Default()
	cfg.ModelDirs = []string{root}
	cfg.Engine.KVBudget = 4 << 20
	cfg.MTP.Mode = "auto" // drafting is off by default; auto turns it on for qwen3_next's MTP module
	c := &chatModels{cfg: cfg}
	ctx := context.Background()
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Name+":"+e.Arch)
	}
	if got := strings.Join(names, " "); got != "broken:llama qwen3:qwen3 qwen3_next:qwen3_next" {
		t.Fatalf("list = %s", got)
	}

	var stages []string
	e, err := c.Find(ctx, "qwen3_next")
	if err != nil {
		t.Fatal(err)
	}
	eng, closer, err := c.Load(ctx, e, ui.LoadOptions{}, func(s string) { stages = append(stages, s) })
	if err != nil {
		t.Fatal(err)
	}
	info := eng.Info()
	if info.Name != "qwen3_next" || info.Arch != "qwen3_next" || !info.MTP || info.Draft != 3 || info.MaxContext == 0 {
		t.Errorf("info = %+v", info)
	}
	if strings.Join(stages, ",") != "reading the tokenizer,mapping the weights,starting the runtime" {
		t.Errorf("stages = %q", stages)
	}
	// A reply's Draft reaches the runtime, and its MTP counts come back.
	for _, draft := range []int{2, -1} {
		r, err := eng.Send(ctx, ui.Request{
			Messages: []tokenizer.Message{{Role: "user", Content: "hello"}},
			Settings: ui.Settings{MaxTokens: 8, Draft: draft},
		})
		if err != nil {
			t.Fatal(err)
		}
		var last ui.Event
		for {
			ev, ok := r.Next()
			if !ok {
				break
			}
			last = ev
		}
		if last.Kind != ui.EventDone {
			t.Fatalf("draft %d: final event %+v", draft, last)
		}
		if got := last.Usage.DraftTokens > 0; got != (draft > 0) {
			t.Errorf("draft %d: usage %+v", draft, last.Usage)
		}
	}
	if st := eng.Stats(); st.DraftTokens == 0 || st.AcceptRate < 0 || st.AcceptRate > 1 {
		t.Errorf("stats = %+v", st)
	}
	// The model's memory reaches the chat: on the CPU, host weights.
	if m := eng.Stats().Memory; m.OnDevice || m.Weights == 0 {
		t.Errorf("memory = %+v, want the model's weights in host RAM", m)
	}
	if err := closer.Close(); err != nil {
		t.Fatal(err)
	}

	// A model without weights fails to load with the reason.
	be, _ := c.Find(ctx, "broken")
	if _, _, err := c.Load(ctx, be, ui.LoadOptions{}, func(string) {}); err == nil {
		t.Error("the broken model loaded")
	}
	// A cancelled load gives up.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := c.Load(cctx, e, ui.LoadOptions{}, func(string) {}); err == nil {
		t.Error("a cancelled load succeeded")
	}
	// mtp = "on" refuses a model without MTP at start, not when switching.
	cfg.MTP.Mode = "on"
	c = &chatModels{cfg: cfg}
	qe, _ := c.find("qwen3")
	if _, _, err := c.open(ctx, qe, openMode{strict: true}, func(string) {}); err == nil || !strings.Contains(err.Error(), "no MTP module") {
		t.Errorf("strict: %v", err)
	}
	eng, closer, err = c.open(ctx, qe, openMode{}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if eng.Info().MTP || eng.Info().Draft != 0 {
		t.Errorf("info = %+v", eng.Info())
	}
	closer.Close()
}

// TestNoRoom: a load that found too little device memory becomes
// ui.ErrNoRoom with the numbers (the chat's /model makes room on it);
// other failures stay as they are.
func TestNoRoom(t *testing.T) {
	dme := &engine.DeviceMemoryError{Device: "cuda:0 NVIDIA H200", Need: 15 << 30, Free: 7 << 29}
	err := noRoom(fmt.Errorf("%w: run it on the CPU (--device cpu) or pick a smaller or quantized model", dme))
	if !errors.Is(err, ui.ErrNoRoom) || err.Error() != "no room on the device: the weights take 15.0 GiB and cuda:0 NVIDIA H200 has 3.5 GiB free" {
		t.Errorf("noRoom(device memory) = %v", err)
	}
	if err := noRoom(errors.New("no .safetensors weights")); errors.Is(err, ui.ErrNoRoom) || err.Error() != "no .safetensors weights" {
		t.Errorf("noRoom(other) = %v", err)
	}
	if noRoom(nil) != nil {
		t.Error("noRoom(nil) is not nil")
	}
}
