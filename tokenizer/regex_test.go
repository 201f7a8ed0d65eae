package tokenizer

import (
	"strings"
	"testing"
	"time"
)

// A pre-tokenizer regex that backtracks for ever on its input stops at the
// match time limit: Encode returns, with the rest of the text in one piece.
func TestRegexBacktracking(t *testing.T) {
	j := strings.Replace(tinyTokenizer, `"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}`,
		`"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": false}`, 1)
	tok, err := parseTokenizer([]byte(j))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ids := tok.Encode(strings.Repeat("a", 40)+"b", false)
	if d := time.Since(start); d > regexTimeout+3*time.Second {
		t.Fatalf("Encode took %v", d)
	}
	if len(ids) == 0 {
		t.Fatal("no ids")
	}
}
