package device

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Spec{
		"": {Kind: Auto}, "auto": {Kind: Auto}, "CPU": {Kind: CPU}, "cuda": {Kind: CUDA},
		"cuda:0": {Kind: CUDA}, " cuda:3 ": {Kind: CUDA, Ordinal: 3},
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"gpu0", "cuda:", "cuda:-1", "cuda:x", "tpu", "gpu"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
	if s := (Spec{Kind: CUDA, Ordinal: 2}).String(); s != "cuda:2" {
		t.Errorf("String = %q", s)
	}
}

// TestOpen checks the three choices on this machine: cpu always works;
// with a GPU, auto and cuda take it; without one, auto falls back to the
// CPU and says why, and cuda fails with one line.
func TestOpen(t *testing.T) {
	c, err := Open(Spec{Kind: CPU}, 2)
	if err != nil || c.Backend.Name() != "cpu" || c.Desc != "cpu (2 threads)" || c.Note != "" || c.Err() != nil {
		t.Fatalf("cpu: %+v, %v", c, err)
	}
	c.Close()

	a, err := Open(Spec{Kind: Auto}, 2)
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer a.Close()
	g, gerr := Open(Spec{Kind: CUDA}, 2)
	if a.Backend.Name() == "cuda" {
		t.Logf("GPU present: %s", a.Desc)
		if !strings.HasPrefix(a.Desc, "cuda:0 ") || a.Note != "" {
			t.Errorf("auto on a GPU: name %q, note %q", a.Desc, a.Note)
		}
		if gerr == nil {
			g.Close() // a second Backend on the same GPU is fine
		}
		if _, err := Open(Spec{Kind: CUDA, Ordinal: 99}, 1); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("cuda:99: %v, want a one-line error", err)
		}
		return
	}
	t.Logf("no GPU: auto took %s (%s); cuda: %v", a.Desc, a.Note, gerr)
	if !strings.HasPrefix(a.Note, "no GPU: ") || !strings.HasPrefix(a.Desc, "cpu") {
		t.Errorf("auto without a GPU: name %q, note %q", a.Desc, a.Note)
	}
	if gerr == nil || strings.Contains(gerr.Error(), "\n") || !strings.HasPrefix(gerr.Error(), "cuda: ") {
		t.Errorf("cuda without a GPU: %v, want one \"cuda: ...\" line", gerr)
	}
}
