// Package settings reads ferrite's configuration file,
// $XDG_CONFIG_HOME/ferrite/config.toml (~/.config/ferrite/config.toml when
// XDG_CONFIG_HOME is unset).
//
// Every key is optional: Default holds the value of a key the file leaves
// out. Load never fails the program: a file that cannot be read, does not
// parse, has a value of the wrong type or out of range, or has a key this
// version does not know is ignored as a whole, and the problems come back
// as one error naming the file, the line and the key of each, so that the
// chat can start with the defaults and show the warning. A missing file is
// no problem at all.
//
// Table is the one description of every setting (key, type, default, range,
// help, flag, /set name): the file's parser, the command-line flags, the
// chat's /set and README.md's settings table are made from it.
//
// Flags win over the file; the command line applies the flags the user set
// on top of what Load returns (internal/cli).
package settings

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Config is the whole file. The TOML keys are the field tags.
type Config struct {
	// DefaultModel is the model the chat opens without --model: a name
	// from /models (a Hugging Face id such as "Qwen/Qwen3-0.6B", a folder
	// name, the built-in model's name) or a directory.
	DefaultModel string `toml:"default_model"`
	// ModelDirs are more places to find models: each is a model directory
	// (config.json and safetensors) or a folder of them.
	ModelDirs    []string `toml:"model_dirs"`
	SystemPrompt string   `toml:"system_prompt"`
	Theme        string   `toml:"theme"`     // auto, dark or light
	Mouse        bool     `toml:"mouse"`     // the mouse wheel scrolls the chat
	Autosave     bool     `toml:"autosave"`  // save every chat after each message
	History      bool     `toml:"history"`   // keep the input history across sessions
	DebugLog     bool     `toml:"debug_log"` // write a debug log under $XDG_STATE_HOME/ferrite

	Sampling Sampling `toml:"sampling"`
	MTP      MTP      `toml:"mtp"`
	Engine   Engine   `toml:"engine"`

	// Endpoints are the [[endpoints]] tables: remote servers whose models
	// the chat lists as NAME/MODEL (endpoints.go; not rows of Table).
	Endpoints []Endpoint `toml:"-"`

	// Given holds the keys the file or a flag set (Give); the others
	// have their Table defaults, which a model's recommended sampling
	// may replace (SamplingFor). nil when none was set.
	Given map[string]bool `toml:"-"`
}

// Give records that the file or a flag set key.
func (c *Config) Give(key string) {
	if c.Given == nil {
		c.Given = map[string]bool{}
	}
	c.Given[key] = true
}

// SamplingFor is c's sampling with what a model recommends (its
// generation_config.json or GGUF metadata: tokenizer.Sampling) in place of
// the defaults of the keys neither the file nor a flag gave, where the
// values lie in the settings' ranges.
func (c *Config) SamplingFor(rec tokenizer.Sampling) Sampling {
	s := c.Sampling
	free := func(key string) bool { return !c.Given[key] }
	inRange := func(key string, v float64) bool {
		t := Lookup(key)
		return !math.IsNaN(v) && v >= t.Min && v <= t.Max
	}
	if v := rec.Temperature; v != nil && free("sampling.temperature") && inRange("sampling.temperature", *v) {
		s.Temperature = *v
	}
	if v := rec.TopP; v != nil && free("sampling.top_p") && inRange("sampling.top_p", *v) {
		s.TopP = *v
	}
	if v := rec.TopK; v != nil && free("sampling.top_k") && inRange("sampling.top_k", float64(*v)) {
		s.TopK = *v
	}
	return s
}

// Sampling is the sampling defaults of a new chat (/set changes them).
type Sampling struct {
	Temperature   float64 `toml:"temperature"`    // 0 is greedy; 0–5
	TopP          float64 `toml:"top_p"`          // 1 is off; 0–1
	TopK          int     `toml:"top_k"`          // 0 is off
	MinP          float64 `toml:"min_p"`          // 0 is off; 0–1
	RepeatPenalty float64 `toml:"repeat_penalty"` // 1 is off; 0–10
	Seed          uint64  `toml:"seed"`           // 0 is a fresh seed per reply
	MaxTokens     int     `toml:"max_tokens"`     // 0 is until the context is full
}

// MTP is speculative decoding with the model's multi-token-prediction
// module.
type MTP struct {
	Mode  string `toml:"mode"`  // auto (on when the model has an MTP module), on, off
	Draft int    `toml:"draft"` // draft tokens per step, 1–MaxDraft
}

// Engine is how the engine runs a model.
type Engine struct {
	Device      string   `toml:"device"`       // auto, cpu, cuda or cuda:N (package kernels/device)
	Threads     int      `toml:"threads"`      // CPU threads; 0 is one per core
	KVBudget    ByteSize `toml:"kv_budget"`    // bytes of KV cache: a number or "1GiB", "512MiB"
	BatchTokens int      `toml:"batch_tokens"` // tokens one engine step may run; 0 is the runtime's default
	MaxSeqs     int      `toml:"max_seqs"`     // replies generated at once; 0 is the runtime's default
	Quant       string   `toml:"quant"`        // quantize safetensors weights at load: "" (off), q8_0, q4_k
}

// MaxDraft is the largest MTP draft length (engine/runtime.MaxDraft).
const MaxDraft = 16

// Default is the configuration of a missing file: every Table default.
func Default() Config {
	var c Config
	for i := range Table {
		Table[i].Put(&c, Table[i].Default)
	}
	return c
}

// DefaultPath is $XDG_CONFIG_HOME/ferrite/config.toml.
func DefaultPath() string {
	return filepath.Join(xdg.ConfigHome, "ferrite", "config.toml")
}

// Load reads the file at path over Default. A missing file gives the
// defaults and no error. Any other problem gives the defaults and an error
// that lists every problem found with its line and key: the file is then
// ignored as a whole.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Default(), nil
	}
	return parseFile(path, data, err)
}

// LoadRequired is Load for a file the user named (--config): a missing
// file is an error too, and the only one that returns no Config to go on
// with.
func LoadRequired(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Default(), &MissingError{Path: path}
	}
	return parseFile(path, data, err)
}

// MissingError is LoadRequired's error for a file that does not exist.
type MissingError struct{ Path string }

func (e *MissingError) Error() string { return e.Path + ": no such file" }

func parseFile(path string, data []byte, err error) (Config, error) {
	if err != nil {
		return Default(), fmt.Errorf("%s is ignored: %w", path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return Default(), fmt.Errorf("%s is ignored: %w", path, err)
	}
	return c, nil
}

// Problem is one thing wrong with a file.
type Problem struct {
	Line int    // 1-based; 0 when unknown
	Key  string // dotted, e.g. "sampling.temperature"; "" when none
	Msg  string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Key != "" {
		fmt.Fprintf(&b, "%s: ", p.Key)
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error is every problem of a file.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return strings.Join(parts, "; ")
}

// Parse reads a file's contents over Default. Its error is an *Error
// listing every problem: syntax (the parser stops at the first), then each
// key that is unknown, of the wrong type or out of range.
func Parse(data []byte) (Config, error) {
	var raw map[string]any
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return Default(), &Error{[]Problem{{Line: pe.Position.Line, Key: pe.LastKey, Msg: pe.Message}}}
		}
		return Default(), &Error{[]Problem{{Msg: strings.TrimPrefix(err.Error(), "toml: ")}}}
	}
	c := Default()
	var probs []Problem
	var unknown []string // keys reported unknown: their children are not reported again
	for _, k := range md.Keys() {
		key := k.String()
		if isEndpointKey(key) {
			continue // parseEndpoints below
		}
		if slices.ContainsFunc(unknown, func(u string) bool { return strings.HasPrefix(key, u+".") }) {
			continue
		}
		s := Lookup(key)
		if s == nil {
			if slices.Contains(tables, key) {
				if md.Type(k...) != "Hash" {
					probs = append(probs, Problem{Line: keyLine(data, key), Key: key, Msg: "want a table ([" + key + "])"})
				}
				continue
			}
			unknown = append(unknown, key)
			msg := "unknown key"
			if sug := suggest(key); sug != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", sug)
			}
			probs = append(probs, Problem{Line: keyLine(data, key), Key: key, Msg: msg})
			continue
		}
		v, err := s.decode(valueAt(raw, k))
		if err != nil {
			probs = append(probs, Problem{Line: keyLine(data, key), Key: key, Msg: err.Error()})
			continue
		}
		s.Put(&c, v)
		c.Give(key)
	}
	eps, eprobs := parseEndpoints(raw[endpointsKey], data)
	probs = append(probs, eprobs...)
	c.Endpoints = eps
	if len(probs) > 0 {
		slices.SortStableFunc(probs, func(a, b Problem) int { return a.Line - b.Line })
		return Default(), &Error{probs}
	}
	return c, nil
}

// valueAt is the decoded value of a key.
func valueAt(raw map[string]any, k toml.Key) any {
	var v any = raw
	for _, part := range k {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[part]
	}
	return v
}

// suggest is the known key an unknown one most likely meant: the same last
// part in another table, or a key one or two edits away.
func suggest(key string) string {
	last := key[strings.LastIndexByte(key, '.')+1:]
	for _, s := range Table {
		if k := s.Key; k != key && k[strings.LastIndexByte(k, '.')+1:] == last {
			return k
		}
	}
	for _, s := range Table {
		if editDistance(s.Key, key) <= 2 {
			return s.Key
		}
	}
	return ""
}

// editDistance is the Levenshtein distance of two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// keyLine finds the line that sets a dotted key: "name = …" under its
// "[table]" header, "table.name = …" before any header, or the header of
// a table. 0 when not
// found (the parser has checked the syntax, so this is only a locator).
func keyLine(data []byte, key string) int {
	table, name := "", key
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		table, name = key[:i], key[i+1:]
	}
	cur := ""
	for i, line := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "[") {
			cur = strings.Trim(strings.TrimSpace(strings.SplitN(l, "#", 2)[0]), "[] ")
			if cur == key {
				return i + 1
			}
			continue
		}
		k, _, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		k = strings.Trim(strings.TrimSpace(k), `"`)
		if (cur == table && k == name) || (cur == "" && k == key) {
			return i + 1
		}
	}
	return 0
}

// ByteSize is a number of bytes, written in the file as an integer or as
// a string with a unit: "512MiB", "2GiB", "1.5 GB", "4096".
type ByteSize int64

// byteUnits are the units ParseByteSize knows, longest first where one is
// a suffix of another.
var byteUnits = []struct {
	name string
	n    float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseByteSize reads "2GiB", "512 MiB", "1.5GB", "4096" (bytes).
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(t, u.name); ok {
			t, mult = strings.TrimSpace(rest), u.n
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f*mult > math.MaxInt64 {
		return 0, fmt.Errorf("%q is not a size: use bytes or a unit, e.g. \"2GiB\" or \"512MiB\"", s)
	}
	return ByteSize(f * mult), nil
}

// String prints the size the way the file may write it.
func (b ByteSize) String() string {
	for _, u := range []struct {
		name string
		n    int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= ByteSize(u.n) && int64(b)%u.n == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.n, u.name)
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
