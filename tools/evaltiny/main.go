// Command evaltiny answers ferrite-tiny's evaluation questions with ferrite
// itself: greedy decoding on the CPU, one chat turn per question, up to 56
// new tokens, as tools/train/train.py's evaluate does with PyTorch. It reads
// the items (kind, word, question) of an eval_results.json that train.py
// wrote and writes the same list with ferrite's answers; the scores come
// from tools/train/score.py, which applies train.py's own scoring functions.
//
//	go run ./tools/evaltiny -out /tmp/q8.json                 # the built-in model
//	go run ./tools/evaltiny -model /tmp/ft/model -quant q8_0 -out /tmp/q8.json
//	python3 tools/train/score.py /tmp/q8.json
//
// -model is "builtin" (the model embedded in this build) or a model
// directory or GGUF file (a training run's bf16 checkpoint); -quant
// quantizes its matrices on load as ferrite's --quant does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/engine/sample"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// item is one evaluation question, and ferrite's answer once asked. Gold
// (synonym items) passes through for the scorer; define items get their
// gold glosses from WordNet there.
type item struct {
	Kind     string   `json:"kind"`
	Word     *string  `json:"word"`
	Question string   `json:"question"`
	Gold     []string `json:"gold,omitempty"`
	Answer   string   `json:"answer"`
	Ended    bool     `json:"ended"`
	Tokens   int      `json:"tokens"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "evaltiny:", err)
		os.Exit(1)
	}
}

func run() error {
	items := flag.String("items", "tools/train/results/eval_results.json", "train.py's eval_results.json (questions)")
	modelPath := flag.String("model", "builtin", `"builtin" or a model directory or GGUF file`)
	quant := flag.String("quant", "", "quantize the matrices on load (q8_0, q4_k)")
	out := flag.String("out", "", "where to write the answers (JSON)")
	threads := flag.Int("threads", 0, "CPU threads (0: one per CPU)")
	maxNew := flag.Int("max-new", 56, "most new tokens per answer, the stop token included (train.py --max-new)")
	flag.Parse()
	if *out == "" {
		return errors.New("-out is required")
	}
	qs, err := readItems(*items)
	if err != nil {
		return err
	}
	l, tok, err := open(*modelPath, engine.Options{Threads: *threads, Quant: *quant})
	if err != nil {
		return err
	}
	defer l.Close()
	t0 := time.Now()
	if err := answer(l, tok, qs, *maxNew); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "evaltiny: %d answers in %.1fs (%s%s)\n", len(qs), time.Since(t0).Seconds(), l.Dir, quantNote(*quant))
	data, err := json.MarshalIndent(qs, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}

func quantNote(q string) string {
	if q == "" {
		return ""
	}
	return ", quantized to " + q
}

func readItems(path string) ([]item, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var qs []item
	if err := json.Unmarshal(data, &qs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no items", path)
	}
	for i := range qs {
		qs[i].Answer, qs[i].Ended, qs[i].Tokens = "", false, 0
	}
	return qs, nil
}

func open(path string, opts engine.Options) (*engine.Loaded, *tokenizer.Tokenizer, error) {
	if builtin.IsName(path) {
		return builtin.Open(opts)
	}
	l, err := engine.Load(path, opts)
	if err != nil {
		return nil, nil, err
	}
	tok, err := engine.LoadTokenizer(path)
	if err != nil {
		l.Close()
		return nil, nil, err
	}
	return l, tok, nil
}

// answer decodes every question greedily, all submitted at once so that
// the runtime batches them; prefix reuse is off so that each answer is
// computed from its own prompt alone.
func answer(l *engine.Loaded, tok *tokenizer.Tokenizer, qs []item, maxNew int) error {
	rt, err := runtime.New(l.Model, runtime.Options{KVBudget: 64 << 20, PrefixCache: -1})
	if err != nil {
		return err
	}
	defer rt.Close()
	ctx := context.Background()
	streams := make([]*runtime.Stream, len(qs))
	for i, q := range qs {
		text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: q.Question}},
			tokenizer.TemplateOptions{AddGenerationPrompt: true})
		if err != nil {
			return err
		}
		// max-new counts the stop token, which the runtime does not emit:
		// an answer of maxNew-1 tokens may still end with it.
		req := runtime.Request{Prompt: tok.Encode(text, false), MaxTokens: maxNew, Sampling: sample.Params{}, Stop: tok.EOS()}
		if streams[i], err = rt.Generate(ctx, req); err != nil {
			return fmt.Errorf("%q: %w", q.Question, err)
		}
	}
	for i, st := range streams {
		r := st.Collect()
		if r.Err != nil {
			return fmt.Errorf("%q: %w", qs[i].Question, r.Err)
		}
		qs[i].Answer = tok.Decode(r.Tokens, true)
		qs[i].Ended = r.Finish == runtime.FinishStop
		qs[i].Tokens = len(r.Tokens)
	}
	return nil
}
