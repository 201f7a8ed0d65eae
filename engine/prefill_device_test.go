package engine

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
)

// prefillTol bounds each logit row's max |device − CPU| over the largest
// CPU logit in TestPrefillOnDevice. Both run the same bf16 weights and BF16
// cache; the device also rounds activations to bf16 for its large products
// (cuBLASLt from 256 rows, the tensor-core prefill attention: each input
// within 2⁻⁹), which the two layers carry into the logits.
const prefillTol = 2e-2

// TestPrefillOnDevice runs a 300-token prompt through a random Qwen3-shaped
// model at head dim 128 with GQA (the shape the GPU's prefill attention
// kernel takes) on FERRITE_TEST_DEVICE, in one step and as chunks of 100
// and 200 tokens, and checks every row's logits against the CPU backend
// on the same weights: a causal mask, position or block-table mistake
// moves the rows far beyond prefillTol (on the CPU, letting every row see
// one key too many moves rows 0 / 100 / 298 by 0.73 / 0.11 / 0.08 of the
// largest logit).
func TestPrefillOnDevice(t *testing.T) {
	dev := testGPU(t)
	dir := configDir(t, `{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128, "hidden_size": 512,
		"intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
		"vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
		"tie_word_embeddings": true, "torch_dtype": "bfloat16"}`)
	load := func(device string) *Loaded {
		l, err := Load(dir, Options{Threads: 2, RandomWeights: true, Seed: 7, Device: device})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	const n = 300
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(1024))
	}
	// logits returns every row's logits of the prompt fed in chunks.
	logits := func(l *Loaded, chunks ...int) []float32 {
		c, err := l.NewCache(int64(n+64)*l.Model.Info().KVBytesPerToken, 16)
		if err != nil {
			t.Fatal(err)
		}
		s := c.NewSeq()
		var all []float32
		pos := 0
		for _, k := range chunks {
			if err := c.Reserve(s, pos+k); err != nil {
				t.Fatal(err)
			}
			out, err := l.Model.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: prompt[pos : pos+k], Pos: pos, KV: s, Logits: model.AllLogits}}})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, out.Seqs[0].Logits...)
			pos += k
		}
		if err := l.DeviceErr(); err != nil {
			t.Fatal(err)
		}
		return all
	}
	want := logits(load(""), n)
	gpu := load(dev)
	var maxRef float64
	for _, v := range want {
		maxRef = max(maxRef, math.Abs(float64(v)))
	}
	vocab := len(want) / n
	for _, chunks := range [][]int{{n}, {100, 200}} {
		got := logits(gpu, chunks...)
		rel, _ := fixtures.RelErr(got, want)
		t.Logf("%s, chunks %v: max relative error %.3g (tol %g per row)", gpu.Device, chunks, rel, prefillTol)
		bad := 0
		for r := range n {
			if _, a := fixtures.RelErr(got[r*vocab:(r+1)*vocab], want[r*vocab:(r+1)*vocab]); !(a <= prefillTol*maxRef) {
				if bad++; bad <= 3 {
					t.Errorf("chunks %v: row %d off by %.3g·max|logit|", chunks, r, a/maxRef)
				}
			}
		}
		if bad > 3 {
			t.Errorf("chunks %v: %d of %d rows off", chunks, bad, n)
		}
	}
}

// testGPU returns the device FERRITE_TEST_DEVICE names and skips the test
// where it names no GPU.
func testGPU(t *testing.T) string {
	t.Helper()
	dev := os.Getenv("FERRITE_TEST_DEVICE")
	if dev == "" || strings.HasPrefix(dev, "cpu") {
		t.Skip("FERRITE_TEST_DEVICE names no GPU")
	}
	return dev
}

// configDir returns a temporary model directory holding config.json cfg
// (for RandomWeights).
func configDir(t *testing.T, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
