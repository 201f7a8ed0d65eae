package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// FuzzModelConfig builds models from arbitrary config.json bytes against the
// real weights of the fixture of their model_type: CheckDims and the
// architectures' constructors must turn every bad value into an error,
// never a panic or an allocation that ends the process. Seeds: the fixture
// configs.
func FuzzModelConfig(f *testing.F) {
	names, err := fixtures.List()
	if err != nil || len(names) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	byType := map[string]*weights.Set{}
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(fixtures.Dir(n), "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		cfg, err := config.Parse(n, data)
		if err != nil {
			f.Fatal(err)
		}
		if _, ok := byType[cfg.ModelType]; ok {
			continue
		}
		w, err := weights.Open(fixtures.Dir(n))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { w.Close() })
		byType[cfg.ModelType] = w
	}
	be := cpu.New(1)
	f.Cleanup(be.Close)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse("config.json", data)
		if err != nil {
			return
		}
		w, ok := byType[cfg.ModelType]
		if !ok {
			return
		}
		if CheckDims(cfg, w) != nil {
			return
		}
		_, _ = model.New(cfg, w, be)
	})
}
