//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"slices"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// CUDA graphs for repeated steps. A step's ops are queued until EndStep
// (queue), so the whole step is known before anything launches. EndStep
// first runs the queued closures in trace mode, which records every launch
// (kernel, grid, block, arguments: device addresses included) instead of
// issuing it. A step whose trace equals that of a cached graph replays it
// with one cuGraphLaunch. A step whose trace was seen before among the
// last graphSeenSize traces without a graph is captured (stream capture,
// relaxed mode, cuBLASLt included) and replayed; any other step launches
// eagerly and its trace's hash is remembered. So a trace captures on its
// second sighting, whatever ran in between: speculative decoding
// alternates MTP draft passes and verification passes of a few shapes
// every step, and each shape replays from its second occurrence on.
//
// What makes a replay exact: the trace holds every launch argument, so a
// graph replays only where eager launching would issue the same launches,
// and the queued closures do nothing but launch (no allocation, copy,
// read-back or host branch on device data inside a step; uploads of the
// step's inputs come before BeginStep, read-backs after EndStep). Decode
// steps of one batch shape repeat their trace exactly: their inputs live in
// fixed buffers (gqa.Inputs: one packed upload of ids, positions, sequence
// map, slots, output rows and block tables; hybrids' state rows; the MTP
// layer's hidden rows), the arena hands out the same addresses, and
// everything that changes between tokens is device data the kernels read.
// A new block-table width, batch size or arena chunk changes the trace, as
// ggml-cuda re-captures when a node's properties change. A hash collision
// among the remembered traces captures early at worst: the graph is keyed
// by the whole trace.
//
// The Backend keeps the graphs of the last graphCacheSize traces (least
// recently used out first, its graph exec destroyed): under continuous
// batching the batch size comes and goes as sequences finish and arrive,
// and a shape seen again replays at once.

// traceGemm marks a cuBLASLt call in a launch trace (no kernel handle is 1).
const traceGemm = 1

// captureRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED.
const captureRelaxed = 2

// graphCacheSize is the most step graphs a Backend keeps: a decode shape,
// and speculation's verification and draft shapes at a few draft lengths.
const graphCacheSize = 32

// graphSeenSize is how many recent traces without a graph are remembered
// (by hash) for capture on their second sighting.
const graphSeenSize = 64

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
	seen    [graphSeenSize]uint64 // hashes of recent traces without a graph (0: empty), a ring
	next    int                   // the ring's next slot
	cache   []stepGraph           // at most graphCacheSize
	clock   uint64                // steps looked up, for least-recently-used eviction
	buf     []uint64              // the trace of the step being launched

	n kernels.StepGraphs // counts; Err is why capturing failed, which turned graphs off
}

// traceHash is a hash of a launch trace (never 0), to skip most
// comparisons.
func traceHash(tr []uint64) uint64 {
	h := uint64(14695981039346656037)
	for _, v := range tr {
		h = (h ^ v) * 1099511628211
	}
	return h | 1
}

// lookup decides how a step of trace tr launches: through the cached graph
// it returns (marked used), by capturing a graph (capture: tr was seen
// before among the remembered traces, which forget it now), or eagerly
// (tr is remembered). It returns tr's hash too.
func (g *stepGraphs) lookup(tr []uint64) (c *stepGraph, capture bool, h uint64) {
	h = traceHash(tr)
	if c = g.find(tr, h); c != nil {
		return c, false, h
	}
	if i := slices.Index(g.seen[:], h); i >= 0 {
		g.seen[i] = 0
		return nil, true, h
	}
	g.seen[g.next] = h
	g.next = (g.next + 1) % graphSeenSize
	return nil, false, h
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
	g.n.Evictions++
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
// cached graph when the step repeats a captured trace, capturing one on a
// trace's second sighting, eagerly otherwise.
func (b *Backend) runStepL(ops []func(*Device) error) error {
	d, g := b.dev, &b.graphs
	if d.prof != nil && !d.prof.graph && len(ops) > 0 {
		d.prof.table.steps++
	}
	if !g.enabled || len(ops) == 0 {
		g.n.Eager++
		return runOps(d, ops)
	}
	tr := g.buf[:0] // reused: only a captured step's trace is kept (cloned)
	d.trace = &tr
	err := runOps(d, ops)
	d.trace = nil
	g.buf = tr
	if err != nil {
		return err
	}
	c, capture, h := g.lookup(tr)
	switch {
	case c != nil:
	case capture:
		exec, err := b.captureL(ops)
		if err != nil {
			g.enabled, g.n.Err = false, err
			g.n.Eager++
			return runOps(d, ops)
		}
		if old := g.add(slices.Clone(tr), h, exec); old != 0 {
			call(driver.cuGraphExecDestroy, old)
		}
		g.n.Captures++
		c = &stepGraph{exec: exec}
	default:
		g.n.Eager++
		return runOps(d, ops)
	}
	g.n.Replays++
	if d.prof != nil {
		return d.prof.replayL(d, c.exec)
	}
	if st := b.stepTime; st != nil {
		st.recordL(d, false)
		err := check("cuGraphLaunch", call(driver.cuGraphLaunch, c.exec, d.stream))
		st.recordL(d, true)
		st.recorded = err == nil
		return err
	}
	return check("cuGraphLaunch", call(driver.cuGraphLaunch, c.exec, d.stream))
}

// captureL records ops into a graph and returns it instantiated.
func (b *Backend) captureL(ops []func(*Device) error) (uintptr, error) {
	d := b.dev
	// The step's uploads are queued before it (uploadAsyncL): let them run
	// first, so the capture begins on an idle stream (once per shape).
	if err := d.syncL(); err != nil {
		return 0, err
	}
	if err := check("cuStreamBeginCapture", call(driver.cuStreamBeginCapture, d.stream, captureRelaxed)); err != nil {
		return 0, err
	}
	d.prof.beginCapture()
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
	d.prof.endCapture(exec, err)
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
	n := b.StepGraphStats()
	return n.Captures, n.Replays, n.Err
}

var _ kernels.StepGrapher = (*Backend)(nil)

// StepGraphStats implements kernels.StepGrapher.
func (b *Backend) StepGraphStats() kernels.StepGraphs {
	var n kernels.StepGraphs
	b.dev.do(func() error {
		n = b.graphs.n
		n.Cached = len(b.graphs.cache)
		return nil
	})
	return n
}
