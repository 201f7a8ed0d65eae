package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/adrg/xdg"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/kernels/device"
)

// TestMain keeps the tests off the user's configuration, data and log
// folders, and off the model stores of other tools (ollama's, and LM
// Studio's under $HOME).
func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "ferrite-cli-test")
	if err != nil {
		panic(err)
	}
	for _, v := range []string{"XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "HF_HUB_CACHE", "OLLAMA_MODELS", "HOME"} {
		os.Setenv(v, filepath.Join(tmp, v))
	}
	xdg.Reload()
	defer os.RemoveAll(tmp)
	m.Run()
}

// fixtureModel is fixtures.ChatModel: a fixture's config and weights with
// the byte tokenizer, in a temporary directory.
func fixtureModel(t *testing.T, name string) string { return fixtures.ChatModel(t, name) }

// byteTokenizer writes fixtures.WriteByteTokenizer's tokenizer into dir.
func byteTokenizer(t *testing.T, dir string) {
	t.Helper()
	if err := fixtures.WriteByteTokenizer(dir); err != nil {
		t.Fatal(err)
	}
}

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestTokenize(t *testing.T) {
	dir := t.TempDir()
	byteTokenizer(t, dir)
	code, out, errs := runCLI(t, "", "tokenize", "--model", dir, "Hi <|im_end|>")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if got, want := strings.TrimSpace(out), "72 105 32 258"; got != want {
		t.Fatalf("ids %q, want %q", got, want)
	}
	// The text may come on stdin.
	code, out, _ = runCLI(t, "é", "tokenize", "--model", dir)
	if code != 0 || strings.TrimSpace(out) != "195 169" {
		t.Fatalf("stdin: exit %d, ids %q", code, out)
	}
}

func TestRunGreedyIsDeterministic(t *testing.T) {
	dir := fixtureModel(t, "qwen3")
	args := []string{"run", "--model", dir, "--temperature", "0", "--max-tokens", "12", "--system", "be brief", "hello there"}
	code, out1, errs := runCLI(t, "", args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "prompt:") || !strings.Contains(errs, "decode:") || !strings.Contains(errs, "time to first token") {
		t.Fatalf("no timing line on stderr: %q", errs)
	}
	_, out2, _ := runCLI(t, "", args...)
	if out1 != out2 {
		t.Fatalf("greedy runs differ: %q vs %q", out1, out2)
	}
	if out1 == "" {
		t.Fatal("no output")
	}
}

// TestRunModelSampling checks that the sampling a model's
// generation_config.json recommends replaces the defaults the file and
// the flags left, and only those.
func TestRunModelSampling(t *testing.T) {
	dir := fixtureModel(t, "qwen3")
	gen := filepath.Join(dir, "generation_config.json")
	run := func(extra ...string) string {
		t.Helper()
		args := append([]string{"run", "--model", dir, "--max-tokens", "24", "--config", filepath.Join(dir, "none.toml")}, extra...)
		code, out, errs := runCLI(t, "", append(args, "hello there")...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errs)
		}
		return out
	}
	if err := os.WriteFile(filepath.Join(dir, "none.toml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(gen, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// do_sample false: greedy whatever the seed, as --temperature 0 is.
	write(`{"do_sample": false}`)
	greedy := run("--temperature", "0")
	if a, b := run("--seed", "1"), run("--seed", "2"); a != greedy || b != greedy {
		t.Errorf("do_sample false: seeds 1 and 2 give %q and %q, want the greedy %q", a, b, greedy)
	}
	// ...but a temperature given as a flag wins: the seeds then differ.
	if a, b := run("--seed", "1", "--temperature", "2"), run("--seed", "2", "--temperature", "2"); a == b {
		t.Errorf("--temperature 2 over do_sample false: seeds 1 and 2 give the same %q", a)
	}
	// A recommended temperature is taken: 0 here is greedy.
	write(`{"do_sample": true, "temperature": 0, "top_k": 5}`)
	if a := run("--seed", "3"); a != greedy {
		t.Errorf("temperature 0 recommended: %q, want the greedy %q", a, greedy)
	}
}

func TestRunErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing dir", []string{"run", "--model", filepath.Join(t.TempDir(), "nope"), "hi"}, 1, "nope"},
		{"bad flag", []string{"run", "--bogus"}, 2, "flag provided but not defined"},
		{"bad size", []string{"run", "--kv-budget", "lots", "hi"}, 2, `invalid value "lots" for flag -kv-budget: "lots" is not a size`},
		{"out of range", []string{"--temperature", "9"}, 2, "invalid value \"9\" for flag -temperature: 9 is out of range [0, 5]"},
		{"bad enum", []string{"run", "--mtp", "maybe"}, 2, `"maybe": want auto, on, off`},
		{"no prompt", []string{"run"}, 2, "no prompt"},
		{"fixture", []string{"run", "--model", fixtures.Dir("llama"), "hi"}, 1, "tokenizer.json: file does not exist: a model directory needs its tokenizer files too (the folders of testdata/models are test fixtures"},
		{"bad quant", []string{"run", "--quant", "q3_k", "hi"}, 2, `invalid value "q3_k" for flag -quant: "q3_k": want "", q8_0, q4_k`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, "", c.args...)
			if code != c.code || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d containing %q", code, errs, c.code, c.want)
			}
			// One line, not the whole usage.
			if n := strings.Count(errs, "\n"); n != 1 || out != "" {
				t.Errorf("%d lines on stderr, stdout %q:\n%s", n, out, errs)
			}
		})
	}
}

// TestMissingModelSameErrorEverywhere: run, the piped chat and tokenize
// say the same about a model folder that does not exist (the chat on a
// terminal resolves --model with the same code before it starts).
func TestMissingModelSameErrorEverywhere(t *testing.T) {
	nope := filepath.Join(t.TempDir(), "nope")
	var msgs []string
	for _, cmd := range [][]string{{"run"}, {}, {"tokenize"}} {
		code, _, errs := runCLI(t, "hi", append(cmd, "--model", nope)...)
		if code != 1 {
			t.Errorf("%v: exit %d, %s", cmd, code, errs)
		}
		_, msg, _ := strings.Cut(errs, ": ")
		msgs = append(msgs, msg)
	}
	if msgs[0] != msgs[1] || msgs[0] != msgs[2] || !strings.Contains(msgs[0], nope+": no such model directory") {
		t.Errorf("messages differ or do not name the folder: %q", msgs)
	}
}

// TestUnknownCommandFails: a word in the command position is not a prompt,
// on a pipe as on a terminal.
func TestUnknownCommandFails(t *testing.T) {
	code, out, errs := runCLI(t, "", "tokenise", "hello")
	if code != 2 || out != "" || !strings.Contains(errs, `unknown command "tokenise"`) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestPipedPromptLosesItsFinalNewline: `echo TEXT | ferrite run` is
// `ferrite run TEXT`; inner line breaks stay.
func TestPipedPromptLosesItsFinalNewline(t *testing.T) {
	dir := fixtureModel(t, "llama")
	args := []string{"run", "--model", dir, "--temperature", "0", "--max-tokens", "6"}
	_, byArg, _ := runCLI(t, "", append(args, "hello there")...)
	code, piped, errs := runCLI(t, "hello there\n", args...)
	if code != 0 || piped != byArg {
		t.Fatalf("exit %d (%s): piped %q, argument %q", code, errs, piped, byArg)
	}
	for in, want := range map[string]string{"a\n\nb\n": "a\n\nb", "a\r\n": "a", "  a  \n": "  a  "} {
		if got, err := promptText(nil, strings.NewReader(in)); err != nil || got != want {
			t.Errorf("promptText(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := promptText(nil, strings.NewReader("\n")); err == nil {
		t.Error("a lone newline is a prompt")
	}
}

// TestRunSaysWhyTheReplyStopped: a reply cut by the KV budget or the
// context before --max-tokens says so and exits 1; one that reaches
// --max-tokens, or the context with --max-tokens 0, exits 0.
func TestRunSaysWhyTheReplyStopped(t *testing.T) {
	dir := fixtureModel(t, "llama")
	base := []string{"run", "--model", dir, "--temperature", "0", "--raw"}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--max-tokens", "5"}, 0, ""},
		{[]string{"--kv-budget", "64KiB", "--max-tokens", "200"}, 1, "the reply was cut: the KV cache holds only"},
		{[]string{"--max-tokens", "600"}, 1, "the reply was cut: prompt and reply filled the model's context of 512 tokens"},
		{[]string{"--max-tokens", "0"}, 0, ""},
	} {
		code, _, errs := runCLI(t, "hello", append(base, c.args...)...)
		if code != c.code || c.want != "" && !strings.Contains(errs, c.want) || c.want == "" && strings.Contains(errs, "cut") {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", c.args, code, errs, c.code, c.want)
		}
	}
}

// TestTokenizeDefaultsToTheBuiltinModel: tokenize opens the model run
// would, the built-in one without --model.
func TestTokenizeDefaultsToTheBuiltinModel(t *testing.T) {
	tok, err := builtin.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "", "tokenize", "What does ephemeral mean?")
	var want []string
	for _, id := range tok.Encode("What does ephemeral mean?", false) {
		want = append(want, strconv.Itoa(int(id)))
	}
	if code != 0 || strings.TrimSpace(out) != strings.Join(want, " ") {
		t.Fatalf("exit %d (%s): %q, want %q", code, errs, out, want)
	}
}

func TestRunPromptFromStdin(t *testing.T) {
	dir := fixtureModel(t, "llama")
	code, out, errs := runCLI(t, "from stdin", "run", "--model", dir, "--temperature", "0", "--max-tokens", "4", "--raw")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(out, "from stdin") {
		t.Fatalf("--raw printed the prompt: %q", out)
	}
	if n := strings.Count(errs, "decode: "); n != 1 {
		t.Fatalf("stderr %q", errs)
	}
}

func TestRunMTPGreedyEqualsPlain(t *testing.T) {
	dir := fixtureModel(t, "qwen3_next")
	base := []string{"run", "--model", dir, "--temperature", "0", "--max-tokens", "10"}
	code, plain, errs := runCLI(t, "", append(base, "--mtp", "off", "tell me")...)
	if code != 0 {
		t.Fatalf("plain: exit %d: %s", code, errs)
	}
	code, spec, errs := runCLI(t, "", append(base, "--mtp", "on", "--draft", "2", "tell me")...)
	if code != 0 {
		t.Fatalf("mtp: exit %d: %s", code, errs)
	}
	if spec != plain {
		t.Fatalf("speculative output %q differs from plain %q", spec, plain)
	}
	if !strings.Contains(errs, "mtp:") {
		t.Fatalf("no MTP stats on stderr: %q", errs)
	}
}

func TestRunMTPFlagErrors(t *testing.T) {
	dir := fixtureModel(t, "llama")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--mtp", "on"}, "no MTP module"},
		{[]string{"--mtp", "maybe"}, `invalid value "maybe" for flag -mtp: "maybe": want auto, on, off`},
	} {
		args := append([]string{"run", "--model", dir, "--max-tokens", "2"}, c.args...)
		code, _, errs := runCLI(t, "", append(args, "hi")...)
		if wantCode := 1 + strings.Count(c.want, "invalid value"); code != wantCode || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}

// TestRunQuantizedBuiltin runs the built-in model with its weights
// quantized on load: greedy, it still introduces itself (measured: the
// same 30 tokens as bf16 with q8_0 and q4_k).
func TestRunQuantizedBuiltin(t *testing.T) {
	for _, q := range []string{"q8_0", "q4_k"} {
		code, out, errs := runCLI(t, "", "run", "--quant", q, "--temperature", "0", "--max-tokens", "12", "Who are you?")
		if code != 0 {
			t.Fatalf("--quant %s: exit %d: %s", q, code, errs)
		}
		if !strings.Contains(out, "ferrite-tiny") {
			t.Errorf("--quant %s: the built-in model did not introduce itself: %q", q, out)
		}
	}
}

func TestRunDefaultsToBuiltinModel(t *testing.T) {
	code, out, errs := runCLI(t, "", "run", "--temperature", "0", "--max-tokens", "40", "Who are you?")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "ferrite-tiny") {
		t.Fatalf("the built-in model did not introduce itself: %q", out)
	}
}

func TestRunMTPOffByDefault(t *testing.T) {
	dir := fixtureModel(t, "qwen3_next")
	code, _, errs := runCLI(t, "", "run", "--model", dir, "--temperature", "0", "--max-tokens", "6", "hi")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(errs, "mtp:") {
		t.Fatalf("speculative decoding ran without --mtp: %q", errs)
	}
}

// TestRunDevice checks --device: cpu runs, a malformed spec is refused, and
// cuda on a machine without a usable GPU fails with one line that says why.
func TestRunDevice(t *testing.T) {
	dir := fixtureModel(t, "qwen3")
	args := []string{"run", "--model", dir, "--temperature", "0", "--max-tokens", "2", "hi"}
	if code, out, errs := runCLI(t, "", append([]string{args[0], "--device", "cpu"}, args[1:]...)...); code != 0 || out == "" {
		t.Fatalf("--device cpu: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runCLI(t, "", append([]string{args[0], "--device", "tpu"}, args[1:]...)...); code != 2 || !strings.Contains(errs, `-device: "tpu": want auto, cpu, cuda or cuda:N`) {
		t.Fatalf("--device tpu: exit %d, stderr %q", code, errs)
	}
	if gpu, err := device.Open(device.Spec{Kind: device.CUDA}, 1); err == nil {
		gpu.Close()
		t.Skip("a GPU is present")
	}
	code, _, errs := runCLI(t, "", append([]string{args[0], "--device", "cuda"}, args[1:]...)...)
	if code != 1 || !strings.Contains(errs, "cuda: ") || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
		t.Fatalf("--device cuda without a GPU: exit %d, stderr %q; want exit 1 and one line", code, errs)
	}
	t.Logf("--device cuda: %s", errs)
}
