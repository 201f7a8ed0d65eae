package ui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/internal/openai"
)

// RemoteEngine is the Engine of a model served by an OpenAI-compatible
// server (vLLM, SGLang, ferrite serve…): each reply is a streamed chat
// completion. Speed and time to first token are measured here, on the
// client; the server's KV cache is not visible, so Stats only counts the
// replies in flight.
type RemoteEngine struct {
	client *openai.Client
	model  string // the server's name of the model
	info   ModelInfo

	running atomic.Int32
	// noExtras is set once the server refused the non-OpenAI sampling
	// fields (top_k, min_p, repetition_penalty): they are not sent again.
	noExtras atomic.Bool
	now      func() time.Time
}

// NewRemoteEngine talks to model on the server of c. info describes it
// (its Name is what the chat shows, e.g. "gpu/Qwen3-32B"); Remote is set.
func NewRemoteEngine(c *openai.Client, model string, info ModelInfo) *RemoteEngine {
	info.Remote = true
	return &RemoteEngine{client: c, model: model, info: info, now: time.Now}
}

// Info implements Engine.
func (e *RemoteEngine) Info() ModelInfo { return e.info }

// Stats implements Engine.
func (e *RemoteEngine) Stats() Stats { return Stats{Running: int(e.running.Load())} }

// Send implements Engine: it sends the request and returns once the
// server has accepted it (so a refused request, an unreachable server or
// a bad API key is an error here, and the message goes back to the
// input), before the reply is generated.
func (e *RemoteEngine) Send(ctx context.Context, req Request) (Reply, error) {
	start := e.now()
	cr := e.chatRequest(req)
	stream, err := e.client.StreamChat(ctx, cr)
	for retry := true; retry; {
		retry = false
		var ae *openai.APIError
		if !errors.As(err, &ae) || ae.Status != 400 {
			break
		}
		switch {
		case cr.Extra != nil && mentionsExtra(ae.Message):
			e.noExtras.Store(true) // an OpenAI-strict server: standard fields only
			cr.Extra, retry = nil, true
		case cr.MaxTokens > 0 && strings.Contains(ae.Message, "context length"):
			// The prompt and max_tokens together pass the context (vLLM
			// refuses that): let the reply use what is left, as the local
			// engine does.
			cr.MaxTokens, retry = 0, true
		}
		if retry {
			stream, err = e.client.StreamChat(ctx, cr)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if ce := contextError(err); ce != nil {
			return nil, ce
		}
		return nil, fmt.Errorf("%s: %w", e.info.Name, err)
	}
	r := &remoteReply{events: make(chan Event, 16), stream: stream, start: start, now: e.now}
	ctx, r.cancel = context.WithCancel(ctx)
	e.running.Add(1)
	go func() {
		defer e.running.Add(-1)
		r.run(ctx)
	}()
	return r, nil
}

// The context-length refusals of vLLM and SGLang: "This model's maximum
// context length is 4096 tokens. However, you requested 5000 tokens (4000
// in the messages, 1000 in the completion)", or "… your request has 5000
// input tokens".
var (
	contextLimitRE  = regexp.MustCompile(`maximum context length is (\d+)`)
	contextPromptRE = regexp.MustCompile(`(\d+) in the messages|has (\d+) input tokens`)
)

// contextError is the *ContextError a server's refusal of a prompt too
// long for the model means; nil for any other error.
func contextError(err error) *ContextError {
	var ae *openai.APIError
	if !errors.As(err, &ae) || ae.Status != 400 {
		return nil
	}
	lim := contextLimitRE.FindStringSubmatch(ae.Message)
	pr := contextPromptRE.FindStringSubmatch(ae.Message)
	if lim == nil || pr == nil {
		return nil
	}
	limit, _ := strconv.Atoi(lim[1])
	prompt, _ := strconv.Atoi(pr[1] + pr[2])
	return &ContextError{PromptTokens: prompt, Limit: limit}
}

// extraFields are the sampling fields an OpenAI-strict server refuses.
var extraFields = []string{"top_k", "min_p", "repetition_penalty"}

func mentionsExtra(msg string) bool {
	for _, f := range extraFields {
		if strings.Contains(msg, f) {
			return true
		}
	}
	return false
}

// chatRequest maps the chat's settings to the request: the OpenAI fields,
// and the extras the open servers take when they are not off.
func (e *RemoteEngine) chatRequest(req Request) openai.ChatRequest {
	s := req.Settings
	cr := openai.ChatRequest{Model: e.model, MaxTokens: s.MaxTokens, Temperature: &s.Temperature}
	for _, m := range req.Messages {
		cr.Messages = append(cr.Messages, openai.Message{Role: m.Role, Content: m.Content})
	}
	if s.TopP > 0 && s.TopP < 1 {
		cr.TopP = &s.TopP
	}
	if s.Seed != 0 {
		cr.Seed = &s.Seed
	}
	if e.noExtras.Load() {
		return cr
	}
	extra := map[string]any{}
	if s.TopK > 0 {
		extra["top_k"] = s.TopK
	}
	if s.MinP > 0 {
		extra["min_p"] = s.MinP
	}
	if s.RepeatPenalty > 0 && s.RepeatPenalty != 1 {
		extra["repetition_penalty"] = s.RepeatPenalty
	}
	if len(extra) > 0 {
		cr.Extra = extra
	}
	return cr
}

// remoteReply turns a stream's chunks into events, timing them.
type remoteReply struct {
	events chan Event
	stream *openai.Stream
	cancel context.CancelFunc
	prompt atomic.Int64
	start  time.Time
	now    func() time.Time

	// Owned by run.
	usage    Usage
	first    time.Time // the first token's arrival
	last     time.Time // the last one's
	thinking bool      // inside reasoning text, wrapped in <think>
}

func (r *remoteReply) Cancel()           { r.cancel() }
func (r *remoteReply) PromptTokens() int { return int(r.prompt.Load()) }

func (r *remoteReply) Next() (Event, bool) {
	ev, ok := <-r.events
	return ev, ok
}

// run reads the stream to its end and closes events after the final one.
func (r *remoteReply) run(ctx context.Context) {
	defer close(r.events)
	stop := context.AfterFunc(ctx, func() { r.stream.Close() }) // unblocks a read on cancel
	defer stop()
	defer r.stream.Close()
	finish := ""
	for {
		c, err := r.stream.Next()
		switch {
		case err == io.EOF:
			r.final(Event{Kind: EventDone, Finish: mapFinish(finish)})
			return
		case err != nil && ctx.Err() != nil:
			r.final(Event{Kind: EventDone, Finish: FinishCancelled})
			return
		case errors.Is(err, openai.ErrCut) || errors.Is(err, io.ErrUnexpectedEOF):
			r.final(Event{Kind: EventError, Err: fmt.Errorf("the server's stream was cut after %d tokens", r.usage.GeneratedTokens)})
			return
		case err != nil:
			r.final(Event{Kind: EventError, Err: err})
			return
		}
		if c.Finish != "" {
			finish = c.Finish
		}
		if u := c.Usage; u != nil {
			r.usage.PromptTokens, r.usage.CachedTokens = u.PromptTokens, u.CachedTokens
			r.usage.GeneratedTokens = max(u.CompletionTokens, r.usage.GeneratedTokens)
			r.prompt.Store(int64(u.PromptTokens))
		}
		if text := r.text(c); text != "" {
			r.token()
			r.events <- Event{Kind: EventDelta, Text: text, Usage: r.usage}
		}
	}
}

// text is a chunk's text, reasoning wrapped in a <think> block the way
// local models write it.
func (r *remoteReply) text(c openai.Chunk) string {
	var b strings.Builder
	if c.Reasoning != "" {
		if !r.thinking {
			b.WriteString(thinkOpen + "\n")
			r.thinking = true
		}
		b.WriteString(c.Reasoning)
	}
	if c.Content != "" || c.Finish != "" {
		if r.thinking {
			b.WriteString("\n" + thinkClose + "\n\n")
			r.thinking = false
		}
		b.WriteString(c.Content)
	}
	return b.String()
}

// token counts a chunk of text as a token (servers stream one token per
// chunk; the usage at the end corrects the count) and updates the timing.
func (r *remoteReply) token() {
	now := r.now()
	if r.first.IsZero() {
		r.first = now
		r.usage.TimeToFirstToken = now.Sub(r.start)
		if r.usage.PromptTokens > 0 && r.usage.TimeToFirstToken > 0 {
			r.usage.PromptTokensPerSec = float64(r.usage.PromptTokens) / r.usage.TimeToFirstToken.Seconds()
		}
	}
	r.usage.GeneratedTokens++
	r.last = now
	r.usage.Total = now.Sub(r.start)
	r.decodeRate()
}

// minDecodeSpan is the least time between the first and the last token
// that measures a decode speed: tokens that arrive closer together were
// buffered on the way (a proxy that holds the stream back), and their
// speed is the whole reply's, from the request on.
const minDecodeSpan = 10 * time.Millisecond

// decodeRate is the tokens after the first over the time since it.
func (r *remoteReply) decodeRate() {
	n := r.usage.GeneratedTokens
	switch d := r.last.Sub(r.first); {
	case n > 1 && d >= minDecodeSpan:
		r.usage.DecodeTokensPerSec = float64(n-1) / d.Seconds()
	case n > 0 && r.usage.Total > 0:
		r.usage.DecodeTokensPerSec = float64(n) / r.usage.Total.Seconds()
	}
}

// final sends the last event, with the usage as it ends (the server's
// token count, when it sent one, over the time the tokens took).
func (r *remoteReply) final(ev Event) {
	r.usage.Total = r.now().Sub(r.start)
	r.decodeRate()
	ev.Usage = r.usage
	r.events <- ev
}

// mapFinish is the chat's name of an OpenAI finish_reason.
func mapFinish(reason string) string {
	switch reason {
	case "length":
		return FinishLength
	case "", "stop", "eos", "stop_sequence", "end_turn", "tool_calls":
		return FinishStop
	}
	return reason
}
