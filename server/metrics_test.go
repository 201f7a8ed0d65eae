package server

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// metricLine is one sample of the Prometheus text format.
var metricLine = regexp.MustCompile(`^([a-z_]+)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+)$`)

// metrics scrapes /metrics and returns its samples by name and labels,
// checking the format on the way.
func metrics(t *testing.T, ts *testServer) map[string]float64 {
	t.Helper()
	status, body := ts.do(t, "GET", "/metrics", "")
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	out := map[string]float64{}
	typed := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(rest)[0]] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		m := metricLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a Prometheus sample: %q", line)
		}
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m[1], "_sum"), "_count"), "_bucket")
		if !typed[m[1]] && !typed[base] {
			t.Errorf("%s has no TYPE line before it", m[1])
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out[m[1]+m[2]] = v
	}
	return out
}

func TestMetrics(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	before := metrics(t, ts)
	if before[`ferrite_model_ready{model="ferrite-tiny"}`] != 1 || before[`ferrite_kv_cache_blocks_total{model="ferrite-tiny"}`] == 0 {
		t.Errorf("before: %v", before)
	}
	chatJSON(t, ts, `{"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"max_tokens":6,"n":2}`)
	ts.post(t, "/v1/chat/completions", `{"temperature":9}`)
	after := metrics(t, ts)
	for key, want := range map[string]float64{
		`ferrite_requests_total{model="ferrite-tiny"}`:                               1,
		`ferrite_completions_total{model="ferrite-tiny",finish_reason="length"}`:     2,
		`ferrite_time_to_first_token_seconds_count{model="ferrite-tiny"}`:            2,
		`ferrite_time_to_first_token_seconds_bucket{model="ferrite-tiny",le="+Inf"}`: 2,
		`ferrite_time_to_first_token_seconds_bucket{model="ferrite-tiny",le="30"}`:   2,
		`ferrite_generation_tokens_total{model="ferrite-tiny"}`:                      12,
		`ferrite_http_requests_total{path="/v1/chat/completions",code="200"}`:        1,
		`ferrite_http_requests_total{path="/v1/chat/completions",code="400"}`:        1,
		`ferrite_http_requests_total{path="/metrics",code="200"}`:                    1,
		`ferrite_requests_running{model="ferrite-tiny"}`:                             0,
		`ferrite_requests_waiting{model="ferrite-tiny"}`:                             0,
	} {
		if got := after[key]; got != want {
			t.Errorf("%s = %g, want %g", key, got, want)
		}
	}
	if after[`ferrite_prompt_tokens_total{model="ferrite-tiny"}`] == 0 || after[`ferrite_time_to_first_token_seconds_sum{model="ferrite-tiny"}`] <= 0 {
		t.Errorf("no prompt tokens or TTFT: %v", after)
	}
}

func TestTokenize(t *testing.T) {
	b := tinyBackend(t, defaultTestRuntime())
	ts := startServer(t, Options{Models: []Model{loaded("ferrite-tiny", b)}}, true)
	for body, want := range map[string]string{
		`{"prompt":"hello world"}`: `"tokens":[` + join(b.Tokenizer.Encode("hello world", true)) + `]`,
		`{"messages":[{"role":"user","content":"hi"}]}`: `"tokens":[` +
			join(b.Tokenizer.Encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false)) + `]`,
		`{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`: `"tokens":[` +
			join(b.Tokenizer.Encode("<|im_start|>user\nhi<|im_end|>\n", false)) + `]`,
	} {
		status, out := ts.post(t, "/tokenize", body)
		if status != 200 || !strings.Contains(out, want) || !strings.Contains(out, `"max_model_len":1024`) {
			t.Errorf("%s: %d %s; want %s", body, status, out, want)
		}
	}
}

func join(ids []int32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(int(id))
	}
	return strings.Join(s, ",")
}
