package gqa_test

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

const tiny = `{
  "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
  "vocab_size": 101, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": true
}`

// TestCacheElsewhere checks that a cache outside the model's device memory
// is an error, not a crash, and that BF16 halves the bytes per token.
func TestCacheElsewhere(t *testing.T) {
	m := modeltest.BuildOn(t, strict.New(), tiny, kernels.F32, nil)
	bf16 := m.Info().KVBytesPerToken
	if err := m.(model.DeviceModel).SetCacheDType(kernels.F32); err != nil {
		t.Fatal(err)
	}
	if f32 := m.Info().KVBytesPerToken; f32 != 2*bf16 || f32 != 2*2*2*16*4 {
		t.Fatalf("KV bytes per token: F32 %d, BF16 %d", f32, bf16)
	}
	if err := m.(model.DeviceModel).SetCacheDType(kernels.F16); err == nil {
		t.Fatal("F16 KV cache accepted")
	}
	// A cache in another device's memory.
	c, err := kvcache.New(m.CacheLayout(), kvcache.Options{Budget: 1 << 20, Memory: strict.New()})
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSeq()
	if err := c.Reserve(s, 1); err != nil {
		t.Fatal(err)
	}
	_, err = m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: []int32{1}, KV: s, Logits: model.LastLogits}}})
	if err == nil || !strings.Contains(err.Error(), "device memory") {
		t.Errorf("a cache in another device's memory: error %v", err)
	}
}
