package chatprompt

import (
	"testing"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

func TestEncode(t *testing.T) {
	tok, err := builtin.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "Who are you?"}}
	p, err := Encode(tok, msgs, tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	const want = "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
	if p.Text != want {
		t.Errorf("text %q, want %q", p.Text, want)
	}
	if got := tok.Decode(p.IDs, false); got != want {
		t.Errorf("ids decode to %q", got)
	}
	if p.OpensThink() {
		t.Error("ferrite-tiny's prompt opens a <think> block")
	}
	if p, err = Encode(tok, msgs, tokenizer.TemplateOptions{}); err != nil || p.Text != "<|im_start|>user\nWho are you?<|im_end|>\n" {
		t.Errorf("without the generation prompt: %q, %v", p.Text, err)
	}
}

func TestOpensThink(t *testing.T) {
	for text, want := range map[string]bool{
		"<|im_start|>assistant\n<think>\n": true,
		"<|im_start|>assistant\n<think>":   true,
		"<|im_start|>assistant\n":          false,
		"<think>\n\n</think>\n\n":          false,
	} {
		if got := (Prompt{Text: text}).OpensThink(); got != want {
			t.Errorf("%q: %v, want %v", text, got, want)
		}
	}
}
