package engine

import (
	"strconv"
	"sync"

	"github.com/ferrite-llm/ferrite/engine/model"
	"github.com/ferrite-llm/ferrite/kernels"
)

// weightTally is a model.WeightSource that passes requests on and adds up
// the bytes of the weights the model took, each tensor once (a tied
// embedding is loaded twice): the weights' host memory, mapped from the
// file or converted at load, that Loaded.Memory reports on the CPU.
type weightTally struct {
	model.WeightSource

	mu    sync.Mutex
	seen  map[string]bool
	bytes int64
}

func newWeightTally(src model.WeightSource) *weightTally {
	return &weightTally{WeightSource: src, seen: map[string]bool{}}
}

func (w *weightTally) Mat(name string, rows, cols int) (*kernels.Mat, error) {
	m, err := w.WeightSource.Mat(name, rows, cols)
	if err == nil {
		w.add(name, matBytes(m))
	}
	return m, err
}

func (w *weightTally) Expert(name string, e, rows, cols int) (*kernels.Mat, error) {
	m, err := w.WeightSource.Expert(name, e, rows, cols)
	if err == nil {
		w.add(name+"#"+strconv.Itoa(e), matBytes(m))
	}
	return m, err
}

func (w *weightTally) Float32(name string, shape ...int) ([]float32, error) {
	v, err := w.WeightSource.Float32(name, shape...)
	if err == nil {
		w.add(name, 4*int64(len(v)))
	}
	return v, err
}

// matBytes is the memory m's values and block scales take.
func matBytes(m *kernels.Mat) int64 { return m.DataBytes() + 4*int64(len(m.Scale)) }

func (w *weightTally) add(key string, n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen[key] {
		w.seen[key] = true
		w.bytes += n
	}
}

func (w *weightTally) total() int64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bytes
}

// Memory reports what the model holds in its backend's memory
// (kernels.MemoryReporter; zero for a backend without it). On the host the
// backend reports only its copies of the weights (repacked for its
// kernels), so Weights adds the model's weights as loaded: mapped from the
// file or converted in RAM. Cheap enough for every step.
func (l *Loaded) Memory() kernels.MemoryUse {
	var u kernels.MemoryUse
	if r, ok := l.Backend.(kernels.MemoryReporter); ok {
		u = r.MemoryUse()
	}
	if !u.OnDevice {
		u.Weights += l.tally.total()
	}
	return u
}
