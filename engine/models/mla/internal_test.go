package mla

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/nn"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + rng.IntN(60)
		k := 1 + rng.IntN(n)
		scores := make([]float32, n)
		for i := range scores {
			// Few distinct values so that ties are common.
			scores[i] = float32(rng.IntN(7)) - 3
			if trial%2 == 0 {
				scores[i] = float32(rng.NormFloat64())
			}
		}
		order := make([]int32, n)
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortStableFunc(order, func(a, b int32) int {
			switch {
			case scores[a] > scores[b]:
				return -1
			case scores[a] < scores[b]:
				return 1
			}
			return int(a - b)
		})
		want := slices.Clone(order[:k])
		slices.Sort(want)
		got := make([]int32, k)
		topK(scores, make([]int32, 0, k), got)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: top-%d of %v = %v, want %v", trial, k, scores, got, want)
		}
	}
}

func TestLayerNorm(t *testing.T) {
	x := []float32{1, 2, 3, 4, -1, 0.5, 0.25, 8}
	ln := &nn.LayerNorm{W: []float32{1, 2, 0.5, -1}, B: []float32{0.1, 0, -0.2, 0.3}, Eps: 1e-6}
	y := make([]float32, len(x))
	ln.Forward(y, x, 2)
	for r := range 2 {
		row := x[r*4 : (r+1)*4]
		var mean, v float64
		for _, e := range row {
			mean += float64(e) / 4
		}
		for _, e := range row {
			v += (float64(e) - mean) * (float64(e) - mean) / 4
		}
		for j, e := range row {
			want := (float64(e)-mean)/math.Sqrt(v+1e-6)*float64(ln.W[j]) + float64(ln.B[j])
			if d := math.Abs(float64(y[r*4+j]) - want); d > 1e-6 {
				t.Errorf("row %d col %d: %g, want %g", r, j, y[r*4+j], want)
			}
		}
	}
}

func TestSelectionReset(t *testing.T) {
	var s Selection
	s.reset([]int32{0, 3, 4, 9, 2}, 4)
	wantFull := []bool{true, true, false, false, true}
	if !slices.Equal(s.Full, wantFull) || len(s.Idx) != 8 || s.Off[5] != 8 {
		t.Fatalf("full %v off %v idx %d", s.Full, s.Off, len(s.Idx))
	}
	if idx, full := s.Row(3); full || len(idx) != 4 {
		t.Fatalf("row 3: %v %v", idx, full)
	}
}

// TestIndexerScoringPaths checks that scoring keys in parallel (few rows)
// and rows in parallel (many rows) select the same positions.
func TestIndexerScoringPaths(t *testing.T) {
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
	m, err := New(cfg, randweights.New(3, kernels.F32), be, Spec{Arch: "deepseek_v32", DSA: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kvcache.New(m.CacheLayout(), kvcache.Options{BlockSize: 4, Budget: 64 * m.Info().KVBytesPerToken})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 37)
	for i := range toks {
		toks[i] = int32(i * 7 % 50)
	}
	var sels [2][]int32
	defer func(b int) { scoreBudget = b }(scoreBudget)
	for k, budget := range []int{1 << 22, 0} {
		scoreBudget = budget
		s := c.NewSeq()
		if err := c.Reserve(s, len(toks)); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, KV: s}}}); err != nil {
			t.Fatal(err)
		}
		sels[k] = slices.Clone(m.(*Model).Attention(1).Selection().Idx)
		c.Free(s)
	}
	if len(sels[0]) != (37-7)*7 || !slices.Equal(sels[0], sels[1]) {
		t.Fatalf("selections differ or have the wrong size: %d and %d positions", len(sels[0]), len(sels[1]))
	}
}

func TestNaiveFor(t *testing.T) {
	dsv3 := &Attention{KVLora: 512, Nope: 128, Rope: 64, V: 128}
	tiny := &Attention{KVLora: 32, Nope: 16, Rope: 8, V: 16}
	dsa := &Attention{KVLora: 512, Nope: 128, Rope: 64, V: 128, Indexer: &Indexer{TopK: 2048}}
	shared := &Attention{KVLora: 512, Nope: 128, Rope: 64, V: 128, Share: dsa}
	for _, tc := range []struct {
		a       *Attention
		n, ctx  int
		naive   bool
		comment string
	}{
		{dsv3, 2048, 2048, true, "prefill"},
		{dsv3, 512, 8192, true, "prefill chunk over a cached context"},
		{dsv3, 1, 4096, false, "decode"},
		{dsv3, 4, 4096, false, "verification"},
		{tiny, 83, 83, true, "fixture prompt"},
		{tiny, 1, 84, false, "fixture decode"},
		{dsa, 2048, 100000, false, "DSA chunk over a long context"},
		{shared, 2048, 100000, false, "shared DSA layer"},
		{dsa, 2048, 2048, true, "DSA prefill"},
	} {
		if got := tc.a.naiveFor(tc.n, tc.ctx); got != tc.naive {
			t.Errorf("%s (n %d, ctx %d): naive %v, want %v", tc.comment, tc.n, tc.ctx, got, tc.naive)
		}
	}
}
