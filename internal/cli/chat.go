package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ferrite-llm/ferrite/ui"
)

// cmdChat implements plain `ferrite`: the chat on a terminal, and `ferrite
// run` when stdout is not a terminal (pipes, scripts).
func cmdChat(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ferrite", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f runFlags
	f.register(fs)
	noSave := fs.Bool("no-save", false, "do not autosave chats")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fmt.Fprint(stderr, "\nflags of the chat (and of run):\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if !isTerminal(stdout) {
		prompt, err := promptText(fs.Args(), stdin)
		if err != nil {
			fmt.Fprintf(stderr, "ferrite: %v\n", err)
			return 2
		}
		if err := run(ctx, &f, prompt, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "ferrite: %v\n", err)
			return 1
		}
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ferrite: unexpected argument %q (to generate once, use `ferrite run`)\n", fs.Arg(0))
		return 2
	}
	fmt.Fprintf(stderr, "loading %s…\n", f.model)
	s, err := open(&f)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	defer s.Close()
	settings := ui.DefaultSettings()
	settings.Temperature = f.temperature
	settings.TopK = f.topK
	settings.TopP = f.topP
	settings.MinP = f.minP
	settings.RepeatPenalty = f.repeat
	settings.Seed = f.seed
	settings.MaxTokens = f.maxTokens
	eng := ui.NewRuntimeEngine(s.rt, s.tok, ui.ModelInfo{Name: s.name, Arch: s.lm.Model.Info().Arch})
	if err := ui.Run(ctx, eng, ui.Options{Settings: &settings, System: f.system, NoSave: *noSave}); err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	return 0
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
