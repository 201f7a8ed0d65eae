package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the config.json parser and reads every
// key through each typed getter, as the models do: errors are recorded,
// nothing panics. Seeds: the config.json of every test model.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("../../testdata/models/*/config.json")
	paths = append(paths, "../testdata/qwen3-0.6b/config.json")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"model_type": "llama", "text_config": {"hidden_size": 1e400}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("config.json", data)
		if err != nil {
			return
		}
		readAll(c, 0)
		_ = c.Top().Keys()
		_ = c.Rope()
		_ = c.RopeFor("sliding_attention")
		_ = c.Dtype()
		_ = c.Errs()
	})
}

// readAll reads every key of c with every getter, recursing into objects.
func readAll(c *Config, depth int) {
	for _, k := range c.Keys() {
		_ = c.IntOr(k, 0)
		_ = c.FloatOr(k, 0)
		_ = c.BoolOr(k, false)
		_ = c.StringOr(k, "")
		_ = c.Ints(k)
		_ = c.Floats(k)
		_ = c.Strings(k)
		_ = c.Raw(k)
		if depth < 3 {
			if sub := c.Sub(k); sub != nil {
				readAll(sub, depth+1)
			}
		}
	}
}
