// Package cli parses ferrite's command line and runs its subcommands: the
// chat (the default), run, tokenize and bench. It returns exit codes instead
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
		}
	}
	return cmdChat(ctx, args, stdin, stdout, stderr)
}
