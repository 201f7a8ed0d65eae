package tokenizer

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// hostileTemplates are templates that build huge values or never end; each
// must fail with the error given, quickly and without exhausting memory.
var hostileTemplates = []string{}

var hostileCases = []struct{ name, src, want string }{
	{"string repetition", `{{ 'a' * 1000000000 }}`, "string repetition too big"},
	{"repetition past memory", `{{ 'a' * 1000000000000 }}`, "string repetition too big"},
	{"repetition overflowing int64", `{{ 'ab' * 9223372036854775807 }}`, "string repetition too big"},
	{"content times a large number", `{{ messages[0].content * 100000000 }}`, "string repetition too big"},
	{"repetition of a repetition", `{{ ('x' * 60000000) * 1000 }}`, "string repetition too big"},
	{"output", `{% for i in range(3) %}{{ 'x' * 6000000 }}{% endfor %}`, "output too big"},
	{"doubling in a loop", `{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}`, "concatenation too big"},
	{"doubling without a loop", `{% set a = 'abcdefgh' * 1000 %}` + strings.Repeat(`{% set a = a + a %}`, 40) + `{{ a|length }}`, "concatenation too big"},
	{"replace with empty old", `{% set s = messages[0].content * 4000 %}{{ s.replace('', s)|length }}`, "replace too big"},
	{"replace filter", `{% set s = 'a' * 100000 %}{{ s|replace('a', s)|length }}`, "replace too big"},
	{"indent", `{{ 'a\nb\nc'|indent(100000000000) }}`, "indent too big"},
	{"format", `{% set s = '{0}' * 100000 %}{{ s.format('x' * 100000)|length }}`, "format too big"},
	{"join of shared items", `{% set ns = namespace(l=[]) %}{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% set ns.l = ns.l + [s] %}{% endfor %}{{ ns.l|join|length }}`, "join too big"},
	{"printed nested list", `{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}`, "printed value too big"},
	{"compared nested list", `{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l == ns.l }}`, "comparison too big"},
	{"tojson of nested list", `{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson }}`, "tojson too big"},
	{"tojson indent", `{{ [[[[1]]]]|tojson(indent=10000000) }}`, "tojson too big"},
	{"list that holds itself", `{% set l = [1] %}{{ l.append(l) }}{{ l }}`, "printed value too big"},
	{"list of a string's characters", `{{ ('ab' * 30000000)|list|length }}`, "list too big"},
	{"split", `{{ (', ' * 20000000).split(',')|length }}`, "split too big"},
	{"memory kept by a loop", `{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + ['x' * 50000000 ~ i] %}{% endfor %}`, "memory built by the rendering too big"},
	{"nested brackets", strings.Repeat("{{ ", 1) + strings.Repeat("(", 100000) + "1" + strings.Repeat(")", 100000) + " }}", "nested more than"},
}

func init() {
	for _, c := range hostileCases {
		hostileTemplates = append(hostileTemplates, c.src)
	}
}

// TestTemplateHostile: each hostile template fails with its error within a
// second, and the heap does not grow past a few hundred MiB.
func TestTemplateHostile(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "hello"}}
	for _, c := range hostileCases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			tmpl, err := NewChatTemplate(c.name, c.src)
			if err == nil {
				_, err = tmpl.Render(msgs, TemplateOptions{Timeout: 5 * time.Second})
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("took %v", d)
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > 2<<30 {
				t.Errorf("heap %d MiB after the rendering", ms.HeapAlloc>>20)
			}
		})
	}
}

// TestTemplateStopsInsideExpression: the deadline holds inside one long
// expression, with no loop or macro for the guard rewrite to count: Render
// returns in time and its goroutine ends soon after.
func TestTemplateStopsInsideExpression(t *testing.T) {
	before := runtime.NumGoroutine()
	src := `{{ ('ab' * 500000)` + strings.Repeat(`.replace('a', 'c').replace('c', 'a')`, 2000) + `|length }}`
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
	for runtime.NumGoroutine() > before {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("the rendering goroutine still runs %v after the deadline", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
