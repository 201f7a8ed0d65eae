package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
)

// TestAbsurdDims sets each number of each fixture model's config.json in
// turn to 10^12 (hidden_size, index_head_dim, layer, head and expert counts,
// vocab_size, conv kernels, top-k, ...): Load must fail naming the key,
// without allocating anything sized by it (which would end the process).
func TestAbsurdDims(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(fixtures.ModelsDir(), "*", "config.json"))
	if len(dirs) == 0 {
		t.Fatal("no fixture models")
	}
	for _, cfgPath := range dirs {
		src := filepath.Dir(cfgPath)
		t.Run(filepath.Base(src), func(t *testing.T) {
			orig, err := os.ReadFile(cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			weightsPath, err := filepath.EvalSymlinks(filepath.Join(src, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(weightsPath, filepath.Join(dir, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			var root map[string]any
			if err := json.Unmarshal(orig, &root); err != nil {
				t.Fatal(err)
			}
			n := 0
			forEachNumber(root, "", func(path, key string, set func(any)) {
				if notDims[key] || strings.HasSuffix(key, "_id") || strings.HasSuffix(key, "_ids") {
					return
				}
				set(1e12)
				defer set(nil)
				data, _ := json.Marshal(root)
				if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
					t.Fatal(err)
				}
				n++
				l, err := Load(dir, Options{Threads: 1})
				if err == nil {
					l.Close()
					t.Errorf("%s = 1e12: loaded", path)
				} else if !strings.Contains(err.Error(), `"`+path+`" is 1000000000000`) {
					t.Errorf("%s = 1e12: %v", path, err)
				}
			})
			if n < 5 {
				t.Errorf("only %d dimensions tried", n)
			}
		})
	}
}

// forEachNumber calls fn for each number in v with its dotted path, its key
// and a setter (set(nil) restores the original).
func forEachNumber(v any, path string, fn func(path, key string, set func(any))) {
	switch c := v.(type) {
	case map[string]any:
		for k, e := range c {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if _, ok := e.(float64); ok {
				orig := e
				fn(p, k, func(x any) {
					if x == nil {
						x = orig
					}
					c[k] = x
				})
				continue
			}
			forEachNumber(e, p, fn)
		}
	}
}

// TestAbsurdGGUFDims: a GGUF file whose metadata sets a dimension absurdly
// high fails with an error naming it before anything is sized by it.
func TestAbsurdGGUFDims(t *testing.T) {
	for _, key := range []string{"qwen3.embedding_length", "qwen3.feed_forward_length", "qwen3.block_count", "qwen3.attention.key_length"} {
		w, err := ggufwrite.Convert(fixtures.Dir("qwen3"), ggufwrite.F32)
		if err != nil {
			t.Fatal(err)
		}
		w.Set(key, uint64(1e12))
		path := filepath.Join(t.TempDir(), "bad.gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		l, err := Load(path, Options{Threads: 1})
		if err == nil {
			l.Close()
			t.Errorf("%s = 10^12: loaded", key)
			continue
		}
		if !strings.Contains(err.Error(), "1000000000000") {
			t.Errorf("%s = 10^12: error does not name the value: %v", key, err)
		}
	}
}
