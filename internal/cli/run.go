package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// runFlags are the options of `ferrite run`.
type runFlags struct {
	model       string
	maxTokens   int
	temperature float64
	topK        int
	topP        float64
	minP        float64
	repeat      float64
	seed        uint64
	system      string
	raw         bool
	threads     int
	device      string
	kvBudget    int64
	mtp         string
	draft       int
}

func (f *runFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.model, "model", "", "Hugging Face model directory (config.json, safetensors, tokenizer.json); default: the built-in "+builtin.Name)
	fs.IntVar(&f.maxTokens, "max-tokens", 512, "stop after this many generated tokens")
	fs.Float64Var(&f.temperature, "temperature", 0.7, "sampling temperature; 0 = greedy")
	fs.IntVar(&f.topK, "top-k", 40, "keep the k most likely tokens (0 = off)")
	fs.Float64Var(&f.topP, "top-p", 0.95, "nucleus sampling mass (1 = off)")
	fs.Float64Var(&f.minP, "min-p", 0.05, "drop tokens below this fraction of the top probability (0 = off)")
	fs.Float64Var(&f.repeat, "repeat-penalty", 1.0, "penalty for recently seen tokens (1 = off)")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed (0 = a fresh seed each run)")
	fs.StringVar(&f.system, "system", "", "system prompt")
	fs.BoolVar(&f.raw, "raw", false, "no chat template: tokenize the prompt as it is and print only the continuation")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0 = all cores)")
	fs.StringVar(&f.device, "device", "auto", "compute device: auto (the GPU when one is usable, else the CPU), cpu, cuda or cuda:N")
	fs.Int64Var(&f.kvBudget, "kv-budget", 1<<30, "KV-cache budget in bytes")
	fs.StringVar(&f.mtp, "mtp", "off", "MTP speculative decoding: off, auto (on when the model has an MTP module), on; off by default: on the CPU backend it costs more than it gains (BENCHMARKS.md §5)")
	fs.IntVar(&f.draft, "draft", 3, "draft tokens per speculative step (adapted to the measured acceptance)")
}

// draftTokens is the runtime's Draft option for m under the --mtp and
// --draft flags.
func (f *runFlags) draftTokens(m model.Model) (int, error) {
	_, hasMTP := m.(model.MTPModel)
	switch f.mtp {
	case "off":
		return 0, nil
	case "auto":
		if !hasMTP {
			return 0, nil
		}
	case "on":
		if !hasMTP {
			return 0, fmt.Errorf("--mtp on: the model has no MTP module")
		}
	default:
		return 0, fmt.Errorf("--mtp %q: want auto, on or off", f.mtp)
	}
	if f.draft < 1 || f.draft > runtime.MaxDraft {
		return 0, fmt.Errorf("--draft %d: want 1 to %d", f.draft, runtime.MaxDraft)
	}
	return f.draft, nil
}

// cmdRun implements `ferrite run`: one generation, text to stdout, timing to stderr.
func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f runFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: ferrite run [--model DIR] [flags] [PROMPT]   (the prompt is read from stdin when not given)\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	prompt, err := promptText(fs.Args(), stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ferrite run: %v\n", err)
		return 2
	}
	if err := run(ctx, &f, prompt, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ferrite run: %v\n", err)
		return 1
	}
	return 0
}

// promptText is the joined arguments, or all of stdin when there are none.
func promptText(args []string, stdin io.Reader) (string, error) {
	if len(args) > 0 && !(len(args) == 1 && args[0] == "-") {
		return strings.Join(args, " "), nil
	}
	b, err := io.ReadAll(stdin)
	if err != nil {
		return "", fmt.Errorf("reading the prompt from stdin: %w", err)
	}
	if len(b) == 0 {
		return "", errors.New("no prompt: give it as an argument or on stdin")
	}
	return string(b), nil
}

// session is a loaded model with its tokenizer and a running runtime.
type session struct {
	name string
	lm   *engine.Loaded
	tok  *tokenizer.Tokenizer
	rt   *runtime.Runtime
}

// open loads the model and tokenizer f names (the built-in model when f
// names none) and starts a runtime on them.
func open(f *runFlags) (*session, error) {
	name := filepath.Base(filepath.Clean(f.model))
	var (
		lm  *engine.Loaded
		tok *tokenizer.Tokenizer
		err error
	)
	if f.model == "" || builtin.IsName(f.model) {
		name = builtin.Name
		lm, tok, err = builtin.Open(engine.Options{Threads: f.threads, Device: f.device})
	} else {
		if tok, err = tokenizer.Load(f.model); err == nil {
			lm, err = engine.Load(f.model, engine.Options{Threads: f.threads, Device: f.device})
		}
	}
	if err != nil {
		return nil, err
	}
	draft, err := f.draftTokens(lm.Model)
	if err != nil {
		lm.Close()
		return nil, err
	}
	rt, err := runtime.New(lm.Model, runtime.Options{
		KVBudget:   f.kvBudget,
		Draft:      draft,
		NewDecoder: func() runtime.TextDecoder { return tok.NewStreamDecoder() },
	})
	if err != nil {
		lm.Close()
		return nil, err
	}
	return &session{name: name, lm: lm, tok: tok, rt: rt}, nil
}

// Close stops the runtime and releases the model.
func (s *session) Close() {
	s.rt.Close()
	s.lm.Close()
}

// sampling is the sampler settings of the flags.
func (f *runFlags) sampling() sample.Params {
	return sample.Params{
		Temperature:   float32(f.temperature),
		TopK:          f.topK,
		TopP:          float32(f.topP),
		MinP:          float32(f.minP),
		RepeatPenalty: float32(f.repeat),
		Seed:          f.seed,
	}
}

func run(ctx context.Context, f *runFlags, prompt string, stdout, stderr io.Writer) error {
	s, err := open(f)
	if err != nil {
		return err
	}
	defer s.Close()
	tok := s.tok
	var ids []int32
	if f.raw {
		ids = tok.Encode(prompt, true)
	} else {
		var msgs []tokenizer.Message
		if f.system != "" {
			msgs = append(msgs, tokenizer.Message{Role: "system", Content: f.system})
		}
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: prompt})
		text, err := tok.ApplyChatTemplate(msgs, tokenizer.TemplateOptions{AddGenerationPrompt: true})
		if err != nil {
			return err
		}
		ids = tok.Encode(text, false)
	}
	rt := s.rt
	stream, err := rt.Generate(ctx, runtime.Request{
		Prompt:    ids,
		MaxTokens: f.maxTokens,
		Stop:      tok.EOS(),
		Sampling:  f.sampling(),
	})
	if err != nil {
		return err
	}
	var werr error
	for {
		ev, ok := stream.Next()
		if !ok {
			return errors.New("generation ended without a final event")
		}
		switch ev.Type {
		case runtime.EventDelta:
			if werr == nil {
				_, werr = io.WriteString(stdout, ev.Text)
			}
		case runtime.EventDone, runtime.EventError:
			if werr == nil && !f.raw {
				_, werr = io.WriteString(stdout, "\n")
			}
			fmt.Fprintf(stderr, "\n%s\n", formatStats(ev.Usage))
			if ev.Type == runtime.EventError {
				return ev.Err
			}
			if ev.Finish == runtime.FinishCancelled {
				return context.Canceled
			}
			return werr
		}
	}
}

// formatStats renders the timing line `ferrite run` prints to stderr.
func formatStats(u runtime.Usage) string {
	rate := func(r float64) string {
		if r <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f tok/s", r)
	}
	line := fmt.Sprintf("prompt: %d tokens, %s · decode: %d tokens, %s · time to first token: %.0f ms",
		u.PromptTokens, rate(u.PromptTokensPerSec), u.GeneratedTokens, rate(u.DecodeTokensPerSec),
		float64(u.TimeToFirstToken.Microseconds())/1000)
	if u.VerifySteps > 0 {
		line += fmt.Sprintf(" · mtp: %d of %d drafts accepted, %.2f per verify step",
			u.AcceptedTokens, u.DraftTokens, u.AcceptedPerStep)
	}
	return line
}
