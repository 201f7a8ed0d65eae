package tokenizer

import (
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// TestLoadFS checks that LoadFS reads a directory of a file system exactly as
// Load reads it from disk.
func TestLoadFS(t *testing.T) {
	texts := []string{"Hello, world! It's 2024.", "  spaces\tand\nnewlines  ", "café 日本語 😀", "<|im_start|>user\nhi<|im_end|>"}
	dirs := []string{"qwen3", "gpt2"}
	if testing.Short() {
		dirs = dirs[1:] // Qwen3's 151k-token vocabulary takes seconds to load three times
	}
	for _, dir := range dirs {
		want, err := Load("testdata/" + dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := LoadFS(os.DirFS("testdata"), dir)
		if err != nil {
			t.Fatal(err)
		}
		got2, err := LoadFS(os.DirFS("testdata/"+dir), ".")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range texts {
			w := want.Encode(s, true)
			if g := got.Encode(s, true); !slices.Equal(g, w) {
				t.Errorf("%s: %q: LoadFS %v, Load %v", dir, s, g, w)
			}
			if g := got2.Encode(s, true); !slices.Equal(g, w) {
				t.Errorf("%s: %q: LoadFS(.) %v, Load %v", dir, s, g, w)
			}
		}
		if got.VocabSize() != want.VocabSize() || !slices.Equal(got.EOS(), want.EOS()) || got.ChatTemplate() != want.ChatTemplate() {
			t.Errorf("%s: vocab/eos/template differ", dir)
		}
	}
}

func TestLoadFSFiles(t *testing.T) {
	tj, err := os.ReadFile("testdata/qwen3/tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile("testdata/qwen3/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	m := fstest.MapFS{
		"m/tokenizer.json.gz":          {Data: tj},
		"m/tokenizer_config.json":      {Data: cfg},
		"m/chat_template.jinja":        {Data: []byte("{% for m in messages %}[{{ m.content }}]{% endfor %}")},
		"m/generation_config.json":     {Data: []byte(`{"eos_token_id": [151643, 7]}`)},
		"bad/tokenizer.json":           {Data: []byte(`{"model": `)},
		"badjinja/tokenizer.json":      {Data: []byte(tinyTokenizer)},
		"badjinja/chat_template.jinja": {Data: []byte{0xff, 0xfe}},
	}
	tok, err := LoadFS(m, "m")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tok.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, TemplateOptions{})
	if err != nil || out != "[hi]" {
		t.Errorf("template from chat_template.jinja: %q %v", out, err)
	}
	if !tok.IsEOS(7) {
		t.Errorf("generation_config eos not applied: %v", tok.EOS())
	}
	for _, dir := range []string{"bad", "badjinja", "missing"} {
		if _, err := LoadFS(m, dir); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: error %v, want one naming the directory", dir, err)
		}
	}
}
