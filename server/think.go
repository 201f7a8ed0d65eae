package server

import (
	"strings"

	"github.com/ferrite-llm/ferrite/internal/chatprompt"
)

// thinkState is where a thinkSplitter is in a reply.
type thinkState uint8

const (
	thinkStart  thinkState = iota // nothing but white space yet: a <think> tag may come
	thinkInside                   // inside the <think> block
	thinkAfter                    // the answer (after the block, or a reply without one)
)

// thinkSplitter separates a reasoning model's streamed reply into its
// reasoning (the <think> block, reasoning_content) and its answer
// (content). The tags are never released, nor is white space at the edges
// of the reasoning and at the start of the answer; text that may be the
// start of a tag is held back until the next piece decides.
type thinkSplitter struct {
	state   thinkState
	held    string
	started bool // some text of the current part (reasoning or answer) has been released
}

// newThinkSplitter starts in the reasoning when the generation prompt
// already opened the <think> block.
func newThinkSplitter(inside bool) *thinkSplitter {
	if inside {
		return &thinkSplitter{state: thinkInside}
	}
	return &thinkSplitter{}
}

const space = " \t\r\n"

// add takes the next piece of the reply and returns the reasoning and
// answer text it releases.
func (t *thinkSplitter) add(text string) (reasoning, content string) {
	buf := t.held + text
	t.held = ""
	if t.state == thinkStart {
		trimmed := strings.TrimLeft(buf, space)
		switch {
		case strings.HasPrefix(trimmed, chatprompt.ThinkOpen):
			t.state = thinkInside
			buf = trimmed[len(chatprompt.ThinkOpen):]
		case strings.HasPrefix(chatprompt.ThinkOpen, trimmed): // "" or a partial tag
			t.held = buf
			return "", ""
		default:
			t.state, t.started = thinkAfter, true
			return "", buf
		}
	}
	if t.state == thinkInside {
		if !t.started {
			buf = strings.TrimLeft(buf, space)
		}
		if before, after, ok := strings.Cut(buf, chatprompt.ThinkClose); ok {
			reasoning = strings.TrimRight(before, space)
			t.state, t.started = thinkAfter, false
			buf = after
		} else {
			body := buf[:len(buf)-partialSuffix(buf, []string{chatprompt.ThinkClose})]
			reasoning = strings.TrimRight(body, space)
			t.held = buf[len(reasoning):]
			t.started = t.started || reasoning != ""
			return reasoning, ""
		}
	}
	if !t.started {
		buf = strings.TrimLeft(buf, space)
		t.started = buf != ""
	}
	return reasoning, buf
}

// flush releases what is held back at the end of the reply.
func (t *thinkSplitter) flush() (reasoning, content string) {
	h := t.held
	t.held = ""
	switch t.state {
	case thinkStart:
		if strings.TrimLeft(h, space) == "" {
			return "", ""
		}
		return "", h
	case thinkInside:
		return strings.TrimRight(h, space), ""
	}
	return "", ""
}
