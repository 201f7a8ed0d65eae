//go:build linux && (amd64 || arm64)

package cuda

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

var _ kernels.Profiler = (*Backend)(nil)

// Per-kernel GPU profiling, on when FERRITE_CUDA_PROFILE is 1 (or eager)
// or graph at Open; programmatic dependent launch is off in both modes.
//
// Eager (1): the device runs without step graphs and brackets every kernel
// launch, cuBLASLt matmul, host↔device copy and memset on its stream with a
// pair of CUDA events from a pool made at Open. When the pool is used up, or a report is asked for, the
// device waits for the stream and adds each pair's elapsed time to a table
// keyed by kernel name, grid and block (or GEMM shape, or copy size), which
// also counts steps (runStepL calls). Times are stream times between the
// two events: on a busy stream a kernel's execution time, but when the GPU
// has run out of work (tiny decode kernels launched eagerly) the start
// event completes at once and the span also holds the host's launch of the
// kernel. The gap between a span and the one before tells the two apart: a
// row's starved% is the share of its calls that followed an idle GPU, and
// the idle total is how much of a step the host, not the GPU, took.
//
// Graph: step graphs stay on; a step's capture puts an event record node
// (cuEventRecordWithFlags, CU_EVENT_RECORD_EXTERNAL) before and after every
// kernel and GEMM, each graph keeps the rows of its spans, and every replay
// is harvested at once (so graphs can share the pool's events). Only
// replayed steps are timed and counted: kernels back to back as a graph
// runs them, without host gaps; the steps that run eagerly (a shape's
// first, most prefills) are not timed at all.

// profilePairs is the event pairs a profiling Device keeps.
const profilePairs = 8192

// starvedUs is the gap before a span, in µs, from which the span counts as
// starved: the GPU had run out of work, so the span's time includes the
// host's launch of its kernel (a lower gap is event resolution).
const starvedUs = 1.0

// Profiling modes (FERRITE_CUDA_PROFILE).
const (
	profileOff   = ""
	profileEager = "eager" // FERRITE_CUDA_PROFILE=1 or eager
	profileGraph = "graph"
)

// profileMode is the mode FERRITE_CUDA_PROFILE asks for: 1 or eager, graph;
// anything else (unset, 0) is off.
func profileMode() string {
	switch os.Getenv("FERRITE_CUDA_PROFILE") {
	case "1", "eager":
		return profileEager
	case "graph":
		return profileGraph
	}
	return profileOff
}

// recordExternal is CU_EVENT_RECORD_EXTERNAL: during stream capture, an
// event record node instead of a capture dependency.
const recordExternal = 1

// profKind is what a profiled span is.
type profKind uint8

const (
	profKernel profKind = iota // name, grid, block
	profGemm                   // dims: m (rows of x), n (rows of W), k (cols), acc
	profHtoD                   // size
	profDtoH                   // size
	profMemset                 // size
)

// profKey identifies one row of the table.
type profKey struct {
	kind  profKind
	name  string
	dims  [3]uint32
	block uint32
	size  int64 // bytes copied or set
}

// group is the row's kernel without the launch shape: "gemv_bf16_1",
// "cublasLt", "memcpy HtoD", "memset".
func (k profKey) group() string {
	switch k.kind {
	case profGemm:
		return "cublasLt"
	case profHtoD:
		return "memcpy HtoD"
	case profDtoH:
		return "memcpy DtoH"
	case profMemset:
		return "memset"
	}
	return strings.TrimPrefix(k.name, "ferrite_")
}

// label is the row's text: "ferrite_gemv_bf16_1 grid=1024x1x1 blk=256".
func (k profKey) label() string {
	switch k.kind {
	case profGemm:
		acc := ""
		if k.block != 0 {
			acc = " +=" // β = 1
		}
		return fmt.Sprintf("cublasLt m=%d n=%d k=%d%s", k.dims[0], k.dims[1], k.dims[2], acc)
	case profHtoD:
		return fmt.Sprintf("memcpy HtoD %dB", k.size)
	case profDtoH:
		return fmt.Sprintf("memcpy DtoH %dB", k.size)
	case profMemset:
		return fmt.Sprintf("memset %dB", k.size)
	}
	return fmt.Sprintf("%s grid=%dx%dx%d blk=%d", strings.TrimPrefix(k.name, "ferrite_"), k.dims[0], k.dims[1], k.dims[2], k.block)
}

// profRow is one label's count and total GPU time.
type profRow struct {
	label   string
	group   string // the kernel (or cublasLt, memcpy HtoD, ...) without its launch shape
	calls   int
	us      float64
	starved int // calls the GPU idled before (see starvedUs)
}

// profTable accumulates rows by key; it is pure bookkeeping (no CUDA).
type profTable struct {
	mode  string // what was timed, the first line of the report
	index map[profKey]int
	rows  []profRow
	steps int
	idle  float64 // µs the GPU idled between spans (measured gaps only)
}

// row returns the index of k's row, adding it on first use.
func (t *profTable) row(k profKey) int {
	if i, ok := t.index[k]; ok {
		return i
	}
	if t.index == nil {
		t.index = map[profKey]int{}
	}
	t.index[k] = len(t.rows)
	t.rows = append(t.rows, profRow{label: k.label(), group: k.group()})
	return len(t.rows) - 1
}

// add counts one call of row i that took us microseconds, after a gap of
// gap µs since the previous span ended (negative: not measured).
func (t *profTable) add(i int, us, gap float64) {
	t.rows[i].calls++
	t.rows[i].us += us
	if gap >= starvedUs {
		t.rows[i].starved++
	}
	t.idle += max(gap, 0)
}

// reset zeroes every count, keeping the rows themselves: cached step
// graphs hold row indices.
func (t *profTable) reset() {
	for i := range t.rows {
		t.rows[i] = profRow{label: t.rows[i].label, group: t.rows[i].group}
	}
	t.steps, t.idle = 0, 0
}

// write prints two tables sorted by total time, largest first, each with
// its sum: by kernel (launch shapes together), then by launch shape. Their
// columns: label, calls, calls per step, µs per call, µs per step, share of
// the total, share of calls starved. Then the GPU's idle time between
// spans. Per-step columns are blank when no step was counted.
func (t *profTable) write(w io.Writer) error {
	var rows, groups []profRow
	at := map[string]int{}
	calls := 0
	for _, r := range t.rows {
		if r.calls == 0 {
			continue // counted before a reset
		}
		rows = append(rows, r)
		calls += r.calls
		i, ok := at[r.group]
		if !ok {
			i, at[r.group] = len(groups), len(groups)
			groups = append(groups, profRow{label: r.group})
		}
		g := &groups[i]
		g.calls, g.us, g.starved = g.calls+r.calls, g.us+r.us, g.starved+r.starved
	}
	perStep := func(v float64) string {
		if t.steps == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", v/float64(t.steps))
	}
	if t.mode != "" {
		fmt.Fprintln(w, t.mode)
	}
	fmt.Fprintln(w, "by kernel:")
	if err := writeRows(w, groups, t.steps, perStep); err != nil {
		return err
	}
	fmt.Fprintln(w, "by launch shape:")
	if err := writeRows(w, rows, t.steps, perStep); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "GPU idle between spans: %.1f µs, %s µs/step, %.2f µs a call (starved%%: calls after the GPU idled ≥ %g µs; "+
		"eager, their time includes their launch; in graphs, the gap is the event nodes' own)\n", t.idle, perStep(t.idle), t.idle/float64(max(calls, 1)), starvedUs)
	return err
}

// writeRows prints rows sorted by total time and their sum (see write).
func writeRows(w io.Writer, rows []profRow, steps int, perStep func(float64) string) error {
	rows = slices.Clone(rows)
	slices.SortStableFunc(rows, func(a, b profRow) int { return cmp.Compare(b.us, a.us) })
	var total float64
	calls, starved := 0, 0
	width := len("kernel")
	for _, r := range rows {
		total += r.us
		calls += r.calls
		starved += r.starved
		width = max(width, len(r.label))
	}
	totalLabel := fmt.Sprintf("total (%d steps)", steps)
	width = max(width, len(totalLabel))
	pct := func(n, of int) float64 { return 100 * float64(n) / float64(max(of, 1)) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tcalls\tcalls/step\tµs/call\tµs/step\t%%\tstarved%%\t\n", width, "kernel")
	for _, r := range rows {
		share := 0.0
		if total > 0 {
			share = 100 * r.us / total
		}
		fmt.Fprintf(tw, "%-*s\t%d\t%s\t%.2f\t%s\t%.1f\t%.0f\t\n", width, r.label, r.calls, perStep(float64(r.calls)),
			r.us/float64(max(r.calls, 1)), perStep(r.us), share, pct(r.starved, r.calls))
	}
	fmt.Fprintf(tw, "%-*s\t%d\t%s\t%.2f\t%s\t100.0\t%.0f\t\n", width, totalLabel, calls, perStep(float64(calls)),
		total/float64(max(calls, 1)), perStep(total), pct(starved, calls))
	return tw.Flush()
}

// profiler is a Device's event pool and table, owned by the device thread.
type profiler struct {
	events    []uintptr // 2 × profilePairs: start, stop of pair i at 2i, 2i+1
	rows      []int     // the table row of each pair in use
	table     profTable
	graph     bool // FERRITE_CUDA_PROFILE=graph: time replayed step graphs only
	capturing bool // a step graph is being captured: spans become event record nodes
	// graphRows are the rows of each step graph's timed spans, by its
	// CUgraphExec (a later capture given a freed handle overwrites them).
	graphRows map[uintptr][]int
}

// newProfilerL makes the event pool for mode (profileEager or
// profileGraph; graph falls back to eager without cuEventRecordWithFlags).
func newProfilerL(mode string) (*profiler, error) {
	p := &profiler{events: make([]uintptr, 0, 2*profilePairs), rows: make([]int, 0, profilePairs)}
	p.graph = mode == profileGraph && driver.cuEventRecordWithFlags != 0
	switch {
	case p.graph:
		p.table.mode = "mode graph: replayed step graphs only, an event record node around each kernel and GEMM (no PDL); steps run eagerly (a shape's first, most prefills) untimed"
	case mode == profileGraph:
		p.table.mode = "mode eager (graph asked for, but the driver has no cuEventRecordWithFlags): every launch, copy and memset between two events, no graphs, no PDL"
	default:
		p.table.mode = "mode eager: every launch, copy and memset between two events, no graphs, no PDL"
	}
	for range 2 * profilePairs {
		var e uintptr
		if err := check("cuEventCreate", call(driver.cuEventCreate, uintptr(unsafe.Pointer(&e)), 0)); err != nil {
			p.closeL()
			return nil, err
		}
		p.events = append(p.events, e)
	}
	return p, nil
}

// closeL destroys the events.
func (p *profiler) closeL() {
	for _, e := range p.events {
		call(driver.cuEventDestroy, e)
	}
	p.events = nil
}

// harvestL waits for the pairs in use and adds their times to the table.
func (p *profiler) harvestL() error {
	if len(p.rows) == 0 {
		return nil
	}
	last := p.events[2*len(p.rows)-1]
	if err := check("cuEventSynchronize", call(driver.cuEventSynchronize, last)); err != nil {
		return err
	}
	elapsed := func(from, to uintptr) (float64, error) {
		var ms float32
		err := check("cuEventElapsedTime", call(driver.cuEventTime, uintptr(unsafe.Pointer(&ms)), from, to))
		return 1000 * float64(ms), err
	}
	for i, r := range p.rows {
		us, err := elapsed(p.events[2*i], p.events[2*i+1])
		if err != nil {
			return err
		}
		gap := -1.0 // the first pair's predecessor was reused
		if i > 0 {
			if gap, err = elapsed(p.events[2*i-1], p.events[2*i]); err != nil {
				return err
			}
		}
		p.table.add(r, us, gap)
	}
	p.rows = p.rows[:0]
	return nil
}

// spanL runs f, which queues one piece of work on d's stream, between the
// next pair of events, counted under k. In graph mode only work captured
// into a step graph is timed.
func (p *profiler) spanL(d *Device, k profKey, f func() error) error {
	if p.graph && !p.capturing {
		return f()
	}
	if len(p.rows) == profilePairs {
		if p.capturing {
			return fmt.Errorf("cuda: profile: a step of more than %d timed spans cannot be captured", profilePairs)
		}
		if err := p.harvestL(); err != nil {
			return err
		}
	}
	i := len(p.rows)
	if err := p.recordL(d, p.events[2*i]); err != nil {
		return err
	}
	if err := f(); err != nil {
		return err
	}
	if err := p.recordL(d, p.events[2*i+1]); err != nil {
		return err
	}
	p.rows = append(p.rows, p.table.row(k))
	return nil
}

// recordL records event e on d's stream: an event record node while a
// graph is being captured.
func (p *profiler) recordL(d *Device, e uintptr) error {
	if p.capturing {
		return check("cuEventRecordWithFlags", call(driver.cuEventRecordWithFlags, e, d.stream, recordExternal))
	}
	return check("cuEventRecord", call(driver.cuEventRecord, e, d.stream))
}

// beginCapture arms graph mode's spans for a step graph's capture (a no-op
// on a nil or eager profiler: eager mode captures nothing).
func (p *profiler) beginCapture() {
	if p != nil && p.graph {
		p.rows, p.capturing = p.rows[:0], true
	}
}

// endCapture ends the capture of graph exec (none when err is set) and
// keeps the rows of the spans it timed for the graph's replays.
func (p *profiler) endCapture(exec uintptr, err error) {
	if p == nil || !p.capturing {
		return
	}
	if err == nil {
		if p.graphRows == nil {
			p.graphRows = map[uintptr][]int{}
		}
		p.graphRows[exec] = slices.Clone(p.rows)
	}
	p.rows, p.capturing = p.rows[:0], false
}

// replayL launches step graph exec and, in graph mode, counts the step and
// adds the times of its spans as soon as it finishes.
func (p *profiler) replayL(d *Device, exec uintptr) error {
	if err := check("cuGraphLaunch", call(driver.cuGraphLaunch, exec, d.stream)); err != nil || !p.graph {
		return err
	}
	p.table.steps++
	p.rows = append(p.rows[:0], p.graphRows[exec]...)
	return p.harvestL()
}

// profiledL runs f under d's profiler when it has one, else just runs it.
func (d *Device) profiledL(k profKey, f func() error) error {
	if d.prof == nil {
		return f()
	}
	return d.prof.spanL(d, k, f)
}

// Profiling reports whether the device times its work (FERRITE_CUDA_PROFILE=1).
func (d *Device) Profiling() bool { return d.prof != nil }

// ResetProfile forgets the times and steps counted so far (work still in
// flight is dropped too).
func (d *Device) ResetProfile() {
	d.do(func() error {
		if d.prof != nil {
			err := d.prof.harvestL()
			d.prof.table.reset()
			return err
		}
		return nil
	})
}

// WriteProfile waits for queued work and writes the profile table (see
// profTable.write) to w; it writes nothing when the device is not profiling.
func (d *Device) WriteProfile(w io.Writer) error {
	t, err := d.profileTable()
	if err != nil || t.mode == "" { // not profiling
		return err
	}
	return t.write(w)
}

// profileTable waits for queued work and returns a copy of the table.
func (d *Device) profileTable() (profTable, error) {
	var t profTable
	err := d.do(func() error {
		if d.prof == nil {
			return nil
		}
		err := d.prof.harvestL()
		t = d.prof.table
		t.rows = slices.Clone(t.rows)
		t.index = maps.Clone(t.index)
		return err
	})
	return t, err
}

// Profiling implements kernels.Profiler: the device times its kernels
// (FERRITE_CUDA_PROFILE) or the backend its steps (FERRITE_CUDA_STEPTIME=1).
func (b *Backend) Profiling() bool { return b.dev.Profiling() || b.stepTime != nil }

// ResetProfile implements kernels.Profiler.
func (b *Backend) ResetProfile() {
	if b.dev.Profiling() {
		b.dev.ResetProfile()
	}
	if b.stepTime != nil {
		b.dev.do(func() error { b.stepTime.reset(); return nil })
	}
}

// WriteProfile implements kernels.Profiler: the kernel table, then the
// step times.
func (b *Backend) WriteProfile(w io.Writer) error {
	if b.dev.Profiling() {
		if err := b.dev.WriteProfile(w); err != nil {
			return err
		}
	}
	if b.stepTime != nil {
		return b.stepTime.write(w)
	}
	return nil
}
