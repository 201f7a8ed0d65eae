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
//
// A matrix's values are a kernels.RandomFill (seed and magnitude), which
// Mat also sets on it; with Deferred the Source leaves Data nil, for a
// backend that generates the same bytes where it keeps the weights
// (kernels.RandomGenerator: the GPU fills them in device memory).
package randweights

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
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

	// Deferred leaves the matrices' Data nil (kernels.Mat.Random says
	// what it holds): only for a kernels.RandomGenerator backend, or
	// where every user calls Materialize. Set it before the first Mat.
	Deferred bool

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
	// Magnitude ~ 1/√cols: the top exponent is floor(log2(1/√cols)) + 1.
	top := int(math.Floor(-0.5*math.Log2(float64(cols)))) + 1
	m := &kernels.Mat{DType: dt, Rows: rows, Cols: cols, Random: &kernels.RandomFill{Seed: s.seed(key), Top: top}}
	if !s.Deferred {
		m.Materialize()
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.mats[key]; ok { // generated concurrently: keep the first
		return old, nil
	}
	if s.mats == nil {
		s.mats = make(map[string]*kernels.Mat)
	}
	s.mats[key] = m
	s.bytes += m.DataBytes()
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
	r := kernels.SplitMix64{S: s.seed(name)}
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
		out[i] = base + spread*(2*uniform(&r)-1)
	}
	return out, nil
}

func (s *Source) seed(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() ^ (s.Seed * 0x9e3779b97f4a7c15)
}

// uniform returns a uniform value in [0, 1) from 24 bits of r.
func uniform(r *kernels.SplitMix64) float32 { return float32(r.Next()>>40) / (1 << 24) }
