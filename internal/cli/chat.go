package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/tokenizer"
	"github.com/ferrite-llm/ferrite/ui"
)

// builtinModels are the models built into the binary, listed first by
// /models; the first is the default model when neither --model nor the
// configuration names one.
var builtinModels = []catalog.Entry{builtinEntry()}

// builtinEntry is ferrite-tiny, the model embedded in the binary.
func builtinEntry() catalog.Entry {
	return catalog.Entry{Name: builtin.Name, Arch: "glm5_next", Size: int64(len(builtin.WeightBytes())),
		Source: catalog.SourceBuiltin, Open: builtin.Open}
}

// chatFlags are the chat's flags that `ferrite run` does not have.
type chatFlags struct {
	config      string
	noSave      bool
	noHistory   bool
	noMouse     bool
	theme       string
	batchTokens int
	maxSeqs     int
}

func (c *chatFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.config, "config", settings.DefaultPath(), "configuration file")
	fs.BoolVar(&c.noSave, "no-save", false, "do not autosave chats")
	fs.BoolVar(&c.noHistory, "no-history", false, "do not keep the input history across sessions")
	fs.BoolVar(&c.noMouse, "no-mouse", false, "leave the mouse to the terminal (select text; no wheel scrolling)")
	fs.StringVar(&c.theme, "theme", "auto", "colours for a dark or light terminal: auto, dark, light")
	fs.IntVar(&c.batchTokens, "batch-tokens", 0, "tokens one engine step may run (0 = the runtime's default)")
	fs.IntVar(&c.maxSeqs, "max-seqs", 0, "replies generated at once (0 = the runtime's default)")
}

// chatFlagSet is the flag set of plain `ferrite`.
func chatFlagSet(f *runFlags, c *chatFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ferrite", flag.ContinueOnError)
	fs.SetOutput(out)
	f.register(fs)
	c.register(fs)
	fs.Usage = func() { printHelp(out) }
	return fs
}

// printHelp is `ferrite --help`: the commands, the chat's flags, the
// configuration file, and the chat's slash commands and keys.
func printHelp(w io.Writer) {
	var f runFlags
	var c chatFlags
	fs := chatFlagSet(&f, &c, w)
	fmt.Fprint(w, usage)
	fmt.Fprint(w, "\nflags of the chat (plain `ferrite`; run has the first group too):\n")
	fs.PrintDefaults()
	fmt.Fprintf(w, `
--model takes a model directory or the name of a model /models lists (a
Hugging Face cache entry such as Qwen/Qwen3-0.6B, a folder of model_dirs or
of %s). Without it the chat opens default_model.

configuration: %s
  default_model, model_dirs, system_prompt, theme, mouse, autosave, history,
  [sampling] temperature top_p top_k min_p repeat_penalty seed max_tokens,
  [mtp] mode draft, [engine] device threads kv_budget batch_tokens max_seqs.
  Flags given on the command line win. README.md ("The chat") documents
  every key.

in the chat:
%s
`, catalog.ModelsDir(), settings.DefaultPath(), indentText(ui.Help(), "  "))
}

func indentText(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// cmdChat implements plain `ferrite`: the chat on a terminal, and `ferrite
// run` when stdout is not a terminal (pipes, scripts).
func cmdChat(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f runFlags
	var cf chatFlags
	fs := chatFlagSet(&f, &cf, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, cfgErr := settings.Load(cf.config)
	if err := applyFlags(&cfg, fs, &f, &cf); err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 2
	}
	f.fromConfig(&cfg)
	cat := &chatModels{cfg: cfg, builtin: builtinModels}
	if !isTerminal(stdout) {
		if cfgErr != nil {
			fmt.Fprintf(stderr, "ferrite: warning: %v\n", cfgErr)
		}
		prompt, err := promptText(fs.Args(), stdin)
		if err != nil {
			fmt.Fprintf(stderr, "ferrite: %v\n", err)
			return 2
		}
		e, err := cat.resolve(f.model)
		if err != nil {
			fmt.Fprintf(stderr, "ferrite: %v\n", err)
			return 1
		}
		f.model = e.Dir
		if e.Open != nil {
			f.model = builtin.Label
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
	e, err := cat.resolve(f.model)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "loading %s…\n", e.Name)
	eng, closer, err := cat.open(ctx, e, true, func(string) {})
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	s := cfg.Sampling
	opts := ui.Options{
		Settings: &ui.Settings{
			Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP,
			RepeatPenalty: s.RepeatPenalty, Seed: s.Seed, MaxTokens: s.MaxTokens,
		},
		System:    cfg.SystemPrompt,
		NoSave:    !cfg.Autosave,
		NoHistory: !cfg.History,
		NoMouse:   !cfg.Mouse,
		Theme:     cfg.Theme,
		Models:    cat,
		Model:     uiEntry(e),
		Closer:    closer, // Run closes it
	}
	if cfgErr != nil {
		opts.Warnings = append(opts.Warnings, cfgErr.Error()+" (the chat uses the defaults)")
	}
	if err := ui.Run(ctx, eng, opts); err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	return 0
}

// applyFlags puts the flags the user set on top of the configuration, and
// checks the chat's own flags.
func applyFlags(cfg *settings.Config, fs *flag.FlagSet, f *runFlags, cf *chatFlags) error {
	var err error
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "model":
			cfg.DefaultModel = f.model
		case "max-tokens":
			cfg.Sampling.MaxTokens = f.maxTokens
		case "temperature":
			cfg.Sampling.Temperature = f.temperature
		case "top-k":
			cfg.Sampling.TopK = f.topK
		case "top-p":
			cfg.Sampling.TopP = f.topP
		case "min-p":
			cfg.Sampling.MinP = f.minP
		case "repeat-penalty":
			cfg.Sampling.RepeatPenalty = f.repeat
		case "seed":
			cfg.Sampling.Seed = f.seed
		case "system":
			cfg.SystemPrompt = f.system
		case "threads":
			cfg.Engine.Threads = f.threads
		case "device":
			cfg.Engine.Device = f.device
		case "kv-budget":
			cfg.Engine.KVBudget = settings.ByteSize(f.kvBudget)
		case "mtp":
			cfg.MTP.Mode = f.mtp
		case "draft":
			cfg.MTP.Draft = f.draft
		case "batch-tokens":
			cfg.Engine.BatchTokens = cf.batchTokens
		case "max-seqs":
			cfg.Engine.MaxSeqs = cf.maxSeqs
		case "theme":
			if cf.theme != "auto" && cf.theme != "dark" && cf.theme != "light" {
				err = fmt.Errorf("--theme %q: want auto, dark or light", cf.theme)
			}
			cfg.Theme = cf.theme
		case "no-mouse":
			cfg.Mouse = !cf.noMouse
		case "no-save":
			cfg.Autosave = !cf.noSave
		case "no-history":
			cfg.History = !cf.noHistory
		}
	})
	return err
}

// fromConfig sets the flags of `ferrite run` from the configuration (in
// which the flags the user set have already won).
func (f *runFlags) fromConfig(cfg *settings.Config) {
	s := cfg.Sampling
	f.model = cfg.DefaultModel
	f.maxTokens, f.temperature, f.topK, f.topP, f.minP, f.repeat, f.seed =
		s.MaxTokens, s.Temperature, s.TopK, s.TopP, s.MinP, s.RepeatPenalty, s.Seed
	f.system = cfg.SystemPrompt
	f.threads, f.device, f.kvBudget = cfg.Engine.Threads, cfg.Engine.Device, int64(cfg.Engine.KVBudget)
	f.mtp, f.draft = cfg.MTP.Mode, cfg.MTP.Draft
}

// chatModels is the chat's ui.Models: internal/catalog to find models,
// and the real engine to load them with the configuration's engine and
// MTP settings.
type chatModels struct {
	cfg     settings.Config
	builtin []catalog.Entry
}

func (c *chatModels) discover() ([]catalog.Entry, error) {
	es, errs := catalog.Discover(catalog.Options{Builtin: c.builtin, Dirs: c.cfg.ModelDirs})
	return es, errors.Join(errs...)
}

// resolve is the model to open for --model (or default_model) name: a
// directory, or a name the catalog knows; without a name, the first
// built-in model.
func (c *chatModels) resolve(name string) (catalog.Entry, error) {
	if name == "" {
		if len(c.builtin) > 0 {
			return c.builtin[0], nil
		}
		msg := "no model: give --model DIR (or a name /models lists), or set default_model in " + settings.DefaultPath()
		if es, _ := c.discover(); len(es) > 0 {
			names := make([]string, len(es))
			for i, e := range es {
				names[i] = e.Name
			}
			msg += "; models found: " + strings.Join(names, ", ")
		}
		return catalog.Entry{}, errors.New(msg)
	}
	return c.find(name)
}

// find is a directory (an existing one, or a name that looks like a
// path) or a catalog name.
func (c *chatModels) find(name string) (catalog.Entry, error) {
	if st, err := os.Stat(name); (err == nil && st.IsDir()) || catalog.LooksLikePath(name) {
		return catalog.Probe(name)
	}
	es, err := c.discover()
	e, ferr := catalog.Find(es, name)
	if ferr != nil && err != nil {
		return e, fmt.Errorf("%w (and: %v)", ferr, err)
	}
	return e, ferr
}

// List implements ui.Models.
func (c *chatModels) List(context.Context) ([]ui.ModelEntry, error) {
	es, err := c.discover()
	out := make([]ui.ModelEntry, len(es))
	for i, e := range es {
		out[i] = uiEntry(e)
	}
	return out, err
}

// Find implements ui.Models.
func (c *chatModels) Find(_ context.Context, name string) (ui.ModelEntry, error) {
	e, err := c.find(name)
	return uiEntry(e), err
}

// Load implements ui.Models.
func (c *chatModels) Load(ctx context.Context, me ui.ModelEntry, progress func(string)) (ui.Engine, io.Closer, error) {
	var e catalog.Entry
	var err error
	if me.Path != "" {
		e, err = catalog.Probe(me.Path)
		e.Name, e.Source = me.Name, me.Source
	} else {
		e, err = c.find(me.Name)
	}
	if err != nil {
		return nil, nil, err
	}
	return c.open(ctx, e, false, progress)
}

func uiEntry(e catalog.Entry) ui.ModelEntry {
	return ui.ModelEntry{Name: e.Name, Arch: e.Arch, Source: e.Source, Path: e.Dir, Size: e.Size, Problem: e.Problem}
}

// open loads e and starts a runtime on it, reporting its stages. strict
// makes mtp = "on" fail for a model without an MTP module (the model the
// chat starts with, as with `ferrite run`); a model switched to later
// just runs without speculation.
func (c *chatModels) open(ctx context.Context, e catalog.Entry, strict bool, progress func(string)) (ui.Engine, io.Closer, error) {
	eo := engine.Options{Threads: c.cfg.Engine.Threads, Device: c.cfg.Engine.Device}
	var s session
	s.name = e.Name
	var err error
	if e.Open != nil {
		progress("loading the built-in model")
		s.lm, s.tok, err = catalog.Load(e, eo)
	} else {
		progress("reading the tokenizer")
		s.tok, err = tokenizer.Load(e.Dir)
		if err == nil {
			if err = ctx.Err(); err == nil {
				progress("mapping the weights")
				s.lm, err = engine.Load(e.Dir, eo)
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	progress("starting the runtime")
	mode := c.cfg.MTP.Mode
	_, hasMTP := s.lm.Model.(model.MTPModel)
	if !strict && mode == "on" && !hasMTP {
		mode = "auto"
	}
	draft, err := (&runFlags{mtp: mode, draft: c.cfg.MTP.Draft}).draftTokens(s.lm.Model)
	if err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	tok := s.tok
	s.rt, err = runtime.New(s.lm.Model, runtime.Options{
		KVBudget:       int64(c.cfg.Engine.KVBudget),
		MaxBatchTokens: c.cfg.Engine.BatchTokens,
		MaxSeqs:        c.cfg.Engine.MaxSeqs,
		Draft:          draft,
		NewDecoder:     func() runtime.TextDecoder { return tok.NewStreamDecoder() },
	})
	if err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		s.Close()
		return nil, nil, err
	}
	info := ui.ModelInfo{Name: e.Name, Arch: s.lm.Model.Info().Arch, MTP: hasMTP, Draft: draft,
		Device: s.lm.Device, DeviceNote: s.lm.DeviceNote}
	return ui.NewRuntimeEngine(s.rt, s.tok, info), sessionCloser{&s}, nil
}

// sessionCloser closes a session for the chat.
type sessionCloser struct{ s *session }

func (c sessionCloser) Close() error {
	c.s.Close()
	return nil
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
