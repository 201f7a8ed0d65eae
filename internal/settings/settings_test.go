package settings

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/adrg/xdg"
)

func TestMissingFileIsDefaults(t *testing.T) {
	c, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sampling != Default().Sampling || c.MTP != Default().MTP || !c.Mouse || c.Theme != "auto" {
		t.Errorf("config = %+v", c)
	}
}

func TestParseEveryKey(t *testing.T) {
	src := `
default_model = "Qwen/Qwen3-0.6B"
model_dirs = ["~/models", "/srv/models"]
system_prompt = "Be brief."
theme = "light"
mouse = false
autosave = false
history = false

[sampling]
temperature = 0.2
top_p = 0.9
top_k = 20
min_p = 0.0
repeat_penalty = 1.1
seed = 7
max_tokens = 300

[mtp]
mode = "off"
draft = 2

[engine]
device = "cuda:1"
threads = 4
kv_budget = "512MiB"
batch_tokens = 256
max_seqs = 8
`
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		DefaultModel: "Qwen/Qwen3-0.6B", ModelDirs: []string{"~/models", "/srv/models"}, SystemPrompt: "Be brief.",
		Theme: "light", Mouse: false, Autosave: false, History: false,
		Sampling: Sampling{Temperature: 0.2, TopP: 0.9, TopK: 20, MinP: 0, RepeatPenalty: 1.1, Seed: 7, MaxTokens: 300},
		MTP:      MTP{Mode: "off", Draft: 2},
		Engine:   Engine{Device: "cuda:1", Threads: 4, KVBudget: 512 << 20, BatchTokens: 256, MaxSeqs: 8},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("config =\n%+v\nwant\n%+v", c, want)
	}
}

func TestPartialFileKeepsDefaults(t *testing.T) {
	c, err := Parse([]byte("[sampling]\ntemperature = 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	d.Sampling.Temperature = 0
	if c.Sampling != d.Sampling || c.Engine != d.Engine || c.MTP != d.MTP || !c.Mouse {
		t.Errorf("config = %+v", c)
	}
}

func TestBadFilesReportLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string // each must appear in the error
	}{
		{"syntax", "theme = \"dark\"\n[sampling]\ntemperature = \n", []string{"line 3", "sampling.temperature"}},
		{"type", "[sampling]\n\ntop_k = \"many\"\n", []string{"line 3", "sampling.top_k", "incompatible types"}},
		{"range", "# comment\n[sampling]\ntemperature = 9\n", []string{"line 3: sampling.temperature: 9 is out of range [0, 5]"}},
		{"unknown", "[sampling]\ntemprature = 1\n", []string{"line 2: sampling.temprature: unknown key (did you mean sampling.temperature?)"}},
		{"wrong table", "temperature = 1\n", []string{"line 1: temperature: unknown key (did you mean sampling.temperature?)"}},
		{"enum", "[mtp]\nmode = \"sometimes\"\n", []string{"line 2: mtp.mode", "want auto, on, off"}},
		{"draft", "[mtp]\ndraft = 40\n", []string{"line 2: mtp.draft: 40 is out of range [1, 16]"}},
		{"size", "[engine]\nkv_budget = \"lots\"\n", []string{"line 2", "engine.kv_budget", "not a size"}},
		{"negative", "[engine]\nthreads = -1\nmax_seqs = -2\n", []string{"line 2: engine.threads", "line 3: engine.max_seqs"}},
		{"device", "[engine]\ndevice = \"tpu\"\n", []string{"line 2: engine.device", "want auto, cpu, cuda or cuda:N"}},
		{"dotted", "sampling.min_p = 3\n", []string{"line 1: sampling.min_p: 3 is out of range"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.src))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want an *Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if c.Sampling != Default().Sampling || c.MTP != Default().MTP || c.Engine != Default().Engine {
				t.Errorf("a bad file was not ignored: %+v", c)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[sampling]\ntop_p = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+" is ignored: line 2: sampling.top_p") {
		t.Fatalf("err = %v", err)
	}
	if c.Sampling.TopP != Default().Sampling.TopP {
		t.Error("not the defaults")
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"4096": 4096, "2GiB": 2 << 30, "512 MiB": 512 << 20, "1.5GB": 1500000000, "64k": 64 << 10, "10B": 10,
	} {
		got, err := ParseByteSize(in)
		if err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-1GiB", "GiB"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) did not fail", bad)
		}
	}
	c, err := Parse([]byte("[engine]\nkv_budget = 268435456\n"))
	if err != nil || c.Engine.KVBudget != 256<<20 {
		t.Errorf("integer kv_budget: %v, %v", c.Engine.KVBudget, err)
	}
	if s := ByteSize(3 << 30).String(); s != "3GiB" {
		t.Errorf("String() = %q", s)
	}
}

func TestDefaultPathFollowsXDG(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/tmp/xdg-config-test")
	xdg.Reload()
	t.Cleanup(xdg.Reload)
	if got := DefaultPath(); got != "/tmp/xdg-config-test/ferrite/config.toml" {
		t.Errorf("DefaultPath() = %q", got)
	}
}

// TestREADMEExample parses the example config.toml of the README's chat
// section, and checks that the README documents every key.
func TestREADMEExample(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	_, chat, ok := strings.Cut(readme, "## The chat")
	if !ok {
		t.Skip("README has no chat section yet")
	}
	if i := strings.Index(chat, "\n## "); i >= 0 {
		chat = chat[:i]
	}
	m := regexp.MustCompile("(?s)```toml\n(.*?)```").FindStringSubmatch(chat)
	if m == nil {
		t.Fatal("the chat section has no toml example")
	}
	if _, err := Parse([]byte(m[1])); err != nil {
		t.Fatalf("the README's example does not parse: %v", err)
	}
	for _, k := range knownKeys {
		name := k[strings.LastIndexByte(k, '.')+1:]
		if !strings.Contains(chat, "`"+name+"`") && !strings.Contains(chat, "`"+k+"`") {
			t.Errorf("the README's chat section does not document %s", k)
		}
	}
}
