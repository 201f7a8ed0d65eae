package gguf

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
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

// TestQuantizedRows checks, on Q8_0 conversions, that the row operations
// work on quantized data: llama's Q/K un-permuted, an expert sliced,
// Qwen3-Next's in_proj_qkvz rebuilt, each equal to quantizing the
// checkpoint's matrix in its own row order.
func TestQuantizedRows(t *testing.T) {
	for _, c := range []struct{ fixture, stored, asked string }{
		{"llama", "model.layers.1.self_attn.q_proj.weight", ""},
		{"llama", "model.layers.2.self_attn.k_proj.weight", ""},
		{"mixtral", "model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.mlp.experts.3.gate_proj.weight"},
		{"qwen3_next", "model.layers.0.linear_attn.in_proj_qkvz.weight", ""},
		{"qwen3_moe", "model.layers.1.mlp.experts.5.down_proj.weight", ""},
	} {
		w, err := ggufwrite.Convert(fixtures.Dir(c.fixture), ggufwrite.Q8_0)
		if err != nil {
			t.Fatal(err)
		}
		m := openWriter(t, w)
		if m.Quantization() != "Q8_0" || m.Problem() != "no tokenizer (tokenizer.ggml.model is absent)" {
			t.Errorf("%s: quantization %q, problem %q", c.fixture, m.Quantization(), m.Problem())
		}
		ws, err := m.Weights()
		if err != nil {
			t.Fatal(err)
		}
		set, err := weights.Open(fixtures.Dir(c.fixture))
		if err != nil {
			t.Fatal(err)
		}
		x, err := set.Tensor(c.stored)
		if err != nil {
			t.Fatal(err)
		}
		asked := c.asked
		if asked == "" {
			asked = c.stored
		}
		got, err := ws.Mat(asked, x.Shape[0], x.Shape[1])
		if err != nil {
			t.Fatal(err)
		}
		want := ggufwrite.QuantizeQ8_0(ggufwrite.DecodeF32(x.Data))
		if got.DType != kernels.Q8_0 || !bytes.Equal(got.Data, want) {
			t.Errorf("%s %s: %v, %d bytes, not the checkpoint's rows quantized", c.fixture, asked, got.DType, len(got.Data))
		}
		set.Close()
	}
}
