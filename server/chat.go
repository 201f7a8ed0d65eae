package server

import (
	"encoding/json"
	"net/http"

	"github.com/ferrite-llm/ferrite/internal/chatprompt"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// handleChat is POST /v1/chat/completions.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) *apiError {
	var req chatRequest
	if e := decodeBody(w, r, &req); e != nil {
		return e
	}
	p, pr, m, e := s.chatRequest(&req)
	if e != nil {
		return e
	}
	j, e := s.start(r.Context(), m, []prompt{pr}, &p)
	if e != nil {
		return e
	}
	defer j.close()
	head := chatChunk{ID: s.opts.newID("chatcmpl-"), Created: s.opts.now().Unix(), Model: m.name}
	if p.stream {
		s.streamChat(w, r, j, head, p.includeUsage)
		return nil
	}
	res, e := j.collect(r.Context())
	if e != nil {
		return e
	}
	if res == nil {
		return nil // the client has gone
	}
	out := chatCompletion{ID: head.ID, Object: "chat.completion", Created: head.Created, Model: head.Model,
		Choices: make([]chatChoice, len(res)), Usage: j.usage(res)}
	for i, c := range res {
		msg := responseMessage{Role: "assistant", Content: string(c.content)}
		if len(c.reasoning) > 0 {
			rc := string(c.reasoning)
			msg.ReasoningContent = &rc
		}
		out.Choices[i] = chatChoice{Index: i, Message: msg, FinishReason: c.finish}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// chatRequest checks a chat request and renders its prompt.
func (s *Server) chatRequest(req *chatRequest) (genParams, prompt, *served, *apiError) {
	p, err := req.params(0)
	if err != nil {
		return p, prompt{}, nil, err
	}
	if isSet(req.Tools) {
		return p, prompt{}, nil, paramError("tools", "tools (function calling) are not supported")
	}
	if f := req.ResponseFormat; f != nil && f.Type != "" && f.Type != "text" {
		return p, prompt{}, nil, paramError("response_format", "response_format "+f.Type+" is not supported (only text)")
	}
	msgs, err := templateMessages(req.Messages)
	if err != nil {
		return p, prompt{}, nil, err
	}
	m, e := s.backend(req.Model)
	if e != nil {
		return p, prompt{}, nil, e
	}
	req.modelDefaults(&p, m.b.Sampling)
	opts, e := templateOptions(req.ChatTemplateKwargs)
	if e != nil {
		return p, prompt{}, nil, e
	}
	cp, terr := chatprompt.Encode(m.b.Tokenizer, msgs, opts) // start checks the length
	if terr != nil {
		return p, prompt{}, nil, badRequest("%v", terr)
	}
	return p, prompt{param: "messages", ids: cp.IDs, think: m.b.Reasoning, thinkInside: cp.OpensThink()}, m, nil
}

// templateOptions are the chat template's options: the generation prompt,
// and chat_template_kwargs as template variables (enable_thinking among
// them).
func templateOptions(kwargs map[string]json.RawMessage) (tokenizer.TemplateOptions, *apiError) {
	opts := tokenizer.TemplateOptions{AddGenerationPrompt: true}
	for k, v := range kwargs {
		if k == "enable_thinking" {
			var on bool
			if err := json.Unmarshal(v, &on); err != nil {
				return opts, paramError("chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking: want true or false")
			}
			opts.EnableThinking = &on
			continue
		}
		if opts.Vars == nil {
			opts.Vars = map[string]any{}
		}
		opts.Vars[k] = v
	}
	return opts, nil
}

// streamChat writes the choices as chat.completion.chunk events: a first
// delta with the role for every choice, the text as it comes, a last delta
// with the finish reason, the usage when asked, then [DONE].
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, j *job, head chatChunk, includeUsage bool) {
	sse := newSSE(w)
	head.Object = "chat.completion.chunk"
	chunk := func(c chatChunkChoice) error {
		ch := head
		ch.Choices = []chatChunkChoice{c}
		return sse.send(ch)
	}
	for i := range j.total {
		if chunk(chatChunkChoice{Index: i, Delta: chatDelta{Role: "assistant"}}) != nil {
			return
		}
	}
	j.stream(r.Context(), sse,
		func(p piece) error {
			return chunk(chatChunkChoice{Index: p.index, Delta: chatDelta{Content: p.content, ReasoningContent: p.reasoning}})
		},
		func(p piece) error { return chunk(chatChunkChoice{Index: p.index, FinishReason: &p.finish}) },
		usageChunk(includeUsage, func(u *usage) any {
			ch := head
			ch.Choices, ch.Usage = []chatChunkChoice{}, u
			return ch
		}))
}
