package mla

import (
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// TestIndexerChunks checks that scoring a step's rows in chunks (a small
// score budget) selects the same positions as scoring them at once.
func TestIndexerChunks(t *testing.T) {
	const cfgJSON = `{
  "model_type": "deepseek_v32", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16,
  "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48,
  "first_k_dense_replace": 2, "index_n_heads": 4, "index_head_dim": 8, "index_topk": 7,
  "vocab_size": 50, "max_position_embeddings": 64, "rope_theta": 10000.0
}`
	cfg, err := config.Parse("config.json", []byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(2)
	defer be.Close()
	mm, err := New(cfg, randweights.New(3, kernels.F32), be, Spec{Arch: "deepseek_v32", DSA: true})
	if err != nil {
		t.Fatal(err)
	}
	m := mm.(*Model)
	c, err := model.NewCache(m, kvcache.Options{BlockSize: 4, Budget: 64 * m.Info().KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 37)
	for i := range toks {
		toks[i] = int32(i * 7 % 50)
	}
	var sels [2][][]int32
	defer func(b int) { scoreBudget = b }(scoreBudget)
	for k, budget := range []int{1 << 22, 2 * scoreWidthStep} { // chunks of 2 rows
		scoreBudget = budget
		s := c.NewSeq()
		if err := c.Reserve(s, len(toks)); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, KV: s}}}); err != nil {
			t.Fatal(err)
		}
		sels[k] = m.Attention(1).Selection()
		c.Free(s)
	}
	if len(sels[0]) != 37 || len(sels[0][36]) != 7 || !slices.EqualFunc(sels[0], sels[1], slices.Equal) {
		t.Fatalf("selections differ or have the wrong size:\n%v\n%v", sels[0], sels[1])
	}
}
