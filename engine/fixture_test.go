package engine

import (
	"math"
	"os"
	"slices"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// fixtureTol bounds max|engine − transformers| / max|transformers| for
// logits and hidden states. The references are float32 (bf16 weights are
// widened exactly), so only summation order separates the two.
const fixtureTol = 1e-4

// relErr is max|got−want| / max|want|.
func relErr(got, want []float32) (rel, abs float64) {
	var maxRef float64
	for i := range want {
		maxRef = max(maxRef, math.Abs(float64(want[i])))
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		abs = max(abs, d)
	}
	return abs / maxRef, abs
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// TestFixtures runs every supported architecture's transformers fixture:
// prompt logits and final hidden states from one forward, cached decode
// logits fed one token at a time, and 16 greedy tokens.
func TestFixtures(t *testing.T) {
	for _, name := range []string{"llama", "qwen3", "qwen3-bf16", "qwen3_moe", "mixtral", "glm4_moe"} {
		t.Run(name, func(t *testing.T) {
			fx, err := fixtures.Load(name)
			if os.IsNotExist(err) {
				t.Skipf("fixture %s not present", name)
			}
			if err != nil {
				t.Fatal(err)
			}
			// FERRITE_TEST_DEVICE=cuda runs the fixtures on the GPU.
			l, err := Load(fx.Dir, Options{Threads: 2, Device: os.Getenv("FERRITE_TEST_DEVICE")})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			m := l.Model
			info := m.Info()
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
				rel, abs := relErr(got, want)
				t.Logf("%-14s max abs error %.3g, relative %.3g", what, abs, rel)
				if rel > fixtureTol {
					t.Errorf("%s: relative error %.3g > %g", what, rel, fixtureTol)
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
			next := argmax(run(g, prompt, model.LastLogits, false).Logits)
			var got []int32
			for range len(greedy) {
				got = append(got, next)
				next = argmax(run(g, []int32{next}, model.LastLogits, false).Logits)
			}
			if !slices.Equal(got, greedy) {
				t.Errorf("greedy tokens\n got %v\nwant %v", got, greedy)
			}
			c.Free(g)
			if st := c.Stats(); st.BlocksUsed != 0 {
				t.Errorf("cache not empty after Free: %+v", st)
			}
		})
	}
}
