package ui

import (
	"context"
	"errors"

	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/internal/chatprompt"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// RuntimeEngine is the Engine of an in-process engine/runtime.Runtime: it
// renders the conversation with the tokenizer's chat template, encodes it
// and streams the runtime's events.
type RuntimeEngine struct {
	rt   *runtime.Runtime
	tok  *tokenizer.Tokenizer
	info ModelInfo
}

// NewRuntimeEngine adapts rt. The runtime must decode text, so create it
// with runtime.Options.NewDecoder returning tok.NewStreamDecoder() (special
// tokens kept, so that <think> tags reach the chat). info names the model;
// its MaxContext is replaced by rt.MaxSeqLen() (the model's context or the
// whole KV cache, whichever is smaller). info.MTP and info.Draft say
// whether the model speculates and the runtime's Options.Draft; the
// caller sets them. The caller keeps ownership of rt.
func NewRuntimeEngine(rt *runtime.Runtime, tok *tokenizer.Tokenizer, info ModelInfo) *RuntimeEngine {
	info.MaxContext = rt.MaxSeqLen()
	info.KVLimited = rt.SeqLimit() == runtime.LimitKVCache
	return &RuntimeEngine{rt: rt, tok: tok, info: info}
}

// Info implements Engine.
func (e *RuntimeEngine) Info() ModelInfo { return e.info }

// Stats implements Engine.
func (e *RuntimeEngine) Stats() Stats {
	s := e.rt.Stats()
	var perToken int64
	if slots := int64(s.KVBlocksTotal) * int64(s.KVBlockSize); slots > 0 {
		perToken = s.KVBytesTotal / slots
	}
	return Stats{
		KVBytesPerToken: perToken,
		KVBlocksUsed:    s.KVBlocksUsed,
		KVBlocksTotal:   s.KVBlocksTotal,
		KVBytesUsed:     s.KVBytesUsed,
		KVBytesTotal:    s.KVBytesTotal,
		Running:         s.Running,
		Waiting:         s.Waiting,

		RecurrentBytes:  s.RecurrentBytes,
		Memory:          s.Memory,
		DraftTokens:     s.DraftTokens,
		AcceptedTokens:  s.AcceptedTokens,
		AcceptRate:      s.AcceptRate,
		AcceptedPerStep: s.AcceptedPerStep,
	}
}

// Send implements Engine.
func (e *RuntimeEngine) Send(ctx context.Context, req Request) (Reply, error) {
	p, err := chatprompt.Encode(e.tok, req.Messages, tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		return nil, err
	}
	ids := p.IDs
	if limit := e.info.MaxContext; limit > 0 && len(ids) > limit {
		return nil, &ContextError{PromptTokens: len(ids), Limit: limit, KV: e.info.KVLimited}
	}
	s := req.Settings
	stream, err := e.rt.Generate(ctx, runtime.Request{
		Prompt:    ids,
		MaxTokens: s.MaxTokens,
		Stop:      e.tok.EOS(),
		Draft:     runtimeDraft(s.effectiveDraft(e.info)),
		Sampling: sample.Params{
			Temperature:   float32(s.Temperature),
			TopP:          float32(s.TopP),
			TopK:          s.TopK,
			MinP:          float32(s.MinP),
			RepeatPenalty: float32(s.RepeatPenalty),
			Seed:          s.Seed,
		},
	})
	if errors.Is(err, runtime.ErrPromptTooLong) {
		return nil, &ContextError{PromptTokens: len(ids), Limit: e.info.MaxContext, KV: e.info.KVLimited}
	}
	if err != nil {
		return nil, err
	}
	return &runtimeReply{s: stream, n: len(ids)}, nil
}

// runtimeDraft is Request.Draft for a reply that drafts k tokens per step
// (0: none).
func runtimeDraft(k int) int {
	if k == 0 {
		return -1
	}
	return k
}

// runtimeReply is a Reply over a runtime stream.
type runtimeReply struct {
	s *runtime.Stream
	n int
}

func (r *runtimeReply) Cancel()           { r.s.Cancel() }
func (r *runtimeReply) PromptTokens() int { return r.n }

func (r *runtimeReply) Next() (Event, bool) {
	ev, ok := r.s.Next()
	if !ok {
		return Event{}, false
	}
	out := Event{Text: ev.Text, Finish: string(ev.Finish), Limit: string(ev.Limit), Err: ev.Err, Usage: Usage{
		PromptTokens:       ev.Usage.PromptTokens,
		CachedTokens:       ev.Usage.CachedTokens,
		GeneratedTokens:    ev.Usage.GeneratedTokens,
		TimeToFirstToken:   ev.Usage.TimeToFirstToken,
		Total:              ev.Usage.Total,
		PromptTokensPerSec: ev.Usage.PromptTokensPerSec,
		DecodeTokensPerSec: ev.Usage.DecodeTokensPerSec,
		Seed:               ev.Usage.Seed,
		VerifySteps:        ev.Usage.VerifySteps,
		DraftTokens:        ev.Usage.DraftTokens,
		AcceptedTokens:     ev.Usage.AcceptedTokens,
		AcceptedPerStep:    ev.Usage.AcceptedPerStep,
	}}
	switch ev.Type {
	case runtime.EventDone:
		out.Kind = EventDone
	case runtime.EventError:
		out.Kind = EventError
	default:
		out.Kind = EventDelta
	}
	return out, true
}
