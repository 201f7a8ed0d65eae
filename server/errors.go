package server

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// apiError is an error the client gets in OpenAI's shape:
//
//	{"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
type apiError struct {
	Status  int    // HTTP status
	Message string // for people
	Type    string // invalid_request_error, authentication_error, not_found_error, server_error, ...
	Param   string // the request field at fault; "" for none
	Code    string // a machine-readable code such as context_length_exceeded; "" for none
}

func (e *apiError) Error() string { return e.Message }

// wireError is apiError's JSON body.
type wireError struct {
	Error wireErrorBody `json:"error"`
}

type wireErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) wire() wireError {
	w := wireError{Error: wireErrorBody{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		w.Error.Param = &e.Param
	}
	if e.Code != "" {
		w.Error.Code = &e.Code
	}
	return w
}

// paramError is a 400 for the request field param.
func paramError(param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: param}
}

func badRequest(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: "invalid_request_error"}
}

func serverError(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Message: fmt.Sprintf(format, args...), Type: "server_error"}
}

func unavailable(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf(format, args...), Type: "server_error", Code: "service_unavailable"}
}

// contextError is a 400 for a prompt (the request field param) of prompt
// tokens that, with want tokens asked for in all (0: none), does not fit
// in limit; kv says the KV budget sets the limit, not the model.
func contextError(param string, prompt, want, limit int, kv bool) *apiError {
	what := "this model's maximum context length is %d tokens"
	if kv {
		what = "the server's KV cache holds %d tokens (its --kv-budget)"
	}
	msg := fmt.Sprintf(what+", but the prompt is %d tokens", limit, prompt)
	if want > prompt {
		msg = fmt.Sprintf(what+", but %d were requested (%d in the prompt, %d for the completion); lower max_tokens or shorten the prompt",
			limit, want, prompt, want-prompt)
	}
	return &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: param, Code: "context_length_exceeded"}
}

// writeJSON writes v as the response body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("server: a response type does not marshal to JSON") // a programmer error: our own types always do
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeError writes e as the response.
func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, e.wire())
}
