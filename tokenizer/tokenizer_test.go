package tokenizer

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var roundTripSeeds = []string{
	"", "a", " ", "\n", "Hello world", "  leading and trailing  ", "a\r\nb\n\n\tc",
	"don't I'M we'Re", "12345678901234567890", "你好，世界！", "👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈",
	"e\u0301 \u212b", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>x<|endoftext|",
	"<think>\nx\n</think>", "مرحبا नमस्ते สวัสดี", "func main() {\n\tfmt.Println(\"hi\")\n}\n",
	"\u00a0\u3000\u2009\u0085", "a\x00b\x7f", "<|im_end|>\u0338", strings.Repeat("ab ", 50),
}

// FuzzRoundTrip: Decode(Encode(s)) gives s back for valid UTF-8 (GPT-2 has
// no normalizer; Qwen3 gives the NFC form of the text between added tokens).
func FuzzRoundTrip(f *testing.F) {
	for _, s := range roundTripSeeds {
		f.Add(s)
	}
	gpt2 := testTokenizer(f, "gpt2")
	qwen := testTokenizer(f, "qwen3")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			// Invalid bytes are encoded as U+FFFD.
			if got := gpt2.Decode(gpt2.Encode(s, false), false); got != sanitizeUTF8(s) {
				t.Fatalf("gpt2 invalid %q: got %q", s, got)
			}
			return
		}
		if got := gpt2.Decode(gpt2.Encode(s, true), false); got != s {
			t.Fatalf("gpt2: Decode(Encode(%q)) = %q", s, got)
		}
		var want strings.Builder
		for _, p := range qwen.added.split(s, qwen.added.raw, true, nil) {
			if p.id >= 0 {
				want.WriteString(p.s)
			} else {
				want.WriteString(norm.NFC.String(p.s))
			}
		}
		ids := qwen.Encode(s, true)
		if got := qwen.Decode(ids, false); got != want.String() {
			t.Fatalf("qwen3: Decode(Encode(%q)) = %q, want %q", s, got, want.String())
		}
		checkStream(t, qwen, ids, "qwen3")
	})
}

// FuzzStreamDecode: any id sequence streams to Decode's output in valid
// UTF-8 pieces.
func FuzzStreamDecode(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{0xe2 - 0xa1 + 0x80, 0, 0x82 - 0xa1 + 0x80, 0, 1, 2})
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f, 0x01, 0x00})
	f.Add([]byte("\x9c\x02\x00\x00\xa0\x02\x00\x00\x9d\x02\x00\x00"))
	qwen := testTokenizer(f, "qwen3")
	f.Fuzz(func(t *testing.T, data []byte) {
		var ids []int32
		for len(data) >= 2 {
			var id int32
			if data[0]&1 == 0 {
				// small ids: single bytes of the byte-level alphabet
				id = int32(data[1])
				data = data[2:]
			} else if len(data) >= 4 {
				id = int32(binary.LittleEndian.Uint32(data) % uint32(qwen.VocabSize()+10))
				data = data[4:]
			} else {
				break
			}
			ids = append(ids, id)
		}
		checkStream(t, qwen, ids, "fuzz")
	})
}

func TestStreamByteTokens(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	// "☃" is E2 98 83: feed it one byte token at a time.
	var ids []int32
	for _, b := range []byte("☃x\xe2\x98") {
		id, ok := tok.TokenToID(byteToStr[b])
		if !ok {
			t.Fatal("no byte token")
		}
		ids = append(ids, id)
	}
	sd := tok.NewStreamDecoder()
	var got []string
	for _, id := range ids {
		got = append(got, sd.Add(id))
	}
	got = append(got, sd.Flush())
	want := []string{"", "", "☃", "x", "", "", "\uFFFD"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestAPI(t *testing.T) {
	q := testTokenizer(t, "qwen3")
	if _, ok := q.BOS(); ok {
		t.Error("qwen3 has no bos_token")
	}
	if eos := q.EOS(); !slices.Equal(eos, []int32{151645}) {
		t.Errorf("EOS = %v", eos)
	}
	if pad, _ := q.PAD(); pad != 151643 {
		t.Errorf("PAD = %d", pad)
	}
	if id, ok := q.TokenToID("<|im_start|>"); !ok || id != 151644 {
		t.Errorf("TokenToID = %d %v", id, ok)
	}
	if s, ok := q.IDToToken(151644); !ok || s != "<|im_start|>" {
		t.Errorf("IDToToken = %q", s)
	}
	if s, ok := q.IDToToken(220); !ok || s != "Ġ" {
		t.Errorf("IDToToken(220) = %q", s)
	}
	if !q.IsSpecial(151644) || q.IsSpecial(151667) || q.IsSpecial(100) {
		t.Error("IsSpecial")
	}
	if n := len(q.SpecialIDs()); n != 14 {
		t.Errorf("%d special ids", n)
	}
	if !strings.Contains(q.ChatTemplate(), "<|im_start|>") {
		t.Error("no chat template")
	}
	g := testTokenizer(t, "gpt2")
	if id, ok := g.BOS(); !ok || id != 50256 {
		t.Errorf("gpt2 BOS = %d", id)
	}
	if g.VocabSize() != 50257 {
		t.Errorf("gpt2 VocabSize = %d", g.VocabSize())
	}
	if _, err := g.ApplyChatTemplate(nil, TemplateOptions{}); err == nil {
		t.Error("gpt2 has no chat template")
	}
}

// writeDir makes a tokenizer directory from files.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const tinyTokenizer = `{
  "version": "1.0",
  "added_tokens": [{"id": 5, "content": "<eos>", "special": true}, {"id": 6, "content": "<bos>", "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}, "merges": [["a", "b"], "Ġ ab"]}
}`

func TestLoadSampling(t *testing.T) {
	for _, c := range []struct {
		gen  string
		want string
	}{
		{`{"eos_token_id": 5}`, "{<nil> <nil> <nil>}"},
		{`{"do_sample": false}`, "{0 <nil> <nil>}"},
		// do_sample false: greedy, the other values unused (transformers)
		{`{"do_sample": false, "temperature": 0.9, "top_k": 5}`, "{0 <nil> <nil>}"},
		{`{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20}`, "{0.6 0.95 20}"},
		{`{"temperature": 1.0}`, "{1 <nil> <nil>}"},
	} {
		dir := writeDir(t, map[string]string{"tokenizer.json": tinyTokenizer, "generation_config.json": c.gen})
		tok, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		s := tok.Sampling()
		str := func(p any) string {
			switch v := p.(type) {
			case *float64:
				if v != nil {
					return fmt.Sprint(*v)
				}
			case *int:
				if v != nil {
					return fmt.Sprint(*v)
				}
			}
			return "<nil>"
		}
		if got := "{" + str(s.Temperature) + " " + str(s.TopP) + " " + str(s.TopK) + "}"; got != c.want {
			t.Errorf("%s: Sampling = %s, want %s", c.gen, got, c.want)
		}
	}
	dir := writeDir(t, map[string]string{"tokenizer.json": tinyTokenizer, "generation_config.json": `{"top_k": "many"}`})
	if _, err := Load(dir); err == nil {
		t.Error("top_k \"many\": no error")
	}
}

func TestLoadConfigFiles(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"tokenizer.json":         tinyTokenizer,
		"tokenizer_config.json":  `{"bos_token": {"content": "<bos>"}, "eos_token": "<eos>", "add_bos_token": true, "chat_template": "config {{ messages[0].content }}"}`,
		"generation_config.json": `{"eos_token_id": [6, 5, 2]}`,
		"chat_template.jinja":    "jinja {{ messages[0].content }}{{ eos_token }}",
	})
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("ab ab", true); !slices.Equal(got, []int32{6, 2, 4}) {
		t.Errorf("Encode = %v", got)
	}
	if got := tok.Encode("ab<eos>", false); !slices.Equal(got, []int32{2, 5}) {
		t.Errorf("Encode = %v", got)
	}
	if got := tok.EOS(); !slices.Equal(got, []int32{5, 6, 2}) {
		t.Errorf("EOS = %v", got)
	}
	if !tok.IsEOS(2) || tok.IsEOS(0) {
		t.Error("IsEOS")
	}
	s, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, TemplateOptions{})
	if err != nil || s != "jinja hi<eos>" {
		t.Errorf("template: %q %v", s, err)
	}
}

// TestStreamGeneric covers the stream decoder of non-ByteLevel decoders:
// word-joining without a decoder plus transformers' space clean-up, and a
// Metaspace decoder.
func TestStreamGeneric(t *testing.T) {
	const vocab = `{"Hello": 0, ",": 1, "world": 2, ".": 3, "n't": 4, "'s": 5, "do": 6, "▁a": 7, "▁": 8, "b": 9}`
	for _, dec := range []string{"null", `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}`} {
		j := `{"decoder": ` + dec + `, "added_tokens": [{"id": 10, "content": "<s>", "special": true}], "model": {"type": "BPE", "vocab": ` + vocab + `, "merges": []}}`
		tok, err := parseTokenizer([]byte(j))
		if err != nil {
			t.Fatal(err)
		}
		if err := tok.applyConfig([]byte(`{"clean_up_tokenization_spaces": true}`)); err != nil {
			t.Fatal(err)
		}
		if got := tok.Decode([]int32{0, 1, 2, 3}, false); dec == "null" && got != "Hello, world." {
			t.Errorf("Decode = %q", got)
		}
		for seed := range 300 {
			ids := make([]int32, 1+seed%13)
			for i := range ids {
				ids[i] = int32((seed*7 + i*i*3 + i) % 12)
			}
			checkStream(t, tok, ids, "generic")
		}
	}
}

func TestTemplateProcessingString(t *testing.T) {
	j := strings.Replace(tinyTokenizer, `"post_processor": null`, `"post_processor": {"type": "TemplateProcessing", "single": "<bos> $A:0 <eos>:0", "special_tokens": {"<bos>": {"ids": [6]}, "<eos>": {"ids": [5]}}}`, 1)
	tok, err := parseTokenizer([]byte(j))
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("ab", true); !slices.Equal(got, []int32{6, 2, 5}) {
		t.Fatalf("Encode = %v", got)
	}
}

func TestMalformedTokenizer(t *testing.T) {
	cases := []struct {
		name, json, want string
	}{
		{"syntax", `{"model": {`, "line 1"},
		{"not object", `[1, 2]`, "cannot unmarshal"},
		{"no model", `{"version": "1.0"}`, "model is missing"},
		{"bad version", `{"version": "2.0", "model": {}}`, "version"},
		{"wordpiece", `{"model": {"type": "WordPiece", "vocab": {}}}`, "unsupported model type"},
		{"vocab type", `{"model": {"type": "BPE", "vocab": [1], "merges": []}}`, "vocab"},
		{"merge unknown", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`, `model.merges[0]: token "b"`},
		{"merge result", `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}}`, `merged token "ab"`},
		{"merge format", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}}`, "two tokens"},
		{"merge pair", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}}`, "model.merges: [0]"},
		{"negative id", `{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`, "negative id"},
		{"pretok type", `{"pre_tokenizer": {"type": "Nope"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, `pre_tokenizer: unsupported pre-tokenizer type "Nope"`},
		{"bad regex", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated", "invert": false}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "regex"},
		{"bad behavior", `{"pre_tokenizer": {"type": "Split", "pattern": {"String": "x"}, "behavior": "Sideways"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "split behavior"},
		{"normalizer type", `{"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "normalizer"},
		{"nested seq", `{"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": 3}]}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "normalizer"},
		{"decoder", `{"decoder": {"type": "Strip", "content": "ab"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "decoder: Strip"},
		{"post", `{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "special_tokens"},
		{"added", `{"added_tokens": {"a": 1}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`, "added_tokens"},
		{"dropout", `{"model": {"type": "BPE", "vocab": {}, "merges": [], "dropout": 0.1}}`, "dropout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeDir(t, map[string]string{"tokenizer.json": c.json})
			_, err := Load(dir)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer.json")) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q should name the file and contain %q", err, c.want)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("bad gzip", func(t *testing.T) {
		dir := writeDir(t, map[string]string{"tokenizer.json.gz": "not gzip"})
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer.json.gz") {
			t.Fatalf("error %v", err)
		}
	})
	for name, cfg := range map[string]string{
		"tokenizer_config.json":  `{"eos_token": "<nope>"}`,
		"generation_config.json": `{"eos_token_id": "x"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeDir(t, map[string]string{"tokenizer.json": tinyTokenizer, name: cfg})
			if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("error %v", err)
			}
		})
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, src := range []string{
		"{% if x %}unclosed",
		"{{ unclosed ",
		"{% for %}{% endfor %}",
		"{% endfor %}",
	} {
		if _, err := NewChatTemplate("bad.jinja", src); err == nil || !strings.Contains(err.Error(), "bad.jinja") {
			t.Errorf("%q: error %v should name the template", src, err)
		}
	}
	c, err := NewChatTemplate("raise.jinja", `{{ raise_exception("roles must alternate") }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Render(nil, TemplateOptions{}); err == nil || !strings.Contains(err.Error(), "roles must alternate") || !strings.Contains(err.Error(), "raise.jinja") {
		t.Errorf("raise_exception: %v", err)
	}
	// A tokenizer with a malformed template loads; applying it fails.
	dir := writeDir(t, map[string]string{"tokenizer.json": tinyTokenizer, "chat_template.jinja": "{% if %}"})
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.ApplyChatTemplate(nil, TemplateOptions{}); err == nil || !strings.Contains(err.Error(), "chat_template.jinja") {
		t.Errorf("error %v", err)
	}
}

func TestTemplateLimits(t *testing.T) {
	for _, c := range []struct {
		name, src, want string
		timeout         time.Duration
	}{
		{"recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "macro calls", 5 * time.Second},
		{"huge range", `{% for i in range(1000000000) %}x{% endfor %}`, "range too big", time.Second},
		{"nested loops", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, "took longer than", 300 * time.Millisecond},
		{"loops over a list", `{% set l = range(100000) %}{% for i in l %}{% for j in l %}{% for k in l %}{% endfor %}{% endfor %}{% endfor %}`, "took longer than", 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := NewChatTemplate(c.name, c.src)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = tmpl.Render(nil, TemplateOptions{Timeout: c.timeout})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if d := time.Since(start); d > c.timeout+time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
}

func TestTemplateFeatures(t *testing.T) {
	src := `{% macro item(x, sep="; ") %}{{ x }}{{ sep }}{% endmacro %}` +
		`{%- for m in messages %}{{ item(m.role) }}{{ m.content }}|{% endfor %}` +
		`{{ strftime_now("%-d %B %Y") }}|{{ range(3) | join(",") }}|{{ tools[0] | tojson }}|{{ extra.b }}{{ enable_thinking }}` +
		`{# {% for c in d %} #}{% raw %}{% for q in r %}{% endraw %}{{ "{% for" }}`
	c, err := NewChatTemplate("features", src)
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	got, err := c.Render([]Message{{Role: "user", Content: "hi"}}, TemplateOptions{
		Now:            time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC),
		Tools:          []json.RawMessage{json.RawMessage(`{"z": 1, "a": "<&>", "n": 1.5}`)},
		Vars:           map[string]any{"extra": json.RawMessage(`{"b": "B"}`)},
		EnableThinking: &yes,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `user; hi|5 March 2026|0,1,2|{"z": 1, "a": "<&>", "n": 1.5}|BTrue{% for q in r %}{% for`
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := testTokenizer(t, "qwen3")
	text := strings.Repeat("Concurrent encoding of 123 words, with ünïcödé and 中文. ", 20)
	want := tok.Encode(text, false)
	done := make(chan []int32, 8)
	for range 8 {
		go func() { done <- tok.Encode(text, false) }()
	}
	for range 8 {
		if got := <-done; !slices.Equal(got, want) {
			t.Fatal("concurrent Encode differs")
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, name := range []string{"qwen3", "gpt2"} {
		b.Run(name, func(b *testing.B) {
			tok := testTokenizer(b, name)
			var fx encodeFixture
			readJSON(b, "encode_qwen3.json", &fx)
			var sb strings.Builder
			for _, c := range fx.Cases {
				sb.WriteString(c.Text)
				sb.WriteString("\n")
			}
			text := sb.String()
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for range b.N {
				tok.Encode(text, false)
			}
		})
	}
}

func BenchmarkEncodeUncached(b *testing.B) {
	tok := testTokenizer(b, "qwen3")
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; 12345 times! ", 200)
	b.SetBytes(int64(len(text)))
	for range b.N {
		tok.model.mu.Lock()
		clear(tok.model.cache)
		tok.model.mu.Unlock()
		tok.Encode(text, false)
	}
}
