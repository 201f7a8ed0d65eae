package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHealthWhileLoading: /health and generation answer 503 until the
// model has loaded, then 200.
func TestHealthWhileLoading(t *testing.T) {
	release := make(chan struct{})
	b := tinyBackend(t, defaultTestRuntime())
	slow := Model{Name: "ferrite-tiny", Load: func(ctx context.Context) (*Backend, error) {
		select {
		case <-release:
			return b, nil
		case <-ctx.Done():
			b.Close()
			return nil, ctx.Err()
		}
	}}
	ts := startServer(t, Options{Models: []Model{slow}}, false)
	if status, body := ts.do(t, "GET", "/health", ""); status != http.StatusServiceUnavailable || !strings.Contains(body, "loading") {
		t.Errorf("health while loading: %d %s", status, body)
	}
	status, body := ts.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "still loading") {
		t.Errorf("chat while loading: %d %s", status, body)
	}
	if status, body := ts.do(t, "GET", "/v1/models", ""); status != http.StatusOK || !strings.Contains(body, `"id":"ferrite-tiny"`) {
		t.Errorf("models while loading: %d %s", status, body)
	}
	close(release)
	<-ts.models[0].ready
	if status, body := ts.do(t, "GET", "/health", ""); status != http.StatusOK {
		t.Errorf("health once loaded: %d %s", status, body)
	}
}

// TestLoadFailure: a model that fails to load ends Serve with the error.
func TestLoadFailure(t *testing.T) {
	s, err := New(Options{Models: []Model{{Name: "broken", Load: func(context.Context) (*Backend, error) {
		return nil, errors.New("no weights")
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = s.Serve(context.Background(), ln)
	if err == nil || !strings.Contains(err.Error(), "loading broken: no weights") {
		t.Errorf("Serve: %v", err)
	}
}

// TestDisconnectFreesBlocks: a client that goes away mid-stream, or before
// a whole completion is ready, cancels its generation and the runtime
// gets every block back.
func TestDisconnectFreesBlocks(t *testing.T) {
	b := scriptedBackend(t, "Go on.", strings.Repeat("and on ", 200), 5*time.Millisecond)
	ts := startServer(t, Options{Models: []Model{loaded("slow", b)}}, true)
	cancelled := func() string {
		_, metrics := ts.do(t, "GET", "/metrics", "")
		for l := range strings.SplitSeq(metrics, "\n") {
			if v, ok := strings.CutPrefix(l, `ferrite_completions_total{model="slow",finish_reason="cancelled"} `); ok {
				return v
			}
		}
		return "0"
	}
	body := `{"messages":[{"role":"user","content":"Go on."}],"stream":true,"n":2}`
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.url+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for range 3 { // the role events and some text
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	waitIdle(t, b.Runtime)
	if n := cancelled(); n != "2" {
		t.Errorf("%s choices counted as cancelled, want 2", n)
	}

	// Not streamed: the client gives up once its generation has started,
	// before the completion is ready.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "POST", ts.url+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"Go on."}]}`))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	for ts.models[0].metrics.requests.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	waitIdle(t, b.Runtime)
	for deadline := time.Now().Add(10 * time.Second); ; { // the handler counts it as it returns
		_, metrics := ts.do(t, "GET", "/metrics", "")
		if strings.Contains(metrics, `ferrite_http_requests_total{path="/v1/chat/completions",code="499"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned request is not counted as 499:\n%s", metrics)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := cancelled(); n != "3" {
		t.Errorf("%s choices counted as cancelled, want 3", n)
	}
}

// TestGracefulShutdown: when Serve's context ends, a request that can
// finish within the timeout does, one that cannot gets an error event,
// new connections are refused, and Serve returns.
func TestGracefulShutdown(t *testing.T) {
	b := scriptedBackend(t, "Go on.", strings.Repeat("and on ", 200), 20*time.Millisecond)
	ts := startServer(t, Options{Models: []Model{loaded("slow", b)}, ShutdownTimeout: time.Second}, true)
	type result struct {
		body string
		err  error
	}
	stream := func(maxTokens string) chan result {
		out := make(chan result, 1)
		resp, err := http.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"messages":[{"role":"user","content":"Go on."}],"stream":true`+maxTokens+`}`))
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(resp.Body)
		first, err := r.ReadString('\n') // the role: the request is running
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer resp.Body.Close()
			rest, err := io.ReadAll(r)
			out <- result{first + string(rest), err}
		}()
		return out
	}
	short, long := stream(`,"max_tokens":20`), stream("")
	t0 := time.Now()
	ts.cancel()
	s := <-short
	if s.err != nil || !strings.HasSuffix(s.body, "data: [DONE]\n\n") || !strings.Contains(s.body, `"finish_reason":"length"`) {
		t.Errorf("the short request did not finish: %v\n%s", s.err, s.body)
	}
	l := <-long
	if !strings.Contains(l.body, `"error":{"message":"the server shut down before the request finished"`) {
		t.Errorf("the long request did not end with an error event: %v\n…%s", l.err, l.body[max(0, len(l.body)-300):])
	}
	if d := time.Since(t0); d < 900*time.Millisecond || d > 10*time.Second {
		t.Errorf("the long request ended %v after the shutdown began; the timeout is 1s", d)
	}
	select {
	case err := <-ts.done:
		ts.done <- err
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := http.Get(ts.url + "/health"); err == nil {
		t.Error("the server still accepts connections")
	}
}

// TestJobCloseWithoutReading: a handler that stops reading (an error in
// one choice, a failed write) can close its job while the choices still
// have pieces to send; close returns and the runtime gets its blocks back.
func TestJobCloseWithoutReading(t *testing.T) {
	b := scriptedBackend(t, "Go on.", strings.Repeat("and on ", 100), 0)
	ts := startServer(t, Options{Models: []Model{loaded("fast", b)}}, true)
	var req chatRequest
	req.Messages = []chatMessage{{Role: "user", Content: []byte(`"Go on."`)}}
	p, pr, m, e := ts.chatRequest(&req)
	if e != nil {
		t.Fatal(e)
	}
	p.n = 4
	j, e := ts.start(context.Background(), m, []prompt{pr}, &p)
	if e != nil {
		t.Fatal(e)
	}
	for len(j.pieces) < cap(j.pieces) { // the choices fill the channel and block
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() {
		j.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("job.close hangs while the choices wait to send")
	}
	waitIdle(t, b.Runtime)
}
