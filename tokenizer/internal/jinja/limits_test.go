package jinja

import (
	"errors"
	"strings"
	"testing"
)

func render1(t *testing.T, src string, lim Limits) (string, error) {
	t.Helper()
	tmpl, err := Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl.RenderLimited(map[string]Value{"s": NewString("abc")}, lim)
}

func TestLimits(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	for _, c := range []struct {
		name, src string
		lim       Limits
		want      string // error text; "" for success
	}{
		{"within limits", `{{ s * 3 }}{{ [s, 1]|join('-') }}`, Limits{MaxOutput: 100, Budget: 1000}, ""},
		{"output", `{{ s * 3 }}`, Limits{MaxOutput: 8}, "output too big (9 bytes, more than the limit of 8)"},
		{"budget", `{% for i in range(10) %}{% set x = s * 100 %}{% endfor %}`, Limits{Budget: 500}, "memory built by the rendering too big"},
		{"single value", `{{ s * 100000000 }}`, Limits{}, "string repetition too big (300000000 bytes, more than the limit of 67108864)"},
		{"overflow", `{{ s * 9223372036854775807 }}`, Limits{}, "string repetition too big (more than the limit"},
		{"negative count", `[{{ s * -5 }}]`, Limits{}, ""},
		{"check", `{% for i in range(100000) %}{{ i }}{% endfor %}`, Limits{Check: func() error {
			if calls++; calls > 3 {
				return stop
			}
			return nil
		}}, "stop"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := render1(t, c.src, c.lim)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("output %.40q, error %v; want %q", out, err, c.want)
			}
		})
	}
	if calls != 4 {
		t.Errorf("Check called %d times, want 4 (every %d steps until it failed)", calls, checkEvery)
	}
}

// A list holding itself can be built, but not printed or compared.
func TestCycles(t *testing.T) {
	for _, src := range []string{
		`{% set l = [1] %}{{ l.append(l) }}{{ l }}`,
		`{% set l = [1] %}{{ l.append(l) }}{{ l == l }}`,
		`{% set l = [1] %}{{ l.append(l) }}{{ l|tojson }}`,
		`{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns|string }}`,
	} {
		if _, err := render1(t, src, Limits{}); err == nil || !strings.Contains(err.Error(), "too big") {
			t.Errorf("%s: error %v", src, err)
		}
	}
}
