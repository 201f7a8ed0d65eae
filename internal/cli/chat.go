package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

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
	return catalog.Entry{Name: builtin.Name, Arch: "glm5_next", Quant: builtin.Quant, Size: int64(len(builtin.WeightBytes())),
		Source: catalog.SourceBuiltin, Open: builtin.Open}
}

const chatUsage = `usage:
  ferrite [flags]                 open the chat (on a pipe: like run, with the prompt on stdin)
  ferrite run [flags] [TEXT]      generate once, streaming to stdout, timing to stderr
  ferrite tokenize [flags] [TEXT] print the token ids of TEXT (or stdin)
  ferrite bench --model DIR|FILE|ferrite-tiny [flags]  measure throughput: concurrency × prompt × gen sweep, roofline
  ferrite pull ORG/NAME[@REV][:QUANT]  download a Hugging Face model into the HF cache (resumable, verified)
  ferrite serve [flags]           OpenAI-compatible HTTP API on 127.0.0.1:8080 (ferrite serve --help)
  ferrite help                    this help

flags of the chat (run has those not marked [chat only]); the defaults are
an empty configuration file's: the file's values win over them, and flags
over the file:
`

// printHelp is `ferrite --help`: the commands, the chat's flags, the
// configuration file, and the chat's slash commands and keys.
func printHelp(w io.Writer) {
	var f cmdFlags
	fs := newFlagSet("ferrite", chatScope, &f)
	fmt.Fprint(w, chatUsage)
	printFlags(w, fs)
	fmt.Fprintf(w, "\n%s\n\nconfiguration: %s\n%s\n\nin the chat:\n%s\n",
		wrapText("--model takes a model directory, a GGUF file or the name of a model /models lists (a Hugging Face cache entry such as Qwen/Qwen3-0.6B, an ollama model such as llama3.2:3b, an LM Studio file, a folder of model_dirs or of "+
			catalog.ModelsDir()+"). Without it ferrite opens default_model, else the built-in "+builtin.Name+".", "", 76),
		settings.DefaultPath(),
		wrapText(configKeys()+"; [[endpoints]] name base_url api_key_env api_key models (remote servers). README.md (\"Configuration\", \"Remote endpoints\") documents every key.", "  ", 76),
		indentText(ui.Help(), "  "))
}

// configKeys lists the configuration's keys by table.
func configKeys() string {
	var parts []string
	table := ""
	for _, s := range settings.Table {
		t, name, ok := strings.Cut(s.Key, ".")
		if !ok {
			t, name = "", s.Key
		}
		if t != table {
			table = t
			name = "[" + t + "] " + name
		}
		parts = append(parts, name)
	}
	return strings.Join(parts, ", ")
}

// wrapText breaks s into lines of at most width columns (a longer word
// stays whole), each starting with indent.
func wrapText(s, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, w := range strings.Fields(s) {
		if line != indent && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += w
	}
	b.WriteString(line)
	return b.String()
}

func indentText(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// cmdChat implements plain `ferrite`: the chat on a terminal, and `ferrite
// run` with the prompt on stdin when stdout is not a terminal (pipes,
// scripts).
func cmdChat(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f cmdFlags
	fs := newFlagSet("ferrite", chatScope, &f)
	if code, ok := parseFlags(fs, args, printHelp, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ferrite: unknown command %q: the commands are run, tokenize, bench, pull, serve and help (a prompt goes after `ferrite run`, or on stdin)\n", fs.Arg(0))
		return 2
	}
	if !isTerminal(stdout) {
		return generateOnce(ctx, "ferrite", nil, &f, fs, stdin, stdout, stderr)
	}
	st, warn, err := f.setup(fs)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 2
	}
	defer st.closeLog()
	cfg, log, logPath, cat := st.cfg, st.log, st.logPath, st.models()
	var remWarns []string
	cat.remote, remWarns = newRemotes(cfg.Endpoints, f.endpoints)
	var e catalog.Entry
	if cfg.DefaultModel == "" && len(f.endpoints) > 0 {
		if e, err = cat.remote.first(ctx); err != nil {
			remWarns = append(remWarns, fmt.Sprintf("--endpoint: %v; the chat opens the default model", err))
		}
	}
	if e.Name == "" {
		e, err = cat.resolve(cfg.DefaultModel)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v\n", err)
		return 1
	}
	// On a terminal the loading line is erased once the model is loaded:
	// the chat runs on the alternate screen, and the line would otherwise
	// be left on the terminal after it.
	tty := isTerminal(stderr)
	if tty {
		fmt.Fprintf(stderr, "loading %s…", e.Name)
	} else {
		fmt.Fprintf(stderr, "loading %s…\n", e.Name)
	}
	eng, closer, err := cat.open(ctx, e, openMode{strict: true}, func(string) {})
	if tty {
		fmt.Fprint(stderr, "\r\x1b[K")
	}
	if err != nil {
		fmt.Fprintf(stderr, "ferrite: %v%s\n", err, logHint(logPath))
		return 1
	}
	// The model's recommended sampling (its generation_config.json or
	// GGUF metadata, or its ollama parameters) in place of the defaults
	// the file and the flags left.
	sampling := cfg.SamplingFor(eng.Info().Sampling)
	chatSettings := ui.SettingsOf(sampling)
	opts := ui.Options{
		Settings:  &chatSettings,
		System:    cfg.SystemPrompt,
		NoSave:    !cfg.Autosave,
		NoHistory: !cfg.History,
		NoMouse:   !cfg.Mouse,
		Theme:     cfg.Theme,
		Models:    cat,
		Model:     uiEntry(e),
		Closer:    closer, // Run closes it
		Puller:    chatPuller{},
		// /model applies the new model's recommendation as a new chat would.
		SamplingFor: func(rec tokenizer.Sampling) ui.Settings { return ui.SettingsOf(cfg.SamplingFor(rec)) },
		Log:         log,
		LogPath:     logPath,
	}
	if note := ui.SamplingNote(e.Name, ui.SettingsOf(cfg.Sampling), chatSettings); note != "" {
		opts.Notes = append(opts.Notes, note)
	}
	if warn != nil {
		opts.Warnings = append(opts.Warnings, warn.Error()+" (the chat uses the defaults)")
	}
	opts.Warnings = append(opts.Warnings, remWarns...)
	if err := ui.Run(ctx, eng, opts); err != nil {
		log.Error("chat failed", "err", err)
		fmt.Fprintf(stderr, "ferrite: %v%s\n", err, logHint(logPath))
		return 1
	}
	return 0
}

// logHint points to the debug log after an error message, when there is
// one.
func logHint(path string) string {
	if path == "" {
		return ""
	}
	return " (details in " + path + ")"
}

// chatModels is the chat's ui.Models: internal/catalog to find models,
// and the real engine to load them with the configuration's engine and
// MTP settings.
type chatModels struct {
	cfg     settings.Config
	builtin []catalog.Entry
	log     *slog.Logger // the debug log: load timings and failures
	remote  *remotes     // the endpoints' models; nil: none
	// idsOnly starts runtimes without a text decoder: their events carry
	// token ids only (the server decodes them itself, one at a time).
	idsOnly bool
}

// logger is the debug log, or one that drops everything.
func (c *chatModels) logger() *slog.Logger {
	if c.log == nil {
		return discardLog
	}
	return c.log
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

// find is a directory or a GGUF file (an existing one, or a name that
// looks like a path) or a catalog name.
func (c *chatModels) find(name string) (catalog.Entry, error) {
	if st, err := os.Stat(name); (err == nil && (st.IsDir() || st.Mode().IsRegular())) || catalog.LooksLikePath(name) {
		return catalog.Probe(name)
	}
	if e, ok := c.remote.lookup(name); ok {
		return e, nil
	}
	es, err := c.discover()
	es = append(es, c.remote.listed()...)
	e, ferr := catalog.Find(es, name)
	if ferr != nil && err != nil {
		return e, fmt.Errorf("%w (and: %v)", ferr, err)
	}
	return e, ferr
}

// List implements ui.Models.
func (c *chatModels) List(ctx context.Context) ([]ui.ModelEntry, error) {
	es, err := c.discover()
	es = append(es, c.remote.list(ctx)...)
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

// Load implements ui.Models. A model that does not fit the device's free
// memory with opts.KeepDevice fails with an error wrapping ui.ErrNoRoom.
func (c *chatModels) Load(ctx context.Context, me ui.ModelEntry, opts ui.LoadOptions, progress func(string)) (ui.Engine, io.Closer, error) {
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
	eng, closer, err := c.open(ctx, e, openMode{keepDevice: opts.KeepDevice}, progress)
	if opts.KeepDevice {
		err = noRoom(err)
	}
	return eng, closer, err
}

// noRoom is err, or, where a model did not fit the device's free memory
// (*engine.DeviceMemoryError), ui.ErrNoRoom with the numbers: the chat
// then unloads its model to make room.
func noRoom(err error) error {
	if dme := (*engine.DeviceMemoryError)(nil); errors.As(err, &dme) {
		return fmt.Errorf("%w: %w", ui.ErrNoRoom, dme)
	}
	return err
}

// openMode says how open loads a model: strict makes mtp = "on" fail for
// a model without an MTP module (the model the chat starts with, as with
// `ferrite run`; a model switched to later just runs without
// speculation); keepDevice is engine.Options.KeepDevice (a /model switch
// from a model on a GPU, which the chat can unload to make room).
type openMode struct {
	strict, keepDevice bool
}

func uiEntry(e catalog.Entry) ui.ModelEntry {
	return ui.ModelEntry{Name: e.Name, Arch: e.Arch, Quant: e.Quant, Source: e.Source, Path: e.Dir, Size: e.Size, Problem: e.Problem}
}

// open loads e as mode says and starts a runtime on it, reporting its
// stages.
func (c *chatModels) open(ctx context.Context, e catalog.Entry, mode openMode, progress func(string)) (ui.Engine, io.Closer, error) {
	if e.Source == sourceRemote {
		return c.remote.open(e)
	}
	s, err := c.openSession(ctx, e, mode, progress)
	if err != nil {
		return nil, nil, err
	}
	_, hasMTP := s.lm.Model.(model.MTPModel)
	info := ui.ModelInfo{Name: e.Name, Arch: s.lm.Model.Info().Arch, MTP: hasMTP, Draft: s.draft,
		Device: s.lm.Device, DeviceNote: s.lm.DeviceNote, Sampling: s.sampling, DeviceMemory: s.lm.Memory().OnDevice}
	return ui.NewRuntimeEngine(s.rt, s.tok, info), sessionCloser{s}, nil
}

// openSession loads e and starts a runtime on it (see open), and records
// the time each stage took, or why it failed, in the debug log.
func (c *chatModels) openSession(ctx context.Context, e catalog.Entry, mode openMode, progress func(string)) (*session, error) {
	start := time.Now()
	s, stages, err := c.load(ctx, e, mode, progress)
	if err != nil {
		c.logger().Error("model load failed", "model", e.Name, "dir", e.Dir, "err", err, "after", time.Since(start))
		return nil, err
	}
	args := []any{"model", e.Name, "dir", e.Dir, "total", time.Since(start)}
	for _, st := range stages {
		args = append(args, st.name, st.took)
	}
	c.logger().Info("model loaded", args...)
	return s, nil
}

// stage is one timed step of a model load.
type stage struct {
	name string
	took time.Duration
}

func (c *chatModels) load(ctx context.Context, e catalog.Entry, mode openMode, progress func(string)) (*session, []stage, error) {
	var stages []stage
	t := time.Now()
	step := func(name string) {
		now := time.Now()
		stages = append(stages, stage{name, now.Sub(t)})
		t = now
	}
	eo := engine.Options{Threads: c.cfg.Engine.Threads, Quant: c.cfg.Engine.Quant, Device: c.cfg.Engine.Device, KeepDevice: mode.keepDevice}
	s := &session{name: e.Name}
	var err error
	if e.Open != nil {
		progress("loading the built-in model")
		s.lm, s.tok, err = catalog.Load(e, eo)
		step("builtin")
	} else {
		progress("reading the tokenizer")
		s.tok, err = engine.LoadTokenizer(e.Dir)
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: a model directory needs its tokenizer files too (the folders of testdata/models are test fixtures without one, not models to chat with)", err)
		}
		step("tokenizer")
		if err == nil {
			if err = ctx.Err(); err == nil {
				progress("mapping the weights")
				s.lm, err = engine.Load(e.Dir, eo)
				step("weights")
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	s.sampling = e.Recommended(s.tok)
	if err := ctx.Err(); err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	progress("starting the runtime")
	mtp := c.cfg.MTP
	_, hasMTP := s.lm.Model.(model.MTPModel)
	if !mode.strict && mtp.Mode == "on" && !hasMTP {
		mtp.Mode = "auto"
	}
	if s.draft, err = draftTokens(mtp, s.lm.Model); err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	ro := runtime.Options{
		KVBudget:       int64(c.cfg.Engine.KVBudget),
		MaxBatchTokens: c.cfg.Engine.BatchTokens,
		MaxSeqs:        c.cfg.Engine.MaxSeqs,
		Draft:          s.draft,
		DeviceErr:      s.lm.DeviceErr,
		DeviceMemory:   s.lm.Memory,
	}
	if !c.idsOnly {
		tok := s.tok
		ro.NewDecoder = func() runtime.TextDecoder { return tok.NewStreamDecoder() }
	}
	s.rt, err = runtime.New(s.lm.Model, ro)
	step("runtime")
	if err != nil {
		s.lm.Close()
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, stages, nil
}

// session is a loaded model with its tokenizer and a running runtime.
type session struct {
	name     string
	lm       *engine.Loaded
	tok      *tokenizer.Tokenizer
	rt       *runtime.Runtime
	draft    int                // the runtime's Options.Draft
	sampling tokenizer.Sampling // what the model and its store recommend (catalog.Entry.Recommended)
}

// Close stops the runtime and releases the model.
func (s *session) Close() {
	s.rt.Close()
	s.lm.Close()
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
