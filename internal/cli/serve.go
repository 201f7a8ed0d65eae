package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/server"
)

// DefaultServeAddr is where `ferrite serve` listens without --addr: the
// loopback interface only; listening beyond it is the user's choice.
const DefaultServeAddr = "127.0.0.1:8080"

// serveFlags are the options of `ferrite serve`.
type serveFlags struct {
	models   stringList
	addr     string
	apiKey   string
	config   string
	shutdown time.Duration

	threads     int
	kvBudget    int64
	batchTokens int
	maxSeqs     int
	mtp         string
	draft       int
}

// stringList is a flag that may be given more than once.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.models, "model", "a model to serve: a directory or a name /models lists; repeat for several (the first answers requests that name none); default: default_model, else the built-in one")
	fs.StringVar(&f.addr, "addr", DefaultServeAddr, "HOST:PORT to listen on (0.0.0.0:8080 listens on every interface)")
	fs.StringVar(&f.apiKey, "api-key", "", "require Authorization: Bearer KEY on every request but GET /health (default: $FERRITE_API_KEY)")
	fs.StringVar(&f.config, "config", settings.DefaultPath(), "configuration file (model_dirs, [engine], [mtp])")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM or ctrl+c, how long running requests may take to finish before they are cancelled")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0 = all cores)")
	fs.Int64Var(&f.kvBudget, "kv-budget", 1<<30, "KV-cache budget in bytes, per model")
	fs.IntVar(&f.batchTokens, "batch-tokens", 0, "tokens one engine step may run (0 = the runtime's default)")
	fs.IntVar(&f.maxSeqs, "max-seqs", 0, "sequences generated at once (0 = the runtime's default)")
	fs.StringVar(&f.mtp, "mtp", "off", "MTP speculative decoding: off, auto, on (see `ferrite --help`)")
	fs.IntVar(&f.draft, "draft", 3, "draft tokens per speculative step")
}

// apply puts the flags the user set on top of the configuration.
func (f *serveFlags) apply(cfg *settings.Config, fs *flag.FlagSet) {
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "threads":
			cfg.Engine.Threads = f.threads
		case "kv-budget":
			cfg.Engine.KVBudget = settings.ByteSize(f.kvBudget)
		case "batch-tokens":
			cfg.Engine.BatchTokens = f.batchTokens
		case "max-seqs":
			cfg.Engine.MaxSeqs = f.maxSeqs
		case "mtp":
			cfg.MTP.Mode = f.mtp
		case "draft":
			cfg.MTP.Draft = f.draft
		}
	})
}

// cmdServe implements `ferrite serve`: the OpenAI-compatible API until
// SIGTERM or ctrl+c.
func cmdServe(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: ferrite serve [--model M]... [--addr HOST:PORT] [--api-key KEY] [flags]\n\n"+
			"An OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,\n"+
			"/tokenize, /health, /metrics) on ferrite's engine; README.md (\"ferrite serve\") has examples.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ferrite serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if f.shutdown <= 0 {
		fmt.Fprintf(stderr, "ferrite serve: --shutdown-timeout %v: want a positive duration\n", f.shutdown)
		return 2
	}
	cfg, cfgErr := settings.Load(f.config)
	if cfgErr != nil {
		fmt.Fprintf(stderr, "ferrite serve: warning: %v\n", cfgErr)
	}
	f.apply(&cfg, fs)
	log := slog.New(slog.NewTextHandler(stderr, nil))
	models, err := serveModels(&chatModels{cfg: cfg, builtin: builtinModels}, f.models, cfg.DefaultModel, log)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	key := f.apiKey
	if key == "" {
		key = os.Getenv("FERRITE_API_KEY")
	}
	srv, err := server.New(server.Options{Models: models, APIKey: key, ShutdownTimeout: f.shutdown, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	if key == "" && !isLoopback(ln.Addr()) {
		log.Warn("listening beyond loopback without an API key: anyone who can reach this port can use the models (set --api-key or FERRITE_API_KEY)")
	}
	log.Info("listening", "url", "http://"+ln.Addr().String(), "auth", key != "")
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	return 0
}

// serveModels resolves the --model names (the configuration's default
// model, or the built-in one, when there are none) into the server's
// models, each loaded by the engine with the configuration's settings.
func serveModels(cat *chatModels, names []string, def string, log *slog.Logger) ([]server.Model, error) {
	if len(names) == 0 {
		names = []string{def}
	}
	var models []server.Model
	seen := map[string]bool{}
	for _, name := range names {
		e, err := cat.resolve(name)
		if err != nil {
			return nil, err
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("--model %s: a model named %s is already served", name, e.Name)
		}
		seen[e.Name] = true
		models = append(models, server.Model{Name: e.Name, Load: serveLoader(cat, e, log)})
	}
	return models, nil
}

// serveLoader loads e for the server: a runtime without a text decoder
// (the server decodes each request's ids itself).
func serveLoader(cat *chatModels, e catalog.Entry, log *slog.Logger) func(context.Context) (*server.Backend, error) {
	return func(ctx context.Context) (*server.Backend, error) {
		s, _, err := cat.openSession(ctx, e, true, false, func(stage string) { log.Info(stage, "model", e.Name) })
		if err != nil {
			return nil, err
		}
		return &server.Backend{Runtime: s.rt, Tokenizer: s.tok, Reasoning: server.IsReasoning(s.tok), Close: s.Close}, nil
	}
}

// isLoopback reports whether a listener's address is on the loopback
// interface only.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
