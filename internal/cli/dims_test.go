package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A config.json dimension far beyond the checkpoint's tensors fails `run`
// and `bench` with an error naming the key, before anything is allocated
// by it (10^12 floats would end the process).
func TestAbsurdDimension(t *testing.T) {
	dir := fixtureModel(t, "qwen3")
	path := filepath.Join(dir, "config.json")
	cfg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `"hidden_size": 64`) {
		t.Fatalf("fixture config changed:\n%s", cfg)
	}
	bad := strings.Replace(string(cfg), `"hidden_size": 64`, `"hidden_size": 1000000000000`, 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"run", "--model", dir, "--max-tokens", "2", "hi"},
		{"bench", "--model", dir, "--concurrency", "1", "--prompt-len", "4", "--gen-len", "2", "--bandwidth", "10"},
	} {
		code, _, errs := runCLI(t, "", args...)
		if code != 1 || !strings.Contains(errs, `key "hidden_size" is 1000000000000, larger than any tensor dimension`) {
			t.Errorf("%s: exit %d, stderr %q", args[0], code, errs)
		}
	}
}
