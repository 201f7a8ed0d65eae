package server

import "testing"

// split runs pieces through a thinkSplitter and returns the whole
// reasoning and answer.
func split(inside bool, pieces ...string) (reasoning, content string) {
	t := newThinkSplitter(inside)
	for _, p := range pieces {
		r, c := t.add(p)
		reasoning += r
		content += c
	}
	r, c := t.flush()
	return reasoning + r, content + c
}

func TestThinkSplitter(t *testing.T) {
	cases := []struct {
		name           string
		inside         bool
		pieces         []string
		reason, answer string
	}{
		{"no block", false, []string{"Hello", " world"}, "", "Hello world"},
		{"block", false, []string{"<think>\nhmm", " ok\n</think>\n\nHi"}, "hmm ok", "Hi"},
		{"tags split", false, []string{"<th", "ink>a", "b</th", "ink>", " c"}, "ab", "c"},
		{"opened by the prompt", true, []string{"\nplan", "</think>", "done"}, "plan", "done"},
		{"space held, then released", true, []string{"a ", " b", "</think>x"}, "a  b", "x"},
		{"false close", true, []string{"a</thi", "s</think>b"}, "a</this", "b"},
		{"cut inside reasoning", false, []string{"<think>deep"}, "deep", ""},
		{"only a partial tag", false, []string{"<thi"}, "", "<thi"},
		{"leading space before tag", false, []string{"  ", "<think>r</think>a"}, "r", "a"},
		{"empty block", false, []string{"<think>\n\n</think>\n\nAnswer"}, "", "Answer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, a := split(c.inside, c.pieces...)
			if r != c.reason || a != c.answer {
				t.Errorf("reasoning %q, answer %q; want %q, %q", r, a, c.reason, c.answer)
			}
		})
	}
}

// TestThinkSplitterNeverLeaksTags cuts a reply at every pair of points: the
// tags never reach either part, and the parts are the same every way.
func TestThinkSplitterNeverLeaksTags(t *testing.T) {
	const text = "<think>\nweigh it up\n</think>\n\nThe answer."
	for i := 0; i <= len(text); i++ {
		for j := i; j <= len(text); j++ {
			r, a := split(false, text[:i], text[i:j], text[j:])
			if r != "weigh it up" || a != "The answer." {
				t.Fatalf("cuts %d,%d: reasoning %q, answer %q", i, j, r, a)
			}
		}
	}
}
