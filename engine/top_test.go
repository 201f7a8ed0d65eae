package engine

import (
	"math"
	"os"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestFixturesTopEntries runs batches of three sequences of fixture models
// (prefill, then greedy decode steps; on FERRITE_TEST_DEVICE when set) that
// ask for their logit rows' best entries (model.Batch.Top), and checks
// them bit for bit against the whole rows of the same step, read back with
// model.Output.Logits: the device's kernels.SampleOps on real logits, and
// the plumbing from the output head to the sampler. Samplers drawing from
// the entries must draw what they draw from the rows.
func TestFixturesTopEntries(t *testing.T) {
	for _, name := range []string{"qwen3", "llama"} {
		t.Run(name, func(t *testing.T) {
			fx, err := fixtures.Load(name)
			if os.IsNotExist(err) {
				t.Skipf("fixture %s not present", name)
			}
			if err != nil {
				t.Fatal(err)
			}
			l, err := Load(fx.Dir, Options{Threads: 2, Device: os.Getenv("FERRITE_TEST_DEVICE")})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			m, vocab := l.Model, l.Model.Info().Vocab
			prompt, _, err := fx.Ints("prompt_ids")
			if err != nil {
				t.Fatal(err)
			}
			c, err := l.NewCache(int64(3*(len(prompt)+64))*m.Info().KVBytesPerToken, 16)
			if err != nil {
				t.Fatal(err)
			}
			seqs := []*kvcache.Seq{c.NewSeq(), c.NewSeq(), c.NewSeq()}
			toks := [][]int32{prompt, prompt[:len(prompt)/2], prompt[len(prompt)/3:]}
			samplers := []sample.Params{{}, {Temperature: 0.7, TopK: 40, Seed: 3}, {Temperature: 1.5, TopK: 100, TopP: 0.9, Seed: 4}}
			for step := range 6 {
				top := sample.MaxCandidates
				if step%3 == 2 {
					top = 1 // the argmax kernel
				}
				b := &model.Batch{Cache: c, Top: top}
				for i, s := range seqs {
					pos := s.Len()
					if err := c.Reserve(s, len(toks[i])); err != nil {
						t.Fatal(err)
					}
					// Every third step the last two sequences want whole rows:
					// one copy for the run of both.
					full := step%3 == 1 && i > 0
					b.Seqs = append(b.Seqs, model.Seq{Tokens: toks[i][pos:], Pos: pos, KV: s, Logits: model.LastLogits, Full: full})
				}
				out, err := m.Forward(b)
				if err != nil {
					t.Fatal(err)
				}
				if out.Logits == nil {
					t.Fatalf("step %d: no best entries (the device has no kernels.SampleOps?)", step)
				}
				for i := range seqs {
					o := &out.Seqs[i]
					if b.Seqs[i].Full {
						row := out.Logits(i)
						if o.Top != 0 || len(o.Logits) != vocab {
							t.Fatalf("step %d seq %d: Top %d, %d logits; want a whole row", step, i, o.Top, len(o.Logits))
						}
						for j, v := range o.Logits {
							if math.Float32bits(v) != math.Float32bits(row[j]) {
								t.Fatalf("step %d seq %d: logit %d is %g, the row read alone has %g", step, i, j, v, row[j])
							}
						}
						toks[i] = append(toks[i], fixtures.Argmax(row))
						continue
					}
					if o.Top != min(top, vocab) || o.Logits != nil {
						t.Fatalf("step %d seq %d: Top %d, %d logits; want %d best entries", step, i, o.Top, len(o.Logits), min(top, vocab))
					}
					row := out.Logits(i)
					vals, ids := o.TopRow(0)
					wantV, wantI := make([]float32, o.Top), make([]int32, o.Top)
					ref.TopKRow(wantV, wantI, row)
					for j := range wantV {
						if ids[j] != wantI[j] || math.Float32bits(vals[j]) != math.Float32bits(wantV[j]) {
							t.Fatalf("step %d seq %d entry %d: id %d value %g, want id %d value %g (the whole row's)", step, i, j, ids[j], vals[j], wantI[j], wantV[j])
						}
					}
					for _, p := range samplers {
						if p.TopK+1 > o.Top && p.Temperature != 0 {
							continue
						}
						a, b := sample.New(p), sample.New(p)
						want := a.Sample(row, toks[i])
						if got, ok := b.SampleTop(vals, ids, vocab); ok && got != want {
							t.Errorf("step %d seq %d %+v: SampleTop %d, Sample %d", step, i, p, got, want)
						}
					}
					toks[i] = append(toks[i], ids[0]) // greedy
				}
			}
			t.Logf("%d sequences, 6 steps: best entries equal the rows' (vocab %d)", len(seqs), vocab)
		})
	}
}
