package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// benchLlama is small but not tiny: 8 layers of width 512 (about 27 M
// parameters with the embeddings), so a long prompt takes seconds to
// prefill on two cores.
const benchLlama = `{
  "model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1376,
  "vocab_size": 4096, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false
}`

// Chat shape of BenchmarkChatTurn10: every turn adds a user message of
// chatUser tokens and a reply of chatReply.
const (
	chatUser  = 120
	chatReply = 30
)

// BenchmarkChatTurn10 measures the time to first token of the 10th turn
// of a conversation (about 1,470 prompt tokens: nine turns of 150 and a
// new message of 120) with the prefix cache, which computes only the new
// message, and without, which computes the whole conversation again; and,
// for scale, the new message sent alone on an empty context. The
// first nine turns run once, untimed; each iteration then sends a fresh
// 10th message (MaxTokens 1) after the same history. Run with
//
//	go test -run '^$' -bench ChatTurn10 -benchtime 5x ./engine/runtime
func BenchmarkChatTurn10(b *testing.B) {
	cfg, err := config.Parse("config.json", []byte(benchLlama))
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(0)
	defer be.Close()
	m, err := model.New(cfg, randweights.New(11, kernels.F32), be)
	if err != nil {
		b.Fatal(err)
	}
	vocab := m.Info().Vocab
	kv := int64(4096) * m.Info().KVBytesPerToken

	// The first nine turns, with their replies, on a runtime that keeps them.
	warm, err := runtime.New(m, runtime.Options{KVBudget: kv})
	if err != nil {
		b.Fatal(err)
	}
	defer warm.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var history []int32
	for range 9 {
		history = append(history, randPrompt(rng, chatUser, vocab)...)
		s, err := warm.Generate(b.Context(), runtime.Request{Prompt: slices.Clone(history), MaxTokens: chatReply, Sampling: greedy})
		if err != nil {
			b.Fatal(err)
		}
		res := s.Collect()
		if res.Err != nil || len(res.Tokens) != chatReply {
			b.Fatalf("history: %d tokens, %v", len(res.Tokens), res.Err)
		}
		history = append(history, res.Tokens...)
	}

	msgs := rand.New(rand.NewPCG(3, 4)) // a new 10th message every time
	for _, tc := range []struct {
		name         string
		reuse, alone bool
	}{{"reuse", true, false}, {"cold", false, false}, {"message-alone", false, true}} {
		b.Run(tc.name, func(b *testing.B) {
			r := warm
			if !tc.reuse {
				cold, err := runtime.New(m, runtime.Options{KVBudget: kv, PrefixCache: -1})
				if err != nil {
					b.Fatal(err)
				}
				defer cold.Close()
				r = cold
			}
			var ttft time.Duration
			var prompt, cached, n int
			for b.Loop() {
				p := append(slices.Clone(history), randPrompt(msgs, chatUser, vocab)...)
				if tc.alone {
					p = p[len(history):] // the floor: the new message without a history
				}
				s, err := r.Generate(b.Context(), runtime.Request{Prompt: p, MaxTokens: 1, Sampling: greedy})
				if err != nil {
					b.Fatal(err)
				}
				res := s.Collect()
				if res.Err != nil {
					b.Fatal(res.Err)
				}
				ttft += res.Usage.TimeToFirstToken
				prompt, cached, n = len(p), cached+res.Usage.CachedTokens, n+1
			}
			b.ReportMetric(float64(ttft.Milliseconds())/float64(n), "ttft-ms")
			b.ReportMetric(float64(prompt), "prompt-tokens")
			b.ReportMetric(float64(cached)/float64(n), "cached-tokens")
		})
	}
}

// benchWideVocab is a model whose cost is its vocabulary: Qwen3's 151,936
// logits per row over a tiny body, to show the host work that grows with
// the batch (reading logit rows back, sampling them).
const benchWideVocab = `{
  "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
  "vocab_size": 151936, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false
}`

// timedModel adds up the wall time spent in Forward.
type timedModel struct {
	model.Model
	fwd   time.Duration
	steps int
}

func (m *timedModel) Unwrap() model.Model { return m.Model }

func (m *timedModel) Forward(b *model.Batch) (*model.Output, error) {
	t := time.Now()
	out, err := m.Model.Forward(b)
	m.fwd += time.Since(t)
	m.steps++
	return out, err
}

// BenchmarkDecodeBatch decodes 8 and 32 sequences at once on the CPU
// backend, greedy and with top-k sampling (both from the rows' best
// entries), and splits a decode step's wall time into Forward (the ops,
// the step inputs, reading the outputs) and the rest (scheduling,
// sampling, posting tokens). (Top-p alone samples whole rows, and random
// weights give nearly uniform rows: a nucleus of most of the vocabulary
// to sort, about 80 ms a row here, which says nothing about real models.)
// Run with
//
//	go test -run '^$' -bench DecodeBatch -benchtime 2x ./engine/runtime
func BenchmarkDecodeBatch(b *testing.B) {
	cfg, err := config.Parse("config.json", []byte(benchWideVocab))
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(0)
	defer be.Close()
	inner, err := model.New(cfg, randweights.New(13, kernels.F32), be)
	if err != nil {
		b.Fatal(err)
	}
	const prompt, gen = 8, 48
	for _, c := range []struct {
		name string
		seqs int
		p    sample.Params
	}{
		{"greedy", 8, greedy}, {"greedy", 32, greedy},
		{"top-k", 32, sample.Params{Temperature: 0.8, TopK: 40, Seed: 1}},
	} {
		seqs := c.seqs
		b.Run(fmt.Sprintf("%s/seqs=%d", c.name, seqs), func(b *testing.B) {
			m := &timedModel{Model: inner}
			r, err := runtime.New(m, runtime.Options{KVBudget: int64(seqs*(prompt+gen+32)) * m.Info().KVBytesPerToken, MaxSeqs: seqs})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			rng := rand.New(rand.NewPCG(5, 6))
			var wall, fwd time.Duration
			steps := 0
			for b.Loop() {
				f0, s0 := m.fwd, m.steps
				start := time.Now()
				streams := make([]*runtime.Stream, seqs)
				for i := range streams {
					if streams[i], err = r.Generate(b.Context(), runtime.Request{Prompt: randPrompt(rng, prompt, m.Info().Vocab), MaxTokens: gen, Sampling: c.p}); err != nil {
						b.Fatal(err)
					}
				}
				for _, s := range streams {
					if res := s.Collect(); res.Err != nil {
						b.Fatal(res.Err)
					}
				}
				wall += time.Since(start)
				fwd += m.fwd - f0
				steps += m.steps - s0
			}
			b.ReportMetric(wall.Seconds()*1e3/float64(steps), "ms/step")
			b.ReportMetric(fwd.Seconds()*1e3/float64(steps), "forward-ms/step")
			b.ReportMetric((wall-fwd).Seconds()*1e3/float64(steps), "host-ms/step")
		})
	}
}
