package ui

import (
	"testing"
	"time"
)

// FuzzUnmarshalChat feeds arbitrary bytes as a saved chat: UnmarshalChat
// returns an error or a chat that exports to Markdown and saves back to
// JSON that loads again. Seeds: a saved chat with every field set.
func FuzzUnmarshalChat(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := &Chat{
		Version: chatFormatVersion, ID: "c1", Created: at, Updated: at,
		Model:    ModelInfo{Name: "ferrite-tiny", Arch: "qwen3", MaxContext: 512},
		System:   "Be brief.",
		Settings: Settings{Temperature: 0.7, TopP: 0.95, TopK: 40, MaxTokens: 64},
		Messages: []*Message{
			{Role: RoleUser, Content: "Hi", Time: at},
			{Role: RoleAssistant, Content: "<think>x</think>Hello!", Time: at, Model: "ferrite-tiny",
				Stats: newReplyStats(Usage{PromptTokens: 3, GeneratedTokens: 2}, FinishStop, "", Settings{MaxTokens: 64})},
			{Role: RoleAssistant, Content: "Hel", Time: at, Error: "engine closed"},
		},
	}
	data, err := MarshalChat(c)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"version": 1, "messages": [{"role": "user", "content": "\u0000\ud800"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := UnmarshalChat(data)
		if err != nil {
			return
		}
		_ = ExportMarkdown(c)
		again, err := MarshalChat(c)
		if err != nil {
			t.Fatalf("loaded chat does not save: %v", err)
		}
		if _, err := UnmarshalChat(again); err != nil {
			t.Fatalf("saved chat does not load again: %v\n%s", err, again)
		}
	})
}
