package engine

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/internal/modeltest"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// recorder is a weight source that hands out random tensors and remembers
// them, so that they can be written out as a checkpoint.
type recorder struct {
	*randweights.Source
	mu      sync.Mutex
	mats    map[string]*kernels.Mat
	experts map[string][]*kernels.Mat
	vecs    map[string]weights.WriteTensor
}

func (r *recorder) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := r.Source.Mat(name, rows, cols)
	if err == nil {
		r.mu.Lock()
		r.mats[name] = m
		r.mu.Unlock()
	}
	return m, err
}

func (r *recorder) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	m, err := r.Source.Expert(name, e, rows, cols)
	if err == nil {
		r.mu.Lock()
		for len(r.experts[name]) <= e {
			r.experts[name] = append(r.experts[name], nil)
		}
		r.experts[name][e] = m
		r.mu.Unlock()
	}
	return m, err
}

func (r *recorder) Float32(name string, shape ...int) ([]float32, error) {
	v, err := r.Source.Float32(name, shape...)
	if err == nil {
		r.mu.Lock()
		r.vecs[name] = weights.Encode(name, kernels.F32, shape, v)
		r.mu.Unlock()
	}
	return v, err
}

func (r *recorder) write(t *testing.T, path string) {
	var ts []weights.WriteTensor
	for name, m := range r.mats {
		ts = append(ts, weights.WriteTensor{Name: name, DType: m.DType, Shape: []int{m.Rows, m.Cols}, Data: m.Data})
	}
	for name, ms := range r.experts {
		var data []byte
		for _, m := range ms {
			data = append(data, m.Data...)
		}
		ts = append(ts, weights.WriteTensor{Name: name, DType: ms[0].DType, Shape: []int{len(ms), ms[0].Rows, ms[0].Cols}, Data: data})
	}
	for _, v := range r.vecs {
		ts = append(ts, v)
	}
	if err := weights.WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
}

const tinyMoE = `{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "bfloat16",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 8, "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 4,
  "num_experts_per_tok": 2, "mlp_only_layers": [0], "norm_topk_prob": true,
  "vocab_size": 50, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000,
  "tie_word_embeddings": true
}`

// TestLoadCheckpoint writes a random model to disk as a checkpoint, loads it
// back through Load and checks both give the same logits.
func TestLoadCheckpoint(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyMoE), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Source: randweights.New(9, kernels.BF16), mats: map[string]*kernels.Mat{},
		experts: map[string][]*kernels.Mat{}, vecs: map[string]weights.WriteTensor{}}
	be := cpu.New(2)
	defer be.Close()
	mem, err := model.New(cfg, rec, be)
	if err != nil {
		t.Fatal(err)
	}
	SetActivationPrecision(be, mem) // as Load does for its model
	rec.write(t, filepath.Join(dir, "model.safetensors"))

	l, err := Load(dir, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Model.Info(); got.Arch != "qwen3_moe" || got.Vocab != 50 || got.Hidden != 32 || got.Layers != 2 {
		t.Fatalf("info %+v", got)
	}
	prompt := []int32{1, 7, 3, 49, 0, 22}
	run := func(m model.Model) []float32 {
		c := modeltest.NewCache(t, m, 8)
		s := c.NewSeq()
		if err := c.Reserve(s, len(prompt)); err != nil {
			t.Fatal(err)
		}
		out, err := m.Forward(&model.Batch{Cache: c, Seqs: []model.Seq{{Tokens: prompt, KV: s, Logits: model.AllLogits}}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Seqs[0].Logits
	}
	modeltest.Compare(t, "loaded vs in-memory", run(l.Model), run(mem), 1e-6)

	before := l.Memory()
	cache, err := l.NewCache(1<<20, 0)
	if err != nil || cache.BlockSize() != 16 {
		t.Fatalf("NewCache: %v", err)
	}
	checkMemory(t, l, rec, before.Tensors+cache.Stats().BytesTotal)
	runtime.KeepAlive(cache) // the CPU counts live tensors
}

// checkMemory checks Loaded.Memory on the CPU: the weights are what the
// recorder handed the in-memory model (each tensor once, norms as float32),
// the tensors include the KV cache.
func checkMemory(t *testing.T, l *Loaded, rec *recorder, minTensors int64) {
	t.Helper()
	var want int64
	for _, m := range rec.mats {
		want += int64(len(m.Data))
	}
	for _, ms := range rec.experts {
		for _, m := range ms {
			want += int64(len(m.Data))
		}
	}
	for _, v := range rec.vecs {
		want += int64(len(v.Data))
	}
	u := l.Memory()
	if u.OnDevice || u.Weights != want || u.Tensors < minTensors || u.Total != 0 {
		t.Errorf("Memory = %+v, want host weights of %d bytes and at least %d bytes of tensors", u, want, minTensors)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := strings.Replace(tinyMoE, `"qwen3_moe"`, `"gpt_neo"`, 1)
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)
	_, err := Load(dir, Options{RandomWeights: true})
	if err == nil || !strings.Contains(err.Error(), `unsupported model_type "gpt_neo"`) {
		t.Fatalf("unsupported arch: %v", err)
	}
	for _, arch := range []string{"llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe"} {
		if !strings.Contains(err.Error(), arch) || !slices.Contains(model.Supported(), arch) {
			t.Errorf("%s not listed as supported: %v", arch, err)
		}
	}

	// A config missing a required key names it.
	cfg = strings.Replace(tinyMoE, `"num_experts": 4,`, ``, 1)
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)
	if _, err := Load(dir, Options{RandomWeights: true}); err == nil || !strings.Contains(err.Error(), "num_experts") {
		t.Fatalf("missing key: %v", err)
	}

	// A checkpoint with a misshapen tensor names it, and its shape.
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyMoE), 0o644)
	c, _ := config.Load(dir)
	rec := &recorder{Source: randweights.New(9, kernels.BF16), mats: map[string]*kernels.Mat{},
		experts: map[string][]*kernels.Mat{}, vecs: map[string]weights.WriteTensor{}}
	if _, err := model.New(c, rec, cpu.New(1)); err != nil {
		t.Fatal(err)
	}
	rec.vecs["model.norm.weight"] = weights.Encode("model.norm.weight", kernels.F32, []int{31}, make([]float32, 31))
	rec.write(t, filepath.Join(dir, "model.safetensors"))
	_, err = Load(dir, Options{Threads: 1})
	if err == nil || !strings.Contains(err.Error(), `"model.norm.weight"`) || !strings.Contains(err.Error(), "[32]") {
		t.Fatalf("bad checkpoint: %v", err)
	}
	t.Log(err)
}

// failingBackend is a CPU backend whose device has failed.
type failingBackend struct {
	*cpu.Backend
	err error
}

func (f failingBackend) Err() error { return f.err }

// TestLoadDevice checks Options.Device (a malformed spec is an error, cpu
// names itself) and DeviceErr (nil on the CPU, the backend's failure
// otherwise).
func TestLoadDevice(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyMoE), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, Options{RandomWeights: true, Device: "tpu"}); err == nil || !strings.Contains(err.Error(), `"tpu"`) {
		t.Fatalf("Device tpu: %v", err)
	}
	l, err := Load(dir, Options{RandomWeights: true, Device: "cpu", Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if l.Device != "cpu (1 thread)" || l.DeviceNote != "" || l.DeviceErr() != nil {
		t.Errorf("cpu: device %q, note %q, err %v", l.Device, l.DeviceNote, l.DeviceErr())
	}
	l.Close()
	be := failingBackend{cpu.New(1), errors.New("cuda: CUDA_ERROR_ILLEGAL_ADDRESS")}
	defer be.Close()
	l, err = Load(dir, Options{RandomWeights: true, Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.DeviceErr() != be.err {
		t.Errorf("DeviceErr = %v, want the backend's", l.DeviceErr())
	}
	dev := deviceMemBackend{cpu.New(1), kernels.MemoryUse{OnDevice: true, Weights: 7 << 30, Tensors: 1 << 30, Total: 139 << 30, Free: 120 << 30}}
	defer dev.Close()
	if l, err = Load(dir, Options{RandomWeights: true, Backend: dev}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if u := l.Memory(); u != dev.use {
		t.Errorf("Memory on a device = %+v, want the backend's %+v", u, dev.use)
	}
}

// deviceMemBackend is a CPU backend that reports device memory, as a GPU's
// does.
type deviceMemBackend struct {
	*cpu.Backend
	use kernels.MemoryUse
}

func (d deviceMemBackend) MemoryUse() kernels.MemoryUse { return d.use }
