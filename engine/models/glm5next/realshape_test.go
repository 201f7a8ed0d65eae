package glm5next

import (
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
)

// TestRealShapeConfig checks engine/testdata/glm5next-8l, the real-shape
// config ferrite bench runs with random weights on the GPU: every value is
// the engine's default (transformers' Glm5NextTextConfig) but the layer
// count and the context length (transformers' class default 4096), the
// schedule is the default 3 KDA : 1 DSA with three dense layers first, and
// by the spec's tensor tables its weights fit one H200 with room for the
// caches while the full 45 layers would not.
func TestRealShapeConfig(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "testdata", "glm5next-8l"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := readParams(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := config.Parse("config.json", []byte(`{"model_type": "glm5_next", "hidden_size": 4096, "num_hidden_layers": 8, "vocab_size": 154880}`))
	if err != nil {
		t.Fatal(err)
	}
	def, err := readParams(bare)
	if err != nil {
		t.Fatal(err)
	}
	if p.maxContext != 4096 {
		t.Errorf("max_position_embeddings %d, want transformers' 4096", p.maxContext)
	}
	def.maxContext = p.maxContext
	if !reflect.DeepEqual(p, def) {
		t.Errorf("the config differs from the defaults:\n got %+v\nwant %+v", p, def)
	}
	var kda, dsa, dense []int
	for i := range p.layers {
		switch p.types[i] {
		case linearAttention:
			kda = append(kda, i)
		case sparseAttention:
			dsa = append(dsa, i)
		}
		if p.mlpTypes[i] == denseFFN {
			dense = append(dense, i)
		}
		if p.idxTypes[i] != fullIndexer {
			t.Errorf("layer %d: indexer %q, want full", i, p.idxTypes[i])
		}
	}
	if !reflect.DeepEqual(dsa, []int{3, 7}) || len(kda) != 6 || !reflect.DeepEqual(dense, []int{0, 1, 2}) {
		t.Errorf("schedule: DSA %v, KDA %v, dense %v; want DSA [3 7], 6 KDA, dense [0 1 2]", dsa, kda, dense)
	}
	const h200 = 141e9 // bytes of HBM3e
	n8 := specParams(p)
	if math.Abs(float64(n8)/39.17e9-1) > 0.005 {
		t.Errorf("%d parameters, want ≈ 39.17 B (README.md)", n8)
	}
	if b := 2 * float64(n8); b > h200-40e9 {
		t.Errorf("8 layers: %.1f GB of bf16 weights leaves under 40 GB of an H200", b/1e9)
	}
	full := p
	full.layers = 45
	full.types, full.mlpTypes = nil, nil
	for i := range 45 {
		t, m := linearAttention, sparseFFN
		if i%4 == 3 {
			t = sparseAttention
		}
		if i < 3 {
			m = denseFFN
		}
		full.types, full.mlpTypes = append(full.types, t), append(full.mlpTypes, m)
	}
	if n := specParams(full); math.Abs(float64(n)/313.3e9-1) > 0.005 || 2*float64(n) < h200 {
		t.Errorf("45 layers: %d parameters, want ≈ 313.3 B, more than an H200 holds in bf16", n)
	}
}

// specParams counts glm5_next's parameters from the tensor tables of the
// hybrid-architecture spec (§5.4 MLA and k-pool indexer, §6.3 mHC, §7
// KDA), independently of the loader.
func specParams(p params) int64 {
	H, C, dk := int64(p.hidden), int64(p.linHeads*p.linDim), int64(p.linDim)
	kda := 3*C*H + 3*C*int64(p.convK) + // q, k, v and their conv
		dk*H + C*dk + C + int64(p.linHeads) + // forget gate f_a, f_b, dt_bias, A_log
		int64(p.linHeads)*H + dk*H + C*dk + dk + H*C // b_proj, g_a, g_b, o_norm, o_proj
	qk := int64(p.nope + p.ropeDim)
	mla := int64(p.qLora)*(H+1) + int64(p.heads)*qk*int64(p.qLora) + // q_a (+norm), q_b
		int64(p.kvLora+p.ropeDim)*H + int64(p.kvLora) + int64(p.heads*(p.nope+p.vDim))*int64(p.kvLora) + // kv_a (+norm), kv_b
		H*int64(p.heads*p.vDim) + // o_proj
		int64(p.idxHeads*p.idxDim)*int64(p.qLora) + int64(p.idxDim)*H + 2*int64(p.idxDim) + // indexer wq_b, wk, k_norm
		int64(p.idxHeads)*H + int64(p.idxDim)*H + int64(p.kpool*p.idxDim) // weights_proj, compress gate, ape
	m := int64((2 + p.hc) * p.hc)
	hc := 2 * (m*int64(p.hc)*H + m + 3) // attn_hc and ffn_hc: fn, base, scale
	dense := 3 * H * int64(p.inter)
	moe := int64(p.experts+p.shared)*3*H*int64(p.moeInter) + int64(p.experts)*(H+1) // experts, shared, router (+bias)
	n := 2*int64(p.vocab)*H + H                                                     // embeddings, lm_head, final norm
	for i := range p.layers {
		n += 2*H + hc
		if p.types[i] == linearAttention {
			n += kda
		} else {
			n += mla
		}
		if p.mlpTypes[i] == denseFFN {
			n += dense
		} else {
			n += moe
		}
	}
	return n
}
