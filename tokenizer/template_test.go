package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/tokenizer/internal/jinja"
)

// TestGuardRewriteKeepsOutput renders the real chat templates that
// ardanlabs/jinja ships (copied with the library) with and without the guard
// rewrite and the limits: the output must be the same.
func TestGuardRewriteKeepsOutput(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("internal", "jinja", "testdata", "templates", "*.jinja"))
	if len(files) == 0 {
		t.Fatal("no templates in internal/jinja/testdata/templates")
	}
	msgs := []Message{
		{Role: "system", Content: "sys"},
		{Role: "user", Content: "hi"},
		{Role: "assistant", Content: "hello", ToolCalls: []ToolCall{{Type: "function", Function: ToolCallFunction{Name: "f", Arguments: json.RawMessage(`{"a": 1, "b": [1, "x"]}`)}}}},
		{Role: "tool", Content: "res"},
		{Role: "user", Content: "ok"},
	}
	tools := []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "x"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]}}}`)}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		c, err := NewChatTemplate(name, string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		plain, err := jinja.Compile(string(src))
		if err != nil {
			t.Errorf("%s: compiles only when guarded: %v", name, err)
			continue
		}
		for _, withTools := range []bool{false, true} {
			opts := TemplateOptions{AddGenerationPrompt: true, Now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			if withTools {
				opts.Tools = tools
			}
			got, err1 := c.Render(msgs, opts)
			data, err := c.data(msgs, opts)
			if err != nil {
				t.Fatal(err)
			}
			addGuards(data, &guard{deadline: time.Now().Add(time.Hour)}, opts.Now)
			want, err2 := plain.RenderValues(data)
			if (err1 == nil) != (err2 == nil) || got != want {
				t.Errorf("%s (tools %v): guarded %q, %v; plain %q, %v", name, withTools, got, err1, want, err2)
			}
		}
	}
}
