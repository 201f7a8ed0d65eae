package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// tiny loads ferrite-tiny once per test binary (its weights are used in
// place, so every test shares them).
var tiny = sync.OnceValues(func() (*engine.Loaded, error) {
	l, _, err := builtin.Open(engine.Options{Threads: 2})
	return l, err
})

// tinyBackend is a fresh runtime on ferrite-tiny with the given KV budget
// and options.
func tinyBackend(t testing.TB, opts runtime.Options) *Backend {
	t.Helper()
	l, err := tiny()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := builtin.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if opts.KVBudget == 0 {
		opts.KVBudget = 16 << 20
	}
	rt, err := runtime.New(l.Model, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &Backend{Runtime: rt, Tokenizer: tok, Sampling: tok.Sampling(), Reasoning: IsReasoning(tok), Close: func() { rt.Close() }}
}

// loaded is a Model whose loader returns b at once.
func loaded(name string, b *Backend) Model {
	return Model{Name: name, Load: func(context.Context) (*Backend, error) { return b, nil }}
}

// testServer is a Server running on a loopback port.
type testServer struct {
	*Server
	url    string
	cancel context.CancelFunc
	done   chan error
}

// startServer runs a server with opts on a loopback port until the test
// ends, and waits until its models have loaded unless wait is false.
func startServer(t testing.TB, opts Options, wait bool) *testServer {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { ts.stop(t) })
	if wait {
		for _, m := range s.models {
			<-m.ready
		}
	}
	return ts
}

// stop shuts the server down and waits for Serve to return.
func (ts *testServer) stop(t testing.TB) {
	ts.cancel()
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		ts.done <- nil
	case <-time.After(time.Minute):
		t.Error("Serve did not return a minute after its context ended")
	}
}

// post sends body to path and returns the status and response body.
func (ts *testServer) post(t testing.TB, path, body string, header ...string) (int, string) {
	t.Helper()
	return ts.do(t, http.MethodPost, path, body, header...)
}

func (ts *testServer) do(t testing.TB, method, path, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, ts.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// fixedIDs makes response ids and timestamps reproducible.
func fixedIDs(opts *Options) {
	opts.now = func() time.Time { return time.Unix(1700000000, 0) }
	opts.newID = func(prefix string) string { return prefix + "test" }
}

// waitIdle waits until rt runs and queues nothing and, its prefix cache
// emptied, holds no cache block or state slot; it fails the test when
// that does not happen within 30 seconds (a leak). DropPrefixCache also
// makes the runtime publish fresh Stats (a snapshot may otherwise lag the
// events by a step).
func waitIdle(t testing.TB, rt *runtime.Runtime) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rt.DropPrefixCache()
		st := rt.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 && st.RecurrentBytes == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leak: %d running, %d waiting, %d KV blocks and %d bytes of recurrent state held 30 s on",
				st.Running, st.Waiting, st.KVBlocksUsed, st.RecurrentBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scripted is a model that writes a fixed reply: after a prompt of
// promptLen tokens its next token is reply[i] at the i-th generated
// position, then EOS. Its cache holds nothing it reads.
type scripted struct {
	vocab     int
	promptLen int
	reply     []int32
	eos       int32
	delay     time.Duration  // slept in every Forward: a slow model
	dev       *strict.Device // holds its (untouched) KV cache
}

// Device makes scripted a model.DeviceModel, whose cache the runtime
// creates in dev.
func (m *scripted) Device() kernels.Device { return m.dev }

// SetCacheDType accepts F32, the one cache type scripted has.
func (m *scripted) SetCacheDType(dt kernels.DType) error {
	if dt != kernels.F32 {
		return fmt.Errorf("scripted: %v cache", dt)
	}
	return nil
}

func (m *scripted) Info() model.Info {
	return model.Info{Arch: "scripted", Vocab: m.vocab, Hidden: 1, Layers: 1, MaxContext: 1024,
		KVBytesPerToken: m.CacheLayout().BytesPerToken()}
}

func (m *scripted) CacheLayout() kvcache.Layout { return kvcache.Layout{{K: 1}} }

func (m *scripted) Forward(b *model.Batch) (*model.Output, error) {
	time.Sleep(m.delay)
	out := &model.Output{Seqs: make([]model.SeqOutput, len(b.Seqs))}
	for i, s := range b.Seqs {
		first := len(s.Tokens) - 1
		switch s.Logits {
		case model.NoLogits:
			continue
		case model.AllLogits:
			first = 0
		}
		for p := s.Pos + first; p < s.Pos+len(s.Tokens); p++ {
			row := make([]float32, m.vocab)
			next := m.eos
			if k := p + 1 - m.promptLen; k >= 0 && k < len(m.reply) {
				next = m.reply[k]
			}
			row[next] = 30 // certain at any temperature
			out.Seqs[i].Logits = append(out.Seqs[i].Logits, row...)
		}
	}
	return out, nil
}

// scriptedBackend serves a model that answers the user message question
// with reply (text in ferrite-tiny's vocabulary), as a reasoning model.
func scriptedBackend(t testing.TB, question, reply string, delay time.Duration) *Backend {
	t.Helper()
	tok, err := builtin.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: question}}, tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	m := &scripted{vocab: tok.VocabSize(), promptLen: len(tok.Encode(text, false)), reply: tok.Encode(reply, false), eos: tok.EOS()[0], delay: delay, dev: strict.New()}
	if got := tok.Decode(m.reply, false); got != reply {
		panic(fmt.Sprintf("reply %q does not round-trip (%q)", reply, got))
	}
	rt, err := runtime.New(m, runtime.Options{KVBudget: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return &Backend{Runtime: rt, Tokenizer: tok, Reasoning: true, Close: func() { rt.Close() }}
}

// defaultTestRuntime are the runtime options of most tests: a 16 MiB KV
// cache (ferrite-tiny's whole context many times over).
func defaultTestRuntime() runtime.Options { return runtime.Options{KVBudget: 16 << 20} }
