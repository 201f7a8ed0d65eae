// Package chatprompt turns a conversation into the token ids a model is
// given: the tokenizer's chat template rendered (with the generation
// prompt), then encoded without adding special tokens (the template writes
// its own). The chat (ui), `ferrite run` (internal/cli) and the
// OpenAI-compatible server (server) all build their prompts with it, so a
// conversation reaches the model the same way from each.
package chatprompt

import (
	"fmt"
	"strings"

	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Prompt is a rendered and encoded conversation.
type Prompt struct {
	Text string  // the chat template's output
	IDs  []int32 // Text encoded (the template writes its own special tokens)
}

// OpensThink reports whether the generation prompt ends inside an open
// <think> block (templates of reasoning models that start the reply with
// the tag), so that the reply begins with reasoning.
func (p Prompt) OpensThink() bool {
	return strings.HasSuffix(strings.TrimRight(p.Text, " \t\r\n"), ThinkOpen)
}

// The tags around a reasoning model's thinking.
const (
	ThinkOpen  = "<think>"
	ThinkClose = "</think>"
)

// Encode renders msgs with tok's chat template and opts (a reply to
// generate needs opts.AddGenerationPrompt) and encodes the text. Whether
// the prompt fits is the caller's to check (against the runtime's
// MaxSeqLen).
func Encode(tok *tokenizer.Tokenizer, msgs []tokenizer.Message, opts tokenizer.TemplateOptions) (Prompt, error) {
	text, err := tok.ApplyChatTemplate(msgs, opts)
	if err != nil {
		return Prompt{}, fmt.Errorf("chat template: %w", err)
	}
	return Prompt{Text: text, IDs: tok.Encode(text, false)}, nil
}
