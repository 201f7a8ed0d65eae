package ui

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charmbracelet/x/exp/teatest"

	"github.com/ferrite-llm/ferrite/engine/config"
	enginemodel "github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/qwen3"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/runtime"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/strict"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// tinyQwen3 is a random-weight Qwen3 with the real Qwen3 vocabulary, so
// that the tokenizer's ids fit, and a 64-token context.
const tinyQwen3 = `{
  "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
  "vocab_size": 151936, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000, "tie_word_embeddings": true, "attention_bias": false
}`

// The tiny runtime is built once and shared: loading the Qwen3 tokenizer
// takes a couple of seconds. Tests use it one after another.
var (
	tinyOnce sync.Once
	tinyEng  *RuntimeEngine
	tinyTok  *tokenizer.Tokenizer
	tinyM    enginemodel.Model
	tinyErr  error
)

// newTinyRuntimeEngine is the real adapter over a real runtime serving a
// tiny random model, with the Qwen3 tokenizer and chat template.
func newTinyRuntimeEngine(t *testing.T) (*RuntimeEngine, *tokenizer.Tokenizer) {
	t.Helper()
	tinyOnce.Do(func() {
		tok, err := tokenizer.Load("../tokenizer/testdata/qwen3")
		if err != nil {
			tinyErr = err
			return
		}
		cfg, err := config.Parse("config.json", []byte(tinyQwen3))
		if err != nil {
			tinyErr = err
			return
		}
		dev := strict.New()
		m, err := enginemodel.New(cfg, randweights.New(7, kernels.F32), dev)
		if err != nil {
			tinyErr = err
			return
		}
		rt, err := runtime.New(m, runtime.Options{
			KVBudget:     256 * m.Info().KVBytesPerToken,
			BlockSize:    16,
			NewDecoder:   func() runtime.TextDecoder { return tok.NewStreamDecoder() },
			DeviceMemory: dev.MemoryUse, // asked on the runtime's goroutine, as Forward is
		})
		if err != nil {
			tinyErr = err
			return
		}
		tinyEng, tinyTok, tinyM = NewRuntimeEngine(rt, tok, ModelInfo{Name: "tiny", Arch: "qwen3"}), tok, m
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyEng, tinyTok
}

func TestRuntimeEngineStreams(t *testing.T) {
	eng, tok := newTinyRuntimeEngine(t)
	if got := eng.Info().MaxContext; got != 64 {
		t.Errorf("MaxContext = %d, want 64 (the model's context)", got)
	}
	if st := eng.Stats(); st.KVBlocksTotal != 16 || st.KVBytesTotal == 0 || st.KVBytesPerToken != st.KVBytesTotal/(16*16) ||
		st.Memory.Tensors < st.KVBytesTotal {
		t.Errorf("stats = %+v", st)
	}
	req := Request{
		Messages: (&Chat{System: "Be brief.", Messages: []*Message{{Role: RoleUser, Content: "Hi"}}}).promptMessages(),
		Settings: Settings{Temperature: 0, MaxTokens: 6},
	}
	text, err := tok.ApplyChatTemplate(req.Messages, tokenizer.TemplateOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := len(tok.Encode(text, false))

	r, err := eng.Send(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r.PromptTokens() != wantPrompt {
		t.Errorf("PromptTokens() = %d, want %d", r.PromptTokens(), wantPrompt)
	}
	var final Event
	deltas := 0
	for {
		ev, ok := r.Next()
		if !ok {
			break
		}
		switch ev.Kind {
		case EventDelta:
			deltas++
		default:
			final = ev
		}
	}
	if final.Kind != EventDone || (final.Finish != FinishLength && final.Finish != FinishStop) {
		t.Fatalf("final event = %+v", final)
	}
	if final.Usage.PromptTokens != wantPrompt || final.Usage.GeneratedTokens == 0 || final.Usage.TimeToFirstToken <= 0 {
		t.Errorf("usage = %+v", final.Usage)
	}
}

func TestRuntimeEngineContextError(t *testing.T) {
	eng, _ := newTinyRuntimeEngine(t)
	req := Request{
		Messages: (&Chat{Messages: []*Message{{Role: RoleUser, Content: strings.Repeat("many words here ", 40)}}}).promptMessages(),
	}
	_, err := eng.Send(context.Background(), req)
	var ce *ContextError
	if !errors.As(err, &ce) || ce.Limit != 64 || ce.PromptTokens <= 64 {
		t.Fatalf("err = %v", err)
	}
}

func TestRuntimeEngineCancel(t *testing.T) {
	eng, _ := newTinyRuntimeEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := eng.Send(ctx, Request{
		Messages: (&Chat{Messages: []*Message{{Role: RoleUser, Content: "Hi"}}}).promptMessages(),
		Settings: Settings{MaxTokens: 30},
	})
	if err != nil {
		t.Fatal(err)
	}
	var final Event
	for {
		ev, ok := r.Next()
		if !ok {
			break
		}
		final = ev
	}
	if final.Kind != EventDone || final.Finish != FinishCancelled {
		t.Errorf("final event = %+v", final)
	}
}

// TestChatOnRuntime runs the whole chat on the real runtime.
func TestChatOnRuntime(t *testing.T) {
	eng, _ := newTinyRuntimeEngine(t)
	opts := testOptions(t)
	opts.Settings = &Settings{Temperature: 0, MaxTokens: 3}
	m := newModel(eng, opts)
	tm := teatest.NewTestModel(t, probeModel{m}, teatest.WithInitialTermSize(80, 24))
	h := &harness{t: t, tm: tm, timeout: 60 * time.Second} // slow under -race
	t.Cleanup(func() {
		_ = tm.Quit()
		tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
	})
	h.line("Hello")
	h.settle()
	h.line("Again")
	h.settle()
	fm := h.final()
	if n := len(fm.chat.Messages); n != 4 {
		t.Fatalf("%d messages", n)
	}
	for _, msg := range []*Message{fm.chat.Messages[1], fm.chat.Messages[3]} {
		if msg.Stats == nil || msg.Stats.PromptTokens == 0 || msg.Error != "" {
			t.Errorf("reply = %+v", msg)
		}
	}
	if fm.chat.Messages[3].Stats.PromptTokens <= fm.chat.Messages[1].Stats.PromptTokens {
		t.Error("the second prompt is not longer than the first: the conversation was not sent")
	}
}

// finalEvent reads r to its end and returns its last event.
func finalEvent(r Reply) Event {
	var final Event
	for {
		ev, ok := r.Next()
		if !ok {
			return final
		}
		final = ev
	}
}

// TestRuntimeEngineNamesTheLimit: a reply cut by max_tokens, or by a KV
// cache smaller than the model's context, says which; so does the engine's
// info and a prompt that does not fit.
func TestRuntimeEngineNamesTheLimit(t *testing.T) {
	eng, tok := newTinyRuntimeEngine(t)
	hi := (&Chat{Messages: []*Message{{Role: RoleUser, Content: "Hi"}}}).promptMessages()
	r, err := eng.Send(context.Background(), Request{Messages: hi, Settings: Settings{MaxTokens: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if ev := finalEvent(r); ev.Finish == FinishLength && ev.Limit != LimitMaxTokens || eng.Info().KVLimited {
		t.Errorf("max_tokens: final %+v, info %+v", ev, eng.Info())
	}

	// 32 tokens of cache, under the model's 64.
	rt, err := runtime.New(tinyM, runtime.Options{
		KVBudget:   32 * tinyM.Info().KVBytesPerToken,
		BlockSize:  16,
		NewDecoder: func() runtime.TextDecoder { return tok.NewStreamDecoder() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	small := NewRuntimeEngine(rt, tok, ModelInfo{Name: "tiny"})
	if info := small.Info(); info.MaxContext != 32 || !info.KVLimited {
		t.Errorf("info = %+v, want MaxContext 32 set by the KV cache", info)
	}
	r, err = small.Send(context.Background(), Request{Messages: hi, Settings: Settings{Temperature: 0}}) // greedy: deterministic
	if err != nil {
		t.Fatal(err)
	}
	if ev := finalEvent(r); ev.Finish != FinishLength || ev.Limit != LimitKVCache {
		t.Errorf("final event %+v, want length (kv_cache)", ev)
	}
	long := (&Chat{Messages: []*Message{{Role: RoleUser, Content: strings.Repeat("many words here ", 10)}}}).promptMessages()
	_, err = small.Send(context.Background(), Request{Messages: long})
	var ce *ContextError
	if !errors.As(err, &ce) || !ce.KV || !strings.Contains(err.Error(), "the KV cache holds 32") {
		t.Errorf("err = %v, want a ContextError naming the KV cache", err)
	}
}
