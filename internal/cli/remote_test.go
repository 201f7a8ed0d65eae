package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/ui"
)

func TestRemoteEndpointsInTheCatalog(t *testing.T) {
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer sk-gpu" {
			http.Error(w, `{"error": {"message": "no"}}`, http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, `{"object": "list", "data": [{"id": "Qwen/Qwen3-32B", "owned_by": "vllm", "max_model_len": 32768}]}`)
	}))
	defer vllm.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	t.Setenv("GPU_KEY", "sk-gpu")
	t.Setenv("MISSING_KEY", "")
	rem, warns := newRemotes([]settings.Endpoint{
		{Name: "gpu", BaseURL: vllm.URL + "/v1", APIKeyEnv: "GPU_KEY"},
		{Name: "down", BaseURL: down.URL},
		{Name: "fixed", BaseURL: "http://fixed.invalid/v1", APIKeyEnv: "MISSING_KEY", Models: []string{"a", "b"}},
		{Name: "bad", BaseURL: "fixed.invalid:80"},
	}, []string{"http://gpu-box:8000", "http://gpu-box:9000/v1", "mine=http://other:1/v1"})
	for _, w := range []string{"endpoint bad is left out", "endpoint fixed: $MISSING_KEY is not set"} {
		if !strings.Contains(strings.Join(warns, "\n"), w) {
			t.Errorf("warnings %q lack %q", warns, w)
		}
	}
	var names []string
	for _, e := range rem.eps {
		names = append(names, e.name+"="+e.client.BaseURL)
	}
	if got := strings.Join(names, " "); !strings.HasSuffix(got, "gpu-box=http://gpu-box:8000/v1 gpu-box-9000=http://gpu-box:9000/v1 mine=http://other:1/v1") {
		t.Errorf("endpoints %s", got)
	}
	rem.eps = rem.eps[:3] // the flags' hosts do not exist

	cat := &chatModels{remote: rem}
	list, err := cat.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ui.ModelEntry{}
	for _, e := range list {
		got[e.Name] = e
	}
	for _, name := range []string{"gpu/Qwen/Qwen3-32B", "fixed/a", "fixed/b"} {
		if e, ok := got[name]; !ok || e.Source != sourceRemote || e.Problem != "" {
			t.Errorf("%s: %+v (listed: %v)", name, e, got)
		}
	}
	if e := got["down"]; e.Source != sourceRemote || !strings.Contains(e.Problem, "connection refused") {
		t.Errorf("the unreachable endpoint: %+v", e)
	}

	// /model takes the full name, a unique part, or a name with a known
	// endpoint that the server has not listed (yet).
	for name, want := range map[string]string{"gpu/Qwen/Qwen3-32B": "gpu/Qwen/Qwen3-32B", "Qwen3-32B": "gpu/Qwen/Qwen3-32B", "fixed/c": "fixed/c"} {
		e, err := cat.Find(context.Background(), name)
		if err != nil || e.Name != want || e.Source != sourceRemote {
			t.Errorf("Find(%q) = %+v, %v", name, e, err)
		}
	}
	eng, closer, err := cat.Load(context.Background(), got["gpu/Qwen/Qwen3-32B"], ui.LoadOptions{}, func(string) {})
	if err != nil || closer != nil {
		t.Fatal(err, closer)
	}
	if info := eng.Info(); !info.Remote || info.MaxContext != 32768 || info.Name != "gpu/Qwen/Qwen3-32B" {
		t.Errorf("info %+v", info)
	}
	if _, _, err := cat.Load(context.Background(), got["down"], ui.LoadOptions{}, func(string) {}); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("loading the unreachable endpoint: %v", err)
	}
	if e, err := rem.first(context.Background()); err != nil || e.Name != "gpu/Qwen/Qwen3-32B" {
		t.Errorf("first: %+v, %v", e, err)
	}
}

func TestEndpointFlags(t *testing.T) {
	var f cmdFlags
	fs := newFlagSet("ferrite", chatScope, &f)
	if err := fs.Parse([]string{"--endpoint", "http://gpu-box:8000/v1", "--endpoint", "big=https://big.example/v1"}); err != nil {
		t.Fatal(err)
	}
	rem, warns := newRemotes([]settings.Endpoint{{Name: "conf", BaseURL: "http://conf:1/v1"}}, f.endpoints)
	var got []string
	for _, e := range rem.eps {
		got = append(got, e.name+"="+e.client.BaseURL)
	}
	if strings.Join(got, " ") != "conf=http://conf:1/v1 gpu-box=http://gpu-box:8000/v1 big=https://big.example/v1" || len(warns) != 0 {
		t.Fatalf("endpoints %v, warnings %v", got, warns)
	}
	var rf cmdFlags
	if newFlagSet("run", runScope, &rf).Lookup("endpoint") != nil {
		t.Error("ferrite run has --endpoint, but only the chat uses it")
	}
}
