// Package server is ferrite's OpenAI-compatible HTTP API (`ferrite
// serve`): chat and text completions, streamed as server-sent events or
// whole, on the same engine/runtime the chat uses, so the requests of all
// clients share one continuous batch, its prefix cache and its speculative
// decoding.
//
// A request goes: JSON body → checked parameters (params.go) → prompt ids
// (internal/chatprompt renders the chat template, as the chat does) → one
// runtime.Generate per choice (n) → per choice, a goroutine that decodes
// each generated id, holds back text that may be the start of a stop
// string (stop.go), splits a reasoning model's <think> block into
// reasoning_content (think.go) and sends the pieces to the handler, which
// writes chunks (SSE) or gathers the whole completion. A client that goes
// away cancels its request's context, which ends its generations and frees
// their cache blocks at the next engine step.
//
// Endpoints: GET /v1/models, POST /v1/chat/completions, POST
// /v1/completions, POST /tokenize, GET /health (503 until every model has
// loaded), GET /metrics (Prometheus text). Errors are OpenAI's JSON error
// objects. Serve runs the server on a listener until its context ends, then
// shuts down gracefully: new requests are refused, running ones get
// Options.ShutdownTimeout to finish and are then cancelled.
package server
