package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
)

// TestAnswer asks the built-in model two questions from an eval_results.json
// shaped file: a short answer that ends with the stop token, and one cut at
// -max-new tokens, which does not end.
func TestAnswer(t *testing.T) {
	word := "hot"
	in := []item{
		{Kind: "chat", Question: "What is the opposite of hot?", Answer: "stale", Ended: true},
		{Kind: "heldout_define", Word: &word, Question: "What does the word hot mean?"},
	}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "eval_results.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	qs, err := readItems(path)
	if err != nil {
		t.Fatal(err)
	}
	if qs[0].Answer != "" || qs[0].Ended {
		t.Errorf("the recorded answer is kept: %+v", qs[0])
	}
	l, tok, err := builtin.Open(engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := answer(l, tok, qs[:1], 56); err != nil {
		t.Fatal(err)
	}
	if err := answer(l, tok, qs[1:], 4); err != nil {
		t.Fatal(err)
	}
	if a := qs[0]; a.Answer != "The opposite of hot is cold." || !a.Ended {
		t.Errorf("%q: %q (ended %v)", a.Question, a.Answer, a.Ended)
	}
	if a := qs[1]; a.Tokens != 4 || a.Ended || *a.Word != "hot" {
		t.Errorf("%q cut at 4 tokens: %q, %d tokens, ended %v", a.Question, a.Answer, a.Tokens, a.Ended)
	}
	if _, err := readItems(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing file is not an error")
	}
}
