package server

import (
	"encoding/json"
	"net/http"
)

// sseWriter writes a streamed response as server-sent events: one
// "data: JSON" event per chunk, flushed at once, and "data: [DONE]" at the
// end.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// send writes one event; an error means the client has gone.
func (s *sseWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		panic("server: a chunk type does not marshal to JSON") // a programmer error: our own types always do
	}
	return s.raw(b)
}

func (s *sseWriter) raw(data []byte) error {
	buf := make([]byte, 0, len(data)+8)
	buf = append(append(append(buf, "data: "...), data...), "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return err
	}
	return s.rc.Flush()
}

// fail ends the stream with an error event, as OpenAI's streams do.
func (s *sseWriter) fail(e *apiError) { s.send(e.wire()) }

// done ends the stream.
func (s *sseWriter) done() { s.raw([]byte("[DONE]")) }
