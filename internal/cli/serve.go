package cli

import (
	"context"
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
	"github.com/ferrite-llm/ferrite/server"
)

// DefaultServeAddr is where `ferrite serve` listens without --addr: the
// loopback interface only; listening beyond it is the user's choice.
const DefaultServeAddr = "127.0.0.1:8080"

const serveUsage = `usage: ferrite serve [--model M]... [--addr HOST:PORT] [--api-key KEY] [flags]

An OpenAI-compatible HTTP API on ferrite's engine: /v1/chat/completions,
/v1/completions, /v1/models, /tokenize, /health, /metrics. README.md
("ferrite serve") has examples. The configuration file's model_dirs,
[engine] and [mtp] apply; flags win.

flags:
`

// serveFlags are the flags of `ferrite serve` that are not settings.
type serveFlags struct {
	models   stringList
	addr     string
	apiKey   string
	shutdown time.Duration
}

// stringList is a flag that may be given more than once.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.models, "model", "a model to serve (`DIR|NAME`: a model directory, a GGUF file or a name /models lists); repeat it to serve several, the first answering requests that name none (default: default_model, else the built-in model)")
	fs.StringVar(&f.addr, "addr", DefaultServeAddr, "`HOST:PORT` to listen on (0.0.0.0:8080 listens on every interface)")
	fs.StringVar(&f.apiKey, "api-key", "", "require Authorization: Bearer `KEY` on every request but GET /health (default: $FERRITE_API_KEY)")
	fs.DurationVar(&f.shutdown, "shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM or ctrl+c, how long (`DURATION`, such as 10s) running requests may take to finish before they are cancelled")
}

// cmdServe implements `ferrite serve`: the OpenAI-compatible API until
// SIGTERM or ctrl+c.
func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f cmdFlags
	var sf serveFlags
	fs := newFlagSet("serve", serveScope, &f)
	sf.register(fs)
	if code, ok := parseFlags(fs, args, usageAndFlags(serveUsage, fs), stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ferrite serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if sf.shutdown <= 0 {
		fmt.Fprintf(stderr, "ferrite serve: --shutdown-timeout %v: want a positive duration\n", sf.shutdown)
		return 2
	}
	cfg, warn, err := f.loadConfig(fs)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if warn != nil {
		log.Warn("configuration ignored", "err", warn)
	}
	cat := &chatModels{cfg: cfg, builtin: builtinModels, log: log, idsOnly: true}
	models, err := serveModels(cat, sf.models, cfg.DefaultModel)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	key := sf.apiKey
	if key == "" {
		key = os.Getenv("FERRITE_API_KEY")
	}
	srv, err := server.New(server.Options{Models: models, APIKey: key, ShutdownTimeout: sf.shutdown, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "ferrite serve: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", sf.addr)
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
func serveModels(cat *chatModels, names []string, def string) ([]server.Model, error) {
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
		models = append(models, server.Model{Name: e.Name, Load: serveLoader(cat, e)})
	}
	return models, nil
}

// serveLoader loads e for the server (cat starts its runtimes without a
// text decoder: the server decodes each request's ids itself).
func serveLoader(cat *chatModels, e catalog.Entry) func(context.Context) (*server.Backend, error) {
	return func(ctx context.Context) (*server.Backend, error) {
		s, err := cat.openSession(ctx, e, openMode{strict: true}, func(stage string) { cat.logger().Info(stage, "model", e.Name) })
		if err != nil {
			return nil, err
		}
		return &server.Backend{Runtime: s.rt, Tokenizer: s.tok, Sampling: s.sampling, Reasoning: server.IsReasoning(s.tok), Close: s.Close}, nil
	}
}

// isLoopback reports whether a listener's address is on the loopback
// interface only.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
