package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrite-llm/ferrite/internal/settings"
)

// cmdFlags are the flags of the chat and of `ferrite run`: the settings of
// settings.Table that have a flag, and the few flags that are not
// settings.
type cmdFlags struct {
	given   map[string]any // settings.Table key → the value the command line gave, checked
	config  string         // --config: the configuration file
	logPath string         // --log: the debug log's file
	raw     bool           // --raw: no chat template
	// endpoints are the chat's --endpoint flags (URL or NAME=URL).
	endpoints []string
}

// scope is the command a flag set is for.
type scope uint8

const (
	chatScope     scope = iota // plain ferrite: every setting with a flag
	runScope                   // ferrite run: the settings marked Run
	tokenizeScope              // ferrite tokenize: --model and --config
	serveScope                 // ferrite serve: the [engine] and [mtp] settings (serve.go adds its own --model)
)

// inScope reports whether the flag of setting s belongs to a command of
// scope sc.
func inScope(s *settings.Setting, sc scope) bool {
	switch {
	case s.Flag == "":
		return false
	case sc == serveScope:
		return strings.HasPrefix(s.Key, "engine.") || strings.HasPrefix(s.Key, "mtp.")
	}
	return sc == chatScope || sc == runScope && s.Run || s.Flag == "model"
}

// newFlagSet is the flag set of a command. It prints nothing itself:
// parseFlags does.
func newFlagSet(name string, sc scope, f *cmdFlags) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	f.given = map[string]any{}
	for i := range settings.Table {
		s := &settings.Table[i]
		if inScope(s, sc) {
			fs.Var(settingFlag{s, f.given}, s.Flag, s.Help)
		}
	}
	fs.StringVar(&f.config, "config", settings.DefaultPath(), "the configuration `FILE`; one named here must exist")
	if sc == chatScope || sc == runScope {
		fs.StringVar(&f.logPath, "log", "", "write a debug log to `FILE`: errors with their stacks, load and save failures, load timings")
		if sc == chatScope {
			fs.Func("endpoint", "an OpenAI-compatible server, `URL` or NAME=URL (repeatable): its models are listed as NAME/MODEL; without --model the chat opens its first one [chat only]", func(v string) error {
				f.endpoints = append(f.endpoints, v)
				return nil
			})
		}
		fs.BoolVar(&f.raw, "raw", false, "no chat template: the prompt is tokenized as it is and only the continuation is printed (run, or the chat on a pipe)")
	}
	return fs
}

// settingFlag is the flag of one setting. It parses and checks its value
// with the setting's own parser, so that a flag takes what the file takes
// ("--kv-budget 1GiB").
type settingFlag struct {
	s     *settings.Setting
	given map[string]any
}

func (f settingFlag) String() string {
	if f.s == nil || f.s.Kind == settings.Bool { // a "no-…" switch is off by default
		return ""
	}
	return f.s.Format(f.s.Default)
}

func (f settingFlag) Set(text string) error {
	if f.s.Kind == settings.Bool {
		on, err := strconv.ParseBool(text)
		if err != nil {
			return fmt.Errorf("%q: want true or false", text)
		}
		f.given[f.s.Key] = !on
		return nil
	}
	v, err := f.s.Parse(text)
	if err != nil {
		return err
	}
	f.given[f.s.Key] = v
	return nil
}

// IsBoolFlag makes a "no-…" switch take no value.
func (f settingFlag) IsBoolFlag() bool { return f.s != nil && f.s.Kind == settings.Bool }

// parseFlags parses args. On --help it prints help to stdout; on a
// mistake it prints one line to stderr. ok is false when the command
// should return code.
func parseFlags(fs *flag.FlagSet, args []string, help func(io.Writer), stdout, stderr io.Writer) (code int, ok bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		help(stdout)
		return 0, false
	}
	fmt.Fprintf(stderr, "%s: %v (%s --help lists the flags)\n", commandName(fs), err, commandName(fs))
	return 2, false
}

// usageAndFlags is the --help of a command: its usage, then its flags.
func usageAndFlags(usage string, fs *flag.FlagSet) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprint(w, usage)
		printFlags(w, fs)
	}
}

// commandName is how the user typed the command of fs.
func commandName(fs *flag.FlagSet) string {
	if fs.Name() == "ferrite" {
		return "ferrite"
	}
	return "ferrite " + fs.Name()
}

// printFlags lists fs's flags: a setting's with its values and default
// from settings.Table, the others with their usage.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(fl *flag.Flag) {
		arg, help := flag.UnquoteUsage(fl)
		if sf, ok := fl.Value.(settingFlag); ok {
			s := sf.s
			arg, help = flagArg(s), strings.ReplaceAll(s.Help, "`", "")
			switch {
			case s.Kind == settings.Bool:
				help = fmt.Sprintf("turns %s off: %s", s.Key, help)
			case s.DefaultText != "":
				help += fmt.Sprintf(" (default: %s)", s.DefaultText)
			case s.Kind == settings.Enum:
				help += fmt.Sprintf(" (default %s)", s.Format(s.Default))
			case s.Kind != settings.String:
				help += fmt.Sprintf(" (%s; default %s)", s.Values(), s.Format(s.Default))
			}
			if !s.Run && fs.Name() == "ferrite" {
				help += " [chat only]"
			}
		} else if fl.DefValue != "" && fl.DefValue != "false" {
			help += fmt.Sprintf(" (default %s)", fl.DefValue)
		}
		head := "  --" + fl.Name
		if arg != "" {
			head += " " + arg
		}
		fmt.Fprintf(w, "%s\n        %s\n", head, help)
	})
}

// flagArg names a setting flag's value in the help.
func flagArg(s *settings.Setting) string {
	switch s.Kind {
	case settings.Bool:
		return ""
	case settings.Int, settings.Uint, settings.Float:
		return "N"
	case settings.Size:
		return "SIZE"
	case settings.Enum: // an empty choice is the default, not something to type
		return strings.Join(slices.DeleteFunc(slices.Clone(s.Choices), func(c string) bool { return c == "" }), "|")
	}
	if s.Flag == "model" {
		return "DIR|NAME"
	}
	return "TEXT"
}

// loadConfig reads the configuration file (the one --config names, which
// must then exist) and puts the flags given over it. warn is a problem of
// the file, which is then ignored; err stops the command.
func (f *cmdFlags) loadConfig(fs *flag.FlagSet) (cfg settings.Config, warn, err error) {
	configGiven := false
	fs.Visit(func(fl *flag.Flag) { configGiven = configGiven || fl.Name == "config" })
	if configGiven {
		cfg, warn = settings.LoadRequired(f.config)
	} else {
		cfg, warn = settings.Load(f.config)
	}
	if me := (*settings.MissingError)(nil); errors.As(warn, &me) {
		return cfg, nil, fmt.Errorf("--config %w", warn)
	}
	for key, v := range f.given {
		settings.Lookup(key).Put(&cfg, v)
		cfg.Give(key)
	}
	return cfg, warn, nil
}

// setup is what the chat and run share after their flags: the
// configuration with the flags over it, and the debug log.
type setup struct {
	cfg      settings.Config
	log      *slog.Logger
	logPath  string // "" without a debug log
	closeLog func()
}

// setup reads the configuration and opens the debug log. A problem of the
// file is logged and returned as warn (the file is then ignored); err
// stops the command.
func (f *cmdFlags) setup(fs *flag.FlagSet) (st *setup, warn, err error) {
	cfg, warn, err := f.loadConfig(fs)
	if err != nil {
		return nil, nil, err
	}
	log, path, closeLog, err := openLog(f.logPath, cfg.DebugLog)
	if err != nil {
		return nil, nil, err
	}
	if warn != nil {
		log.Warn("configuration ignored", "err", warn)
	}
	return &setup{cfg: cfg, log: log, logPath: path, closeLog: closeLog}, warn, nil
}

// models is the catalog of models under the configuration.
func (st *setup) models() *chatModels {
	return &chatModels{cfg: st.cfg, builtin: builtinModels, log: st.log}
}
