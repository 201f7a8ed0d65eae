package e2e

import (
	"strings"
	"testing"
)

// TestUnknownCommandOnATerminal: a mistyped command fails on a terminal
// with the same message and status as on a pipe (internal/cli tests the
// pipe), instead of opening the chat or generating.
func TestUnknownCommandOnATerminal(t *testing.T) {
	bin := build(t)
	tm := newTerm(t, nil, "sh", "-c", bin+" tokenise hello; echo EXIT=$?; sleep 30")
	s := tm.waitFor("the error and the exit status", func(s string) bool { return strings.Contains(s, "EXIT=") })
	if !strings.Contains(s, `ferrite: unknown command "tokenise"`) || !strings.Contains(s, "EXIT=2") {
		t.Errorf("screen:\n%s", s)
	}
}
