package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unicode/utf8"
)

// Fixtures made by tools/tokfixtures/gen_hf.py with Hugging Face tokenizers
// 0.23 and transformers 5.17 (see tools/tokfixtures/README.md).

type encodeCase struct {
	Name       string  `json:"name"`
	Text       string  `json:"text"`
	BytesHex   string  `json:"bytes_hex"`
	IDs        []int32 `json:"ids"`
	IDsSpecial []int32 `json:"ids_special"`
	Decode     string  `json:"decode"`
	DecodeSkip string  `json:"decode_skip"`
}

// input is the Go string Encode gets: the raw bytes for the invalid UTF-8
// cases (whose Text is what HF saw: each invalid byte as U+FFFD).
func (c encodeCase) input(t testing.TB) string {
	if c.BytesHex == "" {
		return c.Text
	}
	b, err := hex.DecodeString(c.BytesHex)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type decodeCase struct {
	IDs      []int32 `json:"ids"`
	Text     string  `json:"text"`
	TextSkip string  `json:"text_skip"`
}

type encodeFixture struct {
	VocabSize   int          `json:"vocab_size"`
	Cases       []encodeCase `json:"cases"`
	DecodeCases []decodeCase `json:"decode_cases"`
}

type variantFixture struct {
	Name        string                     `json:"name"`
	Base        string                     `json:"base"`
	Patch       map[string]json.RawMessage `json:"patch"`
	Cases       []encodeCase               `json:"cases"`
	DecodeCases []decodeCase               `json:"decode_cases"`
}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	p := filepath.Join("testdata", name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Ext(p) == ".gz" {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func readJSON(t testing.TB, name string, v any) {
	t.Helper()
	if err := json.Unmarshal(readTestdata(t, name), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

var (
	loadMu   sync.Mutex
	loaded   = map[string]*Tokenizer{}
	baseJSON = map[string][]byte{}
)

// testTokenizer loads testdata/<name> once per test binary.
func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if tok, ok := loaded[name]; ok {
		return tok
	}
	tok, err := Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	loaded[name] = tok
	return tok
}

func testBaseJSON(t testing.TB, name string) []byte {
	loadMu.Lock()
	defer loadMu.Unlock()
	if b, ok := baseJSON[name]; ok {
		return b
	}
	b := readTestdata(t, filepath.Join(name, "tokenizer.json.gz"))
	baseJSON[name] = b
	return b
}

// applyPatch mirrors apply_patch in tools/tokfixtures/gen_hf.py.
func applyPatch(t testing.TB, base []byte, patch map[string]json.RawMessage) []byte {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(base, &top); err != nil {
		t.Fatal(err)
	}
	for k, v := range patch {
		switch k {
		case "model":
			var m, p map[string]json.RawMessage
			if err := json.Unmarshal(top["model"], &m); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(v, &p); err != nil {
				t.Fatal(err)
			}
			for kk, vv := range p {
				m[kk] = vv
			}
			top["model"] = mustMarshal(t, m)
		case "added_tokens_append":
			var a, b []json.RawMessage
			if err := json.Unmarshal(top["added_tokens"], &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(v, &b); err != nil {
				t.Fatal(err)
			}
			top["added_tokens"] = mustMarshal(t, append(a, b...))
		default:
			top[k] = v
		}
	}
	return mustMarshal(t, top)
}

func mustMarshal(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkCases(t *testing.T, tok *Tokenizer, cases []encodeCase, decodes []decodeCase) {
	t.Helper()
	bad := 0
	for _, c := range cases {
		in := c.input(t)
		got := tok.Encode(in, false)
		if !slices.Equal(got, c.IDs) {
			bad++
			t.Errorf("%s: Encode(%q, false)\n got %v\nwant %v", c.Name, c.Text, got, c.IDs)
		}
		got = tok.Encode(in, true)
		if !slices.Equal(got, c.IDsSpecial) {
			bad++
			t.Errorf("%s: Encode(%q, true)\n got %v\nwant %v", c.Name, c.Text, got, c.IDsSpecial)
		}
		if d := tok.Decode(c.IDsSpecial, false); d != c.Decode {
			bad++
			t.Errorf("%s: Decode = %q, want %q", c.Name, d, c.Decode)
		}
		if d := tok.Decode(c.IDsSpecial, true); d != c.DecodeSkip {
			bad++
			t.Errorf("%s: Decode(skip) = %q, want %q", c.Name, d, c.DecodeSkip)
		}
		checkStream(t, tok, c.IDsSpecial, c.Name)
		if bad > 20 {
			t.Fatal("too many mismatches")
		}
	}
	for i, d := range decodes {
		if got := tok.Decode(d.IDs, false); got != d.Text {
			t.Errorf("decode_cases[%d] %v: got %q, want %q", i, d.IDs, got, d.Text)
		}
		if got := tok.Decode(d.IDs, true); got != d.TextSkip {
			t.Errorf("decode_cases[%d] %v skip: got %q, want %q", i, d.IDs, got, d.TextSkip)
		}
		checkStream(t, tok, d.IDs, "decode_cases")
	}
}

// checkStream: the stream decoder's pieces are valid UTF-8 and add up to
// Decode's output, with and without skipping special tokens.
func checkStream(t testing.TB, tok *Tokenizer, ids []int32, name string) {
	t.Helper()
	for _, skip := range []bool{false, true} {
		sd := tok.NewStreamDecoder()
		sd.SetSkipSpecial(skip)
		var all []byte
		for _, id := range ids {
			s := sd.Add(id)
			if !utf8.ValidString(s) {
				t.Fatalf("%s: stream piece %q is not valid UTF-8", name, s)
			}
			all = append(all, s...)
		}
		s := sd.Flush()
		if !utf8.ValidString(s) {
			t.Fatalf("%s: stream flush %q is not valid UTF-8", name, s)
		}
		all = append(all, s...)
		if want := tok.Decode(ids, skip); string(all) != want {
			t.Fatalf("%s: stream (skip=%v) gave %q, Decode gives %q", name, skip, all, want)
		}
	}
}

func TestEncodeFixtures(t *testing.T) {
	for _, name := range []string{"qwen3", "gpt2"} {
		t.Run(name, func(t *testing.T) {
			var fx encodeFixture
			readJSON(t, "encode_"+name+".json", &fx)
			if len(fx.Cases) < 100 {
				t.Fatalf("only %d cases", len(fx.Cases))
			}
			tok := testTokenizer(t, name)
			if tok.VocabSize() != fx.VocabSize {
				t.Errorf("VocabSize = %d, want %d", tok.VocabSize(), fx.VocabSize)
			}
			checkCases(t, tok, fx.Cases, fx.DecodeCases)
		})
	}
}

func TestVariantFixtures(t *testing.T) {
	var fx struct {
		Variants []variantFixture `json:"variants"`
	}
	readJSON(t, "encode_variants.json.gz", &fx)
	if len(fx.Variants) < 6 {
		t.Fatalf("only %d variants", len(fx.Variants))
	}
	variants := fx.Variants
	if testing.Short() {
		variants = variants[:3] // each parses a whole base tokenizer
	}
	for _, v := range variants {
		t.Run(v.Name, func(t *testing.T) {
			data := applyPatch(t, testBaseJSON(t, v.Base), v.Patch)
			tok, err := parseTokenizer(data)
			if err != nil {
				t.Fatal(err)
			}
			checkCases(t, tok, v.Cases, v.DecodeCases)
		})
	}
}

type templateCase struct {
	Name     string            `json:"name"`
	Messages []Message         `json:"messages"`
	Tools    []json.RawMessage `json:"tools"`
	Kwargs   struct {
		AddGenerationPrompt bool  `json:"add_generation_prompt"`
		EnableThinking      *bool `json:"enable_thinking"`
	} `json:"kwargs"`
	Text  string  `json:"text"`
	IDs   []int32 `json:"ids"`
	Error *string `json:"error"`
}

func TestChatTemplateFixtures(t *testing.T) {
	var fx struct {
		Cases []templateCase `json:"cases"`
	}
	readJSON(t, "chat_template_qwen3.json", &fx)
	if len(fx.Cases) < 10 {
		t.Fatalf("only %d cases", len(fx.Cases))
	}
	tok := testTokenizer(t, "qwen3")
	for _, c := range fx.Cases {
		if c.Error != nil {
			t.Fatalf("%s: fixture has an error: %s", c.Name, *c.Error)
		}
		got, err := tok.ApplyChatTemplate(c.Messages, TemplateOptions{
			AddGenerationPrompt: c.Kwargs.AddGenerationPrompt,
			EnableThinking:      c.Kwargs.EnableThinking,
			Tools:               c.Tools,
		})
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if got != c.Text {
			i := 0
			for i < len(got) && i < len(c.Text) && got[i] == c.Text[i] {
				i++
			}
			t.Errorf("%s: differs at byte %d:\n got %q\nwant %q", c.Name, i, got[i:min(len(got), i+80)], c.Text[i:min(len(c.Text), i+80)])
			continue
		}
		if ids := tok.Encode(got, false); !slices.Equal(ids, c.IDs) {
			t.Errorf("%s: ids of the rendered text differ from apply_chat_template(tokenize=True)", c.Name)
		}
	}
}
