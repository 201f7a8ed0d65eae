package settings

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Endpoint is a remote OpenAI-compatible server (vLLM, SGLang, ferrite
// serve…) of an [[endpoints]] table. Endpoints are not settings of Table:
// there may be any number of them, each a table of its own.
type Endpoint struct {
	Name      string   // the prefix of its models' names: NAME/MODEL
	BaseURL   string   // e.g. "http://gpu-box:8000/v1"
	APIKeyEnv string   // the environment variable holding the API key
	APIKey    string   // the API key itself (api_key_env is better)
	Models    []string // the models to list; empty: ask GET /v1/models
}

// endpointsKey is the array of tables the endpoints are.
const endpointsKey = "endpoints"

// endpointField is a key of an [[endpoints]] table: a string, or a list
// of strings (list), and where it goes.
type endpointField struct {
	key  string
	list bool
	put  func(e *Endpoint, s string, l []string)
}

var endpointFields = []endpointField{
	{"name", false, func(e *Endpoint, s string, _ []string) { e.Name = s }},
	{"base_url", false, func(e *Endpoint, s string, _ []string) { e.BaseURL = s }},
	{"api_key_env", false, func(e *Endpoint, s string, _ []string) { e.APIKeyEnv = s }},
	{"api_key", false, func(e *Endpoint, s string, _ []string) { e.APIKey = s }},
	{"models", true, func(e *Endpoint, _ string, l []string) { e.Models = l }},
}

// isEndpointKey says whether a key of the file belongs to [[endpoints]].
func isEndpointKey(key string) bool {
	return key == endpointsKey || strings.HasPrefix(key, endpointsKey+".")
}

// parseEndpoints reads the [[endpoints]] tables of a decoded file (v is
// raw["endpoints"]), with the problems of each: unknown keys, wrong
// types, a missing or repeated name, a base_url that is not an http(s)
// URL, an API key given twice.
func parseEndpoints(v any, data []byte) ([]Endpoint, []Problem) {
	if v == nil {
		return nil, nil
	}
	tables, ok := v.([]map[string]any)
	if !ok {
		return nil, []Problem{{Line: keyLine(data, endpointsKey), Key: endpointsKey,
			Msg: fmt.Sprintf("want [[endpoints]] tables, not %s", tomlType(v))}}
	}
	var out []Endpoint
	var probs []Problem
	for i, t := range tables {
		line := endpointLine(data, i)
		bad := func(field, format string, args ...any) {
			probs = append(probs, Problem{Line: line, Key: endpointsKey + "." + field,
				Msg: fmt.Sprintf("endpoint %d: ", i+1) + fmt.Sprintf(format, args...)})
		}
		var e Endpoint
		for key, val := range t {
			j := slices.IndexFunc(endpointFields, func(f endpointField) bool { return f.key == key })
			if j < 0 {
				bad(key, "unknown key (want name, base_url, api_key_env, api_key, models)")
				continue
			}
			f := endpointFields[j]
			if s, ok := val.(string); ok && !f.list {
				f.put(&e, s, nil)
				continue
			}
			if l, ok := stringList(val); ok && f.list {
				f.put(&e, "", l)
				continue
			}
			want := "a string"
			if f.list {
				want = "a list of strings"
			}
			bad(key, "want %s, not %s", want, tomlType(val))
		}
		switch {
		case e.Name == "" || strings.ContainsAny(e.Name, "/ \t"):
			bad("name", "%q: want a short name without spaces or '/'", e.Name)
		case slices.ContainsFunc(out, func(o Endpoint) bool { return o.Name == e.Name }):
			bad("name", "%q is already the name of another endpoint", e.Name)
		}
		if u, err := url.Parse(e.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("base_url", "%q: want an http:// or https:// URL such as \"http://localhost:8000/v1\"", e.BaseURL)
		}
		if e.APIKey != "" && e.APIKeyEnv != "" {
			bad("api_key", "give api_key or api_key_env, not both")
		}
		out = append(out, e)
	}
	slices.SortStableFunc(probs, func(a, b Problem) int { return strings.Compare(a.Key, b.Key) })
	return out, probs
}

// stringList reads a TOML array of strings.
func stringList(v any) ([]string, bool) {
	arr, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(arr))
	for i, x := range arr {
		if out[i], ok = x.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

// endpointLine is the line of the i-th (0-based) [[endpoints]] header; 0
// when not found.
func endpointLine(data []byte, i int) int {
	n := 0
	for j, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(strings.SplitN(line, "#", 2)[0]) == "[["+endpointsKey+"]]" {
			if n == i {
				return j + 1
			}
			n++
		}
	}
	return 0
}
