package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferrite-llm/ferrite/internal/catalog"
	"github.com/ferrite-llm/ferrite/internal/openai"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/ui"
)

// sourceRemote marks the catalog entries of remote endpoints' models.
const sourceRemote = "remote"

// listTimeout bounds asking an endpoint for its models, so that an
// unreachable one only shows up as such in /models.
const listTimeout = 3 * time.Second

// endpoint is one OpenAI-compatible server of [[endpoints]] or --endpoint.
type endpoint struct {
	name   string
	client *openai.Client
	models []string // from the configuration; nil: ask GET /v1/models
}

// remotes are the chat's endpoints and the models they were last seen to
// serve. The zero value (no endpoints) lists nothing.
type remotes struct {
	eps []*endpoint

	mu    sync.Mutex
	known map[string]remoteModel // by "NAME/MODEL"
	last  []catalog.Entry        // what list gave last
}

// remoteModel is one model of an endpoint.
type remoteModel struct {
	ep     *endpoint
	id     string // the server's name
	maxLen int    // its context, when the server says; 0: unknown
}

// newRemotes makes the endpoints of the configuration and of --endpoint
// flags ("URL" or "NAME=URL"); problems (a bad URL, an API key variable
// that is not set) come back as warnings, and a bad endpoint is left out.
func newRemotes(cfg []settings.Endpoint, flags []string) (*remotes, []string) {
	r := &remotes{known: map[string]remoteModel{}}
	var warns []string
	for _, f := range flags {
		name, raw, ok := strings.Cut(f, "=")
		if !ok || strings.Contains(name, "/") {
			name, raw = "", f
		}
		cfg = append(cfg, settings.Endpoint{Name: name, BaseURL: raw})
	}
	for _, e := range cfg {
		base, err := openai.NormalizeBaseURL(e.BaseURL)
		if err != nil {
			warns = append(warns, fmt.Sprintf("endpoint %s is left out: %v", cmp.Or(e.Name, e.BaseURL), err))
			continue
		}
		name := cmp.Or(e.Name, r.hostName(base))
		key := e.APIKey
		if e.APIKeyEnv != "" {
			if key = os.Getenv(e.APIKeyEnv); key == "" {
				warns = append(warns, fmt.Sprintf("endpoint %s: $%s is not set, so no API key is sent", name, e.APIKeyEnv))
			}
		}
		r.eps = append(r.eps, &endpoint{name: name, client: &openai.Client{BaseURL: base, APIKey: key}, models: e.Models})
	}
	return r, warns
}

// hostName names an endpoint given by its URL: its host, with the port
// when another endpoint has the host already.
func (r *remotes) hostName(base string) string {
	u, _ := url.Parse(base)
	name := u.Hostname()
	if slices.ContainsFunc(r.eps, func(e *endpoint) bool { return e.name == name }) {
		name = strings.ReplaceAll(u.Host, ":", "-")
	}
	return name
}

// list asks every endpoint for its models at once (each within
// listTimeout): an entry per model, or one entry for an endpoint that
// could not be asked, with the reason as its Problem.
func (r *remotes) list(ctx context.Context) []catalog.Entry {
	if r == nil || len(r.eps) == 0 {
		return nil
	}
	found := make([][]remoteModel, len(r.eps))
	errs := make([]error, len(r.eps))
	var wg sync.WaitGroup
	for i, ep := range r.eps {
		wg.Go(func() { found[i], errs[i] = ep.listModels(ctx) })
	}
	wg.Wait()
	var out []catalog.Entry
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, ep := range r.eps {
		if errs[i] != nil {
			out = append(out, catalog.Entry{Name: ep.name, Source: sourceRemote,
				Problem: fmt.Sprintf("%s: %v", ep.client.BaseURL, errs[i])})
			continue
		}
		for _, m := range found[i] {
			name := ep.name + "/" + m.id
			r.known[name] = m
			out = append(out, catalog.Entry{Name: name, Source: sourceRemote})
		}
	}
	r.last = out
	return out
}

// listed is what list gave last, without asking again (for /model N and
// partial names, which follow the list /models showed).
func (r *remotes) listed() []catalog.Entry {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.last)
}

// listModels is the endpoint's models: those of the configuration, or
// what GET /v1/models says.
func (ep *endpoint) listModels(ctx context.Context) ([]remoteModel, error) {
	if len(ep.models) > 0 {
		out := make([]remoteModel, len(ep.models))
		for i, id := range ep.models {
			out[i] = remoteModel{ep: ep, id: id}
		}
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	ms, err := ep.client.Models(ctx)
	var ue *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("no answer within %s", listTimeout)
	case errors.As(err, &ue):
		err = ue.Err // the URL is said already
	}
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, errors.New("the server lists no models")
	}
	out := make([]remoteModel, len(ms))
	for i, m := range ms {
		out[i] = remoteModel{ep: ep, id: m.ID, maxLen: m.MaxModelLen}
	}
	return out, nil
}

// lookup is the entry of "NAME/MODEL" when NAME is an endpoint, without
// asking the server (the first request will say if the model is not
// there).
func (r *remotes) lookup(name string) (catalog.Entry, bool) {
	if r == nil {
		return catalog.Entry{}, false
	}
	prefix, id, ok := strings.Cut(name, "/")
	if !ok || id == "" || !slices.ContainsFunc(r.eps, func(e *endpoint) bool { return e.name == prefix }) {
		return catalog.Entry{}, false
	}
	return catalog.Entry{Name: name, Source: sourceRemote}, true
}

// first is the first model of the first endpoint that answers, for the
// chat started with --endpoint and no model.
func (r *remotes) first(ctx context.Context) (catalog.Entry, error) {
	var problems []string
	for _, e := range r.list(ctx) {
		if e.Problem == "" {
			return e, nil
		}
		problems = append(problems, e.Name+": "+e.Problem)
	}
	return catalog.Entry{}, fmt.Errorf("no endpoint answered (%s)", strings.Join(problems, "; "))
}

// open is the engine of a remote entry. Nothing is asked of the server
// here: an unreachable one fails the first reply, and the chat says why.
func (r *remotes) open(e catalog.Entry) (ui.Engine, io.Closer, error) {
	r.mu.Lock()
	m, ok := r.known[e.Name]
	r.mu.Unlock()
	if !ok {
		prefix, id, _ := strings.Cut(e.Name, "/")
		i := slices.IndexFunc(r.eps, func(ep *endpoint) bool { return ep.name == prefix })
		if i < 0 || id == "" {
			return nil, nil, fmt.Errorf("%s: %s", e.Name, cmp.Or(e.Problem, "not a model of an endpoint: want ENDPOINT/MODEL"))
		}
		m = remoteModel{ep: r.eps[i], id: id}
	}
	return ui.NewRemoteEngine(m.ep.client, m.id, ui.ModelInfo{Name: e.Name, MaxContext: m.maxLen}), nil, nil
}
