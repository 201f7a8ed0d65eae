//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"slices"
	"unsafe"
)

// CUDA graphs for repeated steps. A step's ops are queued until EndStep
// (queue), so the whole step is known before anything launches. EndStep
// first runs the queued closures in trace mode, which records every launch
// (kernel, grid, block, arguments: device addresses included) instead of
// issuing it. A step whose trace equals that of a captured graph replays it
// with one cuGraphLaunch; a step that repeats the previous step's trace is
// captured (stream capture, relaxed mode, cuBLASLt included) and replayed;
// any other step launches eagerly. Decode steps of one batch shape repeat
// their trace exactly: their inputs live in fixed buffers, the arena hands
// out the same addresses, and everything that changes between tokens (ids,
// positions, slots, block tables) is device data the kernels read. A new
// block-table width, batch size or arena chunk changes the trace, as
// ggml-cuda re-captures when a node's properties change. The Backend keeps
// the graphs of the last graphCacheSize shapes (least recently used out
// first): under continuous batching the batch size comes and goes as
// sequences finish and arrive, and a shape seen again replays at once.

// traceGemm marks a cuBLASLt call in a launch trace (no kernel handle is 1).
const traceGemm = 1

// captureRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED.
const captureRelaxed = 2

// graphCacheSize is the most step graphs a Backend keeps.
const graphCacheSize = 8

// stepGraph is one captured step: its trace and instantiated graph.
type stepGraph struct {
	hash  uint64
	trace []uint64
	exec  uintptr // CUgraphExec
	used  uint64  // stepGraphs.clock when last replayed
}

// stepGraphs is a Backend's graph state, owned by the device thread.
type stepGraphs struct {
	enabled bool
	last    []uint64    // the previous step's launch trace
	cache   []stepGraph // at most graphCacheSize
	clock   uint64      // steps looked up, for least-recently-used eviction
	err     error       // why capturing failed, which turned graphs off

	captures, replays int // counts, for tests and benchmarks
}

// traceHash is a hash of a launch trace, to skip most comparisons.
func traceHash(tr []uint64) uint64 {
	h := uint64(14695981039346656037)
	for _, v := range tr {
		h = (h ^ v) * 1099511628211
	}
	return h
}

// find returns the cached graph of trace tr (hash h), marked used, or nil.
func (g *stepGraphs) find(tr []uint64, h uint64) *stepGraph {
	g.clock++
	for i := range g.cache {
		if c := &g.cache[i]; c.hash == h && slices.Equal(c.trace, tr) {
			c.used = g.clock
			return c
		}
	}
	return nil
}

// add caches the graph exec of trace tr (hash h) and returns the graph it
// evicts to make room (0 for none), for the caller to destroy.
func (g *stepGraphs) add(tr []uint64, h uint64, exec uintptr) (evicted uintptr) {
	c := stepGraph{hash: h, trace: tr, exec: exec, used: g.clock}
	if len(g.cache) < graphCacheSize {
		g.cache = append(g.cache, c)
		return 0
	}
	lru := 0
	for i := range g.cache {
		if g.cache[i].used < g.cache[lru].used {
			lru = i
		}
	}
	evicted, g.cache[lru] = g.cache[lru].exec, c
	return evicted
}

// graphsEnabled is the default for new Backends: on unless
// FERRITE_CUDA_GRAPHS=0 (a switch for comparing with eager launches).
func graphsEnabled() bool { return os.Getenv("FERRITE_CUDA_GRAPHS") != "0" }

// runOps launches ops in order, stopping at the first error.
func runOps(d *Device, ops []func(*Device) error) error {
	for _, f := range ops {
		if err := f(d); err != nil {
			return err
		}
	}
	return nil
}

// runStepL launches a step's queued ops on the device thread: through a
// cached graph when the step repeats its trace, capturing one when it
// repeats the previous step, eagerly otherwise.
func (b *Backend) runStepL(ops []func(*Device) error) error {
	d, g := b.dev, &b.graphs
	if d.prof != nil && len(ops) > 0 {
		d.prof.table.steps++
	}
	if !g.enabled || len(ops) == 0 {
		return runOps(d, ops)
	}
	tr := make([]uint64, 0, max(len(g.last), 64))
	d.trace = &tr
	err := runOps(d, ops)
	d.trace = nil
	if err != nil {
		return err
	}
	repeat := slices.Equal(tr, g.last)
	g.last = tr
	h := traceHash(tr)
	c := g.find(tr, h)
	switch {
	case c != nil:
	case repeat:
		exec, err := b.captureL(ops)
		if err != nil {
			g.enabled, g.err = false, err
			return runOps(d, ops)
		}
		if old := g.add(tr, h, exec); old != 0 {
			call(driver.cuGraphExecDestroy, old)
		}
		g.captures++
		c = &stepGraph{exec: exec}
	default:
		return runOps(d, ops)
	}
	g.replays++
	return check("cuGraphLaunch", call(driver.cuGraphLaunch, c.exec, d.stream))
}

// captureL records ops into a graph and returns it instantiated.
func (b *Backend) captureL(ops []func(*Device) error) (uintptr, error) {
	d := b.dev
	if err := check("cuStreamBeginCapture", call(driver.cuStreamBeginCapture, d.stream, captureRelaxed)); err != nil {
		return 0, err
	}
	runErr := runOps(d, ops)
	var graph, exec uintptr
	err := check("cuStreamEndCapture", call(driver.cuStreamEndCapture, d.stream, uintptr(unsafe.Pointer(&graph))))
	if runErr != nil {
		err = runErr
	}
	if err == nil {
		err = check("cuGraphInstantiate", call(driver.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), graph, 0))
	}
	if graph != 0 {
		call(driver.cuGraphDestroy, graph)
	}
	return exec, err
}

// dropGraphL destroys every cached graph.
func (b *Backend) dropGraphL() {
	g := &b.graphs
	for _, c := range g.cache {
		call(driver.cuGraphExecDestroy, c.exec)
	}
	g.cache = nil
}

// GraphStats reports how many step graphs were captured and how many steps
// replayed one, and why graphs were turned off (nil while they are on).
func (b *Backend) GraphStats() (captures, replays int, err error) {
	b.dev.do(func() error {
		captures, replays, err = b.graphs.captures, b.graphs.replays, b.graphs.err
		return nil
	})
	return
}
