package ui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/kernels"
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
	// Sampling is what the model's generation_config.json recommends
	// (settings.Config.SamplingFor applies it to a new chat's settings).
	Sampling tokenizer.Sampling `json:"-"`
	// KVLimited says MaxContext is what the KV cache holds (its size is
	// set by the KV budget), less than the model's own context.
	KVLimited bool `json:"kv_limited,omitempty"`
	// Remote says another machine serves the model (RemoteEngine): the
	// chat sees no KV cache.
	Remote bool `json:"remote,omitempty"`
	// Device says what runs the model ("cpu (16 threads)", "cuda:0 NVIDIA
	// H200 (...)"); DeviceNote why --device auto took the CPU.
	Device     string `json:"device,omitempty"`
	DeviceNote string `json:"device_note,omitempty"`
	// DeviceMemory says the model holds a device's own memory (a GPU's),
	// which unloading it gives back: /model loads a model that does not
	// fit beside it once it is unloaded (LoadOptions.KeepDevice).
	DeviceMemory bool `json:"device_memory,omitempty"`
}

// contextLimit names what bounds a request, with its size: the model's
// context, or the KV cache when the KV budget makes it smaller.
func (i ModelInfo) contextLimit() string {
	if i.KVLimited {
		return fmt.Sprintf("the KV cache (%d tokens; kv_budget sets its size)", i.MaxContext)
	}
	return fmt.Sprintf("the model's context (%d tokens)", i.MaxContext)
}

// Request is one reply to generate.
type Request struct {
	// Messages is the conversation, system prompt first when there is one,
	// ending with the user's turn.
	Messages []tokenizer.Message
	Settings Settings
}

// Settings are the sampling settings of a reply, as /set changes them.
// Their names, ranges and defaults are those of internal/settings.Table.
type Settings struct {
	Temperature   float64 `json:"temperature"`    // 0: greedy
	TopP          float64 `json:"top_p"`          // 0 or 1: off
	TopK          int     `json:"top_k"`          // 0: off
	MinP          float64 `json:"min_p"`          // 0: off
	RepeatPenalty float64 `json:"repeat_penalty"` // 1: off
	Seed          uint64  `json:"seed"`           // 0: a fresh seed per reply
	MaxTokens     int     `json:"max_tokens"`     // 0: until the context is full
	// MTP is speculative decoding with the model's MTP module: "on",
	// "off", "auto" (on when the model has one), or "" for the engine's
	// setting (ModelInfo.Draft).
	MTP string `json:"mtp,omitempty"`
	// Draft is the draft tokens per step; 0 is the engine's (ModelInfo.Draft,
	// else settings' default). With MTP "" (chats saved before MTP was its
	// own setting) a negative Draft means off and a positive one on.
	Draft int `json:"draft,omitempty"`
}

// field is the field /set calls name: a pointer of the type of its
// settings.Table row; nil for another name.
func (s *Settings) field(name string) any {
	switch name {
	case "temperature":
		return &s.Temperature
	case "top_p":
		return &s.TopP
	case "top_k":
		return &s.TopK
	case "min_p":
		return &s.MinP
	case "repeat_penalty":
		return &s.RepeatPenalty
	case "seed":
		return &s.Seed
	case "max_tokens":
		return &s.MaxTokens
	case "mtp":
		return &s.MTP
	case "draft":
		return &s.Draft
	}
	return nil
}

// get is the value of the field /set calls name.
func (s *Settings) get(name string) any {
	switch p := s.field(name).(type) {
	case *float64:
		return *p
	case *int:
		return *p
	case *uint64:
		return *p
	case *string:
		return *p
	}
	return nil
}

// set stores v, of the field's type, into the field /set calls name.
func (s *Settings) set(name string, v any) {
	switch p := s.field(name).(type) {
	case *float64:
		*p = v.(float64)
	case *int:
		*p = v.(int)
	case *uint64:
		*p = v.(uint64)
	case *string:
		*p = v.(string)
	}
}

// mtpMode is MTP, or for "" the mode the engine's setting amounts to.
func (s Settings) mtpMode(info ModelInfo) string {
	switch {
	case s.MTP != "":
		return s.MTP
	case s.Draft < 0:
		return "off"
	case s.Draft > 0 || info.Draft > 0:
		return "on"
	}
	return "off"
}

// effectiveDraft is the draft length a reply with s gets from a model
// with info: 0 when it does not speculate.
func (s Settings) effectiveDraft(info ModelInfo) int {
	if !info.MTP || s.mtpMode(info) == "off" {
		return 0
	}
	return cmp.Or(max(s.Draft, 0), info.Draft, defaultDraft)
}

// DefaultSettings are the settings a chat starts with unless
// Options.Settings says otherwise: settings.Table's defaults, with the
// engine's MTP setting.
func DefaultSettings() Settings { return SettingsOf(settings.Default().Sampling) }

// SettingsOf are a chat's settings under the configuration's sampling
// settings, with the engine's MTP setting.
func SettingsOf(s settings.Sampling) Settings {
	return Settings{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP,
		RepeatPenalty: s.RepeatPenalty, Seed: s.Seed, MaxTokens: s.MaxTokens}
}

// SamplingNote says which of temperature, top_p and top_k the model's
// recommendation set in place of before (before → after); "" when none.
func SamplingNote(model string, before, after Settings) string {
	var set []string
	if after.Temperature != before.Temperature {
		t := fmt.Sprintf("temperature %g", after.Temperature)
		if after.Temperature == 0 {
			t += " (greedy decoding)"
		}
		set = append(set, t)
	}
	if after.TopP != before.TopP {
		set = append(set, fmt.Sprintf("top_p %g", after.TopP))
	}
	if after.TopK != before.TopK {
		set = append(set, fmt.Sprintf("top_k %d", after.TopK))
	}
	if len(set) == 0 {
		return ""
	}
	return fmt.Sprintf("Sampling as %s recommends: %s. /set changes it; the configuration file and the flags win.", model, strings.Join(set, ", "))
}

// followRecommendation moves s's temperature, top_p and top_k that still
// have the values before (what the previous model's recommendation gave)
// to after's (what the new model's gives); a value /set changed stays.
// It reports whether any moved.
func (s *Settings) followRecommendation(before, after Settings) bool {
	moved := false
	if s.Temperature == before.Temperature && after.Temperature != before.Temperature {
		s.Temperature, moved = after.Temperature, true
	}
	if s.TopP == before.TopP && after.TopP != before.TopP {
		s.TopP, moved = after.TopP, true
	}
	if s.TopK == before.TopK && after.TopK != before.TopK {
		s.TopK, moved = after.TopK, true
	}
	return moved
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

// Limits that end a reply with FinishLength (Event.Limit).
const (
	LimitMaxTokens = "max_tokens" // the max_tokens setting
	LimitContext   = "context"    // the model's context is full
	LimitKVCache   = "kv_cache"   // the KV cache, smaller than the model's context, is full
)

// Event is one message of a Reply.
type Event struct {
	Kind   EventKind
	Text   string // EventDelta: new text (valid UTF-8)
	Finish string // EventDone: one of the Finish constants
	Limit  string // EventDone with FinishLength: one of the Limit constants; "" when unknown
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
	// KVBytesPerToken is the cache memory one token takes across all
	// layers (half for a BF16 cache); 0 when unknown.
	KVBytesPerToken int64
	Running         int // sequences generating
	Waiting         int // requests queued for admission

	RecurrentBytes int64 // recurrent state held (models with linear-attention layers)

	// Memory is what the model holds in its backend's memory: a GPU's
	// device memory (OnDevice), or host RAM; zero when unknown (a remote
	// engine).
	Memory kernels.MemoryUse

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
	Load(ctx context.Context, e ModelEntry, opts LoadOptions, progress func(stage string)) (Engine, io.Closer, error)
}

// LoadOptions control Models.Load.
type LoadOptions struct {
	// KeepDevice says the chat's model holds a device's memory, which it
	// can give back: a model that does not fit the device's free memory
	// beside it then fails with an error wrapping ErrNoRoom instead of
	// running elsewhere (the CPU), and the chat unloads its model and
	// loads again without KeepDevice.
	KeepDevice bool
}

// ErrNoRoom is what Models.Load's error wraps for a model that does not
// fit the device's free memory (LoadOptions.KeepDevice); the rest of the
// message says by how much.
var ErrNoRoom = errors.New("no room on the device")

// ModelEntry is one model Models knows.
type ModelEntry struct {
	Name    string // what /model takes
	Arch    string // the architecture (config.json's model_type); "" when unknown
	Quant   string // a GGUF file's quantization ("Q4_K_M"); "" for other models
	Source  string // where it was found: "built-in", "config", "hf-cache", "ferrite", "ollama", "lm-studio", "path"
	Path    string // its directory; "" for a built-in model
	Size    int64  // bytes on disk; 0 when unknown
	Problem string // why it may not load; "" when it looks fine
}

// ContextError says a prompt does not fit the model's context.
type ContextError struct {
	PromptTokens int  // the prompt's length
	Limit        int  // the most tokens a request may hold
	KV           bool // Limit is the KV cache's size (set by the KV budget), not the model's context
}

func (e *ContextError) Error() string {
	if e.KV {
		return fmt.Sprintf("the prompt is %d tokens and the KV cache holds %d (raise kv_budget / --kv-budget)", e.PromptTokens, e.Limit)
	}
	return fmt.Sprintf("the prompt is %d tokens and the model's context holds %d", e.PromptTokens, e.Limit)
}
