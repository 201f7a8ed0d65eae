package ui

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ferrite-llm/ferrite/tokenizer"
)

// Engine is what the chat needs from an inference engine. NewRuntimeEngine
// implements it on engine/runtime; tests use a scripted fake.
type Engine interface {
	// Info describes the loaded model. It does not change.
	Info() ModelInfo
	// Send starts a reply to the conversation and returns its stream. It
	// may render and tokenize the prompt but must not wait for generation.
	// A prompt that cannot fit the model's context gives a *ContextError.
	// Cancelling ctx ends the reply (its final event is Done).
	Send(ctx context.Context, req Request) (Reply, error)
	// Stats is a cheap snapshot of the engine's load, safe from any
	// goroutine.
	Stats() Stats
}

// ModelInfo describes the model the chat talks to.
type ModelInfo struct {
	Name       string `json:"name"`                  // shown in the status bar, e.g. "Qwen3-0.6B"
	Arch       string `json:"arch,omitempty"`        // architecture, e.g. "qwen3"
	MaxContext int    `json:"max_context,omitempty"` // most tokens (prompt + reply) one request may hold; 0: unknown
	MTP        bool   `json:"mtp,omitempty"`         // the model has an MTP module (speculative decoding)
	Draft      int    `json:"draft,omitempty"`       // the engine's draft tokens per step when Settings.Draft is 0; 0: off
	Device     string `json:"device,omitempty"`      // what runs the model, e.g. "cpu (16 threads)", "cuda:0 NVIDIA H200 (...)"
	DeviceNote string `json:"device_note,omitempty"` // why --device auto took the CPU, e.g. "no GPU: ..."
}

// Request is one reply to generate.
type Request struct {
	// Messages is the conversation, system prompt first when there is one,
	// ending with the user's turn.
	Messages []tokenizer.Message
	Settings Settings
}

// Settings are the sampling settings of a reply, as /set changes them.
type Settings struct {
	Temperature   float64 `json:"temperature"`    // 0: greedy
	TopP          float64 `json:"top_p"`          // 0 or 1: off
	TopK          int     `json:"top_k"`          // 0: off
	MinP          float64 `json:"min_p"`          // 0: off
	RepeatPenalty float64 `json:"repeat_penalty"` // 1: off
	Seed          uint64  `json:"seed"`           // 0: a fresh seed per reply
	MaxTokens     int     `json:"max_tokens"`     // 0: until the context is full
	// Draft is speculative decoding with the model's MTP module: 0 is the
	// engine's default (ModelInfo.Draft), > 0 drafts that many tokens per
	// step, < 0 turns it off.
	Draft int `json:"draft,omitempty"`
}

// effectiveDraft is the draft length a reply with s gets from a model
// with info: 0 when it does not speculate.
func (s Settings) effectiveDraft(info ModelInfo) int {
	switch {
	case !info.MTP || s.Draft < 0:
		return 0
	case s.Draft > 0:
		return s.Draft
	}
	return info.Draft
}

// DefaultSettings are the settings a chat starts with unless
// Options.Settings says otherwise (the same defaults as `ferrite run`).
func DefaultSettings() Settings {
	return Settings{Temperature: 0.7, TopP: 0.95, TopK: 40, MinP: 0.05, RepeatPenalty: 1, MaxTokens: 2048}
}

// Reply is the consumer side of one generation.
type Reply interface {
	// Next blocks until an event is available. After the final event
	// (EventDone or EventError) it returns ok == false.
	Next() (ev Event, ok bool)
	// Cancel ends the generation; the final event is EventDone with
	// FinishCancelled. Safe from any goroutine, more than once.
	Cancel()
	// PromptTokens is the length of the prompt in tokens.
	PromptTokens() int
}

// EventKind says what an Event carries.
type EventKind uint8

// The kinds of Event.
const (
	EventDelta EventKind = iota // new text
	EventDone                   // final: ended normally or was cancelled
	EventError                  // final: failed
)

// Finish reasons of EventDone.
const (
	FinishStop      = "stop"      // the model ended its turn
	FinishLength    = "length"    // max_tokens or the context was reached
	FinishCancelled = "cancelled" // stopped by the user
)

// Event is one message of a Reply.
type Event struct {
	Kind   EventKind
	Text   string // EventDelta: new text (valid UTF-8)
	Finish string // EventDone: one of the Finish constants
	Usage  Usage  // counts and timing as of this event
	Err    error  // EventError: the cause
}

// Usage is one reply's accounting.
type Usage struct {
	PromptTokens       int
	CachedTokens       int
	GeneratedTokens    int
	TimeToFirstToken   time.Duration
	Total              time.Duration
	PromptTokensPerSec float64
	DecodeTokensPerSec float64
	Seed               uint64 // the seed the sampler used

	// Speculative decoding (zero without it).
	VerifySteps     int     // steps that verified drafts
	DraftTokens     int     // draft tokens verified
	AcceptedTokens  int     // draft tokens accepted
	AcceptedPerStep float64 // AcceptedTokens / VerifySteps (each step also emits one token of its own)
}

// Stats is an engine-wide snapshot for the status bar.
type Stats struct {
	KVBlocksUsed  int
	KVBlocksTotal int
	KVBytesUsed   int64
	KVBytesTotal  int64
	Running       int // sequences generating
	Waiting       int // requests queued for admission

	RecurrentBytes int64 // recurrent state held (models with linear-attention layers)

	// Speculative decoding since the engine started (zero without it).
	DraftTokens     uint64
	AcceptedTokens  uint64
	AcceptRate      float64 // AcceptedTokens / DraftTokens
	AcceptedPerStep float64 // accepted drafts per verify step
}

// Models is where /models and /model find other models and load them.
// The command line implements it on internal/catalog and the real engine;
// tests use a fake.
type Models interface {
	// List returns the models /models shows, in that order. It may read
	// the disk; it runs in a command.
	List(ctx context.Context) ([]ModelEntry, error)
	// Find resolves what the user typed after /model: a name List gives,
	// its number in the list, or a model directory.
	Find(ctx context.Context, name string) (ModelEntry, error)
	// Load loads a model and starts an engine on it. progress reports
	// stages ("mapping the weights") for the status bar; it may be called
	// from any goroutine, but not after Load returns. Load gives up with
	// ctx's error when ctx is cancelled. The Closer releases the engine
	// and the model; the chat calls it once no reply uses the engine.
	Load(ctx context.Context, e ModelEntry, progress func(stage string)) (Engine, io.Closer, error)
}

// ModelEntry is one model Models knows.
type ModelEntry struct {
	Name    string // what /model takes
	Arch    string // the architecture (config.json's model_type); "" when unknown
	Source  string // where it was found: "built-in", "config", "hf-cache", "ferrite", "path"
	Path    string // its directory; "" for a built-in model
	Size    int64  // bytes on disk; 0 when unknown
	Problem string // why it may not load; "" when it looks fine
}

// ContextError says a prompt does not fit the model's context.
type ContextError struct {
	PromptTokens int // the prompt's length
	Limit        int // the most tokens a request may hold
}

func (e *ContextError) Error() string {
	return fmt.Sprintf("the prompt is %d tokens and the context holds %d", e.PromptTokens, e.Limit)
}
