package settings

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/tokenizer"
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
quant = "q4_k"
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
		Engine:   Engine{Device: "cuda:1", Threads: 4, KVBudget: 512 << 20, BatchTokens: 256, MaxSeqs: 8, Quant: "q4_k"},
	}
	for _, s := range Table {
		if s.Key != "debug_log" { // the one key the file leaves out
			want.Give(s.Key)
		}
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
		{"type", "[sampling]\n\ntop_k = \"many\"\n", []string{"line 3", "sampling.top_k", `want a whole number, not a string ("many")`}},
		{"range", "# comment\n[sampling]\ntemperature = 9\n", []string{"line 3: sampling.temperature: 9 is out of range [0, 5]"}},
		{"unknown", "[sampling]\ntemprature = 1\n", []string{"line 2: sampling.temprature: unknown key (did you mean sampling.temperature?)"}},
		{"wrong table", "temperature = 1\n", []string{"line 1: temperature: unknown key (did you mean sampling.temperature?)"}},
		{"enum", "[mtp]\nmode = \"sometimes\"\n", []string{"line 2: mtp.mode", "want auto, on, off"}},
		{"quant", "[engine]\nquant = \"q3_k\"\n", []string{"line 2: engine.quant", "q8_0, q4_k"}},
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

// TestEveryProblemIsReported: neither a type error nor several bad values
// hide one another; each comes with its line and key, in file order.
func TestEveryProblemIsReported(t *testing.T) {
	src := `theme = "pink"
mouse = "yes"
[sampling]
temperature = 9
top_p = -1
top_k = "many"
seed = -3
[mtp]
draft = 0
[engine]
kv_budget = "lots"
colour = 3
[extra]
a = 1
b = 2
`
	_, err := Parse([]byte(src))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	want := []string{
		`line 1: theme: "pink": want auto, dark, light`,
		`line 2: mouse: want true or false, not a string ("yes")`,
		`line 4: sampling.temperature: 9 is out of range [0, 5]`,
		`line 5: sampling.top_p: -1 is out of range [0, 1]`,
		`line 6: sampling.top_k: want a whole number, not a string ("many")`,
		`line 7: sampling.seed: -3 is negative`,
		`line 9: mtp.draft: 0 is out of range [1, 16]`,
		`line 11: engine.kv_budget: "lots" is not a size`,
		`line 12: engine.colour: unknown key`,
		`line 13: extra: unknown key`,
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("%d problems, want %d: %v", len(ce.Problems), len(want), err)
	}
	for i, w := range want {
		if i < len(ce.Problems) && !strings.HasPrefix(ce.Problems[i].String(), w) {
			t.Errorf("problem %d = %q, want %q…", i, ce.Problems[i], w)
		}
	}
}

func TestLoadRequiredSaysTheFileIsMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.toml")
	_, err := LoadRequired(path)
	var me *MissingError
	if !errors.As(err, &me) || err.Error() != path+": no such file" {
		t.Fatalf("err = %v", err)
	}
	if err := os.WriteFile(path, []byte("[sampling]\ntop_k = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := LoadRequired(path); err != nil || c.Sampling.TopK != 3 {
		t.Fatalf("%+v, %v", c.Sampling, err)
	}
}

// TestTableIsConsistent: every default is a value of its key's kind that
// its own checks accept, reads back from text as itself, and every flag
// and /set name is unique.
func TestTableIsConsistent(t *testing.T) {
	flags, chats := map[string]bool{}, map[string]bool{}
	d := Default()
	for i := range Table {
		s := &Table[i]
		if !reflect.DeepEqual(s.Get(&d), s.Default) {
			t.Errorf("%s: Default() has %#v, the table %#v", s.Key, s.Get(&d), s.Default)
		}
		if s.Kind != Strings {
			v, err := s.Parse(s.Format(s.Default))
			if err != nil || !reflect.DeepEqual(v, s.Default) {
				t.Errorf("%s: default %#v reads back as %#v, %v", s.Key, s.Default, v, err)
			}
		}
		if s.Help == "" {
			t.Errorf("%s has no help", s.Key)
		}
		if s.Flag != "" {
			if flags[s.Flag] {
				t.Errorf("flag --%s twice", s.Flag)
			}
			flags[s.Flag] = true
			if ByFlag(s.Flag) != s {
				t.Errorf("ByFlag(%q) is not %s", s.Flag, s.Key)
			}
		}
		if s.Chat != "" {
			if chats[s.Chat] {
				t.Errorf("/set %s twice", s.Chat)
			}
			chats[s.Chat] = true
			if ByChat(s.Chat) != s {
				t.Errorf("ByChat(%q) is not %s", s.Chat, s.Key)
			}
		}
	}
}

func TestParseFromText(t *testing.T) {
	for _, tc := range []struct{ key, in, want, err string }{
		{"engine.kv_budget", "1GiB", "1GiB", ""},
		{"engine.kv_budget", "36864", "36KiB", ""},
		{"engine.kv_budget", "0", "", "0 is out of range [1, …)"},
		{"sampling.temperature", "0.3", "0.3", ""},
		{"sampling.temperature", "NaN", "", "NaN is out of range [0, 5]"},
		{"sampling.top_k", "2.5", "", `"2.5" is not a whole number`},
		{"mtp.mode", "maybe", "", `"maybe": want auto, on, off`},
		{"mtp.draft", "17", "", "17 is out of range [1, 16]"},
		{"sampling.seed", "-1", "", `"-1" is not a whole number ≥ 0`},
		{"model_dirs", "a, b", "a,b", ""},
	} {
		s := Lookup(tc.key)
		v, err := s.Parse(tc.in)
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%s %q: err %v, want %q", tc.key, tc.in, err, tc.err)
		case tc.err == "" && (err != nil || s.Format(v) != tc.want):
			t.Errorf("%s %q: %v, %v; want %s", tc.key, tc.in, v, err, tc.want)
		}
	}
}

func TestEndpoints(t *testing.T) {
	c, err := Parse([]byte(`
[sampling]
temperature = 0.5

[[endpoints]]
name = "gpu"
base_url = "http://gpu-box:8000/v1"
api_key_env = "GPU_KEY"
models = ["Qwen/Qwen3-32B"]

[[endpoints]]
name = "local"
base_url = "http://localhost:8080"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Endpoint{
		{Name: "gpu", BaseURL: "http://gpu-box:8000/v1", APIKeyEnv: "GPU_KEY", Models: []string{"Qwen/Qwen3-32B"}},
		{Name: "local", BaseURL: "http://localhost:8080"},
	}
	if !reflect.DeepEqual(c.Endpoints, want) || c.Sampling.Temperature != 0.5 {
		t.Fatalf("endpoints %+v, want %+v", c.Endpoints, want)
	}
	_, err = Parse([]byte(`
[[endpoints]]
name = "a/b"
base_url = "gpu-box:8000"
api_key = "k"
api_key_env = "K"

[[endpoints]]
name = "x"
base_url = "https://x.example/v1"
[[endpoints]] # a comment
name = "x"
base_url = "https://y.example/v1"
modles = []
models = "m"
`))
	for _, w := range []string{
		`line 2: endpoints.name: endpoint 1: "a/b": want a short name`,
		`line 2: endpoints.base_url: endpoint 1: "gpu-box:8000": want an http://`,
		"line 2: endpoints.api_key: endpoint 1: give api_key or api_key_env, not both",
		`line 11: endpoints.name: endpoint 3: "x" is already the name`,
		"line 11: endpoints.modles: endpoint 3: unknown key",
		"line 11: endpoints.models: endpoint 3: want a list of strings, not a string",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	if _, err := Parse([]byte("endpoints = 3\n")); err == nil || !strings.Contains(err.Error(), "want [[endpoints]] tables") {
		t.Errorf("endpoints = 3: %v", err)
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
	for _, s := range Table {
		k := s.Key
		name := k[strings.LastIndexByte(k, '.')+1:]
		if !strings.Contains(chat, "`"+name+"`") && !strings.Contains(chat, "`"+k+"`") {
			t.Errorf("the README's chat section does not document %s", k)
		}
	}
}

var update = flag.Bool("update", false, "rewrite README.md's settings table from Table")

// The README's settings table lies between these lines.
const (
	tableBegin = "<!-- settings table: made from internal/settings.Table; go test ./internal/settings -update rewrites it -->\n"
	tableEnd   = "<!-- end of the settings table -->\n"
)

// TestREADMESettingsTable: README.md's settings table is MarkdownTable.
func TestREADMESettingsTable(t *testing.T) {
	const path = "../../README.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	before, rest, ok1 := strings.Cut(readme, tableBegin)
	table, after, ok2 := strings.Cut(rest, tableEnd)
	if !ok1 || !ok2 {
		t.Fatalf("README.md lacks the settings table's marker lines %q and %q", tableBegin, tableEnd)
	}
	want := MarkdownTable()
	if table == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(before+tableBegin+want+tableEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's settings table is not internal/settings.Table's (go test ./internal/settings -update rewrites it):\n%s\nwant\n%s", table, want)
}

// TestOddShapesAreProblems: tables where values belong, values where
// tables belong and arrays of tables are reported, not crashes.
func TestOddShapesAreProblems(t *testing.T) {
	for src, want := range map[string]string{
		"sampling = 3\n":                         "line 1: sampling: want a table ([sampling])",
		"[[sampling]]\ntemperature = 1\n":        "sampling: want a table ([sampling])",
		"[sampling.temperature]\nx = 1\n":        "sampling.temperature: want a number, not a table",
		"theme = [\"dark\"]\n":                   "line 1: theme: want one of auto, dark, light, not an array",
		"model_dirs = [\"a\", 3]\n":              "line 1: model_dirs: entry 2: want a string, not an integer (3)",
		"model_dirs = \"~/models\"\n":            `line 1: model_dirs: want a list of strings, not a string ("~/models")`,
		"sampling = {temperature = 9}\n":         "sampling.temperature: 9 is out of range [0, 5]",
		"[engine]\nkv_budget = 1e300\n":          "engine.kv_budget: want a number of bytes",
		"[sampling]\nseed = 18446744073709551\n": "",
	} {
		_, err := Parse([]byte(src))
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", src, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: error %v, want %q", src, err, want)
		}
	}
}

// TestEveryConfigFieldHasARow: the keys of Config's toml tags are exactly
// Table's keys, and each row fills the field its key names, so that a
// field added to Config without its row (or a row for a field of another
// key) is caught.
func TestEveryConfigFieldHasARow(t *testing.T) {
	var keys []string
	var walk func(rt reflect.Type, prefix string)
	walk = func(rt reflect.Type, prefix string) {
		for f := range rt.Fields() {
			if f.Tag.Get("toml") == "-" {
				continue // [[endpoints]]: parsed apart, not rows
			}
			key := prefix + f.Tag.Get("toml")
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, key+".")
				continue
			}
			keys = append(keys, key)
		}
	}
	walk(reflect.TypeFor[Config](), "")
	var rows []string
	for _, s := range Table {
		rows = append(rows, s.Key)
	}
	if strings.Join(keys, " ") != strings.Join(rows, " ") {
		t.Fatalf("Config's keys:\n%v\nTable's keys:\n%v", keys, rows)
	}
	// Each row's field is the one its key names: setting a row's value
	// through the field changes what reflection finds under the key.
	for i := range Table {
		s := &Table[i]
		var c Config
		p := reflect.ValueOf(s.field(&c)).Pointer()
		v := reflect.ValueOf(&c).Elem()
		for _, part := range strings.Split(s.Key, ".") {
			for j := range v.NumField() {
				if v.Type().Field(j).Tag.Get("toml") == part {
					v = v.Field(j)
					break
				}
			}
		}
		if v.Addr().Pointer() != p {
			t.Errorf("%s: the row fills another field than its key's", s.Key)
		}
	}
}

func TestSamplingFor(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	k := func(v int) *int { return &v }
	qwen := tokenizer.Sampling{Temperature: f(0.6), TopP: f(0.95), TopK: k(20)}
	for _, c := range []struct {
		name string
		file string
		rec  tokenizer.Sampling
		want [3]float64 // temperature, top_p, top_k
	}{
		{"nothing recommended", "", tokenizer.Sampling{}, [3]float64{0.7, 0.95, 40}},
		{"greedy recommended", "", tokenizer.Sampling{Temperature: f(0)}, [3]float64{0, 0.95, 40}},
		{"greedy, the file's temperature wins", "[sampling]\ntemperature = 0.3\n", tokenizer.Sampling{Temperature: f(0)}, [3]float64{0.3, 0.95, 40}},
		{"Qwen3's recommendation", "", qwen, [3]float64{0.6, 0.95, 20}},
		{"the file's top_k wins", "[sampling]\ntop_k = 50\n", qwen, [3]float64{0.6, 0.95, 50}},
		{"out of range ignored", "", tokenizer.Sampling{Temperature: f(9), TopP: f(1.5), TopK: k(-1)}, [3]float64{0.7, 0.95, 40}},
	} {
		cfg, err := Parse([]byte(c.file))
		if err != nil {
			t.Fatal(err)
		}
		s := cfg.SamplingFor(c.rec)
		if got := [3]float64{s.Temperature, s.TopP, float64(s.TopK)}; got != c.want {
			t.Errorf("%s: temperature, top_p, top_k = %v, want %v", c.name, got, c.want)
		}
		if s.MinP != cfg.Sampling.MinP || s.MaxTokens != cfg.Sampling.MaxTokens {
			t.Errorf("%s: other sampling settings changed: %+v", c.name, s)
		}
	}
	// A flag gives its key as the file does (internal/cli's loadConfig).
	cfg := Default()
	cfg.Sampling.Temperature = 1.2
	cfg.Give("sampling.temperature")
	if s := cfg.SamplingFor(qwen); s.Temperature != 1.2 || s.TopK != 20 {
		t.Errorf("given temperature: %+v", s)
	}
}
