package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

const tokenizeUsage = `usage: ferrite tokenize [--model DIR|NAME] [--config FILE] [TEXT]
Prints the token ids of TEXT (or of stdin, without its final line break),
no special tokens added, space-separated on one line. The model is the one
ferrite run would use: --model, else default_model of the configuration,
else the built-in model.

flags:
`

// cmdTokenize implements `ferrite tokenize`: the ids of a text, no special
// tokens added, space-separated on one line.
func cmdTokenize(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f cmdFlags
	fs := newFlagSet("tokenize", tokenizeScope, &f)
	if code, ok := parseFlags(fs, args, usageAndFlags(tokenizeUsage, fs), stdout, stderr); !ok {
		return code
	}
	cfg, warn, err := f.loadConfig(fs)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite tokenize: %v\n", err)
		return 2
	}
	if warn != nil {
		fmt.Fprintf(stderr, "ferrite tokenize: warning: %v\n", warn)
	}
	text, err := promptText(fs.Args(), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite tokenize: %v\n", err)
		return 2
	}
	tok, err := loadTokenizer(&cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite tokenize: %v\n", err)
		return 1
	}
	ids := tok.Encode(text, false)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(int(id))
	}
	fmt.Fprintln(stdout, strings.Join(parts, " "))
	return 0
}

// loadTokenizer is the tokenizer of the model run would open under cfg,
// or of a directory that holds only the tokenizer's files.
func loadTokenizer(cfg *settings.Config) (*tokenizer.Tokenizer, error) {
	if st, err := os.Stat(cfg.DefaultModel); err == nil && st.IsDir() {
		return tokenizer.Load(cfg.DefaultModel)
	}
	cat := &chatModels{cfg: *cfg, builtin: builtinModels}
	e, err := cat.resolve(cfg.DefaultModel)
	if err != nil {
		return nil, err
	}
	if e.Source == catalog.SourceBuiltin {
		return builtin.Tokenizer()
	}
	return tokenizer.Load(e.Dir)
}
