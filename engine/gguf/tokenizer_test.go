package gguf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// tokFixtures are the tokenizer fixtures (tokenizer/testdata) with the
// tokenizer.ggml.pre their GGUF conversion names.
var tokFixtures = []struct{ name, pre string }{{"qwen3", "qwen2"}, {"gpt2", "gpt-2"}}

func tokDir(name string) string { return filepath.Join("..", "..", "tokenizer", "testdata", name) }

// openWriter writes w to a temporary file and opens it.
func openWriter(t *testing.T, w *ggufwrite.Writer) *Model {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestTokenizerMatchesJSON converts the tokenizer fixtures to GGUF metadata
// and checks the GGUF tokenizer against Hugging Face's recorded ids and
// decodings, and against tokenizer.Load of the same files.
func TestTokenizerMatchesJSON(t *testing.T) {
	for _, fx := range tokFixtures {
		t.Run(fx.name, func(t *testing.T) {
			ref, err := tokenizer.Load(tokDir(fx.name))
			if err != nil {
				t.Fatal(err)
			}
			w := &ggufwrite.Writer{}
			bos, _ := ref.BOS()
			eos := ref.EOS()
			if err := ggufwrite.AddTokenizerJSON(w, filepath.Join(tokDir(fx.name), "tokenizer.json.gz"), fx.pre, bos, eos[0]); err != nil {
				t.Fatal(err)
			}
			w.Add("tokenizer.chat_template", "{{ messages[0].content }}")
			tok, err := openWriter(t, w).Tokenizer()
			if err != nil {
				t.Fatal(err)
			}
			if tok.ChatTemplate() != "{{ messages[0].content }}" || !slices.Equal(tok.EOS(), ref.EOS()) {
				t.Errorf("template %q, eos %v want %v", tok.ChatTemplate(), tok.EOS(), ref.EOS())
			}
			var cases struct {
				Cases []struct {
					Name, Text string
					IDs        []int32 `json:"ids"`
					IDsSpecial []int32 `json:"ids_special"`
					Decode     string  `json:"decode"`
				} `json:"cases"`
			}
			data, err := os.ReadFile(filepath.Join(tokDir(".."), "testdata", "encode_"+fx.name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &cases); err != nil {
				t.Fatal(err)
			}
			if len(cases.Cases) < 10 {
				t.Fatalf("only %d cases", len(cases.Cases))
			}
			for _, c := range cases.Cases {
				if got := tok.Encode(c.Text, false); !slices.Equal(got, c.IDs) {
					t.Errorf("%s: ids %v, want %v", c.Name, got, c.IDs)
				}
				if got := tok.Encode(c.Text, true); !slices.Equal(got, c.IDsSpecial) {
					t.Errorf("%s: ids with special tokens %v, want %v", c.Name, got, c.IDsSpecial)
				}
				if got, want := tok.Decode(c.IDs, false), ref.Decode(c.IDs, false); got != want {
					t.Errorf("%s: decode %q, want %q", c.Name, got, want)
				}
				if got, want := tok.Decode(c.IDsSpecial, true), ref.Decode(c.IDsSpecial, true); got != want {
					t.Errorf("%s: decode skipping special %q, want %q", c.Name, got, want)
				}
			}
		})
	}
}

// TestTokenizerErrors checks that tokenizers ferrite does not read are
// clear errors.
func TestTokenizerErrors(t *testing.T) {
	base := func() *ggufwrite.Writer {
		w := &ggufwrite.Writer{}
		ggufwrite.AddByteTokenizer(w, 300)
		return w
	}
	for _, c := range []struct {
		name, want string
		edit       func(w *ggufwrite.Writer)
	}{
		{"sentencepiece", "SentencePiece", func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.model", "llama") }},
		{"bert", `"bert" is not supported`, func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.model", "bert") }},
		{"none", "no tokenizer", func(w *ggufwrite.Writer) { w.KV = nil }},
		{"pre", `pre-tokenizer "mystery"`, func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.pre", "mystery") }},
		{"types", "token_type", func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.token_type", []int32{1}) }},
		{"eos", "eos_token_id = 999", func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.eos_token_id", uint32(999)) }},
		{"tokens", "tokenizer.ggml.tokens is an array [2 × int32]", func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.tokens", []int32{1, 2}) }},
		{"merge", "not in the vocab", func(w *ggufwrite.Writer) { w.Set("tokenizer.ggml.merges", []string{"x zz"}) }},
	} {
		w := base()
		c.edit(w)
		_, err := openWriter(t, w).Tokenizer()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	tok, err := openWriter(t, base()).Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("<|im_start|>the<|im_end|>", false)
	if len(ids) != 4 || tok.Decode(ids, true) != "the" || len(tok.EOS()) != 2 {
		t.Errorf("byte tokenizer: ids %v, decode %q, eos %v", ids, tok.Decode(ids, true), tok.EOS())
	}
}
