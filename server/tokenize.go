package server

import (
	"net/http"

	"github.com/ferrite-llm/ferrite/internal/chatprompt"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// handleTokenize is POST /tokenize (vLLM's): the ids of a prompt, or of a
// conversation rendered with the chat template.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) *apiError {
	var req tokenizeRequest
	if e := decodeBody(w, r, &req); e != nil {
		return e
	}
	if (req.Prompt == nil) == (req.Messages == nil) {
		return badRequest("give either prompt or messages")
	}
	m, e := s.backend(req.Model)
	if e != nil {
		return e
	}
	tok := m.b.Tokenizer
	var ids []int32
	if req.Prompt != nil {
		ids = tok.Encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	} else {
		msgs, e := templateMessages(req.Messages)
		if e != nil {
			return e
		}
		opts := tokenizer.TemplateOptions{AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt}
		p, err := chatprompt.Encode(tok, msgs, opts)
		if err != nil {
			return badRequest("%v", err)
		}
		ids = p.IDs
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: m.b.Runtime.MaxSeqLen(), Tokens: ids})
	return nil
}
