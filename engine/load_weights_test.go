package engine

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// TestLoadWeights builds a fixture from an in-memory config and weight set
// and checks it reports what Load reports.
func TestLoadWeights(t *testing.T) {
	dir := fixtures.Dir("qwen3")
	data, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if os.IsNotExist(err) {
		t.Skip("fixture qwen3 not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	cfgData, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("mem/config.json", cfgData)
	if err != nil {
		t.Fatal(err)
	}
	w, err := weights.FromBytes("mem/model.safetensors", data)
	if err != nil {
		t.Fatal(err)
	}
	l, err := LoadWeights("mem:qwen3", cfg, w, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ref, err := Load(dir, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if l.Dir != "mem:qwen3" || l.Model.Info() != ref.Model.Info() || !slices.Equal(l.Model.CacheLayout(), ref.Model.CacheLayout()) {
		t.Errorf("LoadWeights: %q %+v, Load: %+v", l.Dir, l.Model.Info(), ref.Model.Info())
	}
	if _, err := LoadWeights("x", cfg, nil, Options{}); err == nil {
		t.Error("want an error without weights")
	}
	if _, err := LoadWeights("x", cfg, w, Options{RandomWeights: true}); err == nil {
		t.Error("want an error for RandomWeights")
	}
}
