package cli

import (
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/engine/bench"
)

// tinyLlama writes a config.json alone (no weights: bench makes random
// ones) for a two-layer llama into a temp dir.
func tinyLlama(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
		"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
		"max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000,
		"tie_word_embeddings": true, "torch_dtype": "bfloat16"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBenchQuant runs the sweep on random weights quantized to Q8_0 and
// checks that the report says so and counts the quantized bytes.
func TestBenchQuant(t *testing.T) {
	dir := tinyLlama(t)
	js := filepath.Join(t.TempDir(), "bench.json")
	var bytes [2]int64
	for i, q := range []string{"", "q8_0"} {
		args := []string{"bench", "--model", dir, "--concurrency", "1", "--prompt-len", "5",
			"--gen-len", "3", "--threads", "2", "--stream-mib", "8", "--quant", q, "--json", js}
		if i == 0 {
			args = append(args, "--no-prepare")
		}
		code, out, errs := runCLI(t, "", args...)
		if code != 0 {
			t.Fatalf("--quant %q: exit %d: %s", q, code, errs)
		}
		if q != "" && !strings.Contains(out, "random bf16 weights quantized to q8_0") {
			t.Errorf("stdout lacks the quantization:\n%s", out)
		}
		raw, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Model struct {
				Quant       string   `json:"quant"`
				WeightBytes int64    `json:"weight_bytes"`
				PrepareSec  *float64 `json:"prepare_s"`
			} `json:"model"`
		}
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		// The weights' one-time forms are made after the load and timed on
		// their own, unless --no-prepare.
		if p := rep.Model.PrepareSec; p == nil || (*p == 0) != (i == 0) || !strings.Contains(out, ", prepare ") {
			t.Errorf("prepare_s %v (--no-prepare %v), stdout:\n%s", p, i == 0, out)
		}
		if rep.Model.Quant != q {
			t.Errorf("json quant %q, want %q", rep.Model.Quant, q)
		}
		bytes[i] = rep.Model.WeightBytes
	}
	// Q8_0 is 34 bytes per 32 weights against bf16's 64; norms stay float32.
	if r := float64(bytes[1]) / float64(bytes[0]); r < 0.5 || r > 0.6 {
		t.Errorf("q8_0 weights are %.2f of bf16's bytes (%d vs %d), want about 34/64", r, bytes[1], bytes[0])
	}
}

func TestBench(t *testing.T) {
	dir := tinyLlama(t)
	js := filepath.Join(t.TempDir(), "bench.json")
	code, out, errs := runCLI(t, "", "bench", "--model", dir, "--concurrency", "1,2", "--prompt-len", "5",
		"--gen-len", "3,4", "--mtp", "off,on", "--threads", "2", "--device", "cpu", "--stream-mib", "8", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"device:    cpu (2 threads)\n", "bandwidth:", "roofline:", "steps/s max at batch 1", "random bf16 weights",
		"tied embedding read in full", "decode tok/s", "TTFT mean ms", "peak KV", "mtp: not available",
		"KV cache 256 B per token", "memory:    host RAM held after the sweep: "} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	// The table: a header and 2 × 2 × 2 rows, every line of it as wide as
	// the header (aligned columns).
	lines := strings.Split(out, "\n")
	hdr := -1
	for i, l := range lines {
		if strings.Contains(l, "conc") && strings.Contains(l, "decode tok/s") {
			hdr = i
			break
		}
	}
	if hdr < 0 || hdr+9 > len(lines) {
		t.Fatalf("no table:\n%s", out)
	}
	for _, l := range lines[hdr+1 : hdr+9] {
		if len(l) != len(lines[hdr]) {
			t.Errorf("row %q is not as wide as the header %q", l, lines[hdr])
		}
	}
	if l := lines[hdr+9]; strings.TrimSpace(l) != "" {
		t.Errorf("more rows than cases: %q", l)
	}

	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Date    string
		Machine struct {
			CPU       string
			Threads   int
			Device    string
			GoVersion string `json:"go_version"`
		}
		Model struct {
			Arch            string
			RandomWeights   bool `json:"random_weights"`
			DType           string
			Params          int64
			WeightBytes     int64 `json:"weight_bytes"`
			KVBytesPerToken int64 `json:"kv_bytes_per_token"`
		}
		Bandwidth struct {
			BytesPerSec float64 `json:"bytes_per_s"`
		}
		Roofline struct {
			WeightBytesPerStep int64   `json:"weight_bytes_per_step"`
			MaxSteps           float64 `json:"max_decode_steps_per_s"`
		}
		Memory struct {
			OnDevice    bool  `json:"on_device"`
			WeightBytes int64 `json:"weight_bytes"`
			TensorBytes int64 `json:"tensor_bytes"`
			ArenaBytes  int64 `json:"arena_bytes"`
			UsedBytes   int64 `json:"used_bytes"`
		}
		Runs []map[string]any
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Date == "" || rep.Machine.CPU == "" || rep.Machine.Threads != 2 || rep.Machine.GoVersion == "" ||
		rep.Machine.Device != "cpu (2 threads)" {
		t.Errorf("machine: %+v, date %q", rep.Machine, rep.Date)
	}
	m := rep.Model
	if m.Arch != "llama" || !m.RandomWeights || m.DType != "bf16" || m.Params <= 0 || m.KVBytesPerToken <= 0 {
		t.Errorf("model: %+v", m)
	}
	// Tied embeddings: every matrix is read once per step, the LM head
	// being the embedding, so per-step bytes are all the weights.
	if m.WeightBytes <= 0 || rep.Roofline.WeightBytesPerStep != m.WeightBytes {
		t.Errorf("weight bytes %d, per step %d", m.WeightBytes, rep.Roofline.WeightBytesPerStep)
	}
	// On the CPU the memory's weights are the model's; its tensors (the
	// model's own buffers: the runs' KV caches were released) are Alloc'd.
	if mem := rep.Memory; mem.OnDevice || mem.WeightBytes != m.WeightBytes || mem.TensorBytes <= 0 ||
		mem.ArenaBytes <= 0 || mem.UsedBytes != mem.WeightBytes+mem.TensorBytes+mem.ArenaBytes {
		t.Errorf("memory: %+v", mem)
	}
	if rep.Bandwidth.BytesPerSec <= 0 || rep.Roofline.MaxSteps <= 0 {
		t.Errorf("bandwidth %g, roofline %g", rep.Bandwidth.BytesPerSec, rep.Roofline.MaxSteps)
	}
	if len(rep.Runs) != 8 {
		t.Fatalf("%d runs, want 8", len(rep.Runs))
	}
	positive := []string{"wall_s", "decode_tok_per_s", "per_request_decode_tok_per_s", "prompt_tok_per_s",
		"ttft_mean_ms", "ttft_p50_ms", "ttft_max_ms", "peak_kv_bytes", "kv_budget_bytes", "steps",
		"decode_steps_per_s", "weight_bytes_per_step", "weight_bytes_per_s", "roofline_fraction"}
	for i, r := range rep.Runs {
		conc, gen := r["concurrency"].(float64), r["gen_len"].(float64)
		if r["mtp"] == true {
			if s, _ := r["skipped"].(string); !strings.HasPrefix(s, "mtp: not available") {
				t.Errorf("run %d: mtp on: %v", i, r)
			}
			continue
		}
		for _, k := range positive {
			if v, ok := r[k].(float64); !ok || v <= 0 {
				t.Errorf("run %d: %s = %v, want > 0", i, k, r[k])
			}
		}
		if got := r["generated_tokens"]; got != conc*gen {
			t.Errorf("run %d: %v tokens generated, want %v", i, got, conc*gen)
		}
		if r["ttft_max_ms"].(float64) < r["ttft_mean_ms"].(float64) {
			t.Errorf("run %d: TTFT max < mean: %v", i, r)
		}
		// At its peak the cache holds at least one whole request (its last
		// step runs position prompt+gen-2).
		if min := (5 + gen - 1) * float64(m.KVBytesPerToken); r["peak_kv_bytes"].(float64) < min {
			t.Errorf("run %d: peak KV %v < %v", i, r["peak_kv_bytes"], min)
		}
	}
}

// TestBenchCheckpoint runs a real (fixture) checkpoint: weights are read,
// not made, and --dtype is refused.
func TestBenchCheckpoint(t *testing.T) {
	dir := fixtureModel(t, "qwen3")
	code, out, errs := runCLI(t, "", "bench", "--model", dir, "--concurrency", "2", "--prompt-len", "4",
		"--gen-len", "2", "--bandwidth", "12.5")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "bandwidth: 12.5 GB/s (given with --bandwidth)") || strings.Contains(errs, "measuring memory bandwidth") {
		t.Errorf("--bandwidth not used:\n%s\n%s", out, errs)
	}
	// qwen3's fixture is untied: the input embedding is not read per step.
	if !strings.Contains(out, "checkpoint") || !strings.Contains(out, "input embedding") {
		t.Errorf("stdout:\n%s", out)
	}
	// An MTP checkpoint drafts with --mtp on and reports the acceptance,
	// one case per draft length.
	mtpDir := fixtureModel(t, "glm4_moe")
	js := filepath.Join(t.TempDir(), "mtp.json")
	code, out, errs = runCLI(t, "", "bench", "--model", mtpDir, "--concurrency", "2", "--prompt-len", "4",
		"--gen-len", "6", "--mtp", "on", "--draft", "2,1", "--stream-mib", "4", "--json", js)
	if code != 0 {
		t.Fatalf("mtp: exit %d: %s", code, errs)
	}
	var rep struct {
		Model struct {
			MTPBytes int64 `json:"mtp_bytes"`
		}
		Runs []struct {
			MTP        bool
			Skipped    string
			Acceptance *float64 `json:"mtp_acceptance"`
			Drafted    int      `json:"mtp_draft_tokens"`
			Draft      int      `json:"mtp_draft"`
			Generated  int      `json:"generated_tokens"`
		}
	}
	if b, err := os.ReadFile(js); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Model.MTPBytes <= 0 || len(rep.Runs) != 2 {
		t.Fatalf("mtp report: %+v", rep)
	}
	for i, r := range rep.Runs {
		if !r.MTP || r.Skipped != "" || r.Acceptance == nil || r.Drafted <= 0 || r.Draft != 2-i || r.Generated != 12 {
			t.Errorf("mtp run %d: %+v\n%s", i, r, out)
		}
	}
	if !strings.Contains(out, " on:2 ") || !strings.Contains(out, " on:1 ") {
		t.Errorf("mtp table without its draft lengths:\n%s", out)
	}

	code, _, errs = runCLI(t, "", "bench", "--model", dir, "--dtype", "f32", "--concurrency", "1",
		"--prompt-len", "4", "--gen-len", "2", "--stream-mib", "4")
	if code != 1 || !strings.Contains(errs, "--dtype applies to random weights") {
		t.Errorf("--dtype with a checkpoint: exit %d, %q", code, errs)
	}
}

func TestBenchErrors(t *testing.T) {
	dir := tinyLlama(t)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no model", []string{}, 2, "--model DIR is required"},
		{"zero concurrency", []string{"--model", dir, "--concurrency", "1,0"}, 2, `"0" is not a positive integer`},
		{"not a number", []string{"--model", dir, "--prompt-len", "abc"}, 2, `"abc" is not a positive integer`},
		{"empty list item", []string{"--model", dir, "--gen-len", "4,"}, 2, `"" is not a positive integer`},
		{"gen-len 0", []string{"--model", dir, "--gen-len", "0"}, 2, `"0" is not a positive integer`},
		{"bad mtp", []string{"--model", dir, "--mtp", "maybe"}, 2, `"maybe" is not on or off`},
		{"zero draft", []string{"--model", dir, "--mtp", "on", "--draft", "1,0"}, 2, `"0" is not a positive integer`},
		{"bad dtype", []string{"--model", dir, "--dtype", "int4"}, 2, "want bf16, f16 or f32"},
		{"bad quant", []string{"--model", dir, "--quant", "int4"}, 2, `--quant "int4": want q8_0 or q4_k`},
		{"bad device", []string{"--model", dir, "--device", "gpu:1"}, 2, `--device "gpu:1": want auto, cpu, cuda or cuda:N`},
		{"negative threads", []string{"--model", dir, "--threads", "-1"}, 2, "negative"},
		{"negative kv budget", []string{"--model", dir, "--kv-budget", "-5"}, 2, `"-5" is not a size`},
		{"negative bandwidth", []string{"--model", dir, "--bandwidth", "-1"}, 2, "want GB/s > 0"},
		{"stray argument", []string{"--model", dir, "extra"}, 2, `unexpected argument "extra"`},
		{"unknown flag", []string{"--bogus"}, 2, "flag provided but not defined"},
		{"missing model", []string{"--model", filepath.Join(t.TempDir(), "nope"), "--stream-mib", "1"}, 1, "nope"},
		{"longer than the context", []string{"--model", dir, "--prompt-len", "250", "--gen-len", "10", "--stream-mib", "1"}, 1, "exceeds the model's context 256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runCLI(t, "", append([]string{"bench"}, c.args...)...)
			if code != c.code || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d containing %q", code, errs, c.code, c.want)
			}
		})
	}
}

// TestBenchMissingModelFailsFast: a --model that is not there fails before
// the bandwidth probe (seconds at the default buffer size).
func TestBenchMissingModelFailsFast(t *testing.T) {
	start := time.Now()
	code, _, errs := runCLI(t, "", "bench", "--model", filepath.Join(t.TempDir(), "nope"), "--device", "cpu")
	if code != 1 || !strings.Contains(errs, "nope") || strings.Contains(errs, "measuring memory bandwidth") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming the model, no bandwidth probe", code, errs)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

// TestBenchKVBudgetTakesASize: bench reads --kv-budget with the same
// parser as config.toml and the other commands.
func TestBenchKVBudgetTakesASize(t *testing.T) {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	if err := fs.Parse([]string{"--kv-budget", "1GiB"}); err != nil || f.kvBudget != 1<<30 {
		t.Fatalf("--kv-budget 1GiB: %d, %v", f.kvBudget, err)
	}
	if err := fs.Parse([]string{"--kv-budget", "1 GB"}); err != nil || f.kvBudget != 1e9 {
		t.Fatalf("--kv-budget 1 GB: %d, %v", f.kvBudget, err)
	}
}

// TestBenchRandomBlocksLabel: random weights a GPU made as random blocks
// of --quant's dtype are reported as such, not as quantized values.
func TestBenchRandomBlocksLabel(t *testing.T) {
	var out strings.Builder
	rep := &benchReport{Model: benchModelJS{Path: "m", Arch: "qwen3", RandomWeights: true, RandomBlocks: true, DType: "bf16", Quant: "q4_k"}}
	printBench(&out, rep, bench.Footprint{}, bench.Roofline{})
	if s := out.String(); !strings.Contains(s, "random q4_k blocks,") || strings.Contains(s, "quantized to") {
		t.Errorf("report:\n%s", s)
	}
}
