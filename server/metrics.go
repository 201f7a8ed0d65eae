package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// modelMetrics are one model's counters, beside its runtime's Stats.
type modelMetrics struct {
	requests atomic.Uint64 // generation requests started

	mu        sync.Mutex
	finishes  map[string]uint64 // choices ended, by finish reason (stop, length, cancelled, error)
	ttftSum   float64           // seconds
	ttftCount uint64
	ttftLE    [len(ttftBuckets)]uint64 // choices whose TTFT was at most ttftBuckets[i]
	samples   []rateSample             // generated-token counts over the last rateWindow
}

type rateSample struct {
	at        time.Time
	generated uint64
}

// ttftBuckets are the upper bounds (seconds) of the time-to-first-token
// histogram's buckets.
var ttftBuckets = [...]float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// rateWindow is the span the tokens-per-second gauge averages over.
const rateWindow = 10 * time.Second

func (m *modelMetrics) finished(reason string) {
	m.mu.Lock()
	if m.finishes == nil {
		m.finishes = map[string]uint64{}
	}
	m.finishes[reason]++
	m.mu.Unlock()
}

// observeTTFT records a choice's time to first token (when it had one).
func (m *modelMetrics) observeTTFT(d time.Duration, tokens int) {
	if tokens == 0 {
		return
	}
	m.mu.Lock()
	sec := d.Seconds()
	m.ttftSum += sec
	m.ttftCount++
	for i, le := range ttftBuckets {
		if sec <= le {
			m.ttftLE[i]++
		}
	}
	m.mu.Unlock()
}

// sample records the runtime's generated-token count at t.
func (m *modelMetrics) sample(t time.Time, generated uint64) {
	m.mu.Lock()
	m.samples = append(m.samples, rateSample{t, generated})
	for len(m.samples) > 2 && t.Sub(m.samples[0].at) > rateWindow {
		m.samples = m.samples[1:]
	}
	m.mu.Unlock()
}

// tokensPerSecond is the generation rate over the samples' span.
func (m *modelMetrics) tokensPerSecond() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) < 2 {
		return 0
	}
	a, b := m.samples[0], m.samples[len(m.samples)-1]
	if dt := b.at.Sub(a.at).Seconds(); dt > 0 {
		return float64(b.generated-a.generated) / dt
	}
	return 0
}

// trackRates samples every loaded model's generated tokens once a second
// for the tokens-per-second gauge, until the returned function is called.
func (s *Server) trackRates() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case t := <-tick.C:
				for _, m := range s.models {
					if b := m.loaded(); b != nil {
						m.metrics.sample(t, b.Runtime.Stats().GeneratedTokens)
					}
				}
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// loaded is the model's backend once it has loaded; nil before or after
// a failure.
func (m *served) loaded() *Backend {
	select {
	case <-m.ready:
		return m.b
	default:
		return nil
	}
}

// httpCounts counts answered requests by path and status.
type httpCounts struct {
	mu sync.Mutex
	n  map[[2]string]uint64
}

// knownPaths are the paths counted under their own name; others count as
// "other", which keeps the label set bounded.
var knownPaths = []string{"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize"}

// pathLabel is path as the metrics count it.
func pathLabel(path string) string {
	switch {
	case slices.Contains(knownPaths, path):
		return path
	case strings.HasPrefix(path, modelPrefix):
		return modelPrefix + "{model}"
	}
	return "other"
}

func (c *httpCounts) count(path string, status int) {
	path = pathLabel(path)
	if status == 0 {
		status = http.StatusOK
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[[2]string]uint64{}
	}
	c.n[[2]string{path, fmt.Sprint(status)}]++
	c.mu.Unlock()
}

// promWriter writes the Prometheus text exposition format.
type promWriter struct{ b strings.Builder }

func (p *promWriter) head(name, typ, help string) {
	fmt.Fprintf(&p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes one value; labels are name, value pairs.
func (p *promWriter) sample(name string, v float64, labels ...string) {
	p.b.WriteString(name)
	for i := 0; i+1 < len(labels); i += 2 {
		sep := ","
		if i == 0 {
			sep = "{"
		}
		fmt.Fprintf(&p.b, `%s%s="%s"`, sep, labels[i], labelEscaper.Replace(labels[i+1]))
	}
	if len(labels) > 0 {
		p.b.WriteByte('}')
	}
	fmt.Fprintf(&p.b, " %g\n", v)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// modelGauge is one per-model metric taken from the model's state.
type modelGauge struct {
	name, typ, help string
	value           func(m *served, b *Backend) float64
}

var modelGauges = []modelGauge{
	{"ferrite_model_ready", "gauge", "1 once the model has loaded.", func(m *served, b *Backend) float64 { return boolValue(b != nil) }},
	{"ferrite_requests_total", "counter", "Generation requests started (each counts once, whatever its n).",
		func(m *served, _ *Backend) float64 { return float64(m.metrics.requests.Load()) }},
	{"ferrite_requests_running", "gauge", "Sequences generating in the engine's batch.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().Running) })},
	{"ferrite_requests_waiting", "gauge", "Sequences queued for admission to the batch.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().Waiting) })},
	{"ferrite_prompt_tokens_total", "counter", "Prompt tokens computed (cached prefixes excluded).", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().PromptTokens) })},
	{"ferrite_generation_tokens_total", "counter", "Tokens generated.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().GeneratedTokens) })},
	{"ferrite_generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 seconds.",
		func(m *served, _ *Backend) float64 { return m.metrics.tokensPerSecond() }},
	{"ferrite_prefix_cache_hits_total", "counter", "Requests that reused a cached prompt prefix.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().PrefixHits) })},
	{"ferrite_prefix_cached_tokens_total", "counter", "Prompt tokens taken from the prefix cache.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().CachedTokens) })},
	{"ferrite_kv_cache_blocks_used", "gauge", "KV-cache blocks in use (sequences and cached prefixes).", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().KVBlocksUsed) })},
	{"ferrite_kv_cache_blocks_total", "gauge", "KV-cache blocks in the pool.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().KVBlocksTotal) })},
	{"ferrite_kv_cache_usage_ratio", "gauge", "Share of the KV-cache blocks in use.", stat(func(b *Backend) float64 {
		st := b.Runtime.Stats()
		if st.KVBlocksTotal == 0 {
			return 0
		}
		return float64(st.KVBlocksUsed) / float64(st.KVBlocksTotal)
	})},
	{"ferrite_preemptions_total", "counter", "Sequences preempted for lack of cache room.", stat(func(b *Backend) float64 { return float64(b.Runtime.Stats().Preemptions) })},
}

// stat is a gauge read from the backend; 0 while the model loads.
func stat(f func(b *Backend) float64) func(*served, *Backend) float64 {
	return func(_ *served, b *Backend) float64 {
		if b == nil {
			return 0
		}
		return f(b)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// handleMetrics is GET /metrics.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	var p promWriter
	for _, g := range modelGauges {
		p.head(g.name, g.typ, g.help)
		for _, m := range s.models {
			p.sample(g.name, g.value(m, m.loaded()), "model", m.name)
		}
	}
	p.head("ferrite_completions_total", "counter", "Choices ended, by finish reason (stop, length, cancelled by the client, error).")
	p.head("ferrite_time_to_first_token_seconds", "histogram", "Time from the request to its first generated token, per choice.")
	for _, m := range s.models {
		m.metrics.mu.Lock()
		reasons := make([]string, 0, len(m.metrics.finishes))
		for r := range m.metrics.finishes {
			reasons = append(reasons, r)
		}
		slices.Sort(reasons)
		for _, r := range reasons {
			p.sample("ferrite_completions_total", float64(m.metrics.finishes[r]), "model", m.name, "finish_reason", r)
		}
		for i, le := range ttftBuckets {
			p.sample("ferrite_time_to_first_token_seconds_bucket", float64(m.metrics.ttftLE[i]), "model", m.name, "le", fmt.Sprint(le))
		}
		p.sample("ferrite_time_to_first_token_seconds_bucket", float64(m.metrics.ttftCount), "model", m.name, "le", "+Inf")
		p.sample("ferrite_time_to_first_token_seconds_sum", m.metrics.ttftSum, "model", m.name)
		p.sample("ferrite_time_to_first_token_seconds_count", float64(m.metrics.ttftCount), "model", m.name)
		m.metrics.mu.Unlock()
	}
	p.head("ferrite_http_requests_total", "counter", "HTTP requests answered, by path and status code.")
	s.http.mu.Lock()
	keys := make([][2]string, 0, len(s.http.n))
	for k := range s.http.n {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	for _, k := range keys {
		p.sample("ferrite_http_requests_total", float64(s.http.n[k]), "path", k[0], "code", k[1])
	}
	s.http.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(p.b.String()))
}
