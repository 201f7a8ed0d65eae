package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// emptyConfig is an empty configuration file: the defaults.
func emptyConfig(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServeFlagErrors(t *testing.T) {
	cfg := emptyConfig(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"serve", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"serve", "--shutdown-timeout", "0s"}, 2, "--shutdown-timeout"},
		{[]string{"serve", "--config", cfg, "--model", filepath.Join(t.TempDir(), "missing", "model")}, 1, "no such model directory"},
		{[]string{"serve", "--config", cfg, "--model", "ferrite-tiny", "--model", "ferrite-tiny"}, 1, "already served"},
		{[]string{"serve", "--config", cfg, "--addr", "256.0.0.1:1"}, 1, "256.0.0.1"},
		{[]string{"serve", "--config", filepath.Join(t.TempDir(), "missing.toml")}, 2, "no such file"},
		{[]string{"serve", "--kv-budget", "lots"}, 2, "kv-budget"},
	} {
		var stderr bytes.Buffer
		code := Main(context.Background(), c.args, strings.NewReader(""), &bytes.Buffer{}, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: code %d, stderr %q; want %d and %q", c.args, code, stderr.String(), c.code, c.want)
		}
	}
}

// TestServe runs `ferrite serve` on a free loopback port with the API key
// from the environment, talks to it, and stops it as a signal would (its
// context ends).
func TestServe(t *testing.T) {
	t.Setenv("FERRITE_API_KEY", "k3y")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The log goes to a file, which the test reads while the server writes.
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	logged := func() string {
		b, _ := os.ReadFile(stderr.Name())
		return string(b)
	}
	code := make(chan int, 1)
	go func() {
		code <- Main(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--config", emptyConfig(t),
			"--kv-budget", "8388608", "--threads", "2", "--shutdown-timeout", "5s"}, strings.NewReader(""), &bytes.Buffer{}, stderr)
	}()
	url := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	var base string
	for deadline := time.Now().Add(30 * time.Second); base == ""; {
		if m := url.FindStringSubmatch(logged()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no listening line:\n%s", logged())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(base + "/health")
		if err == nil && resp.StatusCode == http.StatusOK {
			resp.Body.Close()
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy: %v\n%s", err, logged())
		}
		time.Sleep(10 * time.Millisecond)
	}
	get := func(key string) int {
		req, _ := http.NewRequest("GET", base+"/v1/models", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(""); got != http.StatusUnauthorized {
		t.Errorf("without the key: %d", got)
	}
	if got := get("k3y"); got != http.StatusOK {
		t.Errorf("with the key: %d", got)
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d:\n%s", c, logged())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	if !strings.Contains(logged(), "shutting down") {
		t.Errorf("no shutdown in the log:\n%s", logged())
	}
}
