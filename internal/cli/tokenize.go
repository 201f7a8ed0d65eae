package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/engine"
)

// cmdTokenize implements `ferrite tokenize`: the ids of a text, no special
// tokens added, space-separated on one line.
func cmdTokenize(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("model", "", "model directory holding tokenizer.json, or a GGUF file")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: ferrite tokenize --model DIR [TEXT]   (the text is read from stdin when not given)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *dir == "" {
		fmt.Fprint(stderr, "ferrite tokenize: --model DIR is required\n")
		return 2
	}
	text, err := promptText(fs.Args(), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite tokenize: %v\n", err)
		return 2
	}
	tok, err := engine.LoadTokenizer(*dir)
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
