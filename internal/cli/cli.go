// Package cli parses ferrite's command line and runs its subcommands: the
// chat (the default), run, tokenize, bench and serve. It returns exit codes instead
// of exiting so that main.go is the only place that ends the process.
package cli

import (
	"context"
	"fmt"
	"io"
)

// Main runs ferrite with the given arguments (without the program name) and
// returns the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "ferrite: internal error: %v\n", r)
			code = 3
		}
	}()
	if len(args) > 0 {
		switch args[0] {
		case "-h", "--help", "help":
			printHelp(stdout)
			return 0
		case "run":
			return cmdRun(ctx, args[1:], stdin, stdout, stderr)
		case "tokenize":
			return cmdTokenize(ctx, args[1:], stdin, stdout, stderr)
		case "bench":
			return cmdBench(ctx, args[1:], stdin, stdout, stderr)
		case "serve":
			return cmdServe(ctx, args[1:], stderr)
		}
	}
	return cmdChat(ctx, args, stdin, stdout, stderr)
}

const usage = `usage:
  ferrite [--model DIR] [flags]         open the chat (behaves like run when stdout is not a terminal)
  ferrite run --model DIR [flags] TEXT  generate once, streaming to stdout
  ferrite tokenize --model DIR [TEXT]   print the token ids of TEXT (or stdin)
  ferrite bench --model DIR [flags]     measure throughput: concurrency × prompt × gen sweep, roofline
  ferrite serve [--model M]... [flags]  OpenAI-compatible HTTP API (default 127.0.0.1:8080)
  ferrite help                          this help
`
