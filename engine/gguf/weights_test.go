package gguf

import (
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// TestWeightsMatchCheckpoint serves every tensor of each fixture checkpoint
// from its F32 GGUF conversion and compares values: equal, except where the
// converter changed them (Qwen3-Next's 1+w norms must give the same 1+w,
// its −exp(A_log) the same decay within rounding). This covers the tensors
// a forward pass does not read, such as the MTP layers'.
func TestWeightsMatchCheckpoint(t *testing.T) {
	for _, name := range []string{"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "glm4_moe_lite", "qwen3_next", "deepseek_v32", "glm_moe_dsa"} {
		w, err := convert(t, name, nil).Weights()
		if err != nil {
			t.Fatal(err)
		}
		set, err := weights.Open(fixtures.Dir(name))
		if err != nil {
			t.Fatal(err)
		}
		// Mixtral's transformers-4 names, as the model asks for them from a GGUF file.
		rename := strings.NewReplacer("block_sparse_moe", "mlp", ".w1.", ".gate_proj.", ".w3.", ".up_proj.", ".w2.", ".down_proj.")
		for _, stored := range set.Names() {
			x, _ := set.Tensor(stored)
			want, _ := set.Float32(stored, x.Shape...)
			hf := rename.Replace(stored)
			var got []float32
			if len(x.Shape) == 2 && x.Shape[0] > 1 {
				m, err := w.Mat(hf, x.Shape[0], x.Shape[1])
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				got = make([]float32, m.Rows*m.Cols)
				for r := range m.Rows {
					m.RowF32(got[r*m.Cols:], r)
				}
			} else if got, err = w.Float32(hf, x.Shape...); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			offset := name == "qwen3_next" && (strings.HasSuffix(hf, "norm.weight") || strings.Contains(hf, "pre_fc_norm")) &&
				!strings.HasSuffix(hf, "linear_attn.norm.weight")
			for i := range want {
				g, v := got[i], want[i]
				switch {
				case offset:
					g, v = 1+g, 1+v
				case strings.HasSuffix(hf, "A_log"):
					if d := g - v; d > 1e-6 || d < -1e-6 {
						t.Errorf("%s: %s[%d] = %g, want %g", name, hf, i, g, v)
					}
					continue
				}
				if g != v {
					t.Errorf("%s: %s[%d] = %g, want %g", name, hf, i, got[i], want[i])
					break
				}
			}
		}
		set.Close()
	}
}
