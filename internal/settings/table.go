package settings

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/kernels/device"
)

// Kind is the type of a setting's value.
type Kind uint8

// The kinds of Setting.
const (
	String  Kind = iota // any text
	Strings             // a list of texts (a TOML array; comma-separated as text)
	Bool                // true or false
	Int                 // a whole number in [Min, Max]
	Uint                // a whole number ≥ 0, 64 bits (seeds)
	Float               // a number in [Min, Max]
	Size                // bytes in [Min, Max]: a number or a size such as "512MiB"
	Enum                // one of Choices
)

// Setting is one key of config.toml: its type, default and range, what it
// means, and the flag and the chat's /set name that change it. Table lists
// every one; the file's parser, the flags of `ferrite` and `ferrite run`,
// /set, /stats and README.md's settings table are all made from it.
type Setting struct {
	Key     string   // dotted TOML key, e.g. "sampling.temperature"
	Kind    Kind     // how the value is written and checked
	Default any      // string, []string, bool, int, uint64, float64 or ByteSize, as Kind says
	Min     float64  // Int, Float, Size: the smallest value allowed
	Max     float64  // Int, Float, Size: the largest value allowed (+Inf: no limit)
	Choices []string // Enum: the values allowed
	Help    string   // what it does (README.md, --help, /set), without the range
	// DefaultText describes the default where its value alone says too
	// little (README.md), e.g. "the built-in model" for "".
	DefaultText string
	// Flag is the command-line flag of the chat that sets the key ("" when
	// none). For a Bool it is a "no-…" switch that sets the key to false.
	Flag string
	// Run says `ferrite run` has the flag too.
	Run bool
	// Chat is the /set name that changes it in a chat ("" when /set does
	// not): chat settings belong to each chat and are saved with it.
	Chat string
	// Check, for a String, refuses values of the wrong form.
	Check func(string) error

	field func(c *Config) any // the Config field: a pointer of Default's type
}

// inf is the Max of a setting without an upper limit.
var inf = math.Inf(1)

// Table is every setting, in the order README.md lists them.
var Table = []Setting{
	{Key: "default_model", Kind: String, Default: "", DefaultText: "the built-in model", Flag: "model", Run: true,
		Help:  "the model to open: a name `/models` lists, a model directory or a GGUF file",
		field: func(c *Config) any { return &c.DefaultModel }},
	{Key: "model_dirs", Kind: Strings, Default: []string{},
		Help:  "more places to find models: model directories, GGUF files, or folders of them (`~/` allowed)",
		field: func(c *Config) any { return &c.ModelDirs }},
	{Key: "system_prompt", Kind: String, Default: "", Flag: "system", Run: true,
		Help:  "the system prompt of new chats",
		field: func(c *Config) any { return &c.SystemPrompt }},
	{Key: "theme", Kind: Enum, Default: "auto", Choices: []string{"auto", "dark", "light"}, Flag: "theme",
		Help:  "colours for a dark or light terminal; auto asks the terminal",
		field: func(c *Config) any { return &c.Theme }},
	{Key: "mouse", Kind: Bool, Default: true, Flag: "no-mouse",
		Help:  "the mouse wheel scrolls the chat (Ctrl+O toggles)",
		field: func(c *Config) any { return &c.Mouse }},
	{Key: "autosave", Kind: Bool, Default: true, Flag: "no-save",
		Help:  "save every chat after each message",
		field: func(c *Config) any { return &c.Autosave }},
	{Key: "history", Kind: Bool, Default: true, Flag: "no-history",
		Help:  "keep the input history across sessions",
		field: func(c *Config) any { return &c.History }},
	{Key: "debug_log", Kind: Bool, Default: false,
		Help:  "write a debug log (errors with stacks, load and save failures, load timings) to `$XDG_STATE_HOME/ferrite/ferrite.log`; `--log FILE` writes one to FILE",
		field: func(c *Config) any { return &c.DebugLog }},

	{Key: "sampling.temperature", Kind: Float, Default: 0.7, Min: 0, Max: 5, Flag: "temperature", Run: true, Chat: "temperature",
		Help:  "randomness; 0 is greedy",
		field: func(c *Config) any { return &c.Sampling.Temperature }},
	{Key: "sampling.top_p", Kind: Float, Default: 0.95, Min: 0, Max: 1, Flag: "top-p", Run: true, Chat: "top_p",
		Help:  "nucleus sampling: keep the likeliest tokens up to this mass; 1 is off",
		field: func(c *Config) any { return &c.Sampling.TopP }},
	{Key: "sampling.top_k", Kind: Int, Default: 40, Min: 0, Max: math.MaxInt32, Flag: "top-k", Run: true, Chat: "top_k",
		Help:  "keep the k likeliest tokens; 0 is off",
		field: func(c *Config) any { return &c.Sampling.TopK }},
	{Key: "sampling.min_p", Kind: Float, Default: 0.05, Min: 0, Max: 1, Flag: "min-p", Run: true, Chat: "min_p",
		Help:  "drop tokens below this share of the likeliest one; 0 is off",
		field: func(c *Config) any { return &c.Sampling.MinP }},
	{Key: "sampling.repeat_penalty", Kind: Float, Default: 1.0, Min: 0, Max: 10, Flag: "repeat-penalty", Run: true, Chat: "repeat_penalty",
		Help:  "penalty for tokens seen recently; 1 is off",
		field: func(c *Config) any { return &c.Sampling.RepeatPenalty }},
	{Key: "sampling.seed", Kind: Uint, Default: uint64(0), Flag: "seed", Run: true, Chat: "seed",
		Help:  "sampling seed; 0 is a fresh seed per reply",
		field: func(c *Config) any { return &c.Sampling.Seed }},
	{Key: "sampling.max_tokens", Kind: Int, Default: 2048, Min: 0, Max: math.MaxInt32, Flag: "max-tokens", Run: true, Chat: "max_tokens",
		Help:  "longest reply in tokens; 0 is until the context is full",
		field: func(c *Config) any { return &c.Sampling.MaxTokens }},

	{Key: "mtp.mode", Kind: Enum, Default: "off", Choices: []string{"auto", "on", "off"}, Flag: "mtp", Run: true, Chat: "mtp",
		Help: "speculative decoding with the model's MTP module: auto is on when the model has one; " +
			"off by default, because on the CPU backend verifying drafts costs about as much as decoding them (BENCHMARKS.md §5)",
		field: func(c *Config) any { return &c.MTP.Mode }},
	{Key: "mtp.draft", Kind: Int, Default: 3, Min: 1, Max: MaxDraft, Flag: "draft", Run: true, Chat: "draft",
		Help:  "MTP draft tokens per step (adapted to the measured acceptance)",
		field: func(c *Config) any { return &c.MTP.Draft }},

	{Key: "engine.device", Kind: String, Default: "auto", Flag: "device", Run: true,
		Help:  "what runs the model: `auto` (the GPU when an NVIDIA driver and a GPU of compute capability 8.0 or newer are found, else the CPU), `cpu`, `cuda` or `cuda:N`",
		Check: checkDevice,
		field: func(c *Config) any { return &c.Engine.Device }},
	{Key: "engine.threads", Kind: Int, Default: 0, Min: 0, Max: 4096, Flag: "threads", Run: true,
		Help:  "CPU threads; 0 is one per core",
		field: func(c *Config) any { return &c.Engine.Threads }},
	{Key: "engine.kv_budget", Kind: Size, Default: ByteSize(1 << 30), Min: 1, Max: inf, Flag: "kv-budget", Run: true,
		Help:  "memory of the KV cache (never more than its sequences and cached prefixes can fill at the model's context); it also bounds the context when it holds fewer tokens than the model's",
		field: func(c *Config) any { return &c.Engine.KVBudget }},
	{Key: "engine.batch_tokens", Kind: Int, Default: 0, Min: 0, Max: 1 << 20, Flag: "batch-tokens",
		Help:  "tokens one engine step may run; 0 is the runtime's default (512; on a GPU up to 4096 by its memory)",
		field: func(c *Config) any { return &c.Engine.BatchTokens }},
	{Key: "engine.max_seqs", Kind: Int, Default: 0, Min: 0, Max: 4096, Flag: "max-seqs",
		Help:  "replies generated at once; 0 is the runtime's default (16)",
		field: func(c *Config) any { return &c.Engine.MaxSeqs }},
	{Key: "engine.quant", Kind: Enum, Default: "", Choices: []string{"", "q8_0", "q4_k"}, DefaultText: "as stored", Flag: "quant", Run: true,
		Help: "quantize the model's matrices in memory as it loads: q8_0 or q4_k (see \"Quantized weights\"); \"\" keeps them as stored. " +
			"It applies when a model loads, so /set does not change it",
		field: func(c *Config) any { return &c.Engine.Quant }},
}

// tables are the TOML tables the keys live in.
var tables = []string{"sampling", "mtp", "engine"}

// Lookup is the setting of a dotted key, or nil.
func Lookup(key string) *Setting {
	return find(func(s *Setting) bool { return s.Key == key })
}

// ByChat is the setting /set calls name, or nil.
func ByChat(name string) *Setting {
	return find(func(s *Setting) bool { return name != "" && s.Chat == name })
}

// ByFlag is the setting of a command-line flag (without dashes), or nil.
func ByFlag(name string) *Setting {
	return find(func(s *Setting) bool { return name != "" && s.Flag == name })
}

func find(match func(*Setting) bool) *Setting {
	for i := range Table {
		if match(&Table[i]) {
			return &Table[i]
		}
	}
	return nil
}

// ChatNames are the /set names, in table order.
func ChatNames() []string {
	var out []string
	for _, s := range Table {
		if s.Chat != "" {
			out = append(out, s.Chat)
		}
	}
	return out
}

// Get is the setting's value in c, of Default's type.
func (s *Setting) Get(c *Config) any {
	switch p := s.field(c).(type) {
	case *string:
		return *p
	case *[]string:
		return slices.Clone(*p)
	case *bool:
		return *p
	case *int:
		return *p
	case *uint64:
		return *p
	case *float64:
		return *p
	case *ByteSize:
		return *p
	}
	panic("settings: " + s.Key + " has a field of an unknown type")
}

// Put stores v, a value of Default's type (from Parse), into c.
func (s *Setting) Put(c *Config, v any) {
	switch p := s.field(c).(type) {
	case *string:
		*p = v.(string)
	case *[]string:
		*p = slices.Clone(v.([]string))
	case *bool:
		*p = v.(bool)
	case *int:
		*p = v.(int)
	case *uint64:
		*p = v.(uint64)
	case *float64:
		*p = v.(float64)
	case *ByteSize:
		*p = v.(ByteSize)
	default:
		panic("settings: " + s.Key + " has a field of an unknown type")
	}
}

// Parse reads a value written as text (a flag, /set) and checks it: the
// result has Default's type.
func (s *Setting) Parse(text string) (any, error) {
	t := strings.TrimSpace(text)
	switch s.Kind {
	case String:
		return s.checkString(text)
	case Strings:
		var out []string
		for _, f := range strings.Split(text, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out, nil
	case Bool:
		b, err := strconv.ParseBool(t)
		if err != nil {
			return nil, fmt.Errorf("%q: want true or false", text)
		}
		return b, nil
	case Int:
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", text)
		}
		return s.checkInt(n)
	case Uint:
		n, err := strconv.ParseUint(t, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number ≥ 0", text)
		}
		return n, nil
	case Float:
		f, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", text)
		}
		return s.checkFloat(f)
	case Size:
		b, err := ParseByteSize(t)
		if err != nil {
			return nil, err
		}
		return s.checkSize(b)
	case Enum:
		return s.checkEnum(t)
	}
	panic("settings: " + s.Key + " has an unknown kind")
}

// decode reads a value as the TOML decoder gives it (string, int64,
// float64, bool, []any) and checks it: the result has Default's type.
func (s *Setting) decode(v any) (any, error) {
	switch s.Kind {
	case String:
		if t, ok := v.(string); ok {
			return s.checkString(t)
		}
	case Strings:
		if arr, ok := v.([]any); ok {
			out := make([]string, 0, len(arr))
			for i, e := range arr {
				t, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("entry %d: want a string, not %s", i+1, tomlType(e))
				}
				if strings.TrimSpace(t) == "" {
					return nil, fmt.Errorf("entry %d is empty", i+1)
				}
				out = append(out, t)
			}
			return out, nil
		}
	case Bool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case Int:
		if n, ok := v.(int64); ok {
			return s.checkInt(n)
		}
	case Uint:
		if n, ok := v.(int64); ok {
			if n < 0 {
				return nil, fmt.Errorf("%d is negative", n)
			}
			return uint64(n), nil
		}
	case Float:
		switch f := v.(type) {
		case float64:
			return s.checkFloat(f)
		case int64:
			return s.checkFloat(float64(f))
		}
	case Size:
		switch b := v.(type) {
		case int64:
			return s.checkSize(ByteSize(b))
		case string:
			n, err := ParseByteSize(b)
			if err != nil {
				return nil, err
			}
			return s.checkSize(n)
		}
	case Enum:
		if t, ok := v.(string); ok {
			return s.checkEnum(t)
		}
	}
	return nil, fmt.Errorf("want %s, not %s", s.kindText(), tomlType(v))
}

func (s *Setting) checkString(t string) (any, error) {
	if s.Check != nil {
		if err := s.Check(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// checkDevice accepts the --device specs kernels/device reads.
func checkDevice(t string) error {
	if _, err := device.Parse(t); err != nil {
		return fmt.Errorf("%q: want auto, cpu, cuda or cuda:N", t)
	}
	return nil
}

func (s *Setting) checkInt(n int64) (any, error) {
	if float64(n) < s.Min || float64(n) > s.Max {
		return nil, fmt.Errorf("%d is out of range %s", n, s.rangeText())
	}
	return int(n), nil
}

func (s *Setting) checkFloat(f float64) (any, error) {
	if math.IsNaN(f) || f < s.Min || f > s.Max {
		return nil, fmt.Errorf("%g is out of range %s", f, s.rangeText())
	}
	return f, nil
}

func (s *Setting) checkSize(b ByteSize) (any, error) {
	if float64(b) < s.Min || float64(b) > s.Max {
		return nil, fmt.Errorf("%s is out of range %s", b, s.rangeText())
	}
	return b, nil
}

func (s *Setting) checkEnum(t string) (any, error) {
	if !slices.Contains(s.Choices, t) {
		return nil, fmt.Errorf("%q: want %s", t, s.choiceList())
	}
	return t, nil
}

// choiceList is an Enum's choices, comma-separated, the empty one written
// "" so that it shows.
func (s *Setting) choiceList() string {
	q := make([]string, len(s.Choices))
	for i, c := range s.Choices {
		q[i] = cmp.Or(c, `""`)
	}
	return strings.Join(q, ", ")
}

// rangeText is "[lo, hi]", or "[lo, …)" without an upper limit.
func (s *Setting) rangeText() string {
	if math.IsInf(s.Max, 1) {
		return fmt.Sprintf("[%g, …)", s.Min)
	}
	return fmt.Sprintf("[%g, %g]", s.Min, s.Max)
}

// kindText names what a value of the setting looks like, for type errors.
func (s *Setting) kindText() string {
	switch s.Kind {
	case Strings:
		return "a list of strings"
	case Bool:
		return "true or false"
	case Int, Uint:
		return "a whole number"
	case Float:
		return "a number"
	case Size:
		return `a number of bytes or a size such as "2GiB"`
	case Enum:
		return "one of " + s.choiceList()
	}
	return "a string"
}

// tomlType names the type of a decoded TOML value, for type errors.
func tomlType(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("a string (%q)", v)
	case int64:
		return fmt.Sprintf("an integer (%d)", v)
	case float64:
		return fmt.Sprintf("a float (%g)", v)
	case bool:
		return fmt.Sprintf("a boolean (%t)", v)
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("%T", v)
}

// Format writes v, a value of the setting, the way Parse reads it.
func (s *Setting) Format(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []string:
		return strings.Join(v, ",")
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case ByteSize:
		return v.String()
	}
	return fmt.Sprint(v)
}

// Values describes the values allowed, for README.md and /set: "0–5",
// "≥ 0", "auto, on, off".
func (s *Setting) Values() string {
	switch s.Kind {
	case Int, Float:
		if math.IsInf(s.Max, 1) || s.Max >= math.MaxInt32 {
			return "≥ " + num(s.Min)
		}
		return num(s.Min) + "–" + num(s.Max)
	case Uint:
		return "≥ 0"
	case Size:
		return "bytes, or a size such as 512MiB, 2GiB"
	case Enum:
		return s.choiceList()
	case Bool:
		return "true, false"
	case Strings:
		return "a list of paths"
	}
	return "text"
}

// MarkdownTable is README.md's table of the settings, made from Table.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| key | default | values | meaning | flag | `/set` |\n| --- | --- | --- | --- | --- | --- |\n")
	for i := range Table {
		s := &Table[i]
		def := s.DefaultText
		if def == "" {
			def = "`" + s.tomlDefault() + "`"
		}
		flag := ""
		if s.Flag != "" {
			flag = "`--" + s.Flag + "`"
			if !s.Run {
				flag += " (chat)"
			}
		}
		chat := ""
		if s.Chat != "" {
			chat = "`" + s.Chat + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Key, def, s.Values(), s.Help, flag, chat)
	}
	return b.String()
}

// tomlDefault is the default as the file writes it.
func (s *Setting) tomlDefault() string {
	switch v := s.Default.(type) {
	case string:
		return strconv.Quote(v)
	case ByteSize:
		return strconv.Quote(v.String())
	case []string:
		q := make([]string, len(v))
		for i, e := range v {
			q[i] = strconv.Quote(e)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return s.Format(s.Default)
}

// num writes a range bound without an exponent.
func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
