package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/kvcache"
	"github.com/ferrite-llm/ferrite/engine/model"
	_ "github.com/ferrite-llm/ferrite/engine/models/all" // register every architecture
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/device"
)

// Options control Load.
type Options struct {
	// Threads is the CPU backend's worker count; 0 means one per CPU.
	Threads int
	// Device chooses the backend Load starts: "auto", "cpu", "cuda" or
	// "cuda:N" (package kernels/device); "" is "cpu".
	Device string
	// Backend, when set, is used instead of starting one (and is not
	// closed by Loaded.Close).
	Backend kernels.Backend
	// RandomWeights builds the model from config.json (or a GGUF file's
	// metadata) alone with seeded random tensors (benchmarks, smoke tests);
	// no weights are read.
	RandomWeights bool
	// Seed seeds the random weights.
	Seed uint64
	// KVFloat32 keeps the KV cache in float32 instead of the default of
	// the architectures on the op set (bfloat16, half the bytes per token).
	KVFloat32 bool
	// Quant, when set ("q8_0" or "q4_k", see QuantTypes), quantizes the
	// matrices in memory as the model is built (see quantize.go for which).
	Quant string
	// KeepDevice makes a model whose weights do not fit the device's free
	// memory fail with a *DeviceMemoryError under Device "auto" too,
	// instead of running on the CPU: for a caller that can make room (the
	// chat's /model, which unloads the model it has and tries again).
	KeepDevice bool
}

// Loaded is a model ready to run, with what it was built from. The caller
// loads the tokenizer (LoadTokenizer(dir)) separately.
type Loaded struct {
	Dir     string
	Config  *config.Config
	Weights *weights.Set // nil with RandomWeights or a GGUF file
	GGUF    *gguf.Model  // the GGUF file the model was loaded from, or nil
	Backend kernels.Backend
	Model   model.Model
	// Device says what runs the model ("cpu (16 threads)", "cuda:0 NVIDIA
	// H200 (...)"), DeviceNote why --device auto took the CPU; both empty
	// with Options.Backend.
	Device, DeviceNote string

	ownBackend *device.Backend
	autoDevice bool            // the backend was chosen by --device auto
	tally      *weightTally    // the weights the model took (Memory)
	rec        *WeightRecorder // the matrices it took by name (startPrepare)
	// prepStop stops the backend's preparation of the weights, prepDone is
	// closed when it has returned (startPrepare); nil when none runs.
	prepStop context.CancelFunc
	prepDone chan struct{}
}

// openDevice opens a device backend; tests replace it.
var openDevice = device.Open

// Load opens dir's config.json and weights, starts a backend and builds the
// model. dir may also be a GGUF file, or a directory holding one GGUF model
// and no config.json (see gguf.Find); a directory with a config.json and,
// instead of safetensors, one GGUF file that keeps the checkpoint's tensor
// names (builtin/model: config.json and model.gguf) loads that file. Every
// failure is returned as an error naming the file, key or tensor at fault.
func Load(dir string, opts Options) (*Loaded, error) {
	if err := checkQuant(dir, opts); err != nil {
		return nil, err
	}
	if file, ok, err := findGGUF(dir); err != nil {
		return nil, err
	} else if ok {
		return loadGGUF(dir, file, opts)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		return nil, err
	}
	if g, err := checkpointGGUF(dir, opts); err != nil || g != nil {
		if err != nil {
			return nil, err
		}
		return LoadGGUFCheckpoint(dir, cfg, g, opts)
	}
	l := &Loaded{Dir: dir, Config: cfg, Backend: opts.Backend}
	var src model.WeightSource
	if opts.RandomWeights {
		src = randweights.New(opts.Seed, randomDType(cfg))
	} else {
		if l.Weights, err = weights.Open(dir); err != nil {
			return nil, err
		}
		if err := CheckDims(cfg, l.Weights); err != nil {
			l.Close()
			return nil, err
		}
		src = l.Weights
	}
	if err := l.openBackend(opts); err != nil {
		l.Close()
		return nil, err
	}
	if l.Model, err = l.newModel(cfg, src, opts); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// newModel builds the architecture from src on l's backend, with the KV
// cache dtype opts asks for.
func (l *Loaded) newModel(cfg *config.Config, src model.WeightSource, opts Options) (model.Model, error) {
	m, err := model.New(cfg, l.source(src, opts), l.Backend)
	var missing *model.OpsError
	var why string // why --device auto leaves the device it opened for the CPU
	switch {
	case err != nil && l.autoDevice && errors.As(err, &missing):
		// a backend without the ops this architecture needs (the op set,
		// or its MLA capability)
		why = fmt.Sprintf("%s does not run %s yet (it lacks %s)", l.Device, cfg.ModelType, missing.Missing)
	case err == nil:
		// a device without the memory for the weights: fail here, with
		// the numbers, rather than at the first step's upload
		if short := deviceShort(l.Backend, l.Device, l.tally.total()); short != nil {
			if !l.autoDevice {
				return nil, fmt.Errorf("%w: run it on the CPU (--device cpu) or pick a smaller or quantized model", short)
			}
			if opts.KeepDevice {
				return nil, short
			}
			why = short.Error()
		}
	}
	if why != "" { // run on the CPU instead, and say why
		l.ownBackend.Close()
		b, cerr := openDevice(device.Spec{Kind: device.CPU}, opts.Threads)
		if cerr != nil {
			return nil, cerr
		}
		l.ownBackend, l.Backend, l.Device, l.DeviceNote = b, b.Backend, b.Desc, why
		m, err = model.New(cfg, l.source(src, opts), l.Backend)
	}
	if err != nil {
		return nil, err
	}
	if dm, ok := m.(model.DeviceModel); ok && opts.KVFloat32 {
		if err := dm.SetCacheDType(kernels.F32); err != nil {
			return nil, err
		}
	}
	SetActivationPrecision(l.Backend, m)
	l.Model = m
	l.startPrepare()
	return m, nil
}

// deviceReserve is the device memory Load keeps free beyond the weights
// when it checks that a model fits (deviceShort): the KV cache, the step
// arena and the driver's own take it.
const deviceReserve = 512 << 20

// DeviceMemoryError is a model whose weights do not fit the free memory
// of the device Load opened, with deviceReserve to spare.
type DeviceMemoryError struct {
	Device     string // the device, as Loaded.Device names it
	Need, Free int64  // the weights' bytes as loaded; the device's free bytes
}

func (e *DeviceMemoryError) Error() string {
	return fmt.Sprintf("the weights take %.1f GiB and %s has %.1f GiB free", float64(e.Need)/(1<<30), e.Device, float64(e.Free)/(1<<30))
}

// deviceShort says why a device backend (be, named desc) has no room for
// weights of need bytes as the model loaded them (the host's bytes: a
// lower bound of the device's, whose copies keep the same blocks or widen
// them), or returns nil where they fit with deviceReserve to spare or the
// backend does not report a device's free memory.
func deviceShort(be kernels.Backend, desc string, need int64) *DeviceMemoryError {
	r, ok := be.(kernels.MemoryReporter)
	if !ok {
		return nil
	}
	u := r.MemoryUse()
	if !u.OnDevice || u.Free <= 0 || need+deviceReserve <= u.Free {
		return nil
	}
	return &DeviceMemoryError{Device: desc, Need: need, Free: u.Free}
}

// SetActivationPrecision tells be (if it has the choice, as the CPU backend
// does) whether MatMul may round x to bfloat16 for BF16 weights (its
// VDPBF16PS and AMX tiles): yes for a model that keeps its KV cache in
// bfloat16 and so runs at that precision anyway, no with a float32 cache,
// where MatMuls stay exact in float32 too. Call it after the cache dtype is
// set.
func SetActivationPrecision(be kernels.Backend, m model.Model) {
	if b, ok := be.(interface{ SetBF16Activations(bool) }); ok {
		lay := m.CacheLayout()
		b.SetBF16Activations(len(lay) > 0 && lay[0].DType == kernels.BF16)
	}
}

// checkQuant rejects an unknown Options.Quant before anything is loaded.
func checkQuant(name string, opts Options) error {
	if opts.Quant == "" {
		return nil
	}
	if _, err := parseQuant(opts.Quant); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// DeviceErr returns the failure that made the backend's results invalid (a
// GPU's sticky error), or nil; the CPU never fails this way.
func (l *Loaded) DeviceErr() error {
	if f, ok := l.Backend.(interface{ Err() error }); ok {
		return f.Err()
	}
	return nil
}

// source wraps src to quantize its matrices when opts.Quant asks for it.
func (l *Loaded) source(src model.WeightSource, opts Options) model.WeightSource {
	q, _ := Quantized(src, opts.Quant, l.Backend) // checked by checkQuant
	l.rec = NewWeightRecorder(q)
	l.tally = newWeightTally(l.rec)
	return l.tally
}

// Quantized returns src with its matrices quantized as Options.Quant quant
// says (src itself for ""), the work spread over be's threads. Load does
// this; callers that build models from their own sources (benchmarks) use it
// directly.
func Quantized(src model.WeightSource, quant string, be kernels.Backend) (model.WeightSource, error) {
	if quant == "" {
		return src, nil
	}
	plan, err := parseQuant(quant)
	if err != nil {
		return nil, err
	}
	return newQuantSource(src, plan, be), nil
}

// openBackend starts the backend opts.Device names unless opts.Backend is
// given.
func (l *Loaded) openBackend(opts Options) error {
	if l.Backend != nil {
		return nil
	}
	spec := device.Spec{Kind: device.CPU}
	if opts.Device != "" {
		var err error
		if spec, err = device.Parse(opts.Device); err != nil {
			return err
		}
	}
	b, err := openDevice(spec, opts.Threads)
	if err != nil {
		return err
	}
	l.autoDevice = spec.Kind == device.Auto
	// The model runs on the opened backend itself (the CPU one implements
	// the op set, kernels.Device), not on the wrapper.
	l.ownBackend, l.Backend, l.Device, l.DeviceNote = b, b.Backend, b.Desc, b.Note
	return nil
}

// randomDType is the config's dtype for random weights (bf16 unless the
// config says float32 or float16).
func randomDType(cfg *config.Config) kernels.DType {
	switch cfg.Dtype() {
	case "float32":
		return kernels.F32
	case "float16":
		return kernels.F16
	}
	return kernels.BF16
}

// NewCache returns a paged KV cache for the model within budget bytes
// (blockSize tokens per block; 0 means kvcache.DefaultBlockSize).
func (l *Loaded) NewCache(budget int64, blockSize int) (*kvcache.Cache, error) {
	c, err := model.NewCache(l.Model, kvcache.Options{BlockSize: blockSize, Budget: budget})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.Dir, err)
	}
	return c, nil
}

// Close releases the weights' memory mappings and the backend's workers
// (when Load started them), then returns the freed memory to the system.
// The model must not be used afterwards.
func (l *Loaded) Close() error {
	// A model's memory is gigabytes of large allocations (the CPU's weight
	// copies, the KV cache) that become garbage at once here; left to the
	// collector's pacing, the next model's allocations come before it runs
	// and the process holds both (loading and closing a BF16 and a Q4_0
	// Qwen3-0.6B five times in turn grew one process to 4.5 GB; with this
	// it is back at 32 MB after each Close).
	defer debug.FreeOSMemory()
	l.stopPrepare()
	var err error
	if l.Weights != nil {
		err = l.Weights.Close()
		l.Weights = nil
	}
	if l.GGUF != nil {
		err = errors.Join(err, l.GGUF.Close())
		l.GGUF = nil
	}
	if l.ownBackend != nil {
		if e := l.ownBackend.Close(); err == nil {
			err = e
		}
		l.ownBackend = nil
	}
	return err
}
