package engine

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
)

// fixtureTol bounds max|engine − transformers| / max|transformers| for
// logits and hidden states. The references are float32 (bf16 weights are
// widened exactly), so only summation order separates the two.
const fixtureTol = 1e-4

// bf16KVTol bounds the same error per row with a BF16 KV cache (the op-set
// architectures' default): keys and values are rounded to 8 significant
// bits (relative error ≤ 2⁻⁹ ≈ 2e-3 each), measured at ≤ 5e-3 on these
// fixtures. Rounding may flip a near-tie MoE expert choice, which moves
// that token's row far more (glm4_moe's prompt row 77: 0.17); at most one
// row in bf16KVOutliers may exceed the bound. Greedy tokens must still be
// identical.
const (
	bf16KVTol      = 1e-2
	bf16KVOutliers = 32
)

// f32Only are the fixtures checked against transformers with a float32
// cache only: their DSA indexers (random weights, near-tied scores) pick
// other positions as soon as anything upstream is rounded — BF16 latents
// and index keys flip a few prompt rows' top-k (deepseek_v32: row 73 in
// layer 2; glm_moe_dsa: 4 rows in layer 1, then 15 flips downstream of
// them), the logits of those rows and the rows after them move beyond
// bf16KVTol (up to 0.3 and 0.39 relative) and the greedy tokens follow. Keeping the index
// keys in float32 (kvcache.LayerWidth.VFloat32, glm5_next's fix) does not
// help: the rounded latents move the hidden states the indexer scores.
// Their BF16 default is checked by dsaMarginFixture instead, flip by flip
// against the float32 run (every flip a near-tie, rows before the first
// within bf16KVTol).
var f32Only = map[string]bool{"deepseek_v32": true, "glm_moe_dsa": true}

// TestFixtures runs every supported architecture's transformers fixture:
// prompt logits and final hidden states from one forward, cached decode
// logits fed one token at a time, and 16 greedy tokens.
func TestFixtures(t *testing.T) {
	for _, name := range []string{"llama", "qwen3", "qwen3-bf16", "qwen3_moe", "mixtral", "glm4_moe", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"} {
		for _, kv32 := range []bool{false, true} {
			if f32Only[name] && !kv32 {
				t.Run(name+"/kv-bf16-margin", func(t *testing.T) { dsaMarginFixture(t, name) })
				continue
			}
			t.Run(fmt.Sprintf("%s/kv-f32=%v", name, kv32), func(t *testing.T) { fixture(t, name, kv32, nil) })
		}
		// The strict backend: only the op set touches activations.
		t.Run(name+"/strict", func(t *testing.T) { fixture(t, name, f32Only[name], strict.New()) })
	}
}

// fixture runs one transformers fixture, with a float32 or the model's
// default KV cache.
func fixture(t *testing.T, name string, kv32 bool, be kernels.Backend) {
	{
		{
			fx, err := fixtures.Load(name)
			if os.IsNotExist(err) {
				t.Skipf("fixture %s not present", name)
			}
			if err != nil {
				t.Fatal(err)
			}
			// FERRITE_TEST_DEVICE=cuda runs the fixtures on the GPU (be, when
			// set, takes its place).
			l, err := Load(fx.Dir, Options{Threads: 2, KVFloat32: kv32, Backend: be, Device: os.Getenv("FERRITE_TEST_DEVICE")})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			m := l.Model
			info := m.Info()
			tol := fixtureTol
			if m.CacheLayout()[0].DType == kernels.BF16 {
				tol = bf16KVTol
			}
			prompt, _, err := fx.Ints("prompt_ids")
			if err != nil {
				t.Fatal(err)
			}
			wantLogits, _, _ := fx.Floats("prompt_logits")
			wantHidden, _, _ := fx.Floats("final_hidden")
			decodeIDs, _, _ := fx.Ints("decode_ids")
			wantDecode, _, _ := fx.Floats("decode_logits")
			greedy, _, _ := fx.Ints("greedy_ids")
			if info.Vocab != fx.Ref.V || info.Hidden != fx.Ref.H {
				t.Fatalf("vocab %d hidden %d, fixture %d %d", info.Vocab, info.Hidden, fx.Ref.V, fx.Ref.H)
			}

			c, err := l.NewCache(int64(len(prompt)+64)*info.KVBytesPerToken, 16)
			if err != nil {
				t.Fatal(err)
			}
			run := func(s *kvcache.Seq, toks []int32, mode model.Logits, hidden bool) model.SeqOutput {
				t.Helper()
				pos := s.Len()
				if err := c.Reserve(s, pos+len(toks)); err != nil {
					t.Fatal(err)
				}
				out, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: s, Logits: mode, Hidden: hidden}}})
				if err != nil {
					t.Fatal(err)
				}
				return out.Seqs[0]
			}
			check := func(what string, got, want []float32) {
				t.Helper()
				rel, abs := fixtures.RelErr(got, want)
				t.Logf("%-14s max abs error %.3g, relative %.3g", what, abs, rel)
				if rel <= tol {
					return
				}
				if tol != bf16KVTol {
					t.Errorf("%s: relative error %.3g > %g", what, rel, tol)
					return
				}
				// Per row, relative to the whole tensor's largest value.
				var maxRef float64
				for _, v := range want {
					maxRef = max(maxRef, math.Abs(float64(v)))
				}
				width := fx.Ref.V
				if len(want)%width != 0 || strings.Contains(what, "hidden") {
					width = fx.Ref.H
				}
				bad := 0
				for r := 0; r < len(want)/width; r++ {
					if _, a := fixtures.RelErr(got[r*width:(r+1)*width], want[r*width:(r+1)*width]); a > tol*maxRef {
						bad++
					}
				}
				if rows := len(want) / width; bad > max(1, rows/bf16KVOutliers) {
					t.Errorf("%s: %d of %d rows beyond relative error %g", what, bad, rows, tol)
				}
			}

			s := c.NewSeq()
			out := run(s, prompt, model.AllLogits, true)
			check("prompt logits", out.Logits, wantLogits)
			check("final hidden", out.Hidden, wantHidden)
			var dec []float32
			for _, id := range decodeIDs {
				dec = append(dec, run(s, []int32{id}, model.LastLogits, false).Logits...)
			}
			check("decode logits", dec, wantDecode)
			c.Free(s)

			// Greedy continuation of the prompt.
			g := c.NewSeq()
			next := fixtures.Argmax(run(g, prompt, model.LastLogits, false).Logits)
			var got []int32
			for range len(greedy) {
				got = append(got, next)
				next = fixtures.Argmax(run(g, []int32{next}, model.LastLogits, false).Logits)
			}
			if !slices.Equal(got, greedy) {
				t.Errorf("greedy tokens\n got %v\nwant %v", got, greedy)
			}
			c.Free(g)
			if st := c.Stats(); st.BlocksUsed != 0 {
				t.Errorf("cache not empty after Free: %+v", st)
			}
		}
	}
}
