// Command ferrite is a terminal chat application with a complete LLM
// inference engine in its own process. See README.md.
//
//	ferrite                       open the chat (built-in model)
//	ferrite --model DIR           open the chat on a Hugging Face model directory
//	ferrite run [--model DIR] TEXT  generate once, streaming to stdout
//	ferrite tokenize [TEXT]       print token ids of TEXT (argument or stdin)
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/ferrite-llm/ferrite/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if code != 0 {
		os.Exit(code)
	}
}
