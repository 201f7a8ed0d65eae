package engine

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/linattn"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/fixtures"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
)

// ggufFixtures are the fixtures with a llama.cpp conversion.
var ggufFixtures = []string{"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe", "glm4_moe_lite", "qwen3_next", "deepseek_v32", "glm_moe_dsa"}

// writeGGUF converts fixture name to a GGUF file of type typ in a temporary
// directory and returns its path.
func writeGGUF(t *testing.T, name string, typ uint32) string {
	t.Helper()
	w, err := ggufwrite.Convert(fixtures.Dir(name), typ)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// promptRun is a model's logits for a fixture's prompt and its greedy
// continuation.
type promptRun struct {
	logits []float32
	greedy []int32
}

// loadAndRun loads the model at path, runs prompt through it as runPrompt
// does, and closes it.
func loadAndRun(t *testing.T, path string, opts Options, prompt []int32, steps int) promptRun {
	t.Helper()
	l, err := Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return runPrompt(t, l, prompt, steps)
}

func runPrompt(t *testing.T, l *Loaded, prompt []int32, steps int) promptRun {
	t.Helper()
	m := l.Model
	c, err := l.NewCache(int64(len(prompt)+steps+16)*m.Info().KVBytesPerToken, 16)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSeq()
	// Linear-attention models keep a recurrent state per sequence.
	var states *linattn.StatePool
	var slot *linattn.Slot
	if sm, ok := m.(model.StateModel); ok {
		if states, err = model.NewStatePool(sm, 1<<24); err != nil {
			t.Fatal(err)
		}
		if slot, err = states.Alloc(); err != nil {
			t.Fatal(err)
		}
	}
	step := func(s *kvcache.Seq, toks []int32, mode model.Logits) []float32 {
		pos := s.Len()
		if err := c.Reserve(s, pos+len(toks)); err != nil {
			t.Fatal(err)
		}
		out, err := m.Forward(&model.Batch{Cache: c, States: states, Seqs: []model.Seq{{Tokens: toks, Pos: pos, KV: s, State: slot, Logits: mode}}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Seqs[0].Logits
	}
	r := promptRun{logits: step(s, prompt, model.AllLogits)}
	vocab := m.Info().Vocab
	next := fixtures.Argmax(r.logits[len(r.logits)-vocab:])
	for range steps {
		r.greedy = append(r.greedy, next)
		next = fixtures.Argmax(step(s, []int32{next}, model.LastLogits))
	}
	return r
}

// f16Checkpoint writes a copy of the fixture checkpoint in dir with its
// matrices in F16 (routers, convolutions, norms and biases F32, as in GGUF
// conversions).
func f16Checkpoint(t *testing.T, dir string) string {
	t.Helper()
	set, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	var ts []weights.WriteTensor
	for _, name := range set.Names() {
		x, err := set.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		dt := kernels.F32
		if len(x.Shape) >= 2 && !strings.HasSuffix(name, "gate.weight") && !strings.Contains(name, "conv1d") {
			dt = kernels.F16
		}
		ts = append(ts, weights.Encode(name, dt, x.Shape, ggufwrite.DecodeF32(x.Data)))
	}
	out := t.TempDir()
	if err := weights.WriteFile(filepath.Join(out, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGGUFFixtures converts each fixture to GGUF, in F32 and in F16, and
// checks the model built from the file against the one built from the
// same weights in safetensors: identical logits and greedy tokens (llama's
// logits only within float rounding: its RoPE scaling arrives as
// llama.cpp's rope_freqs factors rather than the llama3 parameters). Both
// run with a float32 KV cache, so that a BF16 cache's rounding does not
// magnify that difference.
func TestGGUFFixtures(t *testing.T) {
	for _, name := range ggufFixtures {
		t.Run(name, func(t *testing.T) {
			fx, err := fixtures.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			prompt, _, err := fx.Ints("prompt_ids")
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				typ uint32
				dir string
			}{{ggufwrite.F32, fx.Dir}, {ggufwrite.F16, f16Checkpoint(t, fx.Dir)}} {
				ref, err := Load(tc.dir, Options{Threads: 2, KVFloat32: true})
				if err != nil {
					t.Fatal(err)
				}
				want := runPrompt(t, ref, prompt, 12)
				_, refMTP := ref.Model.(model.MTPModel)
				ref.Close()
				path := writeGGUF(t, name, tc.typ)
				l, err := Load(path, Options{Threads: 2, KVFloat32: true})
				if err != nil {
					t.Fatal(err)
				}
				got := runPrompt(t, l, prompt, 12)
				if _, mtp := l.Model.(model.MTPModel); mtp != refMTP {
					t.Errorf("type %d: MTP module %v, safetensors %v", tc.typ, mtp, refMTP)
				}
				l.Close()
				rel, abs := fixtures.RelErr(got.logits, want.logits)
				t.Logf("type %d: logits max abs error %.3g, relative %.3g", tc.typ, abs, rel)
				tol := 0.0
				if name == "llama" {
					tol = 1e-5
				}
				if rel > tol {
					t.Errorf("type %d: logits relative error %.3g > %g", tc.typ, rel, tol)
				}
				if !slices.Equal(got.greedy, want.greedy) {
					t.Errorf("type %d: greedy tokens\n got %v\nwant %v", tc.typ, got.greedy, want.greedy)
				}
			}
		})
	}
}

// TestGGUFBF16 converts the bf16 fixture to a BF16 GGUF file (norms in F32,
// as llama.cpp writes them): the same logits as its safetensors.
func TestGGUFBF16(t *testing.T) {
	fx, err := fixtures.Load("qwen3-bf16")
	if err != nil {
		t.Fatal(err)
	}
	prompt, _, _ := fx.Ints("prompt_ids")
	want := loadAndRun(t, fx.Dir, Options{Threads: 2}, prompt, 8)
	l, err := Load(writeGGUF(t, "qwen3-bf16", ggufwrite.BF16), Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if q := l.GGUF.Quantization(); q != "BF16" {
		t.Errorf("quantization %q", q)
	}
	got := runPrompt(t, l, prompt, 8)
	if rel, _ := fixtures.RelErr(got.logits, want.logits); rel != 0 || !slices.Equal(got.greedy, want.greedy) {
		t.Errorf("relative error %.3g, greedy %v want %v", rel, got.greedy, want.greedy)
	}
}

// TestGGUFFusedExperts loads MoE fixtures converted with fused gate and up
// expert tensors (ffn_gate_up_exps): the same logits as the safetensors.
func TestGGUFFusedExperts(t *testing.T) {
	for _, name := range []string{"qwen3_moe", "glm4_moe"} {
		fx, err := fixtures.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		prompt, _, _ := fx.Ints("prompt_ids")
		want := loadAndRun(t, fx.Dir, Options{Threads: 2}, prompt, 8)
		w, err := ggufwrite.Convert(fx.Dir, ggufwrite.F32)
		if err != nil {
			t.Fatal(err)
		}
		w.FuseGateUpExperts()
		path := filepath.Join(t.TempDir(), "fused.gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if _, ok := w.Find("blk.1.ffn_gate_up_exps.weight"); !ok {
			t.Fatal("no fused tensor written")
		}
		l, err := Load(path, Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		got := runPrompt(t, l, prompt, 8)
		l.Close()
		if rel, _ := fixtures.RelErr(got.logits, want.logits); rel != 0 || !slices.Equal(got.greedy, want.greedy) {
			t.Errorf("%s: relative error %.3g, greedy %v want %v", name, rel, got.greedy, want.greedy)
		}
	}
}

// TestGGUFQ8_0 converts every fixture to a Q8_0 GGUF file (ggml's reference
// quantizer, in internal/ggufwrite) and checks it against the same
// safetensors quantized as they load (Options.Quant "q8_0"): the same
// blocks read in place give the same logits and greedy tokens. Llama's
// logits differ a little: its RoPE scaling arrives as rope_freqs, and the
// last-bit differences in q and k move some roundings of the activations,
// which the int8 kernels quantize.
func TestGGUFQ8_0(t *testing.T) {
	for _, name := range ggufFixtures {
		t.Run(name, func(t *testing.T) {
			fx, err := fixtures.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			prompt, _, _ := fx.Ints("prompt_ids")
			want := loadAndRun(t, fx.Dir, Options{Threads: 2, Quant: "q8_0"}, prompt, 12)
			l, err := Load(writeGGUF(t, name, ggufwrite.Q8_0), Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			if q := l.GGUF.Quantization(); q != "Q8_0" {
				t.Errorf("quantization %q", q)
			}
			got := runPrompt(t, l, prompt, 12)
			l.Close()
			rel, abs := fixtures.RelErr(got.logits, want.logits)
			t.Logf("logits max abs error %.3g, relative %.3g", abs, rel)
			tol := 0.0
			if name == "llama" {
				tol = 2e-2
			}
			if rel > tol || !slices.Equal(got.greedy, want.greedy) {
				t.Errorf("relative error %.3g > %g, greedy %v want %v", rel, tol, got.greedy, want.greedy)
			}
		})
	}
}

// TestLoadCheckpointGGUF loads a directory holding config.json and, instead
// of safetensors, a GGUF file with the checkpoint's tensor names (as
// builtin/model holds the built-in model): the same logits as the
// safetensors checkpoint. Without gguf.TensorNamesKey the file is not
// taken for the checkpoint's weights.
func TestLoadCheckpointGGUF(t *testing.T) {
	fx := fixtures.Dir("qwen3")
	set, err := weights.Open(fx)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	w := &ggufwrite.Writer{}
	for _, name := range set.Names() {
		x, err := set.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if x.DType != kernels.F32 {
			t.Fatalf("%s: %v, want the fixture's F32", name, x.DType)
		}
		dims := make([]uint64, len(x.Shape))
		for i, d := range x.Shape {
			dims[len(dims)-1-i] = uint64(d)
		}
		w.Tensors = append(w.Tensors, ggufwrite.Tensor{Name: name, Type: ggufwrite.F32, Dims: dims, Data: x.Data})
	}
	write := func(marked bool) string {
		dir := t.TempDir()
		cfg, err := os.ReadFile(filepath.Join(fx, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		w.KV = nil
		if marked {
			w.Add(gguf.TensorNamesKey, gguf.TensorNamesCheckpoint)
		}
		if err := w.WriteFile(filepath.Join(dir, "model.gguf")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	fxt, err := fixtures.Load("qwen3")
	if err != nil {
		t.Fatal(err)
	}
	prompt, _, err := fxt.Ints("prompt_ids")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Load(write(true), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ref, err := Load(fx, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if l.GGUF == nil || l.Weights != nil {
		t.Error("the model was not built from the GGUF file")
	}
	got, want := runPrompt(t, l, prompt, 4), runPrompt(t, ref, prompt, 4)
	if !slices.Equal(got.logits, want.logits) || !slices.Equal(got.greedy, want.greedy) {
		t.Error("the checkpoint GGUF's logits differ from the safetensors checkpoint's")
	}
	if _, err := Load(write(false), Options{Threads: 1}); err == nil || !strings.Contains(err.Error(), "safetensors") {
		t.Errorf("a GGUF file with llama.cpp's names beside config.json: %v, want the missing safetensors", err)
	}
}

// TestGGUFKVBParts: an MLA model whose GGUF stores attn_k_b as F16 and
// attn_v_b as Q8_0 (llama-quantize quantizes them, in a fallback type
// where a row is not whole K-quant blocks) runs its absorbed attention (decode) on those tensors as stored
// (Mat.KVB) instead of a float32 split of the rebuilt kv_b_proj: decode
// logits within 1e-2 of the same file with the halves' values stored as
// F32 (the split), yet not the same bits (the parts ran), the prompt's
// (the naive form) the same. FERRITE_TEST_DEVICE=cuda runs both on the
// GPU, whose attention is absorbed for the prompt too (kvbWeights): the
// prompt's logits within 1e-2 there.
func TestGGUFKVBParts(t *testing.T) {
	fx, err := fixtures.Load("glm4_moe_lite")
	if err != nil {
		t.Fatal(err)
	}
	prompt, _, _ := fx.Ints("prompt_ids")
	parts, plain := mixedKVB(t, "glm4_moe_lite"), mixedKVB(t, "glm4_moe_lite")
	for i, tn := range parts.Tensors {
		if !strings.Contains(tn.Name, "attn_k_b") && !strings.Contains(tn.Name, "attn_v_b") {
			continue
		}
		vals := ggufwrite.DecodeF32(tn.Data)
		if strings.Contains(tn.Name, "attn_k_b") {
			parts.Tensors[i].Type, parts.Tensors[i].Data = ggufwrite.F16, weights.NewTensor(kernels.F16, []int{len(vals)}, vals).Data
			(&kernels.Mat{DType: kernels.F16, Rows: 1, Cols: len(vals), Data: parts.Tensors[i].Data}).RowF32(vals, 0)
		} else {
			parts.Tensors[i].Type, parts.Tensors[i].Data = ggufwrite.Q8_0, ggufwrite.QuantizeQ8_0(vals)
			(&kernels.Mat{DType: kernels.Q8_0, Rows: 1, Cols: len(vals), Data: parts.Tensors[i].Data}).RowF32(vals, 0)
		}
		plain.Tensors[i].Data = ggufwrite.EncodeF32(vals) // the same values, F32
	}
	load := func(w *ggufwrite.Writer, file string) *Loaded {
		path := filepath.Join(t.TempDir(), file)
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		l, err := Load(path, Options{Threads: 2, Device: os.Getenv("FERRITE_TEST_DEVICE")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	lp, lq := load(parts, "parts.gguf"), load(plain, "plain.gguf")
	onCPU := lp.Device == "" || strings.HasPrefix(lp.Device, "cpu")
	t.Logf("device: %s", lp.Device)
	ep, eq := modeltest.NewEnv(t, lp.Model, 16, 128, 1), modeltest.NewEnv(t, lq.Model, 16, 128, 1)
	sp, sq := ep.NewSeq(t), eq.NewSeq(t)
	got, want := ep.Step(t, sp, prompt, model.LastLogits), eq.Step(t, sq, prompt, model.LastLogits)
	if !onCPU {
		modeltest.Compare(t, "prompt logits", got, want, 1e-2)
	} else if !slices.Equal(got, want) {
		t.Errorf("prompt logits differ (the naive form does not use the parts)")
	}
	worst, same := 0.0, true
	next := fixtures.Argmax(want)
	for range 8 {
		got, want = ep.Step(t, sp, []int32{next}, model.LastLogits), eq.Step(t, sq, []int32{next}, model.LastLogits)
		worst = max(worst, modeltest.Compare(t, "decode logits", got, want, 1e-2))
		same = same && slices.Equal(got, want)
		next = fixtures.Argmax(want)
	}
	t.Logf("decode logits: largest relative error %.3g", worst)
	if same {
		t.Error("decode logits have the float32 split's bits: the stored parts did not run")
	}
}

// mixedKVB converts fixture name to an F32 GGUF (its attn_k_b and
// attn_v_b F32 too).
func mixedKVB(t *testing.T, name string) *ggufwrite.Writer {
	t.Helper()
	w, err := ggufwrite.Convert(fixtures.Dir(name), ggufwrite.F32)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
