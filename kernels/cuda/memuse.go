//go:build linux && (amd64 || arm64)

package cuda

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// memInfoEvery is how long the device's free and total memory are reused
// before the driver is asked again: MemoryUse runs after every step.
const memInfoEvery = time.Second

// memAccount is the Backend's tally of the device memory it allocated, by
// kind, kept apart from the driver calls so that it is tested without a
// GPU. The staging buffers, expert tables and step graphs are not in it
// (they show in the driver's free memory).
type memAccount struct {
	weights atomic.Int64 // uploaded weights (Weight.Bytes)
	tensors atomic.Int64 // Alloc's tensors (KV cache, recurrent state, the model's buffers)

	mu          sync.Mutex // guards the rest
	asked       time.Time  // when the driver was last asked; zero: never
	free, total int64      // its last answer; 0 when unknown
}

// use is the tally with arena bytes of step arena. It asks query for the
// device's free and total memory when the last answer is older than
// memInfoEvery; a failed query leaves them unknown (0) until the next.
func (a *memAccount) use(arena int64, now time.Time, query func() (free, total int64, err error)) kernels.MemoryUse {
	a.mu.Lock()
	if a.asked.IsZero() || now.Sub(a.asked) >= memInfoEvery {
		a.asked = now
		f, t, err := query()
		if err != nil {
			f, t = 0, 0
		}
		a.free, a.total = f, t
	}
	free, total := a.free, a.total
	a.mu.Unlock()
	return kernels.MemoryUse{
		OnDevice: true,
		Weights:  a.weights.Load(),
		Tensors:  a.tensors.Load(),
		Arena:    arena,
		Total:    total,
		Free:     free,
	}
}

// release marks Alloc's tensor buffer tb freed and takes its Buffer out of
// the tally, returning the Buffer to free on the device. It panics for a
// Scratch tensor.
func (a *memAccount) release(tb *tensorBuf) *Buffer {
	if tb.buf == nil {
		panic("cuda: Free of a Scratch tensor (BeginStep releases them)")
	}
	buf := tb.buf
	tb.buf, tb.freed = nil, true
	a.tensors.Add(-buf.size)
	return buf
}

// capacity is the bytes of the arena's chunks.
func (a *arena) capacity() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, c := range a.chunks {
		n += c.size
	}
	return n
}

// MemoryUse implements kernels.MemoryReporter: the device memory the
// backend holds by kind, from its own counters, and the device's total and
// free memory from the driver (cuMemGetInfo, at most once a second; 0 when
// the driver lacks it).
func (b *Backend) MemoryUse() kernels.MemoryUse {
	return b.mem.use(b.arena.capacity()+b.dbufBytes.Load(), time.Now(), b.dev.MemInfo)
}
