package cpu

import (
	"sync"
	"sync/atomic"

	"github.com/ferrite-llm/ferrite/kernels"
)

// weightCache holds a value made once per weight matrix: a form MatMul
// reads instead of the matrix itself (x8Cache's repacked Q4_0 and Q8_0
// weights, residentCache's copies in huge pages; mlaSplits' per-head
// kv_b_proj matrices, for AttentionMLA), and the bytes those
// values hold, for MemoryUse from any goroutine. MatMul (on the engine's
// goroutine) and PrepareWeights (on its own) both go through get.
type weightCache[V any] struct {
	mu    sync.Mutex
	m     map[*kernels.Mat]*weightEntry[V]
	bytes atomic.Int64
}

// weightEntry is one matrix's value, made once.
type weightEntry[V any] struct {
	once sync.Once
	v    V
	made atomic.Bool // v is made (peek)
}

// get returns w's value, made by build on first use; build returns the
// value and the bytes it holds. Concurrent callers for one w wait for the
// first one's build.
func (c *weightCache[V]) get(w *kernels.Mat, build func() (V, int64)) V {
	c.mu.Lock()
	e := c.m[w]
	if e == nil {
		if c.m == nil {
			c.m = map[*kernels.Mat]*weightEntry[V]{}
		}
		e = &weightEntry[V]{}
		c.m[w] = e
	}
	c.mu.Unlock()
	e.once.Do(func() {
		var n int64
		e.v, n = build()
		c.bytes.Add(n)
		e.made.Store(true)
	})
	return e.v
}

// peek returns w's value and true where it has been made, without making
// it.
func (c *weightCache[V]) peek(w *kernels.Mat) (v V, ok bool) {
	c.mu.Lock()
	e := c.m[w]
	c.mu.Unlock()
	if e == nil || !e.made.Load() {
		return v, false
	}
	return e.v, true
}

// drop forgets every value (Backend.Close): their memory then goes as soon
// as the collector finds it, whoever still holds the backend, instead of
// with the backend. A get after drop makes the value again.
func (c *weightCache[V]) drop() {
	c.mu.Lock()
	c.m = nil
	c.bytes.Store(0)
	c.mu.Unlock()
}
