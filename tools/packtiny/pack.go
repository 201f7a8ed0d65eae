package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/ggufwrite"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/device"
)

// ggmlTypes are the GGML type ids of the dtypes a packed tensor may have.
var ggmlTypes = map[kernels.DType]uint32{
	kernels.F32: ggufwrite.F32, kernels.F16: ggufwrite.F16, kernels.BF16: ggufwrite.BF16,
	kernels.Q8_0: ggufwrite.Q8_0, kernels.Q4_0: ggufwrite.Q4_0, kernels.Q4K: ggufwrite.Q4K,
	kernels.Q5K: ggufwrite.Q5K, kernels.Q6K: ggufwrite.Q6K,
}

// fileTypes is general.file_type (llama_ftype) of each quantization.
var fileTypes = map[string]uint32{"q8_0": 7, "q4_k": 15}

// Pack builds the model of the checkpoint directory dir (config.json and
// safetensors) with its matrices quantized as quant says (engine's
// Options.Quant, which decides which matrices and to what type) and returns
// the GGUF file holding every tensor the model read, under the checkpoint's
// names and in the form it read them: matrices in their quantized type
// (those engine keeps, such as MoE router gates, in their stored one),
// vectors and other small tensors (norms, biases) in F32. Tensors the model
// never reads (a vision tower) are left out.
func Pack(dir, quant, name string, threads int) ([]byte, error) {
	ft, ok := fileTypes[quant]
	if !ok {
		return nil, fmt.Errorf("quantization %q: want q8_0 or q4_k", quant)
	}
	cfgData, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse(filepath.Join(dir, "config.json"), cfgData)
	if err != nil {
		return nil, err
	}
	set, err := weights.Open(dir)
	if err != nil {
		return nil, err
	}
	defer set.Close()
	be, err := device.Open(device.Spec{Kind: device.CPU}, threads)
	if err != nil {
		return nil, err
	}
	defer be.Close()
	q, err := engine.Quantized(set, quant, be.Backend)
	if err != nil {
		return nil, err
	}
	rec := newRecorder(q, set)
	if _, err := model.New(cfg, rec, be.Backend); err != nil {
		return nil, err
	}
	sum, err := checkpointSum(set)
	if err != nil {
		return nil, err
	}
	w := &ggufwrite.Writer{}
	w.Add("general.architecture", cfg.ModelType)
	w.Add("general.name", name)
	w.Add("general.file_type", ft)
	w.Add("general.quantization_version", uint32(2))
	w.Add(gguf.TensorNamesKey, gguf.TensorNamesCheckpoint)
	w.Add("ferrite.checkpoint_sha256", sum)
	if w.Tensors, err = rec.tensors(); err != nil {
		return nil, err
	}
	return w.Bytes(), nil
}

// checkpointSum is the SHA-256 of the checkpoint's safetensors files, in
// name order, to tell later which checkpoint a file was packed from.
func checkpointSum(set *weights.Set) (string, error) {
	files, err := filepath.Glob(filepath.Join(set.Dir(), "*.safetensors"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// recorder is a model.WeightSource that hands out what src gives and keeps
// every tensor the model asks for, as it asked for it.
type recorder struct {
	src model.WeightSource
	set *weights.Set // the stored shapes (how many experts a stack holds)

	mu    sync.Mutex
	got   map[string]*recorded
	order []string // names in the order first read
	has   map[string]bool
}

// recorded is one tensor read by the model: its GGML type and ne (innermost
// first), and its bytes, or each expert's for a stack read with Expert.
type recorded struct {
	typ     uint32
	dims    []uint64
	data    []byte
	experts [][]byte
}

func newRecorder(src model.WeightSource, set *weights.Set) *recorder {
	return &recorder{src: src, set: set, got: map[string]*recorded{}, has: map[string]bool{}}
}

func (r *recorder) Has(name string) bool {
	ok := r.src.Has(name)
	r.mu.Lock()
	r.has[name] = r.has[name] || ok
	r.mu.Unlock()
	return ok
}

func (r *recorder) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := r.src.Mat(name, rows, cols)
	if err != nil {
		return nil, err
	}
	typ, err := ggmlType(name, m)
	if err != nil {
		return nil, err
	}
	return m, r.keep(name, &recorded{typ: typ, dims: []uint64{uint64(cols), uint64(rows)}, data: m.Data})
}

func (r *recorder) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	m, err := r.src.Expert(name, e, rows, cols)
	if err != nil {
		return nil, err
	}
	typ, err := ggmlType(name, m)
	if err != nil {
		return nil, err
	}
	t, err := r.set.Tensor(name)
	if err != nil {
		return nil, err
	}
	n := t.Shape[0]
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []uint64{uint64(cols), uint64(rows), uint64(n)}
	g, ok := r.got[name]
	if !ok {
		g = &recorded{typ: typ, dims: want, experts: make([][]byte, n)}
		r.got[name] = g
		r.order = append(r.order, name)
	}
	if g.experts == nil || g.typ != typ || !slices.Equal(g.dims, want) {
		return nil, fmt.Errorf("tensor %s: read as expert %d of a %v %d stack, and before as %v %d", name, e, want, typ, g.dims, g.typ)
	}
	g.experts[e] = m.Data
	return m, nil
}

func (r *recorder) Float32(name string, shape ...int) ([]float32, error) {
	v, err := r.src.Float32(name, shape...)
	if err != nil {
		return nil, err
	}
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		dims[len(shape)-1-i] = uint64(d)
	}
	return v, r.keep(name, &recorded{typ: ggufwrite.F32, dims: dims, data: ggufwrite.EncodeF32(v)})
}

// keep records t, which must equal what an earlier read of name recorded.
func (r *recorder) keep(name string, t *recorded) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.got[name]; ok {
		if g.typ != t.typ || !slices.Equal(g.dims, t.dims) || !slices.Equal(g.data, t.data) {
			return fmt.Errorf("tensor %s: read twice in different forms (type %d ne %v, then type %d ne %v)", name, g.typ, g.dims, t.typ, t.dims)
		}
		return nil
	}
	r.got[name] = t
	r.order = append(r.order, name)
	return nil
}

// tensors returns the recorded tensors in the order first read. Every
// tensor the model found with Has must have been read: a file without it
// would build another model.
func (r *recorder) tensors() ([]ggufwrite.Tensor, error) {
	for name, ok := range r.has {
		if _, read := r.got[name]; ok && !read {
			return nil, fmt.Errorf("tensor %s: the model asked whether it exists but never read it", name)
		}
	}
	out := make([]ggufwrite.Tensor, 0, len(r.order))
	for _, name := range r.order {
		g := r.got[name]
		data := g.data
		if g.experts != nil {
			for e, d := range g.experts {
				if d == nil {
					return nil, fmt.Errorf("tensor %s: expert %d was never read", name, e)
				}
			}
			data = slices.Concat(g.experts...)
		}
		out = append(out, ggufwrite.Tensor{Name: name, Type: g.typ, Dims: g.dims, Data: data})
	}
	return out, nil
}

func ggmlType(name string, m *kernels.Mat) (uint32, error) {
	t, ok := ggmlTypes[m.DType]
	if !ok {
		return 0, fmt.Errorf("tensor %s: dtype %v has no GGUF type here", name, m.DType)
	}
	return t, nil
}
