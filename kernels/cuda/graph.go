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
// issuing it. A step whose trace equals the graph's replays the graph with
// one cuGraphLaunch; a step that repeats the previous step's trace is
// captured (stream capture, relaxed mode, cuBLASLt included) and replayed;
// any other step launches eagerly. Decode steps of one batch shape repeat
// their trace exactly: their inputs live in fixed buffers, the arena hands
// out the same addresses, and everything that changes between tokens (ids,
// positions, slots, block tables) is device data the kernels read. A new
// block-table width, batch size or arena chunk changes the trace and so
// the graph, as ggml-cuda re-captures when a node's properties change.

// traceGemm marks a cuBLASLt call in a launch trace (no kernel handle is 1).
const traceGemm = 1

// captureRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED.
const captureRelaxed = 2

// stepGraphs is a Backend's graph state, owned by the device thread.
type stepGraphs struct {
	enabled bool
	last    []uint64 // the previous step's launch trace
	trace   []uint64 // the trace exec was captured from
	exec    uintptr  // CUgraphExec; 0 for none
	err     error    // why capturing failed, which turned graphs off

	captures, replays int // counts, for tests and benchmarks
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

// runStepL launches a step's queued ops on the device thread: through the
// graph when the step repeats a captured trace, capturing one when it
// repeats the previous step, eagerly otherwise.
func (b *Backend) runStepL(ops []func(*Device) error) error {
	d, g := b.dev, &b.graphs
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
	switch {
	case g.exec != 0 && slices.Equal(tr, g.trace):
	case repeat:
		if err := b.captureL(ops, tr); err != nil {
			g.enabled, g.err = false, err
			return runOps(d, ops)
		}
		g.captures++
	default:
		return runOps(d, ops)
	}
	g.replays++
	return check("cuGraphLaunch", call(driver.cuGraphLaunch, g.exec, d.stream))
}

// captureL records ops into a graph and instantiates it as the Backend's
// graph for trace tr, replacing the previous one.
func (b *Backend) captureL(ops []func(*Device) error, tr []uint64) error {
	d, g := b.dev, &b.graphs
	if err := check("cuStreamBeginCapture", call(driver.cuStreamBeginCapture, d.stream, captureRelaxed)); err != nil {
		return err
	}
	runErr := runOps(d, ops)
	var graph uintptr
	err := check("cuStreamEndCapture", call(driver.cuStreamEndCapture, d.stream, uintptr(unsafe.Pointer(&graph))))
	if runErr != nil {
		err = runErr
	}
	if err == nil {
		var exec uintptr
		err = check("cuGraphInstantiate", call(driver.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), graph, 0))
		if err == nil {
			b.dropGraphL()
			g.exec, g.trace = exec, tr
		}
	}
	if graph != 0 {
		call(driver.cuGraphDestroy, graph)
	}
	return err
}

// dropGraphL destroys the instantiated graph, if any.
func (b *Backend) dropGraphL() {
	g := &b.graphs
	if g.exec != 0 {
		call(driver.cuGraphExecDestroy, g.exec)
		g.exec, g.trace = 0, nil
	}
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
