package ui

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// chatFormatVersion is the Version of the JSON a chat is saved as.
const chatFormatVersion = 1

// Role is who wrote a message.
type Role string

// The roles of a conversation.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Chat is one conversation as it is saved, exported as JSON and loaded
// again: everything needed to continue it or to reproduce its replies.
type Chat struct {
	Version  int        `json:"version"`
	ID       string     `json:"id"`
	Created  time.Time  `json:"created"`
	Updated  time.Time  `json:"updated"`
	Model    ModelInfo  `json:"model"`
	System   string     `json:"system,omitempty"`
	Settings Settings   `json:"settings"` // the settings the next reply will use
	Messages []*Message `json:"messages"`
	// SystemChanges are the system prompts the chat had, when /system
	// changed it after the first message: the first is the one it started
	// with, and System is the last.
	SystemChanges []SystemChange `json:"system_changes,omitempty"`
}

// SystemChange is a system prompt set in the middle of a chat.
type SystemChange struct {
	Before int       `json:"before"` // the index in Messages of the first message it applies to
	Time   time.Time `json:"time"`
	Prompt string    `json:"prompt"` // "": the prompt was cleared
}

// setSystem makes s the system prompt from the next message on, and
// records the change when the chat already has messages.
func (c *Chat) setSystem(s string, now time.Time) {
	if n := len(c.Messages); n > 0 && s != c.System {
		if len(c.SystemChanges) == 0 {
			c.SystemChanges = []SystemChange{{Before: 0, Time: c.Created, Prompt: c.System}}
		}
		if last := &c.SystemChanges[len(c.SystemChanges)-1]; last.Before == n {
			last.Prompt, last.Time = s, now // changed again before any message
		} else {
			c.SystemChanges = append(c.SystemChanges, SystemChange{Before: n, Time: now, Prompt: s})
		}
	}
	c.System = s
}

// Message is one turn of a Chat.
type Message struct {
	Role Role `json:"role"`
	// Content is the text as typed or generated; an assistant's may hold a
	// <think>…</think> block (see Thinking and Answer).
	Content string      `json:"content"`
	Time    time.Time   `json:"time"`
	Model   string      `json:"model,omitempty"` // the model that wrote an assistant reply
	Stats   *ReplyStats `json:"stats,omitempty"` // assistant replies
	Error   string      `json:"error,omitempty"` // the engine error that ended the reply
}

// ReplyStats is what an assistant reply cost, and the settings it was
// sampled with.
type ReplyStats struct {
	PromptTokens       int      `json:"prompt_tokens"`
	CachedTokens       int      `json:"cached_tokens,omitempty"`
	GeneratedTokens    int      `json:"generated_tokens"`
	TTFTMillis         float64  `json:"ttft_ms"`
	TotalMillis        float64  `json:"total_ms"`
	PromptTokensPerSec float64  `json:"prompt_tokens_per_sec"`
	DecodeTokensPerSec float64  `json:"decode_tokens_per_sec"`
	DraftTokens        int      `json:"draft_tokens,omitempty"`    // speculative decoding: drafts verified
	AcceptedTokens     int      `json:"accepted_tokens,omitempty"` // and accepted
	AcceptedPerStep    float64  `json:"accepted_per_step,omitempty"`
	Finish             string   `json:"finish,omitempty"`
	Limit              string   `json:"limit,omitempty"` // with finish "length": the limit reached (Limit constants)
	Seed               uint64   `json:"seed"`
	Settings           Settings `json:"settings"`
}

func newReplyStats(u Usage, finish, limit string, s Settings) *ReplyStats {
	return &ReplyStats{
		PromptTokens:       u.PromptTokens,
		CachedTokens:       u.CachedTokens,
		GeneratedTokens:    u.GeneratedTokens,
		TTFTMillis:         float64(u.TimeToFirstToken.Microseconds()) / 1000,
		TotalMillis:        float64(u.Total.Microseconds()) / 1000,
		PromptTokensPerSec: u.PromptTokensPerSec,
		DecodeTokensPerSec: u.DecodeTokensPerSec,
		DraftTokens:        u.DraftTokens,
		AcceptedTokens:     u.AcceptedTokens,
		AcceptedPerStep:    u.AcceptedPerStep,
		Finish:             finish,
		Limit:              limit,
		Seed:               u.Seed,
		Settings:           s,
	}
}

// Thinking is the reasoning of an assistant message (the <think> block),
// and whether the block is still open.
func (m *Message) Thinking() (think string, open bool) {
	think, _, open = splitThink(m.Content)
	return think, open
}

// Answer is the message without its <think> block.
func (m *Message) Answer() string {
	_, answer, _ := splitThink(m.Content)
	return answer
}

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

// splitThink splits a reply into its leading <think> block and the answer.
// A reply that has a closing tag and no opening one was started inside the
// block (templates that put <think> in the generation prompt). While the
// block is open, open is true and answer is empty. A reply that so far is
// only the start of "<think>" counts as an open, empty block, so the tag
// does not flash on screen while it streams in.
func splitThink(s string) (think, answer string, open bool) {
	trimmed := strings.TrimLeft(s, " \t\r\n")
	if rest, ok := strings.CutPrefix(trimmed, thinkOpen); ok {
		think, answer, closed := strings.Cut(rest, thinkClose)
		if !closed {
			return strings.TrimSpace(rest), "", true
		}
		return strings.TrimSpace(think), strings.TrimLeft(answer, " \t\r\n"), false
	}
	if trimmed != "" && strings.HasPrefix(thinkOpen, trimmed) {
		return "", "", true
	}
	if before, after, ok := strings.Cut(s, thinkClose); ok && !strings.Contains(before, thinkOpen) {
		return strings.TrimSpace(before), strings.TrimLeft(after, " \t\r\n"), false
	}
	return "", s, false
}

// promptMessages is the conversation as the model sees it: the system
// prompt, then every user turn and every assistant reply that has text, its
// reasoning passed apart as ReasoningContent (templates drop or keep it).
func (c *Chat) promptMessages() []tokenizer.Message {
	var out []tokenizer.Message
	if c.System != "" {
		out = append(out, tokenizer.Message{Role: string(RoleSystem), Content: c.System})
	}
	for _, m := range c.Messages {
		switch m.Role {
		case RoleUser:
			out = append(out, tokenizer.Message{Role: string(RoleUser), Content: m.Content})
		case RoleAssistant:
			think, answer, _ := splitThink(m.Content)
			if answer == "" && think == "" {
				continue // failed or stopped before any text
			}
			out = append(out, tokenizer.Message{Role: string(RoleAssistant), Content: answer, ReasoningContent: think})
		}
	}
	return out
}

// clone is a deep copy, for handing to a command that saves it.
func (c *Chat) clone() *Chat {
	d := *c
	d.Messages = make([]*Message, len(c.Messages))
	for i, m := range c.Messages {
		mc := *m
		if m.Stats != nil {
			st := *m.Stats
			mc.Stats = &st
		}
		d.Messages[i] = &mc
	}
	d.SystemChanges = slices.Clone(c.SystemChanges)
	return &d
}

// lastReply is the last assistant message, or nil.
func (c *Chat) lastReply() *Message {
	for i := len(c.Messages) - 1; i >= 0; i-- {
		if c.Messages[i].Role == RoleAssistant {
			return c.Messages[i]
		}
	}
	return nil
}

// MarshalChat is the chat's JSON, indented; UnmarshalChat reads it back.
func MarshalChat(c *Chat) ([]byte, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// UnmarshalChat parses a chat saved by MarshalChat.
func UnmarshalChat(data []byte) (*Chat, error) {
	var c Chat
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("not a ferrite chat: %w", err)
	}
	switch {
	case c.Version == 0:
		return nil, errors.New("not a ferrite chat: no version")
	case c.Version > chatFormatVersion:
		return nil, fmt.Errorf("chat format version %d is newer than this ferrite's (%d)", c.Version, chatFormatVersion)
	}
	for i, m := range c.Messages {
		if m == nil {
			return nil, fmt.Errorf("message %d is null", i)
		}
		switch m.Role {
		case RoleUser, RoleAssistant:
		default:
			return nil, fmt.Errorf("message %d has role %q", i, m.Role)
		}
	}
	// A change recorded after a message that was then taken back (a send
	// that failed) may point past the end: keep every change in order and
	// within the messages.
	lo := 0
	for i := range c.SystemChanges {
		sc := &c.SystemChanges[i]
		sc.Before = min(max(sc.Before, lo), len(c.Messages))
		lo = sc.Before
	}
	return &c, nil
}

// ExportMarkdown renders the chat as a Markdown document: the model and
// settings, then every turn with its role and time, each reply followed by
// its statistics. Reasoning goes in a collapsed <details> block. A system
// prompt changed mid-chat is shown where it was set.
func ExportMarkdown(c *Chat) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Chat %s\n\n", c.ID)
	model := c.Model.Name
	if c.Model.Arch != "" {
		model += " (" + c.Model.Arch + ")"
	}
	fmt.Fprintf(&b, "- Model: %s\n", model)
	if c.Model.MaxContext > 0 {
		fmt.Fprintf(&b, "- Context: %d tokens\n", c.Model.MaxContext)
	}
	fmt.Fprintf(&b, "- Started: %s\n", c.Created.Format(time.RFC3339))
	fmt.Fprintf(&b, "- Sampling: %s\n", formatSettings(c.Settings))
	if len(c.SystemChanges) == 0 && c.System != "" {
		fmt.Fprintf(&b, "\n## System\n\n%s\n", c.System)
	}
	// systemUpTo writes the prompts that apply from message i on; the
	// first one is the prompt the chat started with.
	next := 0
	systemUpTo := func(i int) {
		for ; next < len(c.SystemChanges) && c.SystemChanges[next].Before <= i; next++ {
			sc := c.SystemChanges[next]
			switch {
			case next == 0:
				if sc.Prompt != "" {
					fmt.Fprintf(&b, "\n## System\n\n%s\n", sc.Prompt)
				}
			case sc.Prompt == "":
				fmt.Fprintf(&b, "\n## System · %s\n\n_(the system prompt was cleared)_\n", sc.Time.Format(time.RFC3339))
			default:
				fmt.Fprintf(&b, "\n## System · %s\n\n%s\n", sc.Time.Format(time.RFC3339), sc.Prompt)
			}
		}
	}
	for i, m := range c.Messages {
		systemUpTo(i)
		role := "User"
		if m.Role == RoleAssistant {
			role = "Assistant"
		}
		fmt.Fprintf(&b, "\n## %s · %s", role, m.Time.Format(time.RFC3339))
		if m.Role == RoleAssistant && m.Model != "" && m.Model != c.Model.Name {
			fmt.Fprintf(&b, " · %s", m.Model)
		}
		b.WriteString("\n\n")
		if m.Role == RoleUser {
			b.WriteString(m.Content)
			b.WriteString("\n")
			continue
		}
		think, answer, _ := splitThink(m.Content)
		if think != "" {
			fmt.Fprintf(&b, "<details><summary>Thinking</summary>\n\n%s\n\n</details>\n\n", think)
		}
		if answer != "" {
			b.WriteString(answer)
			b.WriteString("\n")
		}
		if m.Error != "" {
			fmt.Fprintf(&b, "\n> Error: %s\n", m.Error)
		}
		if m.Stats != nil {
			fmt.Fprintf(&b, "\n> %s · %s\n", formatReplyStats(m.Stats), formatSettings(m.Stats.Settings))
		}
	}
	systemUpTo(math.MaxInt) // set after the last message
	return b.String()
}

// formatSettings is the one-line form of s that /set, /stats and exports
// show: each /set name of settings.Table with its value (the seed 0 as
// random; MTP and draft only when the chat sets them).
func formatSettings(s Settings) string {
	var parts []string
	for _, name := range setNames() {
		v := s.get(name)
		text := settings.ByChat(name).Format(v)
		switch {
		case name == "seed" && s.Seed == 0:
			text = "random"
		case name == "mtp" && s.MTP == "" && s.Draft == 0, name == "draft" && s.Draft <= 0:
			continue // the engine's setting
		case name == "mtp" && s.MTP == "":
			text = s.mtpMode(ModelInfo{})
		}
		parts = append(parts, name+"="+text)
	}
	return strings.Join(parts, " ")
}

// formatReplyStats is a reply's statistics in one line.
func formatReplyStats(st *ReplyStats) string {
	parts := []string{
		fmt.Sprintf("%d prompt + %d generated tokens", st.PromptTokens, st.GeneratedTokens),
		fmt.Sprintf("TTFT %s", formatMillis(st.TTFTMillis)),
		fmt.Sprintf("%.1f tok/s", st.DecodeTokensPerSec),
	}
	if st.PromptTokensPerSec > 0 {
		parts = append(parts, fmt.Sprintf("prefill %.0f tok/s", st.PromptTokensPerSec))
	}
	if st.DraftTokens > 0 {
		parts = append(parts, fmt.Sprintf("MTP %d/%d drafts accepted (%.0f%%), %.2f tokens per step",
			st.AcceptedTokens, st.DraftTokens, 100*float64(st.AcceptedTokens)/float64(st.DraftTokens), 1+st.AcceptedPerStep))
	}
	switch {
	case st.Finish == FinishLength && st.Limit != "":
		parts = append(parts, "finish length ("+st.Limit+")")
	case st.Finish != "":
		parts = append(parts, "finish "+st.Finish)
	}
	parts = append(parts, fmt.Sprintf("seed %d", st.Seed))
	return strings.Join(parts, " · ")
}

// formatMillis prints a duration in ms below a second and in s above.
func formatMillis(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.2f s", ms/1000)
}
