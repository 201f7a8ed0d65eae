package server

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/runtime"
)

// prompt is one prompt of a request: its ids, and whether the reply starts
// inside a <think> block (split only when think is set).
type prompt struct {
	param       string // the request field that holds it ("messages", "prompt"), for errors
	ids         []int32
	think       bool // split the reply into reasoning and answer
	thinkInside bool // the prompt opened the <think> block
}

// piece is what a choice's goroutine tells the handler: new text, or the
// choice's end.
type piece struct {
	index     int
	reasoning string // new reasoning text
	content   string // new answer text
	final     bool   // the choice ended: finish (or err), tokens and cached are set
	finish    string // "stop" or "length"
	err       *apiError
	tokens    int // completion tokens
	cached    int // prompt tokens taken from the prefix cache
}

// job is one request's generations: len(prompts) × n choices, choice
// index = prompt × n + i.
type job struct {
	pieces  chan piece
	total   int
	prompt  []int // prompt tokens of each prompt
	cancel  context.CancelFunc
	unwatch func() bool // detaches the abort watch
	wg      sync.WaitGroup
}

// start checks that the prompts fit and queues every choice. ctx is the
// request's: the client going away ends the generations. Two contexts
// derive from it: the handler's side (ended by close too), on which the
// choices give up sending, and the generations' (ended by that and by the
// abort of a shutdown, which must still reach the handler as an error).
func (s *Server) start(ctx context.Context, m *served, prompts []prompt, p *genParams) (*job, *apiError) {
	b := m.b
	limit, kv := b.Runtime.MaxSeqLen(), b.Runtime.SeqLimit() == runtime.LimitKVCache
	for _, pr := range prompts {
		n := len(pr.ids)
		switch {
		case n == 0:
			return nil, paramError(pr.param, "the prompt is empty")
		case n > limit:
			return nil, contextError(pr.param, n, 0, limit, kv)
		case p.explicitMax && n+p.maxTokens > limit:
			return nil, contextError(pr.param, n, n+p.maxTokens, limit, kv)
		}
	}
	hctx, cancel := context.WithCancel(ctx)
	gctx, abort := context.WithCancel(hctx)
	j := &job{total: len(prompts) * p.n, cancel: cancel}
	j.unwatch = context.AfterFunc(s.abort, abort)
	j.pieces = make(chan piece, 4*j.total)
	// Every choice of every prompt is queued at once (GenerateAll), so that
	// the choices start in the same step whenever the request comes: a
	// seeded request's text does not depend on the timing of its own
	// admission.
	reqs := make([]runtime.Request, 0, j.total)
	for _, pr := range prompts {
		j.prompt = append(j.prompt, len(pr.ids))
		for i := range p.n {
			reqs = append(reqs, runtime.Request{
				Prompt:    pr.ids,
				MaxTokens: p.maxTokens,
				Sampling:  p.choiceSampling(i),
				Stop:      b.Tokenizer.EOS(),
			})
		}
	}
	streams, err := b.Runtime.GenerateAll(gctx, reqs)
	if err != nil {
		j.close()
		if errors.Is(err, runtime.ErrPromptTooLong) {
			// The checks above name a prompt longer than the limit; here
			// the runtime found one that can never fit: the longest.
			pr := slices.MaxFunc(prompts, func(a, b prompt) int { return len(a.ids) - len(b.ids) })
			return nil, contextError(pr.param, len(pr.ids), 0, limit, kv)
		}
		if errors.Is(err, runtime.ErrClosed) {
			return nil, unavailable("the server is shutting down")
		}
		return nil, badRequest("%v", err)
	}
	m.metrics.requests.Add(1)
	for idx, st := range streams {
		pr := prompts[idx/p.n]
		c := &choice{s: s, m: m, idx: idx, st: st, stop: stopper{stops: p.stops}, handler: hctx, out: j.pieces}
		if pr.think {
			c.think = newThinkSplitter(pr.thinkInside)
		}
		j.wg.Add(1)
		go func() {
			defer j.wg.Done()
			c.run()
		}()
	}
	return j, nil
}

// close cancels what still runs and waits for the choices' goroutines
// (which stop sending: the handler reads no more).
func (j *job) close() {
	j.cancel()
	j.unwatch()
	j.wg.Wait()
}

// promptTokens is the request's prompt tokens, each prompt counted once
// (not once per choice).
func (j *job) promptTokens() int {
	n := 0
	for _, k := range j.prompt {
		n += k
	}
	return n
}

// choice is one completion being generated, on its own goroutine.
type choice struct {
	s       *Server
	m       *served
	idx     int
	st      *runtime.Stream
	stop    stopper
	think   *thinkSplitter  // nil: all text is content
	handler context.Context // ends when the handler no longer reads out
	out     chan<- piece    // to the handler

	tokens int           // ids generated so far (up to a stop string)
	usage  runtime.Usage // the latest usage the runtime reported
}

// send hands p to the handler; false when the client has gone or the
// handler has stopped reading (the generation is then cancelled and
// counted so).
func (c *choice) send(p piece) bool {
	p.index = c.idx
	select {
	case c.out <- p:
		return true
	case <-c.handler.Done():
		c.gone()
		return false
	}
}

// gone ends a choice whose client went away.
func (c *choice) gone() {
	c.st.Cancel()
	c.m.metrics.finished("cancelled")
}

// text releases text of the reply (after the stop strings).
func (c *choice) text(s string) bool {
	if s == "" {
		return true
	}
	p := piece{content: s}
	if c.think != nil {
		p.reasoning, p.content = c.think.add(s)
	}
	if p.reasoning == "" && p.content == "" {
		return true
	}
	return c.send(p)
}

// run decodes the stream, one id at a time, until it ends or a stop
// string appears.
func (c *choice) run() {
	dec := c.m.b.Tokenizer.NewStreamDecoder()
	for {
		ev, ok := c.st.Next()
		if !ok {
			return
		}
		c.usage = ev.Usage
		switch ev.Type {
		case runtime.EventDelta:
			for _, id := range ev.Tokens {
				c.tokens++
				out, hit := c.stop.add(dec.Add(id))
				if !c.text(out) {
					return
				}
				if hit {
					c.st.Cancel()
					c.end("stop", nil)
					return
				}
			}
		case runtime.EventDone:
			out, hit := c.stop.add(dec.Flush())
			if !hit {
				out += c.stop.flush()
			}
			if !c.text(out) {
				return
			}
			switch {
			case hit || ev.Finish == runtime.FinishStop:
				c.end("stop", nil)
			case ev.Finish == runtime.FinishLength:
				c.end("length", nil)
			case c.s.abort.Err() != nil:
				c.end("", unavailable("the server shut down before the request finished"))
			default:
				c.gone()
			}
			return
		case runtime.EventError:
			c.end("", serverError("generation failed: %v", ev.Err))
			return
		}
	}
}

// end sends the choice's final piece.
func (c *choice) end(finish string, err *apiError) {
	if c.think != nil && err == nil {
		r, t := c.think.flush()
		if !c.send(piece{reasoning: r, content: t}) {
			return
		}
	}
	if err != nil {
		c.m.metrics.finished("error")
	} else {
		c.m.metrics.finished(finish)
	}
	c.m.metrics.observeTTFT(c.usage.TimeToFirstToken, c.tokens)
	c.send(piece{final: true, finish: finish, err: err, tokens: c.tokens, cached: c.usage.CachedTokens})
}

// collected is one choice's whole result.
type collected struct {
	reasoning, content []byte
	finish             string
	tokens, cached     int
}

// add records p in res (the choices' results); done reports that p ended
// its choice.
func (r *collected) add(p piece) (done bool) {
	r.reasoning = append(r.reasoning, p.reasoning...)
	r.content = append(r.content, p.content...)
	if p.final && p.err == nil {
		r.finish, r.tokens, r.cached = p.finish, p.tokens, p.cached
	}
	return p.final
}

// collect gathers every choice's text for a response that is not
// streamed. It returns nil, nil when the client has gone.
func (j *job) collect(ctx context.Context) ([]collected, *apiError) {
	res := make([]collected, j.total)
	for left := j.total; left > 0; {
		select {
		case <-ctx.Done():
			return nil, nil
		case p := <-j.pieces:
			if p.err != nil {
				return nil, p.err
			}
			if res[p.index].add(p) {
				left--
			}
		}
	}
	return res, nil
}

// stream writes a streamed response's body after its first chunks: it
// passes the pieces to text and finish as they come until every choice has
// ended, then writes the usage chunk (when usage is not nil) and [DONE].
// It stops early when the client has gone (a write failed), or when a
// choice failed (after writing the error event).
func (j *job) stream(ctx context.Context, sse *sseWriter, text, finish func(piece) error, usage func(*usage) any) {
	res := make([]collected, j.total)
	for left := j.total; left > 0; {
		var p piece
		select {
		case <-ctx.Done():
			return
		case p = <-j.pieces:
		}
		if p.err != nil {
			sse.fail(p.err)
			return
		}
		if (p.reasoning != "" || p.content != "") && text(p) != nil {
			return
		}
		if res[p.index].add(p) {
			left--
			if finish(p) != nil {
				return
			}
		}
	}
	if usage != nil {
		u := j.usage(res)
		if sse.send(usage(&u)) != nil {
			return
		}
	}
	sse.done()
}

// usageChunk is chunk when the client asked for the usage
// (stream_options.include_usage), else nil.
func usageChunk(include bool, chunk func(*usage) any) func(*usage) any {
	if !include {
		return nil
	}
	return chunk
}

// usage is the usage block of a finished request: each prompt counted
// once, the completions of all choices, the cached tokens of each prompt's
// first choice.
func (j *job) usage(res []collected) usage {
	n := j.total / len(j.prompt)
	u := usage{PromptTokens: j.promptTokens()}
	for i, r := range res {
		u.CompletionTokens += r.tokens
		if i%n == 0 {
			u.PromptTokensDetails.CachedTokens += r.cached
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}
