package cuda_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFatbinManifest checks that fatbin.sha256 names every CUDA source in
// src/ with its current hash, and the committed fatbin with its hash, so a
// source edited without rebuilding (tools/cuda/build_fatbin.sh on a machine
// with nvcc) fails here, on machines without a GPU too.
func TestFatbinManifest(t *testing.T) {
	f, err := os.Open("fatbin.sha256")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("fatbin.sha256: malformed line %q", line)
		}
		listed[name] = sum
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sources, err := filepath.Glob("src/*.cu")
	if err != nil || len(sources) == 0 {
		t.Fatalf("no CUDA sources in src/ (%v)", err)
	}
	for _, name := range append(sources, "ferrite.fatbin") {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		switch want, ok := listed[name]; {
		case !ok:
			t.Errorf("%s is not in fatbin.sha256: rebuild with tools/cuda/build_fatbin.sh", name)
		case want != hex.EncodeToString(h[:]):
			t.Errorf("%s changed since the fatbin was built: rebuild with tools/cuda/build_fatbin.sh", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("fatbin.sha256 lists %s, which is gone: rebuild with tools/cuda/build_fatbin.sh", name)
	}
}
