package settings

import (
	"os"
	"regexp"
	"testing"
)

// FuzzParse feeds arbitrary bytes as config.toml: Parse returns a config or
// an *Error whose problems each carry a message, never a panic. Seeds: the
// example config of the README and small broken files.
func FuzzParse(f *testing.F) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		f.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```toml\n(.*?)```").FindAllSubmatch(readme, -1) {
		f.Add(m[1])
	}
	f.Add([]byte("theme = \"dark\"\n[sampling]\ntemperature = 9\ntop_k = -1\n[engine]\nkv_budget = \"1.5GiB\"\n"))
	f.Add([]byte("[engine]\nkv_budget = 99999999999999999999\nthreads = \"x\"\n[[sampling]]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Parse(data)
		if err == nil {
			return
		}
		e, ok := err.(*Error)
		if !ok {
			t.Fatalf("error %T, want *Error", err)
		}
		for _, p := range e.Problems {
			if p.Msg == "" {
				t.Fatalf("problem without a message: %+v", p)
			}
		}
		_ = e.Error()
	})
}
