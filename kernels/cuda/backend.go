//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
)

// Backend is ferrite's GPU backend. It implements kernels.Device, the op
// set (opset.go, memory.go): tensors live in device memory, each weight is
// uploaded once (cached per *kernels.Mat for the Backend's life), and a step
// queues its kernels without waiting until EndStep. It also implements the
// host-slice kernels.Backend for the architectures not on the op set yet:
// MatMul runs the GEMV kernels with the activations copied in and out on
// every call (a Transient Mat is copied on every call too), and Parallel
// runs on a CPU worker pool.
//
// Ops cannot return errors: when the device fails, the failure is kept
// for Err (a sticky error stays), later ops do nothing, reads return NaN.
type Backend struct {
	dev *Device
	cpu *cpu.Backend

	mu       sync.Mutex // guards the weight caches (weights, stacks, qweights, kvbParts), experts, qexperts, b1BF16, err
	weights  map[*kernels.Mat]*Weight
	experts  map[*kernels.Expert]*Buffer     // expert lists' descriptor tables (expertTable)
	qexperts map[*kernels.Expert]expertKinds // what an expert list's device weights are (expertTable)
	stacks   map[stackKey]*Weight            // weights stacked by rows (LinearCat, SwiGLULinear)
	qweights map[*kernels.Mat]*Weight        // quantized weights in their blocks (linWeight, quant.go)
	kvbParts map[*kernels.Mat]*Weight        // a kv_b_proj's halves as its file stores them, by their head 0's part (kvbWeights, mla.go)
	err      error

	arena    arena      // the op set's per-step scratch
	mem      memAccount // device memory by kind (MemoryUse)
	qmu      sync.Mutex
	pending  []func(*Device) error // op launches not yet handed to the device thread (queue)
	pre      []func(*Device) error // during a step: what was queued before BeginStep, launched first by EndStep
	inStep   bool                  // between BeginStep and EndStep: the step's launches wait for EndStep
	graphs   stepGraphs            // the step graph (graph.go), owned by the device thread
	gemmOnce sync.Once
	gemmErr  error // why cuBLASLt is not used, once tried

	splitKVOnly bool                     // Attention without the prefill kernel (its tests and benchmarks compare)
	prefillRows int                      // the prefill kernel's row tile, 64 or 128; 0 means the default (prefillTile)
	noMMA       bool                     // Experts' prefill path keeps off the tensor cores (tests)
	rowExact    bool                     // SetRowExact: the linear ops sum each row as the n = 1 GEMV does
	moe         moeConfig                // Experts' kernels for a few tokens (moe.go)
	moeBar      kernels.Tensor           // ferrite_moe_b1's grid barrier (moeB1Bar); the zero Tensor until first used
	b1BF16      map[*kernels.Expert]bool // b1Fits: whether an expert list (by its first) is all bf16; guarded by mu
	mlaNoTC     bool                     // AttentionMLA keeps to the CUDA-core latent attention (tests, benchmarks compare)
	mlaSplitCap int                      // at most this many splits of the tensor-core latent attention, 0 for no cap (benchmarks)
	mlaHeads    int                      // heads a tensor-core attention block (≤ 32), 0 for tcPlan's choice (benchmarks)
	mlaTiles    int                      // key tiles a tensor-core attention split at least, 0 for 1 (benchmarks)
	noFuse      bool                     // no fused attention (PrepareQKV inside, split merge): the default; FERRITE_CUDA_FUSE=1, SetFuse
	fuseNorm    bool                     // the norm-fused GEMVs (FERRITE_CUDA_FUSE_NORM=1, SetFuseNorm)
	noFuseQKV   bool                     // QKVAttention as PrepareQKV and Attention (FERRITE_CUDA_FUSE_QKV=0)
	attnCnt     kernels.Tensor           // Attention's split counters (splitCounters); the zero Tensor until first used
	attnWide    bool                     // Attention always with attnGroup query heads a block (tests compare)
	// noAttnPrefetch: a one-row Attention's kernel does not ask L2 for its
	// keys and values before its PDL wait (FERRITE_CUDA_ATTN_PREFETCH=0)
	noAttnPrefetch bool
	// deltaChunk: DeltaRule runs the long sequences of a call in the
	// chunked form (FERRITE_CUDA_DELTA_CHUNK=1; linattn.go's deltaChunked;
	// off by default: measured slower than the row-by-row kernel)
	deltaChunk bool
	// noConvRows: ShortConv steps every sequence's rows in order, never all
	// rows at once (FERRITE_CUDA_CONV_ROWS=0; linattn.go's convRows)
	noConvRows bool

	dec decState // the decode kernels of one row, a verification and decode batches (decode.go)

	moePipeCnt kernels.Tensor // the streamed experts' item counters (moe_pipe.go); the zero Tensor until first used

	presplit presplit // the last op's output, also split for cuBLASLt (opset.go's linearSplit)

	fuseHalves bool       // a split product's residual add and the next norm as one kernel (halves.go)
	halves     halvesPend // the product just queued whose epilogue a norm may join
	splitRows  int        // the most rows of a split product in the step being built (EndStep's poll)

	xbuf, ybuf *Buffer // stagingBytes each: MatMul's device copies of x and y
	tbuf, tscl *Buffer // transient weights' data and scales, grown on demand

	dmu        sync.Mutex   // guards dbuf and qxbuf
	dbuf       *Buffer      // the wide products' weight decoding (decodeBuf); older, smaller ones stay until Close
	qxbuf      *Buffer      // the quantized GEMV's int8 rows of x (qxBuf); older, smaller ones stay until Close
	noQX8      bool         // the quantized GEMV multiplies float32 x, not int8 (FERRITE_CUDA_QX8=0; quant.go)
	dbufBytes  atomic.Int64 // every decode buffer's bytes (MemoryUse counts them with the arena)
	decodeMost int64        // tests: decodeBuf fails above this many bytes, as where the device has no room (0: no limit)

	mlaUK mlaUK // kv_b_proj's W_UK halves transposed (mla.go)

	stepTime *stepTimer // host and GPU time of each step (FERRITE_CUDA_STEPTIME=1, steptime.go); nil when off
}

// OpenBackend opens GPU ordinal and returns a Backend that owns it, with
// threads CPU workers for Parallel (≤ 0: one per CPU).
func OpenBackend(ordinal, threads int) (*Backend, error) {
	d, err := Open(ordinal)
	if err != nil {
		return nil, err
	}
	b := &Backend{dev: d, weights: map[*kernels.Mat]*Weight{}}
	b.graphs.enabled = graphsEnabled() && (!d.Profiling() || d.prof.graph)
	b.moe = moeConfigFromEnv()
	b.noFuse = os.Getenv("FERRITE_CUDA_FUSE") != "1"
	b.noQX8 = os.Getenv("FERRITE_CUDA_QX8") == "0"
	b.noFuseQKV = os.Getenv("FERRITE_CUDA_FUSE_QKV") == "0"
	b.noAttnPrefetch = os.Getenv("FERRITE_CUDA_ATTN_PREFETCH") == "0"
	b.deltaChunk = os.Getenv("FERRITE_CUDA_DELTA_CHUNK") == "1"
	b.noConvRows = os.Getenv("FERRITE_CUDA_CONV_ROWS") == "0"
	b.fuseNorm = os.Getenv("FERRITE_CUDA_FUSE_NORM") == "1"
	b.dec = decConfigFromEnv()
	b.fuseHalves = fuseHalvesDefault()
	if b.xbuf, err = d.Alloc(stagingBytes); err == nil {
		b.ybuf, err = d.Alloc(stagingBytes)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	b.cpu = cpu.New(threads)
	if stepTimeEnabled() {
		if err = d.do(func() error {
			var err error
			b.stepTime, err = newStepTimerL()
			if err == nil && stepTimeOps() {
				b.stepTime.ops = map[string]*opTime{}
			}
			return err
		}); err != nil {
			d.Close()
			return nil, err
		}
	}
	return b, nil
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// Device is the GPU the backend runs on.
func (b *Backend) Device() *Device { return b.dev }

// Threads is the CPU worker count Parallel uses.
func (b *Backend) Threads() int { return b.cpu.Threads() }

// Parallel runs fn over [0, n) on the CPU worker pool.
func (b *Backend) Parallel(n int, fn func(lo, hi int)) { b.cpu.Parallel(n, fn) }

// Err returns the first device failure MatMul met, or nil.
func (b *Backend) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// WeightBytes is the device memory held by cached weights.
func (b *Backend) WeightBytes() int64 { return b.mem.weights.Load() }

// Close frees the cached weights and the device, and stops the CPU pool.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.weights, b.experts, b.qexperts, b.stacks, b.qweights, b.kvbParts = nil, nil, nil, nil, nil, nil
	b.mu.Unlock()
	b.mem.weights.Store(0)
	b.mem.tensors.Store(0)
	b.dev.do(func() error {
		b.dropGraphL()
		if b.stepTime != nil {
			b.stepTime.closeL()
		}
		return nil
	})
	b.cpu.Close()
	return b.dev.Close() // frees every Buffer still allocated
}

// MatMul sets y (n, w.Rows) = x (n, w.Cols) · wᵀ on the GPU with float32
// accumulation. Malformed arguments panic like every backend's MatMul.
func (b *Backend) MatMul(y, x []float32, w *kernels.Mat, n int) {
	kernels.CheckMatMul(y, x, w, n)
	if n == 0 || w.Rows == 0 {
		return
	}
	y = y[:n*w.Rows]
	b.exec(nil) // launches queued by the op set go first
	if w.Cols == 0 {
		clear(y)
		return
	}
	var err error
	if w.Transient {
		err = b.dev.do(func() error {
			dw, err := b.transientL(w)
			if err != nil {
				return err
			}
			return b.matmulL(y, x[:n*w.Cols], dw, n)
		})
	} else {
		var dw *Weight
		if dw, err = b.weight(w); err == nil {
			err = b.dev.do(func() error { return b.matmulL(y, x[:n*w.Cols], dw, n) })
		}
	}
	if err != nil {
		b.fail(err)
		nan := float32(math.NaN())
		for i := range y {
			y[i] = nan
		}
	}
}

func (b *Backend) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = err
	}
}

var _ kernels.RandomGenerator = (*Backend)(nil)

// GeneratesRandom implements kernels.RandomGenerator: a Random Mat without
// Data is generated in device memory when it is first used (UploadMat).
func (b *Backend) GeneratesRandom() bool { return true }

// weight returns m's device copy, uploading it on first use.
func (b *Backend) weight(m *kernels.Mat) (*Weight, error) {
	return cachedWeight(b, &b.weights, m, func() (*Weight, error) { return b.dev.UploadMat(m) })
}

// cachedWeight returns (*cache)[key], or, on first use, the Weight upload
// makes, kept there and counted in the backend's weight bytes: the caches
// of weight, stacked and linWeight, under b.mu (ErrClosed once closed).
func cachedWeight[K comparable](b *Backend, cache *map[K]*Weight, key K, upload func() (*Weight, error)) (*Weight, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.weights == nil {
		return nil, ErrClosed
	}
	if w := (*cache)[key]; w != nil {
		return w, nil
	}
	w, err := upload()
	if err != nil {
		return nil, err
	}
	if *cache == nil {
		*cache = map[K]*Weight{}
	}
	(*cache)[key] = w
	b.mem.weights.Add(w.Bytes())
	return w, nil
}

// decodeBuf returns the address of a device buffer of at least size bytes
// for a weight's decoding that one op writes and then reads (linearQuant's
// bf16 terms, a prefill's experts in bf16), shared by every op: one
// stream's launches run in order (a PDL kernel waits for the one before
// it to complete), so an op's decoding begins after the last op's product
// has read its own. A Scratch tensor instead would take fresh arena bytes
// for each layer of a step (a prefill step of 12 Qwen3-30B-A3B layers in
// Q4_K grew the arena to 24.7 GB). A larger size allocates a new buffer; the
// old one stays until Close, as queued launches and captured graphs may
// still name it. Where the device has no room, its callers take a slower
// path that needs none (linearQuant the GEMV over the blocks, Experts the
// CUDA-core tiles).
func (b *Backend) decodeBuf(size int64) (uint64, error) {
	if b.decodeMost > 0 && size > b.decodeMost {
		return 0, fmt.Errorf("cuda: no room for a %d-byte decoding", size)
	}
	return b.sharedBuf(&b.dbuf, size)
}

// qxBuf is decodeBuf for the quantized GEMV's int8 rows of x (quantGemvL),
// which one op writes and its GEMV then reads: a buffer of its own, as a
// product that found no room in decodeBuf takes the GEMV.
func (b *Backend) qxBuf(size int64) (uint64, error) { return b.sharedBuf(&b.qxbuf, size) }

// sharedBuf returns *cur's address where it holds size bytes, else that of
// a new buffer (whole MiB) that replaces it; the old one stays until Close.
func (b *Backend) sharedBuf(cur **Buffer, size int64) (uint64, error) {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	if *cur != nil && (*cur).size >= size {
		return (*cur).ptr, nil
	}
	buf, err := b.dev.Alloc(alignUp(max(size, 1), 1<<20))
	if err != nil {
		return 0, err
	}
	*cur = buf
	b.dbufBytes.Add(buf.size)
	return buf.ptr, nil
}

// transientL copies a Transient m into the backend's scratch weight
// buffers (grown to fit) and returns a Weight viewing them.
func (b *Backend) transientL(m *kernels.Mat) (*Weight, error) {
	d := b.dev
	grow := func(buf **Buffer, n int64) error {
		if *buf != nil && (*buf).size >= n {
			return nil
		}
		if *buf != nil {
			if err := (*buf).free(); err != nil {
				return err
			}
		}
		nb, err := d.allocL(max(n, 1<<20))
		*buf = nb
		return err
	}
	bytes := int64(m.Rows) * int64(m.Cols) * int64(m.DType.Size())
	if err := grow(&b.tbuf, bytes); err != nil {
		return nil, err
	}
	if err := d.uploadL(b.tbuf.ptr, m.Data[:bytes]); err != nil {
		return nil, err
	}
	w := &Weight{Buf: b.tbuf, DType: m.DType, Rows: m.Rows, Cols: m.Cols, BlockRows: m.BlockRows, BlockCols: m.BlockCols}
	if m.DType == kernels.F8E4M3 {
		ns := ceilDiv(m.Rows, m.BlockRows) * ceilDiv(m.Cols, m.BlockCols)
		if err := grow(&b.tscl, int64(ns)*4); err != nil {
			return nil, err
		}
		if err := d.uploadL(b.tscl.ptr, f32Bytes(m.Scale[:ns])); err != nil {
			return nil, err
		}
		w.Scale = b.tscl
	}
	return w, nil
}

// matmulL runs on the device thread: as many rows of x as fit the staging
// buffers go up, through the GEMV and back down at a time.
func (b *Backend) matmulL(y, x []float32, w *Weight, n int) error {
	d := b.dev
	chunk := min(n, stagingBytes/(4*w.Cols), stagingBytes/(4*w.Rows))
	if chunk == 0 {
		return fmt.Errorf("cuda: MatMul rows of %d×%d exceed the %d MiB staging buffers", w.Rows, w.Cols, stagingBytes>>20)
	}
	for i := 0; i < n; i += chunk {
		m := min(chunk, n-i)
		if err := d.uploadL(b.xbuf.ptr, f32Bytes(x[i*w.Cols:(i+m)*w.Cols])); err != nil {
			return err
		}
		if err := d.linearL(b.ybuf.ptr, b.xbuf.ptr, w, m, 0, false); err != nil {
			return err
		}
		if err := d.downloadL(f32Bytes(y[i*w.Rows:(i+m)*w.Rows]), b.ybuf.ptr); err != nil {
			return err
		}
	}
	return nil
}
