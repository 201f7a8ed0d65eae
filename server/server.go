package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Backend is a loaded model the server generates with.
type Backend struct {
	// Runtime generates; create it without Options.NewDecoder (the server
	// decodes each request's ids itself, one at a time, to find stop
	// strings at token boundaries).
	Runtime   *runtime.Runtime
	Tokenizer *tokenizer.Tokenizer
	// Sampling is what the model recommends, used where a request gives
	// no temperature, top_p or top_k (Tokenizer.Sampling, unless the
	// model's store says more: catalog.Entry.Recommended).
	Sampling tokenizer.Sampling
	// Reasoning makes chat replies that open with a <think> block come
	// back with it as reasoning_content (see IsReasoning).
	Reasoning bool
	// Close releases the runtime and the model; nil when there is nothing
	// to release. The server calls it once no request uses the backend.
	Close func()
}

// IsReasoning reports whether tok's model thinks in <think> blocks: its
// vocabulary has both tags as tokens.
func IsReasoning(tok *tokenizer.Tokenizer) bool {
	_, open := tok.TokenToID("<think>")
	_, end := tok.TokenToID("</think>")
	return open && end
}

// Model is a model to serve: the name clients give as "model", and how to
// load it.
type Model struct {
	Name string
	Load func(ctx context.Context) (*Backend, error)
}

// Options configure a Server.
type Options struct {
	// Models are served under their names, loaded in order when Serve
	// starts; the first one answers requests that name no model.
	Models []Model
	// APIKey, when set, is the bearer token every request but GET /health
	// must carry (Authorization: Bearer KEY).
	APIKey string
	// ShutdownTimeout is how long running requests may take to finish
	// once Serve's context ends before they are cancelled; 0 means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Log receives the server's log (listening, loads, one line per
	// request); nil discards it.
	Log *slog.Logger

	now   func() time.Time           // the created field's clock; nil: time.Now
	newID func(prefix string) string // response ids; nil: random
}

// DefaultShutdownTimeout is Options.ShutdownTimeout's default.
const DefaultShutdownTimeout = 30 * time.Second

// maxBody is the largest request body accepted.
const maxBody = 16 << 20

// Server is an OpenAI-compatible API over loaded models.
type Server struct {
	opts    Options
	log     *slog.Logger
	created int64 // Unix time of New: the models' created field
	models  []*served
	byName  map[string]*served

	abort    context.Context // cancelled when running requests must end (shutdown timeout)
	abortNow context.CancelFunc
	draining atomic.Bool // shutting down: new generations are refused

	http httpCounts
}

// served is one model of the server and its state.
type served struct {
	name    string
	load    func(ctx context.Context) (*Backend, error)
	ready   chan struct{} // closed once loading ended (b or err is set)
	b       *Backend
	err     error
	metrics modelMetrics
}

// New checks opts and returns a server; Serve runs it.
func New(opts Options) (*Server, error) {
	if len(opts.Models) == 0 {
		return nil, errors.New("server: no model to serve")
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if opts.newID == nil {
		opts.newID = randomID
	}
	s := &Server{opts: opts, log: opts.Log, byName: map[string]*served{}, created: opts.now().Unix()}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, m := range opts.Models {
		if m.Name == "" || m.Load == nil {
			return nil, errors.New("server: a model needs a name and a loader")
		}
		if s.byName[m.Name] != nil {
			return nil, fmt.Errorf("server: model %q given twice", m.Name)
		}
		sm := &served{name: m.Name, load: m.Load, ready: make(chan struct{})}
		s.models = append(s.models, sm)
		s.byName[m.Name] = sm
	}
	s.abort, s.abortNow = context.WithCancel(context.Background())
	return s, nil
}

// randomID is a response id such as chatcmpl-5f0c….
func randomID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Serve answers requests on ln while it loads the models, until ctx ends
// or a model fails to load; then it shuts down gracefully (see
// Options.ShutdownTimeout), releases the models and returns. The error is
// nil after a shutdown asked for by ctx. A Server serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	loadCtx, stopLoading := context.WithCancel(ctx)
	loaded := make(chan error, 1)
	go func() { loaded <- s.loadAll(loadCtx) }()
	stopRates := s.trackRates()

	var err error
	for wait := true; wait; {
		select {
		case <-ctx.Done():
			wait = false
		case err = <-serveErr:
			serveErr, wait = nil, false
		case lerr := <-loaded:
			loaded = nil
			if lerr != nil {
				err, wait = lerr, false
			}
		}
	}
	stopLoading()
	s.shutdown(hs)
	if loaded != nil {
		<-loaded
	}
	stopRates()
	s.closeModels()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// shutdown stops accepting, lets running requests finish within the
// timeout, then cancels them and waits a little for their handlers to
// write their last words.
func (s *Server) shutdown(hs *http.Server) {
	s.draining.Store(true)
	s.log.Info("shutting down", "timeout", s.opts.ShutdownTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(ctx); err == nil {
		return
	}
	s.log.Warn("cancelling the requests still running")
	s.abortNow()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := hs.Shutdown(ctx2); err != nil {
		hs.Close()
	}
}

// loadAll loads the models in order.
func (s *Server) loadAll(ctx context.Context) error {
	for i, m := range s.models {
		t0 := time.Now()
		s.log.Info("loading", "model", m.name)
		b, err := m.load(ctx)
		if err == nil && (b == nil || b.Runtime == nil || b.Tokenizer == nil) {
			err = errors.New("the loader returned no runtime or tokenizer")
		}
		if err != nil {
			err = fmt.Errorf("loading %s: %w", m.name, err)
			for _, rest := range s.models[i:] {
				rest.err = err
				close(rest.ready)
			}
			return err
		}
		m.b = b
		close(m.ready)
		s.log.Info("loaded", "model", m.name, "seconds", time.Since(t0).Seconds(), "context", b.Runtime.MaxSeqLen())
	}
	return nil
}

// closeModels releases every loaded model. Serve calls it once no handler
// runs.
func (s *Server) closeModels() {
	for _, m := range s.models {
		select {
		case <-m.ready:
		default:
			continue
		}
		if m.b != nil && m.b.Close != nil {
			m.b.Close()
		}
	}
}

// backend is the loaded model a request names ("" for the first one).
func (s *Server) backend(name string) (*served, *apiError) {
	if s.draining.Load() {
		return nil, unavailable("the server is shutting down")
	}
	m := s.models[0]
	if name != "" {
		m = s.byName[name]
	}
	if m == nil {
		names := make([]string, len(s.models))
		for i, m := range s.models {
			names[i] = m.name
		}
		return nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist; this server has %s", name, strings.Join(names, ", "))}
	}
	select {
	case <-m.ready:
	default:
		return nil, unavailable("the model %s is still loading", m.name)
	}
	if m.err != nil {
		return nil, unavailable("the model %s failed to load: %v", m.name, m.err)
	}
	return m, nil
}

// route is one endpoint. Its handler returns the error to answer with, if
// it has written nothing yet.
type route struct {
	method string
	h      func(w http.ResponseWriter, r *http.Request) *apiError
}

// Handler is the server's HTTP handler (Serve uses it; it serves only
// models that Serve has loaded).
func (s *Server) Handler() http.Handler {
	routes := map[string]route{
		"/health":              {http.MethodGet, infallible(s.handleHealth)},
		"/metrics":             {http.MethodGet, infallible(s.handleMetrics)},
		"/v1/models":           {http.MethodGet, infallible(s.handleModels)},
		"/v1/chat/completions": {http.MethodPost, s.handleChat},
		"/v1/completions":      {http.MethodPost, s.handleCompletions},
		"/tokenize":            {http.MethodPost, s.handleTokenize},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		rec := &statusWriter{ResponseWriter: w}
		defer func() {
			if rec.status == 0 && r.Context().Err() != nil {
				rec.status = statusClientGone
			}
			s.http.count(r.URL.Path, rec.status)
			s.log.Info("request", "method", r.Method, "path", r.URL.Path, "status", rec.status,
				"ms", time.Since(t0).Milliseconds(), "remote", r.RemoteAddr)
		}()
		rt, ok := routes[r.URL.Path]
		if !ok && strings.HasPrefix(r.URL.Path, modelPrefix) {
			rt, ok = route{http.MethodGet, s.handleModel}, true
		}
		switch {
		case !ok:
			writeError(rec, &apiError{Status: http.StatusNotFound, Type: "not_found_error",
				Message: fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
		case r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead):
			rec.Header().Set("Allow", rt.method)
			writeError(rec, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: fmt.Sprintf("%s takes %s, not %s", r.URL.Path, rt.method, r.Method)})
		case r.URL.Path != "/health" && !s.authorized(r):
			rec.Header().Set("WWW-Authenticate", `Bearer realm="ferrite"`)
			writeError(rec, &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
				Message: "missing or wrong API key: send Authorization: Bearer KEY"})
		default:
			if e := rt.h(rec, r); e != nil {
				writeError(rec, e)
			}
		}
	})
}

// infallible is a route handler of h, which always answers.
func infallible(h http.HandlerFunc) func(http.ResponseWriter, *http.Request) *apiError {
	return func(w http.ResponseWriter, r *http.Request) *apiError {
		h(w, r)
		return nil
	}
}

// authorized checks the request's bearer token against Options.APIKey.
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.opts.APIKey)) == 1
}

// statusClientGone is the status logged and counted for a request whose
// client went away before any answer (nginx's 499); it is never sent.
const statusClientGone = 499

// statusWriter remembers the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// decodeBody reads a JSON request body into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		var typeErr *json.UnmarshalTypeError
		var fieldErr *fieldError
		switch {
		case errors.As(err, &fieldErr):
			return paramError(fieldErr.field, fieldErr.msg)
		case errors.As(err, &tooBig):
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("the request body is over %d bytes", maxBody)}
		case errors.As(err, &typeErr):
			field := strings.TrimPrefix(typeErr.Field, "samplingRequest.")
			return paramError(field, fmt.Sprintf("%s: want a JSON %s, not %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value))
		case errors.Is(err, io.EOF):
			return badRequest("the request body is empty: want a JSON object")
		}
		return badRequest("the request body is not valid JSON: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return badRequest("the request body has data after its JSON object")
	}
	return nil
}

// jsonKind names a Go kind as JSON calls it.
func jsonKind(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "slice":
		return "array"
	case kind == "struct", kind == "map":
		return "object"
	case kind == "bool":
		return "boolean"
	}
	return kind
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	for _, m := range s.models {
		select {
		case <-m.ready:
		default:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading", "model": m.name})
			return
		}
		if m.err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "failed", "model": m.name, "error": m.err.Error()})
			return
		}
	}
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	list := modelList{Object: "list", Data: []modelCard{}}
	for _, m := range s.models {
		list.Data = append(list.Data, s.card(m))
	}
	writeJSON(w, http.StatusOK, list)
}

// modelPrefix is the path of one model: GET /v1/models/NAME (a name may
// hold slashes, as in Qwen/Qwen3-0.6B).
const modelPrefix = "/v1/models/"

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) *apiError {
	name := strings.TrimPrefix(r.URL.Path, modelPrefix)
	m := s.byName[name]
	if m == nil {
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist", name)}
	}
	writeJSON(w, http.StatusOK, s.card(m))
	return nil
}

// card describes m for /v1/models.
func (s *Server) card(m *served) modelCard {
	c := modelCard{ID: m.name, Object: "model", Created: s.created, OwnedBy: "ferrite"}
	if b := m.loaded(); b != nil {
		c.MaxModelLen = b.Runtime.MaxSeqLen()
	}
	return c
}
