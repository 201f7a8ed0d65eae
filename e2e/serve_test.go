package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeSIGTERM runs `ferrite serve` as a process, starts a streamed
// completion, sends the process SIGTERM and checks the graceful shutdown:
// the running request still ends with [DONE], and the process exits 0.
func TestServeSIGTERM(t *testing.T) {
	bin := build(t)
	config := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(config, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--config", config, "--kv-budget", "8MiB", "--threads", "2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	logs := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs <- sc.Text()
		}
		close(logs)
	}()
	var log strings.Builder
	wait := func(what string, re *regexp.Regexp) []string {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case l, ok := <-logs:
				if !ok {
					t.Fatalf("the server ended before %s:\n%s", what, log.String())
				}
				log.WriteString(l + "\n")
				if m := re.FindStringSubmatch(l); m != nil {
					return m
				}
			case <-deadline:
				t.Fatalf("no %s in a minute:\n%s", what, log.String())
			}
		}
	}
	url := wait("listening line", regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`))[1]
	wait("loaded model", regexp.MustCompile(`msg=loaded model=ferrite-tiny`))

	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"The Devil's Dictionary defines","max_tokens":600,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // the first chunk: the request runs
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("the running request did not finish after SIGTERM: %v\n…%s", err, rest[max(0, len(rest)-200):])
	}
	wait("shutdown", regexp.MustCompile(`msg="shutting down"`))
	for l := range logs {
		log.WriteString(l + "\n")
	}
	if s := log.String(); strings.Index(s, `msg="shutting down"`) > strings.Index(s, "path=/v1/completions") {
		t.Errorf("the request ended before the shutdown began: the test shows nothing\n%s", s)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("ferrite serve after SIGTERM: %v\n%s", err, log.String())
	}
}
