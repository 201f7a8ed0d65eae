package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// spinFor is how long an idle helper polls for work before it blocks.
const spinFor = 200 * time.Microsecond

// pool is a fixed set of helper goroutines started once, so that a parallel
// call costs a channel send and a wake-up per helper instead of a goroutine
// spawn. The calling goroutine always works too, as worker 0.
//
// One parallel call runs at a time: acquire fails while another is in flight
// (a nested Parallel, or a second goroutine misusing the backend), and the
// caller then runs its work inline instead of deadlocking on busy helpers.
//
// Nothing is allocated per call: the call's description lives in the pool
// (job, mm), which only the goroutine holding the pool writes.
type pool struct {
	workers int                 // helpers + the caller
	wake    []chan *job         // (workers-1) helper inboxes
	done    sync.WaitGroup      // counts helpers still running the current call
	pending atomic.Int32        // the same, dropped after done: what run spins on
	busy    atomic.Bool         // a call is in flight, or the pool is closed
	failure atomic.Pointer[any] // first panic value raised on a helper
	quit    chan struct{}
	closing sync.Once

	job job              // the call in flight
	mm  [maxFused]matmul // the MatMuls in flight (one, or matMulsTo's)
	xs  xbufs            // its x converted for the tiles (int8 or bfloat16)
	// convertFn is mm.convertX, as a func value made once: the Parallel job
	// that converts mm's x rows [lo, hi).
	convertFn func(lo, hi int)
	scratch   [][]float32 // per worker: F8 activations times the block scales
}

// job is one parallel call, shared by its workers: either a Parallel (fn
// over n split nw ways) or one or more MatMuls (the tasks of mm[0], then
// of mm[1], ..., taken off next).
type job struct {
	fn    func(lo, hi int)
	n, nw int
	mm    []matmul
	next  atomic.Int64
}

// do runs worker w's share of j.
func (j *job) do(w int, scratch *[]float32) {
	if j.mm == nil {
		j.fn(w*j.n/j.nw, (w+1)*j.n/j.nw)
		return
	}
	for t := int(j.next.Add(1) - 1); ; t = int(j.next.Add(1) - 1) {
		i := 0
		for i < len(j.mm) && t >= j.mm[i].tasks {
			t -= j.mm[i].tasks
			i++
		}
		if i == len(j.mm) {
			return
		}
		j.mm[i].task(t, scratch)
	}
}

func newPool(workers int) *pool {
	p := &pool{workers: workers, quit: make(chan struct{}), scratch: make([][]float32, workers)}
	p.convertFn = func(lo, hi int) { p.mm[0].convertX(lo, hi) }
	for w := 1; w < workers; w++ {
		ch := make(chan *job, 1) // buffered: the caller never waits for a polling helper
		p.wake = append(p.wake, ch)
		go p.helper(w, ch)
	}
	return p
}

func (p *pool) helper(id int, ch chan *job) {
	for {
		// Poll for a while before blocking: a parked thread takes tens to
		// hundreds of µs to wake on a VM, far more than the ops between two
		// parallel calls of a decode step.
		var j *job
		for start := time.Now(); j == nil && time.Since(start) < spinFor; {
			select {
			case j = <-ch:
			case <-p.quit:
				return
			default:
				runtime.Gosched()
			}
		}
		if j == nil {
			select {
			case j = <-ch:
			case <-p.quit:
				return
			}
		}
		p.call(id, j)
	}
}

// call runs a helper's share of j and records a panic instead of crashing
// the process, so run can re-raise it on the caller's goroutine, where the
// engine can recover it.
func (p *pool) call(id int, j *job) {
	defer func() {
		if r := recover(); r != nil {
			v := r // escapes; only a panicking call pays for it
			p.failure.CompareAndSwap(nil, &v)
		}
		p.done.Done()
		p.pending.Add(-1)
	}()
	j.do(id, &p.scratch[id])
}

// acquire claims the pool for one call; release gives it back.
func (p *pool) acquire() bool { return p.busy.CompareAndSwap(false, true) }
func (p *pool) release()      { p.busy.Store(false) }

// run runs p.job on workers [0, nw) concurrently, worker 0 on the calling
// goroutine, and returns when all are done. The caller must hold the pool and
// 1 ≤ nw ≤ p.workers. A panic on any worker is re-raised here.
func (p *pool) run(nw int) {
	j := &p.job
	p.done.Add(nw - 1)
	p.pending.Store(int32(nw - 1))
	for w := 1; w < nw; w++ {
		p.wake[w-1] <- j
	}
	func() {
		defer p.wait() // also when worker 0 panics: helpers must finish first
		j.do(0, &p.scratch[0])
	}()
	j.fn, j.mm = nil, nil // let the GC have the caller's data
	if r := p.failure.Swap(nil); r != nil {
		panic(*r)
	}
}

// wait returns when the helpers of the call in flight are done. It polls
// for up to spinFor before it blocks: the helpers usually finish within
// microseconds of the caller, and a goroutine parked in WaitGroup.Wait
// takes tens of µs to wake on a VM, which a decode step (hundreds of
// parallel ops) would pay every time.
func (p *pool) wait() {
	for start := time.Now(); p.pending.Load() != 0 && time.Since(start) < spinFor; {
		for range 64 {
			if p.pending.Load() == 0 {
				break
			}
		}
		runtime.Gosched()
	}
	p.done.Wait() // returns at once once pending is 0: Done comes first
}

// close stops the helpers once no call is in flight. The pool then stays
// busy forever, so later calls run inline on the caller.
func (p *pool) close() {
	p.closing.Do(func() {
		for !p.acquire() {
			runtime.Gosched()
		}
		close(p.quit)
	})
}
