package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/tokenizer/internal/jinja"
)

// Message is one chat message given to the chat template.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// ReasoningContent is the assistant's reasoning (Qwen3's
	// reasoning_content); omitted from the template input when empty.
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string     `json:"tool_call_id,omitempty"`
	Name             string     `json:"name,omitempty"`
}

// ToolCall is a function call made by the assistant.
type ToolCall struct {
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"` // "function"
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction names the function and its arguments: a JSON object, or
// a JSON string holding the arguments as text (passed to the template as a
// string, as transformers does).
type ToolCallFunction struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// TemplateOptions are the variables and limits of one rendering.
type TemplateOptions struct {
	// AddGenerationPrompt appends the assistant turn's header.
	AddGenerationPrompt bool
	// EnableThinking, when set, is passed as the enable_thinking variable
	// (transformers passes extra apply_chat_template kwargs the same way).
	EnableThinking *bool
	// Tools are JSON schemas of the functions the model may call (the tools
	// variable; None when empty). Key order is kept.
	Tools []json.RawMessage
	// Vars are further template variables. json.RawMessage values are
	// decoded keeping their key order; other values go through
	// jinja.FromGoValue (Go maps come out with sorted keys).
	Vars map[string]any
	// Now is the time strftime_now formats; zero means time.Now().
	Now time.Time
	// Timeout bounds the rendering; zero means DefaultTemplateTimeout.
	Timeout time.Duration
}

// Limits of one chat-template rendering.
const (
	DefaultTemplateTimeout = 2 * time.Second
	// maxTemplateSteps bounds loop iterations plus macro calls.
	maxTemplateSteps = 10_000_000
	// maxRange is Jinja's sandbox MAX_RANGE.
	maxRange = 100_000
	// maxMacroCalls bounds macro calls, and so the recursion depth (a
	// runaway recursion would otherwise overflow the goroutine stack, which
	// Go cannot recover from).
	maxMacroCalls = 5_000
	// MaxTemplateOutput bounds the text one rendering outputs, in bytes.
	MaxTemplateOutput = 16 << 20
	// maxTemplateBuilt bounds the bytes of the strings and lists one
	// rendering builds in all, garbage included; no single value may pass
	// jinja.MaxValueBytes.
	maxTemplateBuilt = 512 << 20
	// maxTemplateSource bounds a template's size, and maxTemplateNesting
	// the nesting of its brackets (the parser recurses on them).
	maxTemplateSource  = 1 << 20
	maxTemplateNesting = 500
)

// ChatTemplate is a compiled Jinja chat template.
type ChatTemplate struct {
	name     string
	tmpl     *jinja.Template
	specials map[string]string
}

// NewChatTemplate compiles a chat template. name identifies the template
// in errors (a file name, say).
func NewChatTemplate(name, source string) (c *ChatTemplate, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("chat template %s: compile: internal error: %v", name, r)
		}
	}()
	if err := checkSource(source); err != nil {
		return nil, fmt.Errorf("chat template %s: %w", name, err)
	}
	tmpl, err := jinja.Compile(guardTemplate(source))
	if err != nil {
		return nil, fmt.Errorf("chat template %s: %w", name, err)
	}
	return &ChatTemplate{name: name, tmpl: tmpl}, nil
}

// ApplyChatTemplate renders the tokenizer's chat template for msgs, as
// transformers' apply_chat_template(tokenize=False) does. The special tokens
// of tokenizer_config.json are passed as bos_token, eos_token, pad_token
// and unk_token.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, opts TemplateOptions) (string, error) {
	t.tmplOnce.Do(func() {
		if t.chatTemplate == "" {
			t.tmplErr = errors.New("tokenizer has no chat template")
			return
		}
		c, err := NewChatTemplate(t.templateName, t.chatTemplate)
		if err != nil {
			t.tmplErr = err
			return
		}
		c.specials = t.specialNames
		t.tmpl = &compiledTemplate{c}
	})
	if t.tmplErr != nil {
		return "", t.tmplErr
	}
	return t.tmpl.c.Render(msgs, opts)
}

type compiledTemplate struct{ c *ChatTemplate }

// guard enforces the limits of one rendering. The template calls it at
// every loop iteration and macro call (see guardTemplate) and from range().
type guard struct {
	deadline time.Time
	stop     atomic.Bool
	steps    atomic.Int64
	macros   atomic.Int64
	rangeLen atomic.Int64
}

var errStopped = errors.New("rendering took longer than the time limit")

// rendering counts the rendering goroutines still running, abandoned ones
// included (tests check that they end).
var rendering atomic.Int64

// check is called by the renderer every few evaluation steps: it stops a
// rendering past its deadline even inside one long expression.
func (g *guard) check() error {
	if g.stop.Load() {
		return errStopped
	}
	if time.Now().After(g.deadline) {
		g.stop.Store(true)
		return errStopped
	}
	return nil
}

func (g *guard) step() error {
	if g.stop.Load() {
		return errStopped
	}
	n := g.steps.Add(1)
	if n > maxTemplateSteps {
		return fmt.Errorf("rendering stopped: more than %d loop iterations and macro calls", maxTemplateSteps)
	}
	if n&1023 == 0 {
		return g.check()
	}
	return nil
}

// Render renders the template for msgs.
func (c *ChatTemplate) Render(msgs []Message, opts TemplateOptions) (string, error) {
	data, err := c.data(msgs, opts)
	if err != nil {
		return "", fmt.Errorf("chat template %s: %w", c.name, err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTemplateTimeout
	}
	g := &guard{deadline: time.Now().Add(timeout)}
	addGuards(data, g, opts.Now)
	type result struct {
		s   string
		err error
	}
	done := make(chan result, 1)
	rendering.Add(1)
	go func() {
		defer rendering.Add(-1)
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("internal error: %v", r)}
			}
		}()
		s, err := c.tmpl.RenderLimited(data, jinja.Limits{MaxOutput: MaxTemplateOutput, Budget: maxTemplateBuilt, Check: g.check})
		done <- result{s, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			return "", fmt.Errorf("chat template %s: %w", c.name, r.err)
		}
		return r.s, nil
	case <-timer.C:
		g.stop.Store(true)
		return "", fmt.Errorf("chat template %s: rendering took longer than %v", c.name, timeout)
	}
}

func (c *ChatTemplate) data(msgs []Message, opts TemplateOptions) (map[string]jinja.Value, error) {
	data := map[string]jinja.Value{}
	names := make([]string, 0, len(c.specials))
	for k := range c.specials {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		data[k] = jinja.NewString(c.specials[k])
	}
	keys := make([]string, 0, len(opts.Vars))
	for k := range opts.Vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := opts.Vars[k]
		if raw, ok := v.(json.RawMessage); ok {
			jv, err := jsonToValue(raw)
			if err != nil {
				return nil, fmt.Errorf("variable %s: %w", k, err)
			}
			data[k] = jv
		} else {
			data[k] = jinja.FromGoValue(v)
		}
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		list[i] = v
	}
	data["messages"] = jinja.NewList(list)
	data["tools"] = jinja.None()
	if len(opts.Tools) > 0 {
		tools := make([]jinja.Value, len(opts.Tools))
		for i, raw := range opts.Tools {
			v, err := jsonToValue(raw)
			if err != nil {
				return nil, fmt.Errorf("tools[%d]: %w", i, err)
			}
			tools[i] = v
		}
		data["tools"] = jinja.NewList(tools)
	}
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	if opts.EnableThinking != nil {
		data["enable_thinking"] = jinja.NewBool(*opts.EnableThinking)
	}
	return data, nil
}

func messageValue(m Message) (jinja.Value, error) {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(m.Content))
	if m.ReasoningContent != "" {
		d.Set("reasoning_content", jinja.NewString(m.ReasoningContent))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			cv := jinja.NewDict()
			cd := cv.AsDict()
			if tc.ID != "" {
				cd.Set("id", jinja.NewString(tc.ID))
			}
			typ := tc.Type
			if typ == "" {
				typ = "function"
			}
			cd.Set("type", jinja.NewString(typ))
			fv := jinja.NewDict()
			fd := fv.AsDict()
			fd.Set("name", jinja.NewString(tc.Function.Name))
			args := jinja.NewDict()
			if len(bytes.TrimSpace(tc.Function.Arguments)) > 0 {
				var err error
				if args, err = jsonToValue(tc.Function.Arguments); err != nil {
					return jinja.Value{}, fmt.Errorf("tool_calls[%d].function.arguments: %w", i, err)
				}
			}
			fd.Set("arguments", args)
			cd.Set("function", fv)
			calls[i] = cv
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	return v, nil
}

// jsonToValue decodes JSON into a jinja value, keeping object key order.
func jsonToValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			v := jinja.NewDict()
			d := v.AsDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				k, _ := kt.(string)
				ev, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.Set(k, ev)
			}
			_, err := dec.Token()
			return v, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				ev, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, ev)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("unexpected %v", x)
	default:
		return jinja.FromGoValue(x), nil
	}
}

// addGuards installs the callables that the guarded template calls, and a
// bounded range().
func addGuards(data map[string]jinja.Value, g *guard, now time.Time) {
	tick := func(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		if err := g.step(); err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewBool(true), nil
	}
	data[guardTick] = jinja.NewCallable(guardTick, tick)
	data[guardMacro] = jinja.NewCallable(guardMacro, func(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		if g.macros.Add(1) > maxMacroCalls {
			return jinja.Undefined(), fmt.Errorf("rendering stopped: more than %d macro calls (runaway recursion?)", maxMacroCalls)
		}
		return tick(args, kw)
	})
	data["range"] = jinja.NewCallable("range", func(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		if err := g.step(); err != nil {
			return jinja.Undefined(), err
		}
		var start, stop, step int64 = 0, 0, 1
		num := func(v jinja.Value) (int64, error) {
			switch {
			case v.IsInt():
				return v.AsInt(), nil
			case v.IsBool():
				if v.AsBool() {
					return 1, nil
				}
				return 0, nil
			}
			return 0, fmt.Errorf("range: %s object cannot be interpreted as an integer", v.String())
		}
		var err error
		switch len(args) {
		case 1:
			stop, err = num(args[0])
		case 2, 3:
			if start, err = num(args[0]); err == nil {
				stop, err = num(args[1])
			}
			if err == nil && len(args) == 3 {
				step, err = num(args[2])
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
		}
		if err != nil {
			return jinja.Undefined(), err
		}
		if step == 0 {
			return jinja.Undefined(), errors.New("range: step must not be zero")
		}
		var n int64
		if step > 0 && stop > start {
			n = (stop - start + step - 1) / step
		} else if step < 0 && stop < start {
			n = (start - stop - step - 1) / -step
		}
		if n > maxRange {
			return jinja.Undefined(), fmt.Errorf("range too big (%d items, at most %d)", n, maxRange)
		}
		if g.rangeLen.Add(n) > maxTemplateSteps {
			return jinja.Undefined(), fmt.Errorf("rendering stopped: ranges of more than %d items in all", maxTemplateSteps)
		}
		items := make([]jinja.Value, n)
		for i := range items {
			items[i] = jinja.NewInt(start + int64(i)*step)
		}
		return jinja.NewList(items), nil
	})
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		t := now
		if t.IsZero() {
			t = time.Now()
		}
		f := "%Y-%m-%d"
		if len(args) > 0 && args[0].IsString() {
			f = args[0].AsString()
		}
		return jinja.NewString(strftime(t, f)), nil
	})
}

// strftime formats t like Python's time.strftime for the common directives
// (and glibc's %-d style no-padding flag).
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		noPad := false
		if f[i] == '-' && i+1 < len(f) {
			noPad = true
			i++
		}
		num := func(v, width int) {
			if noPad {
				fmt.Fprintf(&b, "%d", v)
			} else {
				fmt.Fprintf(&b, "%0*d", width, v)
			}
		}
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'j':
			num(t.YearDay(), 3)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'B':
			b.WriteString(t.Month().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'Z':
			z, _ := t.Zone()
			b.WriteString(z)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			if noPad {
				b.WriteByte('-')
			}
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

const (
	guardTick  = "__ferrite_tick"
	guardMacro = "__ferrite_enter"
)

var (
	reForTag   = regexp.MustCompile(`^\s*for\s`)
	reMacroTag = regexp.MustCompile(`^\s*macro\s+[A-Za-z_][A-Za-z0-9_]*\s*\(`)
)

// guardTemplate rewrites a template so that every loop iteration and macro
// call goes through the guard (time limit, step limit): `{% for x in y %}`
// becomes `{% for x in y if __ferrite_tick() %}` (the filter is always true,
// and ardanlabs/jinja evaluates it once per item before the loop runs), and
// every macro gets a last parameter whose default value calls the guard.
// Loops that already have a filter or are recursive are left as they are.
// Comments and {% raw %} blocks are not touched.
func guardTemplate(src string) string {
	var b strings.Builder
	b.Grow(len(src) + 256)
	i := 0
	for i < len(src) {
		k := strings.Index(src[i:], "{")
		if k < 0 || i+k+1 >= len(src) {
			break
		}
		k += i
		switch src[k+1] {
		case '#', '{': // a comment or an expression: copied whole
			end := "}}"
			if src[k+1] == '#' {
				end = "#}"
			}
			e := strings.Index(src[k:], end)
			if e < 0 {
				b.WriteString(src[i:])
				return b.String()
			}
			b.WriteString(src[i : k+e+2])
			i = k + e + 2
			continue
		case '%':
		default:
			b.WriteString(src[i : k+1])
			i = k + 1
			continue
		}
		e := strings.Index(src[k:], "%}")
		if e < 0 {
			break
		}
		e += k // src[e:e+2] == "%}"
		inner := src[k+2 : e]
		body := strings.TrimLeft(inner, "-+")
		closeAt := e
		if closeAt > k+2 && (src[closeAt-1] == '-' || src[closeAt-1] == '+') {
			closeAt--
		}
		b.WriteString(src[i:k])
		switch {
		case strings.HasPrefix(strings.TrimSpace(body), "raw") && strings.TrimSpace(strings.TrimSpace(body)[3:]) == "":
			// Copy the raw block untouched.
			end := strings.Index(src[e:], "endraw")
			if end < 0 {
				b.WriteString(src[k:])
				return b.String()
			}
			end2 := strings.Index(src[e+end:], "%}")
			if end2 < 0 {
				b.WriteString(src[k:])
				return b.String()
			}
			stop := e + end + end2 + 2
			b.WriteString(src[k:stop])
			i = stop
			continue
		case reForTag.MatchString(body) && !hasWord(body, "if") && !hasWord(body, "recursive"):
			b.WriteString(src[k:closeAt])
			b.WriteString(" if " + guardTick + "() ")
			b.WriteString(src[closeAt : e+2])
		case reMacroTag.MatchString(body):
			p := strings.LastIndexByte(src[k:closeAt], ')')
			if p < 0 {
				b.WriteString(src[k : e+2])
				break
			}
			p += k
			open := k + strings.IndexByte(src[k:closeAt], '(')
			b.WriteString(src[k:p])
			if strings.TrimSpace(src[open+1:p]) != "" {
				b.WriteString(", ")
			}
			b.WriteString("__ferrite_g=" + guardMacro + "()")
			b.WriteString(src[p : e+2])
		default:
			b.WriteString(src[k : e+2])
		}
		i = e + 2
	}
	b.WriteString(src[i:])
	return b.String()
}

// checkSource rejects a template too big, or nested too deep, for the
// parser.
func checkSource(src string) error {
	if len(src) > maxTemplateSource {
		return fmt.Errorf("template of %d bytes, more than the limit of %d", len(src), maxTemplateSource)
	}
	depth := 0
	for i := 0; i < len(src); i++ {
		switch src[i] {
		case '(', '[', '{':
			if depth++; depth > maxTemplateNesting {
				return fmt.Errorf("brackets nested more than %d deep", maxTemplateNesting)
			}
		case ')', ']', '}':
			depth = max(0, depth-1)
			if i > 0 && (src[i-1] == '}' || src[i-1] == '%') && src[i] == '}' {
				depth = 0 // the end of a tag ends its expression
			}
		}
	}
	return nil
}

// hasWord reports whether s contains w as a whole word outside quotes.
func hasWord(s, w string) bool {
	inQ := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inQ != 0 {
			if c == inQ {
				inQ = 0
			}
			continue
		}
		if c == '"' || c == '\'' {
			inQ = c
			continue
		}
		if strings.HasPrefix(s[i:], w) && (i == 0 || !isIdent(s[i-1])) && (i+len(w) == len(s) || !isIdent(s[i+len(w)])) {
			return true
		}
	}
	return false
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
