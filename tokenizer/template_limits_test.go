package tokenizer

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// TestTemplateHostile: each hostile template fails with its error, in
// seconds (timeout 5 s), having allocated less than 1.5 GiB in all.
func TestTemplateHostile(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "hello"}}
	for _, c := range fixtures.HostileTemplates {
		t.Run(c.Name, func(t *testing.T) {
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			tmpl, err := NewChatTemplate(c.Name, c.Src)
			if err == nil {
				_, err = tmpl.Render(msgs, TemplateOptions{Timeout: 5 * time.Second})
			}
			if err == nil || !strings.Contains(err.Error(), c.Want) {
				t.Fatalf("error %v, want %q", err, c.Want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 1536<<20 {
				t.Errorf("allocated %d MiB", n>>20)
			}
		})
	}
}

// TestTemplateStopsInsideExpression: the deadline holds inside one long
// expression, with no loop or macro for the guard rewrite to count: Render
// returns in time and its goroutine ends soon after.
func TestTemplateStopsInsideExpression(t *testing.T) {
	// 40000 scans of 16 MB, allocating nothing: a minute of work.
	src := `{% set s = 'ab' * 8000000 %}{{ s.count('b')` + strings.Repeat(` + s.count('b')`, 40000) + ` }}`
	tmpl, err := NewChatTemplate("long", src)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = tmpl.Render(nil, TemplateOptions{Timeout: 100 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
	for rendering.Load() > 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("the rendering goroutine still runs %v after the deadline", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
