package server

import (
	"net/http"
)

// handleCompletions is POST /v1/completions (text completion: no chat
// template; the prompt is encoded with the tokenizer's special tokens).
func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) *apiError {
	var req completionRequest
	if e := decodeBody(w, r, &req); e != nil {
		return e
	}
	p, e := req.params(16) // OpenAI's default max_tokens for text completions
	if e != nil {
		return e
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return paramError("suffix", "suffix (fill in the middle) is not supported")
	}
	texts, ids, e := completionPrompts(req.Prompt)
	if e != nil {
		return e
	}
	m, e := s.backend(req.Model)
	if e != nil {
		return e
	}
	req.modelDefaults(&p, m.b.Sampling)
	tok := m.b.Tokenizer
	var prompts []prompt
	var echo []string // each prompt's text, for echo
	for _, t := range texts {
		prompts = append(prompts, prompt{param: "prompt", ids: tok.Encode(t, true)})
		echo = append(echo, t)
	}
	for _, l := range ids {
		prompts = append(prompts, prompt{param: "prompt", ids: l})
		echo = append(echo, tok.Decode(l, false))
	}
	if len(prompts) == 0 {
		return paramError("prompt", "prompt is an empty list")
	}
	if !req.Echo {
		echo = nil
	}
	j, e := s.start(r.Context(), m, prompts, &p)
	if e != nil {
		return e
	}
	defer j.close()
	head := textCompletion{ID: s.opts.newID("cmpl-"), Object: "text_completion", Created: s.opts.now().Unix(), Model: m.name}
	if p.stream {
		s.streamCompletion(w, r, j, head, echo, p.includeUsage)
		return nil
	}
	res, e := j.collect(r.Context())
	if e != nil {
		return e
	}
	if res == nil {
		return nil // the client has gone
	}
	u := j.usage(res)
	out := head
	out.Usage = &u
	out.Choices = make([]textChoice, len(res))
	for i, c := range res {
		text := string(c.content)
		if echo != nil {
			text = echo[i/p.n] + text
		}
		out.Choices[i] = textChoice{Index: i, Text: text, FinishReason: &res[i].finish}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// streamCompletion writes the choices as text_completion events: the
// echoed prompt first when asked, the text as it comes, a last event with
// the finish reason, the usage when asked, then [DONE].
func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, j *job, head textCompletion, echo []string, includeUsage bool) {
	sse := newSSE(w)
	chunk := func(c textChoice) error {
		ch := head
		ch.Choices = []textChoice{c}
		return sse.send(ch)
	}
	n := j.total / len(j.prompt)
	for i := range j.total {
		if echo != nil && chunk(textChoice{Index: i, Text: echo[i/n]}) != nil {
			return
		}
	}
	j.stream(r.Context(), sse,
		func(p piece) error { return chunk(textChoice{Index: p.index, Text: p.content}) },
		func(p piece) error { return chunk(textChoice{Index: p.index, FinishReason: &p.finish}) },
		usageChunk(includeUsage, func(u *usage) any {
			ch := head
			ch.Choices, ch.Usage = []textChoice{}, u
			return ch
		}))
}
