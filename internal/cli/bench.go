package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferrite-llm/ferrite/builtin"
	"github.com/ferrite-llm/ferrite/engine"
	"github.com/ferrite-llm/ferrite/engine/bench"
	"github.com/ferrite-llm/ferrite/engine/config"
	"github.com/ferrite-llm/ferrite/engine/gguf"
	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/engine/randweights"
	"github.com/ferrite-llm/ferrite/engine/weights"
	"github.com/ferrite-llm/ferrite/internal/settings"
	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/device"
	"github.com/ferrite-llm/ferrite/tokenizer"
)

// benchFlags are the options of `ferrite bench`.
type benchFlags struct {
	model          string
	concurrency    []int
	promptLens     []int
	genLens        []int
	mtp            []bool
	drafts         []int
	draftMaxSeqs   int
	draftAlways    bool
	dtype          string
	quant          string
	threads        int
	device         string
	kvBudget       int64
	maxBatchTokens int
	seed           uint64
	jsonPath       string
	streamMiB      int
	bandwidthGBps  float64
	noWarmup       bool
	noPrepare      bool
	warmupCase     bool
	chat           bool
	cpuProfile     string
}

// intList is a comma-separated list of positive integers.
type intList struct{ v *[]int }

func (l intList) String() string {
	if l.v == nil {
		return ""
	}
	s := make([]string, len(*l.v))
	for i, x := range *l.v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func (l intList) Set(s string) error {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l.v = out
	return nil
}

// sizeFlag is a number of bytes, read like config.toml's sizes ("1GiB").
type sizeFlag struct{ v *int64 }

func (s sizeFlag) String() string {
	if s.v == nil {
		return ""
	}
	return settings.ByteSize(*s.v).String()
}

func (s sizeFlag) Set(text string) error {
	b, err := settings.ParseByteSize(text)
	if err != nil {
		return err
	}
	*s.v = int64(b)
	return nil
}

// onOffList is a comma-separated list of on/off.
type onOffList struct{ v *[]bool }

func (l onOffList) String() string {
	if l.v == nil {
		return ""
	}
	s := make([]string, len(*l.v))
	for i, b := range *l.v {
		s[i] = onOff(b)
	}
	return strings.Join(s, ",")
}

func (l onOffList) Set(s string) error {
	var out []bool
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "on":
			out = append(out, true)
		case "off":
			out = append(out, false)
		default:
			return fmt.Errorf("%q is not on or off", f)
		}
	}
	*l.v = out
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	f.concurrency, f.promptLens, f.genLens, f.mtp = []int{1, 8, 32}, []int{128}, []int{64}, []bool{false}
	fs.StringVar(&f.model, "model", "", "checkpoint directory, GGUF file, ferrite-tiny (the built-in model), or a directory or file with only config.json (random weights at full size)")
	fs.Var(intList{&f.concurrency}, "concurrency", "requests in flight at once, comma-separated")
	fs.Var(intList{&f.promptLens}, "prompt-len", "prompt tokens per request, comma-separated")
	fs.Var(intList{&f.genLens}, "gen-len", "generated tokens per request (EOS ignored), comma-separated; 1 times the prompt only (prompt tok/s, TTFT)")
	fs.Var(onOffList{&f.mtp}, "mtp", "MTP speculative decoding: on, off or both (on,off)")
	f.drafts = []int{bench.DefaultDraft}
	fs.Var(intList{&f.drafts}, "draft", "with --mtp on: draft tokens per step, comma-separated (one MTP case each)")
	fs.IntVar(&f.draftMaxSeqs, "draft-max-seqs", 0, "with --mtp on: no drafting while more sequences run (0 = the runtime's default, -1 = no limit)")
	fs.BoolVar(&f.draftAlways, "draft-always", false, "with --mtp on: draft on every step, even where the runtime measures that drafting does not pay")
	fs.StringVar(&f.dtype, "dtype", "", "random weights' dtype: bf16, f16 or f32 (default: the config's torch_dtype/dtype, else bf16)")
	fs.StringVar(&f.quant, "quant", "", "quantize the weights in memory at load: q8_0 or q4_k (default: as stored)")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0 = all cores)")
	fs.StringVar(&f.device, "device", "auto", "compute device: auto (the GPU when one is usable, else the CPU), cpu, cuda or cuda:N")
	fs.Var(sizeFlag{&f.kvBudget}, "kv-budget", "KV-cache budget: bytes or a size such as 512MiB (0 = enough for the largest case without preemption)")
	fs.IntVar(&f.maxBatchTokens, "max-batch-tokens", 0, "tokens per engine step (0 = the runtime's default, at least the largest concurrency)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the prompts, the samplers and the random weights")
	fs.StringVar(&f.jsonPath, "json", "", "also write the results as JSON to this file")
	fs.IntVar(&f.streamMiB, "stream-mib", 1024, "buffer size in MiB of the memory-bandwidth measurement")
	fs.Float64Var(&f.bandwidthGBps, "bandwidth", 0, "memory bandwidth in GB/s for the roofline, instead of measuring it (0 = measure)")
	fs.BoolVar(&f.noWarmup, "no-warmup", false, "skip the warm-up (a request of the longest prompt; on a GPU also requests filling two steps of the token budget)")
	fs.BoolVar(&f.noPrepare, "no-prepare", false, "leave the backend's one-time forms of the weights (the CPU's resident copies and repacked Q4_0/Q8_0) to the first MatMuls, in the warm-up or the first case, instead of making them after loading (prepare s)")
	fs.BoolVar(&f.warmupCase, "warmup-case", false, "before each case, run untimed requests filling two steps, then its own requests for 3 tokens (the largest step and its batch shape's one-time costs out of the measurement)")
	fs.BoolVar(&f.chat, "chat", false, "prompts: chat questions through the model's chat template (needs its tokenizer), request i asking question i, instead of random tokens; --prompt-len is ignored (MTP acceptance on text the model knows)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the sweep (not the loading) to this file")
}

// cmdBench implements `ferrite bench`.
func cmdBench(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var f benchFlags
	f.register(fs)
	help := func(w io.Writer) {
		fmt.Fprint(w, "usage: ferrite bench --model DIR|FILE|ferrite-tiny [flags]\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, help, stdout, stderr); !ok {
		return code
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ferrite bench: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q", fs.Arg(0))
	case f.model == "":
		return usageErr("--model DIR is required")
	case f.threads < 0:
		return usageErr("--threads %d is negative", f.threads)
	case !validDevice(f.device):
		return usageErr("--device %q: want auto, cpu, cuda or cuda:N", f.device)
	case f.maxBatchTokens < 0:
		return usageErr("--max-batch-tokens %d is negative", f.maxBatchTokens)
	case f.streamMiB < 1:
		return usageErr("--stream-mib must be at least 1")
	case f.bandwidthGBps < 0 || math.IsNaN(f.bandwidthGBps) || math.IsInf(f.bandwidthGBps, 0):
		return usageErr("--bandwidth %g: want GB/s > 0, or 0 to measure", f.bandwidthGBps)
	}
	if f.dtype != "" {
		if _, err := parseDType(f.dtype); err != nil {
			return usageErr("%v", err)
		}
	}
	if f.quant != "" && !slices.Contains(engine.QuantTypes, strings.ToLower(f.quant)) {
		return usageErr("--quant %q: want %s", f.quant, strings.Join(engine.QuantTypes, " or "))
	}
	if err := runBench(ctx, &f, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ferrite bench: %v\n", err)
		return 1
	}
	return 0
}

// parseDType reads --dtype or a config's dtype name.
func parseDType(s string) (kernels.DType, error) {
	switch strings.ToLower(s) {
	case "bf16", "bfloat16":
		return kernels.BF16, nil
	case "f16", "fp16", "float16":
		return kernels.F16, nil
	case "f32", "fp32", "float32":
		return kernels.F32, nil
	}
	return 0, fmt.Errorf("--dtype %q: want bf16, f16 or f32", s)
}

// loadBenchGGUF builds the bench model of a GGUF file (quantized further
// as --quant says).
func loadBenchGGUF(file, quant string, be *device.Backend, start time.Time) (_ *benchModel, err error) {
	g, err := gguf.Open(file)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.KeepsCheckpointNames() {
		// A checkpoint's tensors under their own names, with its
		// config.json beside the file: the built-in model's layout
		// (builtin/model/, or what `ferrite export` writes).
		cfg, err := config.Load(filepath.Dir(file))
		if err != nil {
			return nil, err
		}
		return buildBenchGGUF(cfg, g, g.CheckpointWeights(), quant, be, start)
	}
	cfg, err := g.Config()
	if err != nil {
		return nil, err
	}
	gw, err := g.Weights()
	if err != nil {
		return nil, err
	}
	return buildBenchGGUF(cfg, g, gw, quant, be, start)
}

// loadBenchBuiltin builds the bench model of the model built into the
// binary (--model ferrite-tiny or builtin).
func loadBenchBuiltin(quant string, be *device.Backend, start time.Time) (*benchModel, error) {
	cfg, err := builtin.Config()
	if err != nil {
		return nil, err
	}
	g, err := builtin.Weights()
	if err != nil {
		return nil, err
	}
	return buildBenchGGUF(cfg, g, g.CheckpointWeights(), quant, be, start)
}

// buildBenchGGUF builds the bench model of GGUF file g, whose weights src
// serves, quantized further as --quant says.
func buildBenchGGUF(cfg *config.Config, g *gguf.Model, src model.WeightSource, quant string, be *device.Backend, start time.Time) (*benchModel, error) {
	bm := &benchModel{cfg: cfg, backend: be, gguf: g, dtype: g.Quantization()}
	src, err := engine.Quantized(src, quant, be)
	if err != nil {
		return nil, fmt.Errorf("--quant: %w", err)
	}
	bm.quant = quant
	bm.rec = engine.NewWeightRecorder(src)
	bm.counter = bench.NewCounter(bm.rec)
	if bm.model, err = model.New(bm.cfg, bm.counter, be.Backend); err != nil {
		return nil, err
	}
	engine.SetActivationPrecision(be.Backend, bm.model)
	bm.loadSec = time.Since(start).Seconds()
	return bm, nil
}

// hasCheckpoint reports whether path is a directory holding safetensors.
func hasCheckpoint(path string) bool {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return false
	}
	m, _ := filepath.Glob(filepath.Join(path, "*.safetensors"))
	return len(m) > 0
}

// benchModel is the model under test and what it was built from.
type benchModel struct {
	cfg     *config.Config
	model   model.Model
	counter *bench.Counter
	rec     *engine.WeightRecorder // the matrices by name, for the backend's preparation
	backend *device.Backend
	weights *weights.Set // nil for random weights or a GGUF file
	gguf    *gguf.Model  // the GGUF file, or nil
	random  bool
	blocks  bool   // random weights made as random blocks of --quant's dtype (on a GPU)
	dtype   string // random weights' dtype, or a GGUF file's quantization
	quant   string // --quant
	loadSec float64
	prepSec float64 // the backend's preparation of the weights (kernels.WeightPreparer), after loadSec
}

func (b *benchModel) Close() {
	b.backend.Close()
	if b.weights != nil {
		b.weights.Close()
	}
	if b.gguf != nil {
		b.gguf.Close()
	}
}

// loadBenchModel opens the checkpoint or GGUF file at path, or the model
// built into the binary when path names it, or builds random weights of the
// config's shape when path has only a config.json.
// findBenchModel checks that path is a model loadBenchModel can load: the
// built-in model, a GGUF model, or a directory with a config.json. It
// reads no weights.
func findBenchModel(path string) error {
	if builtin.IsName(path) {
		return nil
	}
	if _, ok, err := gguf.Find(path); err != nil || ok {
		return err
	}
	_, err := config.Load(path)
	return err
}

func loadBenchModel(path, dtypeFlag, quant string, seed uint64, be *device.Backend) (*benchModel, error) {
	start := time.Now()
	if builtin.IsName(path) {
		if dtypeFlag != "" {
			return nil, fmt.Errorf("--dtype applies to random weights; %s is the built-in model", path)
		}
		return loadBenchBuiltin(quant, be, start)
	}
	if file, ok, err := gguf.Find(path); err != nil {
		return nil, err
	} else if ok && !hasCheckpoint(path) {
		if dtypeFlag != "" {
			return nil, fmt.Errorf("--dtype applies to random weights; %s is a GGUF model", path)
		}
		return loadBenchGGUF(file, quant, be, start)
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	bm := &benchModel{cfg: cfg, backend: be}
	var src model.WeightSource
	if hasCheckpoint(path) {
		if dtypeFlag != "" {
			return nil, fmt.Errorf("--dtype applies to random weights; %s holds a checkpoint", path)
		}
		if bm.weights, err = weights.Open(path); err != nil {
			return nil, err
		}
		if err := engine.CheckDims(cfg, bm.weights); err != nil {
			bm.weights.Close()
			return nil, err
		}
		src = bm.weights
	} else {
		name := dtypeFlag
		if name == "" {
			name = cfg.Dtype()
		}
		dt := kernels.BF16
		if name != "" {
			if d, err := parseDType(name); err == nil {
				dt = d
			}
		}
		bm.random, bm.dtype = true, strings.ToLower(dt.String())
		rw := randweights.New(seed, dt)
		// A GPU generates the same values in its own memory: nothing is
		// made on the host or uploaded. With --quant the quantizer makes
		// random blocks of its dtype from the same seeds on the host
		// (kernels.RandomFill) instead of quantizing values: seconds, not
		// minutes, for a 30B model.
		if g, ok := be.Backend.(kernels.RandomGenerator); ok && g.GeneratesRandom() {
			rw.Deferred, bm.blocks = true, quant != ""
		}
		src = rw
	}
	if src, err = engine.Quantized(src, quant, be); err != nil {
		if bm.weights != nil {
			bm.weights.Close()
		}
		return nil, fmt.Errorf("--quant: %w", err)
	}
	bm.quant = quant
	bm.rec = engine.NewWeightRecorder(src)
	bm.counter = bench.NewCounter(bm.rec)
	if bm.model, err = model.New(cfg, bm.counter, be.Backend); err != nil {
		if bm.weights != nil {
			bm.weights.Close()
		}
		return nil, err
	}
	engine.SetActivationPrecision(be.Backend, bm.model)
	bm.loadSec = time.Since(start).Seconds()
	return bm, nil
}

// benchReport is the JSON `ferrite bench --json` writes.
type benchReport struct {
	Date    string       `json:"date"`
	Machine benchMachine `json:"machine"`
	Model   benchModelJS `json:"model"`

	Bandwidth struct {
		BytesPerSec       float64 `json:"bytes_per_s"`        // the best round of all
		BeforeBytesPerSec float64 `json:"before_bytes_per_s"` // best of the rounds before the sweep
		AfterBytesPerSec  float64 `json:"after_bytes_per_s"`  // and after it (0 if the sweep failed)
		BufferBytes       int64   `json:"buffer_bytes"`
		Rounds            int     `json:"rounds"`
		Threads           int     `json:"threads"`
		Method            string  `json:"method"`
	} `json:"bandwidth"`

	Roofline struct {
		WeightBytesPerStep int64   `json:"weight_bytes_per_step"` // batch 1
		MaxStepsPerSec     float64 `json:"max_decode_steps_per_s"`
		Method             string  `json:"method"`
	} `json:"roofline"`

	// Memory is what the backend held after the sweep (kernels.MemoryUse;
	// on the host the weights are the model's as loaded). Every case's KV
	// cache and state pool were released when its runtime closed.
	Memory *benchMemory `json:"memory,omitempty"`

	Runs []bench.Result `json:"runs"`
}

type benchMemory struct {
	OnDevice    bool  `json:"on_device"`    // a GPU's memory, not host RAM
	WeightBytes int64 `json:"weight_bytes"` // weights (a GPU's uploaded copies)
	TensorBytes int64 `json:"tensor_bytes"` // persistent tensors: the model's buffers (the runs' KV caches and recurrent state are released)
	ArenaBytes  int64 `json:"arena_bytes"`  // the per-step scratch arena
	UsedBytes   int64 `json:"used_bytes"`   // the three together
	DeviceTotal int64 `json:"device_total_bytes,omitempty"`
	DeviceFree  int64 `json:"device_free_bytes,omitempty"`
}

type benchMachine struct {
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	Threads   int    `json:"threads"`
	Device    string `json:"device"`                // what ran the model: "cpu (16 threads)", "cuda:0 NVIDIA H200 (...)"
	DevNote   string `json:"device_note,omitempty"` // why --device auto took the CPU
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

type benchModelJS struct {
	Path            string  `json:"path"`
	Arch            string  `json:"arch"`
	RandomWeights   bool    `json:"random_weights"`
	RandomBlocks    bool    `json:"random_blocks,omitempty"` // random weights as random blocks of Quant's dtype, not quantized values
	DType           string  `json:"dtype,omitempty"`
	Quant           string  `json:"quant,omitempty"`
	Params          int64   `json:"params"`
	WeightBytes     int64   `json:"weight_bytes"`
	DenseBytes      int64   `json:"dense_bytes"`
	EmbeddingBytes  int64   `json:"embedding_bytes"`
	ExpertBytes     int64   `json:"expert_bytes"`
	MTPBytes        int64   `json:"mtp_bytes"`
	TiedEmbeddings  bool    `json:"tied_embeddings"`
	MoELayers       int     `json:"moe_layers"`
	Experts         int     `json:"experts"`
	TopK            int     `json:"top_k"`
	Layers          int     `json:"layers"`
	Vocab           int     `json:"vocab"`
	KVBytesPerToken int64   `json:"kv_bytes_per_token"`
	LoadSec         float64 `json:"load_s"`
	PrepareSec      float64 `json:"prepare_s"`
}

const (
	bandwidthMethod = "bytes.IndexByte over a buffer without the byte (vector loads only), 1 MiB per task on the backend's threads; best of 3 rounds before the sweep and 3 after"
	rooflineMethod  = "weight bytes one decode step reads (every tensor once; an untied input embedding and the MTP module excluded; routed experts scaled by the expected distinct experts n·(1−(1−k/n)^batch), exactly k/n at batch 1) ÷ measured bandwidth; KV-cache reads not counted"
)

func runBench(ctx context.Context, f *benchFlags, stdout, stderr io.Writer) error {
	if err := findBenchModel(f.model); err != nil {
		return err // before the bandwidth probe spends seconds
	}
	spec, err := device.Parse(f.device)
	if err != nil {
		return err
	}
	be, err := device.Open(spec, f.threads)
	if err != nil {
		return err
	}
	// Bandwidth first, before the model takes memory (and again after the
	// sweep: on a shared machine one measurement can land in a busy moment).
	measure := f.bandwidthGBps == 0
	bw0 := bench.Bandwidth{BytesPerSec: f.bandwidthGBps * 1e9, Threads: be.Threads()}
	if measure {
		fmt.Fprintf(stderr, "measuring memory bandwidth (%d MiB streaming read, best of 3)...\n", f.streamMiB)
		bw0 = bench.MeasureBandwidth(be, int64(f.streamMiB)<<20, 3)
		debug.FreeOSMemory()
	}

	fmt.Fprintf(stderr, "loading %s...\n", f.model)
	bm, err := loadBenchModel(f.model, f.dtype, f.quant, f.seed, be)
	if err != nil {
		be.Close()
		return err
	}
	defer bm.Close()
	if !f.noPrepare {
		// The forms of the weights a backend makes once (the CPU's copies
		// in huge pages, its repacked Q4_0/Q8_0) are made here, timed on
		// their own, as the engine makes them after a load: the warm-up
		// and the cases time steps on them, none the making of them.
		start := time.Now()
		if _, err := kernels.PrepareWeights(ctx, be.Backend, bm.rec.Prepare(bm.model)); err != nil {
			return err
		}
		bm.prepSec = time.Since(start).Seconds()
	}
	info := bm.model.Info()
	topK := bm.cfg.IntOr("num_experts_per_tok", 0)
	fp := bm.counter.Footprint(info.Layers, topK)

	var prompts [][]int32 // --chat's; nil: random tokens
	if f.chat {
		if prompts, err = chatPrompts(f.model); err != nil {
			return fmt.Errorf("--chat: %w", err)
		}
		f.promptLens = []int{0}
		for _, p := range prompts {
			f.promptLens[0] = max(f.promptLens[0], len(p)) // the cases' label: the longest
		}
	}
	opts := bench.Options{
		Prompts:     prompts,
		Concurrency: f.concurrency, PromptLens: f.promptLens, GenLens: f.genLens, MTP: f.mtp,
		Drafts: f.drafts, DraftMaxSeqs: f.draftMaxSeqs, DraftAlways: f.draftAlways,
		Seed: f.seed, KVBudget: f.kvBudget, MaxBatchTokens: f.maxBatchTokens, Warmup: !f.noWarmup, WarmupCase: f.warmupCase,
		Progress: func(c bench.Case) { fmt.Fprintf(stderr, "running %v...\n", c) },
	}
	if p, ok := be.Backend.(kernels.Profiler); ok && p.Profiling() {
		// Each case's table as soon as it ends (a sweep cut short keeps
		// the cases done).
		opts.Profiler = p
		opts.Done = func(r bench.Result) {
			fmt.Fprintf(stdout, "GPU profile, %v (FERRITE_CUDA_PROFILE=%s):\n%s\n", r.Case, os.Getenv("FERRITE_CUDA_PROFILE"), r.Profile)
		}
	}
	stopProfile := func() {}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			pf.Close()
			return err
		}
		stopProfile = func() { pprof.StopCPUProfile(); pf.Close() }
	}
	results, runErr := bench.Run(ctx, bm.model, opts)
	stopProfile()
	bw, bw1 := bw0, bench.Bandwidth{}
	if runErr == nil && measure {
		fmt.Fprintf(stderr, "measuring memory bandwidth again...\n")
		bw1 = bench.MeasureBandwidth(be, int64(f.streamMiB)<<20, 3)
		bw.BytesPerSec, bw.Rounds = max(bw0.BytesPerSec, bw1.BytesPerSec), bw0.Rounds+bw1.Rounds
	}
	rl := bench.NewRoofline(bw, fp)
	for i := range results {
		rl.Apply(&results[i], fp)
	}

	rep := benchReport{
		Date: time.Now().UTC().Format(time.RFC3339),
		Machine: benchMachine{CPU: cpuModel(), CPUs: goruntime.NumCPU(), Threads: be.Threads(), Device: be.Desc, DevNote: be.Note,
			GoVersion: goruntime.Version(), OS: goruntime.GOOS, Arch: goruntime.GOARCH},
		Model: benchModelJS{Path: f.model, Arch: info.Arch, RandomWeights: bm.random, RandomBlocks: bm.blocks, DType: bm.dtype, Quant: bm.quant,
			Params: fp.Params, WeightBytes: fp.TotalBytes, DenseBytes: fp.DenseBytes, EmbeddingBytes: fp.EmbeddingBytes,
			ExpertBytes: fp.ExpertBytes, MTPBytes: fp.MTPBytes, TiedEmbeddings: fp.Tied, MoELayers: fp.MoELayers,
			Experts: fp.Experts, TopK: fp.TopK, Layers: info.Layers, Vocab: info.Vocab,
			KVBytesPerToken: info.KVBytesPerToken, LoadSec: bm.loadSec, PrepareSec: bm.prepSec},
		Runs: results,
	}
	rep.Bandwidth.BytesPerSec, rep.Bandwidth.BufferBytes = bw.BytesPerSec, bw.BufferBytes
	rep.Bandwidth.Rounds, rep.Bandwidth.Threads, rep.Bandwidth.Method = bw.Rounds, bw.Threads, bandwidthMethod
	if !measure {
		rep.Bandwidth.Method = "given with --bandwidth"
	}
	rep.Bandwidth.BeforeBytesPerSec, rep.Bandwidth.AfterBytesPerSec = bw0.BytesPerSec, bw1.BytesPerSec
	rep.Roofline.WeightBytesPerStep, rep.Roofline.MaxStepsPerSec, rep.Roofline.Method = rl.WeightBytesStep1, rl.MaxStepsPerSec, rooflineMethod
	rep.Memory = benchMemoryOf(be.Backend, fp.TotalBytes)

	printBench(stdout, &rep, fp, rl)
	if f.jsonPath != "" {
		b, err := json.MarshalIndent(&rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(f.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return runErr
}

// benchMemoryOf is what be holds (nil when it does not say); on the host
// the weights are the model's as loaded, weightBytes, plus the backend's
// copies of them.
func benchMemoryOf(be kernels.Backend, weightBytes int64) *benchMemory {
	r, ok := be.(kernels.MemoryReporter)
	if !ok {
		return nil
	}
	u := r.MemoryUse()
	if !u.OnDevice {
		u.Weights += weightBytes
	}
	return &benchMemory{OnDevice: u.OnDevice, WeightBytes: u.Weights, TensorBytes: u.Tensors, ArenaBytes: u.Arena,
		UsedBytes: u.Used(), DeviceTotal: u.Total, DeviceFree: u.Free}
}

// kib formats a small byte count: bytes below 1 KiB, else KiB.
func kib(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/1024)
}

// printBench writes the human-readable report.
func printBench(w io.Writer, rep *benchReport, fp bench.Footprint, rl bench.Roofline) {
	m := &rep.Model
	src := "checkpoint"
	switch {
	case m.RandomBlocks:
		src = "random " + m.Quant + " blocks"
	case m.RandomWeights:
		src = "random " + m.DType + " weights"
	case m.DType != "":
		src = "GGUF " + m.DType
	}
	if m.Quant != "" && !m.RandomBlocks {
		src += " quantized to " + m.Quant
	}
	fmt.Fprintf(w, "model:     %s (%s), %s, %s params, %s of weights, %d layers, KV cache %s per token, load %.1f s, prepare %.1f s\n",
		m.Path, m.Arch, src, count(m.Params), gb(m.WeightBytes), m.Layers, kib(m.KVBytesPerToken), m.LoadSec, m.PrepareSec)
	fmt.Fprintf(w, "machine:   %s, %d CPUs, %d threads, %s %s/%s\n",
		rep.Machine.CPU, rep.Machine.CPUs, rep.Machine.Threads, rep.Machine.GoVersion, rep.Machine.OS, rep.Machine.Arch)
	if rep.Machine.DevNote != "" {
		fmt.Fprintf(w, "device:    %s (%s)\n", rep.Machine.Device, rep.Machine.DevNote)
	} else {
		fmt.Fprintf(w, "device:    %s\n", rep.Machine.Device)
	}
	if m := rep.Memory; m != nil {
		where := "host RAM"
		if m.OnDevice {
			where = "device memory"
		}
		fmt.Fprintf(w, "memory:    %s held after the sweep: %s (weights %s, tensors %s, step arena %s)",
			where, gb(m.UsedBytes), gb(m.WeightBytes), gb(m.TensorBytes), gb(m.ArenaBytes))
		if m.DeviceTotal > 0 {
			fmt.Fprintf(w, "; device %s, %s free", gb(m.DeviceTotal), gb(m.DeviceFree))
		}
		fmt.Fprintln(w)
	}
	if rl.Bandwidth.Rounds == 0 {
		fmt.Fprintf(w, "bandwidth: %.1f GB/s (given with --bandwidth)\n", rl.Bandwidth.BytesPerSec/1e9)
	} else {
		after := "-"
		if rep.Bandwidth.AfterBytesPerSec > 0 {
			after = fmt.Sprintf("%.1f", rep.Bandwidth.AfterBytesPerSec/1e9)
		}
		fmt.Fprintf(w, "bandwidth: %.1f GB/s (%s streaming read, %d threads, best of %d rounds: %.1f GB/s before the sweep, %s after)\n",
			rl.Bandwidth.BytesPerSec/1e9, gb(rl.Bandwidth.BufferBytes), rl.Bandwidth.Threads, rl.Bandwidth.Rounds,
			rep.Bandwidth.BeforeBytesPerSec/1e9, after)
	}
	var how []string
	if fp.Tied {
		how = append(how, "tied embedding read in full as the LM head")
	} else {
		how = append(how, fmt.Sprintf("input embedding (%s) left out: one row per token", gb(fp.EmbeddingBytes)))
	}
	if fp.MoELayers > 0 {
		k := strconv.Itoa(fp.TopK)
		if fp.TopK == 0 {
			k = "all (top-k unknown)"
		}
		how = append(how, fmt.Sprintf("%d MoE layers: %s of %d experts active per token, so %s of %s expert weights at batch 1; larger batches assume uniform routing",
			fp.MoELayers, k, fp.Experts, gb(fp.DecodeBytes(1, 0)-fp.DenseBytes), gb(fp.ExpertBytes)))
	}
	if fp.MTPBytes > 0 {
		how = append(how, fmt.Sprintf("MTP module (%s) left out, counted once per draft token with --mtp on", gb(fp.MTPBytes)))
	}
	fmt.Fprintf(w, "roofline:  %s of weights per decode step at batch 1 (%s) ÷ %.1f GB/s = %s steps/s max at batch 1\n\n",
		gb(rl.WeightBytesStep1), strings.Join(how, "; "), rl.Bandwidth.BytesPerSec/1e9, num(rl.MaxStepsPerSec))

	if len(rep.Runs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conc\tprompt\tgen\tmtp\twall s\tdecode tok/s\tper-req tok/s\tprompt tok/s\tTTFT mean ms\tp50 ms\tmax ms\tpeak KV\tsteps/s\tweight GB/s\troofline\taccept\tnote\t")
	for _, r := range rep.Runs {
		mtp := onOff(r.MTP)
		if r.MTP {
			mtp = fmt.Sprintf("on:%d", r.Draft)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t", r.Concurrency, r.PromptLen, r.GenLen, mtp)
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s%s\t\n", strings.Repeat("-\t", 12), r.Skipped)
			continue
		}
		acc, note := "-", ""
		if r.MTPAcceptance != nil {
			acc = fmt.Sprintf("%.0f%%", 100**r.MTPAcceptance)
		} else if r.MTP {
			note = "no drafts verified (see --draft-max-seqs)"
		}
		if r.OneStepDrafts > 0 {
			note = "drafts and verification in one device step"
		}
		dec, perReq, steps, wgb, roof := num(r.DecodeTokPerSec), num(r.PerReqDecodeTPS), num(r.DecodeStepsPerSec),
			fmt.Sprintf("%.2f", r.WeightBytesPerSec/1e9), fmt.Sprintf("%.0f%%", 100*r.RooflineFraction)
		if r.GenLen < 2 { // one token a request: no decode steps
			dec, perReq, steps, wgb, roof = "-", "-", "-", "-", "-"
		}
		fmt.Fprintf(tw, "%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.WallSec, dec, perReq, num(r.PromptTokPerSec),
			num(r.TTFTMeanMs), num(r.TTFTP50Ms), num(r.TTFTMaxMs), size(r.PeakKVBytes),
			steps, wgb, roof, acc, note)
	}
	tw.Flush()
	for _, r := range rep.Runs {
		if r.RooflineFraction > 1 {
			fmt.Fprintf(w, "\nwarning: a case ran above 100%% of the roofline: the bandwidth measurement was disturbed (a busy machine?); rerun, or pass --bandwidth\n")
			break
		}
	}
	printGraphs(w, rep.Runs)
	fmt.Fprintf(w, "\ndecode tok/s: tokens generated after every request has its first token ÷ the time from then to the last token;\n"+
		"steps/s: (those tokens − accepted drafts) ÷ concurrency ÷ that time; accept: accepted ÷ verified draft tokens;\n"+
		"roofline: steps/s × weight bytes per step ÷ bandwidth (KV-cache reads not counted).\n")
}

// printGraphs writes how each case's device steps launched, when the
// device replays repeated steps as graphs (CUDA).
func printGraphs(w io.Writer, runs []bench.Result) {
	head := false
	for _, r := range runs {
		all := r.GraphReplays + r.GraphEager
		if all == 0 {
			continue
		}
		if !head {
			fmt.Fprintf(w, "\nstep graphs (device steps, MTP passes included):\n")
			head = true
		}
		fmt.Fprintf(w, "  %v: %d of %d replayed as one graph (%d captured), %d launched eagerly\n",
			r.Case, r.GraphReplays, all, r.GraphCaptures, r.GraphEager)
	}
}

func gb(b int64) string {
	if b >= 1e9 {
		return fmt.Sprintf("%.2f GB", float64(b)/1e9)
	}
	return fmt.Sprintf("%.1f MB", float64(b)/1e6)
}

// size formats a byte count in binary units.
func size(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}

// num formats a rate or a duration with about three significant digits.
func num(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

func count(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return strconv.FormatInt(n, 10)
}

// cpuModel is /proc/cpuinfo's model name (what lscpu prints), else GOARCH.
func cpuModel() string {
	fh, err := os.Open("/proc/cpuinfo")
	if err == nil {
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return goruntime.GOARCH
}

// chatPrompts are bench.ChatQuestions through the chat template of the
// model at path (the built-in model's, a checkpoint directory's, a GGUF
// file's), each ready for the assistant's answer.
func chatPrompts(path string) ([][]int32, error) {
	var tok *tokenizer.Tokenizer
	var err error
	if builtin.IsName(path) {
		tok, err = builtin.Tokenizer()
	} else {
		tok, err = engine.LoadTokenizer(path)
	}
	if err != nil {
		return nil, err
	}
	var out [][]int32
	for _, q := range bench.ChatQuestions {
		text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: q}}, tokenizer.TemplateOptions{AddGenerationPrompt: true})
		if err != nil {
			return nil, err
		}
		out = append(out, tok.Encode(text, false))
	}
	return out, nil
}

// validDevice reports whether s is a --device spec kernels/device reads.
func validDevice(s string) bool {
	_, err := device.Parse(s)
	return err == nil
}
