package builtin

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// benchQuestions are in-domain chat questions (greedy answers of 10 to 60 tokens).
var benchQuestions = []string{
	"What does ephemeral mean?", "What does length mean?", "Who are you?", "What can you do?",
	"Give me a synonym for big.", "Use candid in a sentence.", "Tell me a quote about time.",
	"What does the Devil's Dictionary say about air?",
}

// BenchmarkSpeculative measures greedy decoding of benchQuestions one at a
// time (a single chat) with and without MTP drafts: generated tokens per
// second and the share of draft tokens accepted.
//
//	go test ./builtin -run '^$' -bench Speculative -benchtime 3x
func BenchmarkSpeculative(b *testing.B) {
	l, tok := open(b)
	var prompts [][]int32
	for _, q := range benchQuestions {
		text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: q}}, tokenizer.TemplateOptions{AddGenerationPrompt: true})
		if err != nil {
			b.Fatal(err)
		}
		prompts = append(prompts, tok.Encode(text, false))
	}
	for _, draft := range []int{0, 1, 2, 3} {
		b.Run(fmt.Sprintf("draft=%d", draft), func(b *testing.B) {
			rt, err := runtime.New(l.Model, runtime.Options{KVBudget: 8 << 20, Draft: draft,
				// FERRITE_BENCH_DRAFT_ALWAYS=1 drafts on every step, to measure acceptance
				// and the cost of speculation without the cost-aware switch.
				DraftIgnoreCost: os.Getenv("FERRITE_BENCH_DRAFT_ALWAYS") == "1"})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			var tokens int
			var busy time.Duration
			b.ResetTimer()
			for range b.N {
				for _, p := range prompts {
					t0 := time.Now()
					tokens += len(generate(b, rt, p, tok.EOS(), 80))
					busy += time.Since(t0)
				}
			}
			st := rt.Stats()
			b.ReportMetric(float64(tokens)/busy.Seconds(), "tok/s")
			b.ReportMetric(st.AcceptRate, "accept")
			b.ReportMetric(float64(st.Steps)/float64(b.N), "steps/op")
		})
	}
}
