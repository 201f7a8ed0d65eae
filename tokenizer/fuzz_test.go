package tokenizer

import (
	"encoding/json"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// FuzzTokenizerJSON feeds arbitrary bytes as tokenizer.json (with the
// built-in model's tokenizer_config.json beside it), then encodes and
// decodes text: Load returns an error or a tokenizer that does not panic.
// Seeds: the built-in model's tokenizer.json and a tiny one.
func FuzzTokenizerJSON(f *testing.F) {
	real, err := os.ReadFile("../builtin/model/tokenizer.json")
	if err != nil {
		f.Fatal(err)
	}
	cfg, err := os.ReadFile("../builtin/model/tokenizer_config.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(real)
	f.Add([]byte(tinyTokenizer))
	f.Fuzz(func(t *testing.T, data []byte) {
		files := map[string][]byte{"tokenizer.json": data, "tokenizer_config.json": cfg}
		read := func(name string) ([]byte, error) {
			if b, ok := files[name]; ok {
				return b, nil
			}
			return nil, fs.ErrNotExist
		}
		tok, err := loadFiles("fuzz", read, func(name string) string { return name })
		if err != nil {
			return
		}
		for _, s := range []string{"Hello, world! <|im_start|>", "  é\u0301 \x00\n\n12345", ""} {
			ids := tok.Encode(s, true)
			_ = tok.Decode(ids, false)
			d := tok.NewStreamDecoder()
			for _, id := range ids {
				d.Add(id)
			}
			d.Flush()
		}
		ids := []int32{-1, 0, 1, 2, int32(tok.VocabSize()), int32(tok.VocabSize()) - 1, 1 << 30}
		_ = tok.Decode(ids, true)
		_ = tok.Decode(ids, false)
	})
}

// FuzzChatTemplate renders arbitrary templates under a short time limit:
// each ends in output or an error within the limit (plus scheduling slack),
// never a panic, a hang or a runaway allocation. Seeds: the Qwen3 template of
// the fixtures, the built-in model's, and hostile ones.
func FuzzChatTemplate(f *testing.F) {
	var cases struct {
		Template string `json:"template_source"`
	}
	data, err := os.ReadFile("testdata/chat_template_qwen3.json")
	if err != nil {
		f.Fatal(err)
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		f.Fatal(err)
	}
	if cases.Template != "" {
		f.Add(cases.Template)
	}
	builtin, err := os.ReadFile("../builtin/model/chat_template.jinja")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(builtin))
	for _, h := range fixtures.HostileTemplates {
		f.Add(h.Src)
	}
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: strings.Repeat("hi ", 100)}}
	const limit = 200 * time.Millisecond
	f.Fuzz(func(t *testing.T, src string) {
		c, err := NewChatTemplate("fuzz", src)
		if err != nil {
			return
		}
		start := time.Now()
		out, err := c.Render(msgs, TemplateOptions{AddGenerationPrompt: true, Timeout: limit})
		if d := time.Since(start); d > limit+2*time.Second {
			t.Fatalf("rendering took %v (limit %v)", d, limit)
		}
		if err == nil && len(out) > MaxTemplateOutput {
			t.Fatalf("output of %d bytes passed the limit", len(out))
		}
	})
}
