package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/internal/chatprompt"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

const runUsage = `usage: ferrite run [flags] [TEXT]
Generates one reply to TEXT (or to stdin, without its final line break),
streaming it to stdout and the timing to stderr. The model is --model, else
default_model of the configuration, else the built-in model. The flags
override the configuration file's values. Exit status: 0 when the reply
ended normally or reached --max-tokens, 1 when it could not be generated
as asked (an error, or cut short by the context or the KV budget), 2 for
a usage mistake.

flags:
`

// cmdRun implements `ferrite run`: one generation, text to stdout, timing
// to stderr.
func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var f cmdFlags
	fs := newFlagSet("run", runScope, &f)
	if code, ok := parseFlags(fs, args, usageAndFlags(runUsage, fs), stdout, stderr); !ok {
		return code
	}
	return generateOnce(ctx, "ferrite run", fs.Args(), &f, fs, stdin, stdout, stderr)
}

// generateOnce is `ferrite run` (and the chat on a pipe) after the flags:
// it reads the configuration and the prompt, resolves the model and
// generates one reply. cmd prefixes the messages.
func generateOnce(ctx context.Context, cmd string, args []string, f *cmdFlags, fs *flag.FlagSet, stdin io.Reader, stdout, stderr io.Writer) int {
	st, warn, err := f.setup(fs)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 2
	}
	defer st.closeLog()
	if warn != nil {
		fmt.Fprintf(stderr, "%s: warning: %v\n", cmd, warn)
	}
	prompt, err := promptText(args, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return 2
	}
	cat := st.models()
	e, err := cat.resolve(st.cfg.DefaultModel)
	if err == nil {
		var s *session
		if s, err = cat.openSession(ctx, e, openMode{strict: true}, func(string) {}); err == nil {
			err = generate(ctx, s, &st.cfg, f.raw, prompt, stdout, stderr, st.log)
			s.Close()
		}
	}
	if err != nil {
		hint := ""
		if ce := (*cutError)(nil); !errors.As(err, &ce) && !errors.Is(err, context.Canceled) {
			hint = logHint(st.logPath)
		}
		fmt.Fprintf(stderr, "%s: %v%s\n", cmd, err, hint)
		return 1
	}
	return 0
}

// promptText is the joined arguments, or all of stdin without the line
// breaks at its end (what `echo` adds) when there are none.
func promptText(args []string, stdin io.Reader) (string, error) {
	if len(args) > 0 && !(len(args) == 1 && args[0] == "-") {
		return strings.Join(args, " "), nil
	}
	b, err := io.ReadAll(stdin)
	if err != nil {
		return "", fmt.Errorf("reading the prompt from stdin: %w", err)
	}
	text := strings.TrimRight(string(b), "\r\n")
	if text == "" {
		return "", errors.New("no prompt: give it as an argument or on stdin")
	}
	return text, nil
}

// draftTokens is the runtime's Draft option for m under the MTP settings.
func draftTokens(mtp settings.MTP, m model.Model) (int, error) {
	_, hasMTP := m.(model.MTPModel)
	switch mtp.Mode {
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
		return 0, fmt.Errorf("--mtp %q: want auto, on or off", mtp.Mode)
	}
	if mtp.Draft < 1 || mtp.Draft > runtime.MaxDraft {
		return 0, fmt.Errorf("--draft %d: want 1 to %d", mtp.Draft, runtime.MaxDraft)
	}
	return mtp.Draft, nil
}

// sampling is the sampler of the settings.
func sampling(s settings.Sampling) sample.Params {
	return sample.Params{
		Temperature:   float32(s.Temperature),
		TopK:          s.TopK,
		TopP:          float32(s.TopP),
		MinP:          float32(s.MinP),
		RepeatPenalty: float32(s.RepeatPenalty),
		Seed:          s.Seed,
	}
}

// cutError is the error of a reply that a limit other than max_tokens
// ended early.
type cutError struct {
	limit     runtime.LengthLimit
	maxSeqLen int // the tokens a sequence may hold
}

func (e *cutError) Error() string {
	switch e.limit {
	case runtime.LimitKVCache:
		return fmt.Sprintf("the reply was cut: the KV cache holds only %d tokens of prompt and reply; give a larger --kv-budget (kv_budget in config.toml)", e.maxSeqLen)
	default:
		return fmt.Sprintf("the reply was cut: prompt and reply filled the model's context of %d tokens", e.maxSeqLen)
	}
}

// generate writes one reply to prompt: text to stdout, the timing line to
// stderr. A reply cut by the context or the KV cache before max_tokens
// gives a *cutError after its text (none when max_tokens is 0, "until the
// context is full", and the context ended it).
func generate(ctx context.Context, s *session, cfg *settings.Config, raw bool, prompt string, stdout, stderr io.Writer, log *slog.Logger) error {
	tok := s.tok
	var ids []int32
	if raw {
		ids = tok.Encode(prompt, true)
	} else {
		var msgs []tokenizer.Message
		if cfg.SystemPrompt != "" {
			msgs = append(msgs, tokenizer.Message{Role: "system", Content: cfg.SystemPrompt})
		}
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: prompt})
		p, err := chatprompt.Encode(tok, msgs, tokenizer.TemplateOptions{AddGenerationPrompt: true})
		if err != nil {
			return err
		}
		ids = p.IDs
	}
	maxTokens := cfg.Sampling.MaxTokens
	stream, err := s.rt.Generate(ctx, runtime.Request{
		Prompt:    ids,
		MaxTokens: maxTokens,
		Stop:      tok.EOS(),
		Sampling:  sampling(cfg.SamplingFor(s.sampling)),
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
			if werr == nil && !raw {
				_, werr = io.WriteString(stdout, "\n")
			}
			fmt.Fprintf(stderr, "\n%s\n", formatStats(ev.Usage))
			switch {
			case ev.Type == runtime.EventError:
				logEngineError(log, s.name, ev.Err)
				return ev.Err
			case ev.Finish == runtime.FinishCancelled:
				return context.Canceled
			case werr != nil:
				return werr
			case ev.Limit == runtime.LimitKVCache || ev.Limit == runtime.LimitContext && maxTokens > 0:
				return &cutError{limit: ev.Limit, maxSeqLen: s.rt.MaxSeqLen()}
			}
			return nil
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
