package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
)

// Config is a parsed config.json, viewed as the text model's configuration.
type Config struct {
	Path          string   // the file, named in every error
	ModelType     string   // model_type of the text model: text_config's, else the top level's
	WrapperType   string   // top-level model_type when the text model is nested in text_config, else ""
	Arch          string   // architectures[0], or "" if there is none
	Architectures []string // the top-level architectures list (nil if absent)

	prefix string         // key prefix in errors: "" at the top, "rope_scaling." in a Sub
	fields map[string]any // values as decoded with json.Decoder.UseNumber
	root   *Config        // the whole file (itself for the top level)
	errs   *errList       // shared by a Config and its Subs
}

// errList collects a Config's problems; getters may run concurrently.
type errList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errList) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

// Load reads and parses dir/config.json (or dir itself, if it is a file).
func Load(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	if fi, err := os.Stat(dir); err == nil && fi.Mode().IsRegular() {
		path = dir
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses config.json contents; path names the file in errors. A JSON
// syntax error is reported as "path:line:col: ...".
func Parse(path string, data []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	err := dec.Decode(&top)
	if err == nil {
		var tok json.Token
		if tok, err = dec.Token(); err == nil {
			return nil, fmt.Errorf("%s: data after the JSON object (%v)", path, tok)
		} else if err == io.EOF {
			err = nil
		}
	}
	if err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			line, col := lineCol(data, se.Offset-1) // Offset counts the offending byte
			return nil, fmt.Errorf("%s:%d:%d: invalid JSON: %v", path, line, col, se)
		case errors.As(err, &te):
			return nil, fmt.Errorf("%s: the top level is a JSON %s, want an object", path, te.Value)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			line, col := lineCol(data, int64(len(data)))
			return nil, fmt.Errorf("%s:%d:%d: invalid JSON: unexpected end of file", path, line, col)
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%s: the top level is null, want an object", path)
	}

	c := &Config{Path: path, fields: top, errs: &errList{}}
	c.root = c
	if tc, ok := top["text_config"]; ok && tc != nil {
		text, ok := tc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: key \"text_config\" is %s, want an object", path, describe(tc))
		}
		merged := maps.Clone(top)
		maps.Copy(merged, text)
		c.fields = merged
		c.root = &Config{Path: path, fields: top, errs: c.errs}
		c.root.root = c.root
		wt, err := topString(path, top, "model_type")
		if err != nil {
			return nil, err
		}
		c.WrapperType = wt
	}
	mt, err := topString(path, c.fields, "model_type")
	if err != nil {
		return nil, err
	}
	c.ModelType = mt
	if v, ok := top["architectures"]; ok && v != nil {
		arr, ok := v.([]any)
		for _, a := range arr {
			s, isStr := a.(string)
			ok = ok && isStr
			c.Architectures = append(c.Architectures, s)
		}
		if !ok {
			return nil, fmt.Errorf("%s: key \"architectures\" is %s, want an array of strings", path, describe(v))
		}
		if len(c.Architectures) > 0 {
			c.Arch = c.Architectures[0]
		}
	}
	c.root.ModelType, c.root.Arch, c.root.Architectures = c.ModelType, c.Arch, c.Architectures
	if c.WrapperType != "" {
		c.root.ModelType = c.WrapperType
	}
	return c, nil
}

// topString reads an optional string field for Parse.
func topString(path string, m map[string]any, key string) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: key %q is %s, want a string", path, key, describe(v))
	}
	return s, nil
}

// lineCol converts a byte offset into data to a 1-based line and column.
func lineCol(data []byte, off int64) (line, col int) {
	off = max(0, min(off, int64(len(data))))
	before := data[:off]
	line = 1 + bytes.Count(before, []byte{'\n'})
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// Err returns the first problem recorded by a getter (of c, its Subs or its
// parent), naming the file and the key, or nil.
func (c *Config) Err() error {
	c.errs.mu.Lock()
	defer c.errs.mu.Unlock()
	if len(c.errs.errs) == 0 {
		return nil
	}
	return c.errs.errs[0]
}

// Errs returns every problem recorded so far.
func (c *Config) Errs() []error {
	c.errs.mu.Lock()
	defer c.errs.mu.Unlock()
	return slices.Clone(c.errs.errs)
}

// Top returns the whole file as a Config: for a vision-language wrapper, the
// top level without text_config merged in (ModelType is then the wrapper's);
// otherwise c's root. It shares c's error list.
func (c *Config) Top() *Config { return c.root }

// Keys returns the keys c has (null-valued ones included), sorted.
func (c *Config) Keys() []string { return slices.Sorted(maps.Keys(c.fields)) }

// Has reports whether key is present with a non-null value.
func (c *Config) Has(key string) bool {
	v, ok := c.fields[key]
	return ok && v != nil
}

// lookup returns key's value; it records a missing-key error when required
// and the key is absent or null.
func (c *Config) lookup(key string, required bool) (any, bool) {
	v, ok := c.fields[key]
	if ok && v != nil {
		return v, true
	}
	if required {
		if ok {
			c.errs.add(fmt.Errorf("%s: key %q is null", c.Path, c.prefix+key))
		} else {
			c.errs.add(fmt.Errorf("%s: missing key %q", c.Path, c.prefix+key))
		}
	}
	return nil, false
}

func (c *Config) wrongType(key string, v any, want string) {
	c.errs.add(fmt.Errorf("%s: key %q is %s, want %s", c.Path, c.prefix+key, describe(v), want))
}

// describe names a decoded JSON value's kind for errors.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return fmt.Sprintf("a bool (%v)", v)
	case string:
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return fmt.Sprintf("a string (%q)", v)
	case json.Number:
		return "a number (" + v.String() + ")"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// toInt converts a JSON number holding an integer (also written 1e5 or 4.0).
func toInt(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := strconv.ParseInt(string(n), 10, 0); err == nil {
		return int(i), true
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt || f >= math.MaxInt {
		return 0, false
	}
	return int(f), true
}

func toFloat(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(n), 64)
	return f, err == nil
}

// Int returns the integer key, recording a problem and returning 0 when it is
// missing, null or not an integer.
func (c *Config) Int(key string) int {
	v, ok := c.lookup(key, true)
	if !ok {
		return 0
	}
	return c.intOf(key, v, 0)
}

// IntOr returns the integer key, or def when it is absent or null.
func (c *Config) IntOr(key string, def int) int {
	v, ok := c.lookup(key, false)
	if !ok {
		return def
	}
	return c.intOf(key, v, def)
}

func (c *Config) intOf(key string, v any, def int) int {
	i, ok := toInt(v)
	if !ok {
		c.wrongType(key, v, "an integer")
		return def
	}
	return i
}

// Float returns the number key, recording a problem and returning 0 when it
// is missing, null or not a number.
func (c *Config) Float(key string) float64 {
	v, ok := c.lookup(key, true)
	if !ok {
		return 0
	}
	return c.floatOf(key, v, 0)
}

// FloatOr returns the number key, or def when it is absent or null.
func (c *Config) FloatOr(key string, def float64) float64 {
	v, ok := c.lookup(key, false)
	if !ok {
		return def
	}
	return c.floatOf(key, v, def)
}

func (c *Config) floatOf(key string, v any, def float64) float64 {
	f, ok := toFloat(v)
	if !ok {
		c.wrongType(key, v, "a number")
		return def
	}
	return f
}

// Bool returns the boolean key, recording a problem and returning false when
// it is missing, null or not a boolean.
func (c *Config) Bool(key string) bool {
	v, ok := c.lookup(key, true)
	if !ok {
		return false
	}
	return c.boolOf(key, v, false)
}

// BoolOr returns the boolean key, or def when it is absent or null.
func (c *Config) BoolOr(key string, def bool) bool {
	v, ok := c.lookup(key, false)
	if !ok {
		return def
	}
	return c.boolOf(key, v, def)
}

func (c *Config) boolOf(key string, v any, def bool) bool {
	b, ok := v.(bool)
	if !ok {
		c.wrongType(key, v, "a bool")
		return def
	}
	return b
}

// String returns the string key, recording a problem and returning "" when
// it is missing, null or not a string.
func (c *Config) String(key string) string {
	v, ok := c.lookup(key, true)
	if !ok {
		return ""
	}
	return c.stringOf(key, v, "")
}

// StringOr returns the string key, or def when it is absent or null.
func (c *Config) StringOr(key, def string) string {
	v, ok := c.lookup(key, false)
	if !ok {
		return def
	}
	return c.stringOf(key, v, def)
}

func (c *Config) stringOf(key string, v any, def string) string {
	s, ok := v.(string)
	if !ok {
		c.wrongType(key, v, "a string")
		return def
	}
	return s
}

// array returns key's elements: nil, false when it is null (no problem) or
// missing or not an array (a problem recorded).
func (c *Config) array(key, want string) ([]any, bool) {
	v, ok := c.fields[key]
	if !ok {
		c.errs.add(fmt.Errorf("%s: missing key %q", c.Path, c.prefix+key))
		return nil, false
	}
	if v == nil {
		return nil, false
	}
	arr, ok := v.([]any)
	if !ok {
		c.wrongType(key, v, want)
		return nil, false
	}
	return arr, true
}

// Ints returns the array of integers key (nil if it is null), recording a
// problem when it is missing or not an array of integers.
func (c *Config) Ints(key string) []int {
	arr, ok := c.array(key, "an array of integers")
	if !ok {
		return nil
	}
	out := make([]int, len(arr))
	for i, v := range arr {
		n, ok := toInt(v)
		if !ok {
			c.wrongType(fmt.Sprintf("%s[%d]", key, i), v, "an integer")
			return nil
		}
		out[i] = n
	}
	return out
}

// Floats returns the array of numbers key (nil if it is null), recording a
// problem when it is missing or not an array of numbers.
func (c *Config) Floats(key string) []float64 {
	arr, ok := c.array(key, "an array of numbers")
	if !ok {
		return nil
	}
	out := make([]float64, len(arr))
	for i, v := range arr {
		f, ok := toFloat(v)
		if !ok {
			c.wrongType(fmt.Sprintf("%s[%d]", key, i), v, "a number")
			return nil
		}
		out[i] = f
	}
	return out
}

// Strings returns the array of strings key (nil if it is null), recording a
// problem when it is missing or not an array of strings.
func (c *Config) Strings(key string) []string {
	arr, ok := c.array(key, "an array of strings")
	if !ok {
		return nil
	}
	out := make([]string, len(arr))
	for i, v := range arr {
		s, ok := v.(string)
		if !ok {
			c.wrongType(fmt.Sprintf("%s[%d]", key, i), v, "a string")
			return nil
		}
		out[i] = s
	}
	return out
}

// Raw returns key's value as encoding/json decodes into an any (objects are
// map[string]any, arrays []any, numbers float64), or nil if it is absent or
// null. The result is a fresh copy.
func (c *Config) Raw(key string) any { return plain(c.fields[key]) }

// plain deep-copies a decoded value, turning json.Numbers into float64s.
func plain(v any) any {
	switch v := v.(type) {
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = plain(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = plain(e)
		}
		return out
	}
	return v
}

// Sub returns the object key (linear_attn_config, rope_scaling,
// quantization_config, vision_config, ...) as a Config sharing c's file, path
// and error list; its errors name keys as "key.inner". When key is absent or
// null the Sub is empty (Has is false for everything); when it is not an
// object a problem is recorded and the Sub is empty.
func (c *Config) Sub(key string) *Config {
	s := &Config{Path: c.Path, prefix: c.prefix + key + ".", root: c.root, errs: c.errs}
	v, ok := c.lookup(key, false)
	if !ok {
		return s
	}
	m, ok := v.(map[string]any)
	if !ok {
		c.wrongType(key, v, "an object")
		return s
	}
	s.fields = m
	if mt, ok := m["model_type"].(string); ok {
		s.ModelType = mt
	}
	return s
}

// Dtype returns the checkpoint's dtype name, transformers 5's "dtype" or the
// older "torch_dtype" ("bfloat16", "float16", ...), or "" if neither is set.
func (c *Config) Dtype() string {
	if c.Has("dtype") {
		return c.StringOr("dtype", "")
	}
	return c.StringOr("torch_dtype", "")
}
