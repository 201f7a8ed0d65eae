package model_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

type fakeModel struct{ model.Model }

func TestRegistry(t *testing.T) {
	model.Register("test_arch", func(*config.Config, model.WeightSource, kernels.Backend) (model.Model, error) {
		return fakeModel{}, nil
	})
	defer func() {
		if recover() == nil {
			t.Error("duplicate Register did not panic")
		}
	}()
	cfg, _ := config.Parse("config.json", []byte(`{"model_type": "nope"}`))
	_, err := model.New(cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), `unsupported model_type "nope"`) || !strings.Contains(err.Error(), "test_arch") {
		t.Errorf("unsupported: %v", err)
	}
	cfg, _ = config.Parse("config.json", []byte(`{"model_type": "test_arch"}`))
	if m, err := model.New(cfg, nil, nil); err != nil || m == nil {
		t.Errorf("registered arch: %v", err)
	}
	model.Register("test_arch", nil)
}

func TestValidate(t *testing.T) {
	layout := kvcache.Layout{{K: 2, V: 2}}
	mem := strict.New()
	c, _ := kvcache.New(layout, kvcache.Options{BlockSize: 4, Budget: 1 << 10, Memory: mem})
	s := c.NewSeq()
	c.Reserve(s, 3)
	ok := model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: []int32{1, 2}, Pos: 1, KV: s, Logits: model.AllLogits}}}
	if err := ok.Validate(10, layout); err != nil {
		t.Fatal(err)
	}
	if ok.Tokens() != 2 {
		t.Fatal("Tokens")
	}
	other, _ := kvcache.New(kvcache.Layout{{K: 2, V: 1}}, kvcache.Options{Budget: 1 << 10, Memory: mem})
	for name, b := range map[string]model.Batch{
		"no cache":        {Seqs: ok.Seqs},
		"wrong layout":    {Cache: other, Seqs: ok.Seqs},
		"past reserve":    {Cache: c, Seqs: []model.Seq{{Tokens: []int32{1, 2, 3}, Pos: 1, KV: s}}},
		"negative pos":    {Cache: c, Seqs: []model.Seq{{Tokens: []int32{1}, Pos: -1, KV: s}}},
		"empty":           {Cache: c, Seqs: []model.Seq{{KV: s}}},
		"no handle":       {Cache: c, Seqs: []model.Seq{{Tokens: []int32{1}}}},
		"bad token":       {Cache: c, Seqs: []model.Seq{{Tokens: []int32{10}, KV: s}}},
		"bad logits mode": {Cache: c, Seqs: []model.Seq{{Tokens: []int32{1}, KV: s, Logits: 7}}},
	} {
		if err := b.Validate(10, layout); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// hostState is a StateModel that is not on the op set.
type hostState struct{ model.Model }

func (hostState) Info() model.Info            { return model.Info{Arch: "host"} }
func (hostState) CacheLayout() kvcache.Layout { return kvcache.Layout{{K: 1, V: 1}} }
func (hostState) StateLayout() []linattn.LayerShape {
	return []linattn.LayerShape{{Heads: 1, DK: 1, DV: 1, ConvK: 1}}
}

// TestStorageNeedsDevice: the KV cache and recurrent state live only in a
// device's memory, so a model without one gets errors, not host storage.
func TestStorageNeedsDevice(t *testing.T) {
	if p, err := model.NewStatePool(hostState{}, 1<<10); err == nil || p != nil || !strings.Contains(err.Error(), "not on the op set") {
		t.Errorf("state pool %v, error %v", p, err)
	}
	if c, err := model.NewCache(hostState{}, kvcache.Options{Budget: 1 << 10}); err == nil || c != nil || !strings.Contains(err.Error(), "not on the op set") {
		t.Errorf("cache %v, error %v", c, err)
	}
}
