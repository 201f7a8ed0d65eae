// Package randweights is a weight source that invents tensors: it returns a
// deterministic pseudo-random tensor of whatever name, shape and dtype the
// loader asks for. With a config.json alone it builds a real-size model in
// memory, for benchmarks and for tests that need no checkpoint.
//
// Every tensor depends only on the seed, its name (and expert index), never
// on the order of requests. Matrices get values of magnitude about
// 1/√cols, so activations stay in a realistic range through deep stacks.
// Small vectors follow their role, recognised by name: norm weights are
// 1 ± 0.1, biases and e_score_correction_bias are small.
package randweights

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/bits"
	"strings"
	"sync"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Source generates tensors on demand. It satisfies the engine's weight
// source interface (Has, Mat, Expert, Float32). Safe for concurrent use.
type Source struct {
	Seed  uint64
	DType kernels.DType // storage dtype of matrices: F32, BF16 or F16

	// Missing, when set, reports the names a checkpoint would not have
	// (Has returns false and loads fail); nil means every name exists.
	Missing func(name string) bool

	mu    sync.Mutex
	mats  map[string]*kernels.Mat // generated matrices by name (and expert)
	bytes int64
}

// New returns a source with the given seed and matrix dtype.
func New(seed uint64, dtype kernels.DType) *Source {
	return &Source{Seed: seed, DType: dtype}
}

// Bytes is the total size of the matrices generated so far.
func (s *Source) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Has reports whether name exists (always, unless Missing says otherwise).
func (s *Source) Has(name string) bool { return s.Missing == nil || !s.Missing(name) }

func (s *Source) missing(name string) error {
	if s.Has(name) {
		return nil
	}
	return fmt.Errorf("randweights: tensor %q not found", name)
}

// Mat returns a (rows, cols) matrix named name. The same name returns the
// same matrix (tied embeddings share memory).
func (s *Source) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	return s.mat(name, -1, rows, cols)
}

// Expert returns expert e's (rows, cols) matrix of the fused tensor name.
func (s *Source) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	if e < 0 {
		return nil, fmt.Errorf("randweights: tensor %q: expert %d", name, e)
	}
	return s.mat(name, e, rows, cols)
}

func (s *Source) mat(name string, e, rows, cols int) (*kernels.Mat, error) {
	if err := s.missing(name); err != nil {
		return nil, err
	}
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("randweights: tensor %q: shape [%d %d]", name, rows, cols)
	}
	key := fmt.Sprintf("%s#%d", name, e)
	s.mu.Lock()
	if m, ok := s.mats[key]; ok {
		s.mu.Unlock()
		if m.Rows != rows || m.Cols != cols {
			return nil, fmt.Errorf("randweights: tensor %q asked as [%d %d], earlier as [%d %d]", name, rows, cols, m.Rows, m.Cols)
		}
		return m, nil
	}
	s.mu.Unlock()

	dt := s.DType
	if dt != kernels.F32 && dt != kernels.BF16 && dt != kernels.F16 {
		return nil, errors.New("randweights: matrix dtype must be F32, BF16 or F16")
	}
	m := &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, rows*cols*dt.Size())}
	// Magnitude ~ 1/√cols: the top exponent is floor(log2(1/√cols)) + 1.
	top := int(math.Floor(-0.5*math.Log2(float64(cols)))) + 1
	fill(m.Data, dt, top, s.seed(key))

	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.mats[key]; ok { // generated concurrently: keep the first
		return old, nil
	}
	if s.mats == nil {
		s.mats = make(map[string]*kernels.Mat)
	}
	s.mats[key] = m
	s.bytes += int64(len(m.Data))
	return m, nil
}

// Float32 returns a small tensor of exactly shape, with values suited to
// its role as guessed from the name.
func (s *Source) Float32(name string, shape ...int) ([]float32, error) {
	if err := s.missing(name); err != nil {
		return nil, err
	}
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("randweights: tensor %q: shape %v", name, shape)
		}
		n *= d
	}
	r := rng{s: s.seed(name)}
	out := make([]float32, n)
	base, spread := float32(0), float32(0.1)
	switch {
	case strings.HasSuffix(name, "norm.weight") || strings.HasSuffix(name, "layernorm.weight"):
		base = 1
	case strings.Contains(name, "e_score_correction_bias"):
		spread = 0.01
	case strings.HasSuffix(name, ".bias"):
		spread = 0.05
	case len(shape) > 0:
		spread = float32(1 / math.Sqrt(float64(shape[len(shape)-1])))
	}
	for i := range out {
		out[i] = base + spread*(2*r.float()-1)
	}
	return out, nil
}

func (s *Source) seed(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() ^ (s.Seed * 0x9e3779b97f4a7c15)
}

// fillChunk is the number of bytes one goroutine fills; each chunk has its
// own stream so the result does not depend on scheduling.
const fillChunk = 4 << 20

// fill writes random values of dtype dt into data: sign random, binary
// exponent top-1 with probability ½, top-2 with ¼, top-3 and top-4 with ⅛
// each, mantissa random — roughly uniform in (−2^top, 2^top).
func fill(data []byte, dt kernels.DType, top int, seed uint64) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for off := 0; off < len(data); off += fillChunk {
		chunk := data[off:min(off+fillChunk, len(data))]
		r := rng{s: seed ^ uint64(off)*0xbf58476d1ce4e5b9}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			fillSerial(chunk, dt, top, &r)
		}()
	}
	wg.Wait()
}

func fillSerial(data []byte, dt kernels.DType, top int, r *rng) {
	switch dt {
	case kernels.BF16, kernels.F16:
		tab := halfTable(dt, top)
		for i := 0; i+8 <= len(data); i += 8 {
			x := r.next()
			for k := range 4 {
				h := tab[uint16(x>>(16*k))]
				data[i+2*k] = byte(h)
				data[i+2*k+1] = byte(h >> 8)
			}
		}
	case kernels.F32:
		for i := 0; i+4 <= len(data); i += 4 {
			x := r.next()
			off := bits.TrailingZeros64(x>>40|8) + 1
			e := uint32(max(top-off+127, 1))
			f := uint32(x)&0x807fffff | e<<23
			data[i], data[i+1], data[i+2], data[i+3] = byte(f), byte(f>>8), byte(f>>16), byte(f>>24)
		}
	}
}

// halfTables caches, per dtype and top exponent, the map from 16 random
// bits to a half-precision bit pattern: bit 15 the sign, bits 13–14 and the
// lowest set bit of (bits 12–13 | 4) pick the exponent offset, the low bits
// the mantissa (their top bits are reused, which is fine for weights).
var halfTables sync.Map // [2]int{dtype, top} → *[1 << 16]uint16

func halfTable(dt kernels.DType, top int) *[1 << 16]uint16 {
	key := [2]int{int(dt), top}
	if t, ok := halfTables.Load(key); ok {
		return t.(*[1 << 16]uint16)
	}
	manBits, bias := 7, 127
	if dt == kernels.F16 {
		manBits, bias = 10, 15
	}
	t := new([1 << 16]uint16)
	for v := range 1 << 16 {
		sel := uint16(v>>12) & 7
		off := bits.TrailingZeros16(sel|8) + 1 // 1 (½), 2 (¼), 3 or 4 (⅛ each)
		e := max(top-off+bias, 1)
		t[v] = uint16(v)&0x8000 | uint16(e)<<manBits | uint16(v)&(1<<manBits-1)
	}
	halfTables.Store(key, t)
	return t
}

// rng is splitmix64: tiny, fast, and good enough for weights.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float32 { return float32(r.next()>>40) / (1 << 24) }
