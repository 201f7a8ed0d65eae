//go:build linux && (amd64 || arm64)

package cuda

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unsafe"
)

// Step timing, on when FERRITE_CUDA_STEPTIME=1 at OpenBackend: where the
// wall time of a step goes between the host and the GPU, without changing
// how the step runs (graphs and PDL stay on). For every step the backend
// notes host times: the gap since the previous step ended (the runtime's
// sampling, scheduling and input building, the output read-back), the
// launches' building (BeginStep to EndStep), the hand-over to the device
// thread, the queued uploads, the launch (the trace run and cuGraphLaunch,
// or the eager launches), the wait for the stream and the return. A
// replayed step also records a CUDA event just before and just after its
// graph on the stream, which gives the graph's GPU time and the GPU's idle
// time since the previous replay's end. The table (Backend.WriteProfile,
// which ferrite bench prints after each case) has, per kind of step
// (replayed, captured, eager), the mean of each part, and for replayed
// steps the spread of their period (begin to next begin) and GPU time, and
// the Go garbage collections run meanwhile. FERRITE_CUDA_STEPTIME=ops also
// splits the build by op: each op queued inside a step is charged the host
// time since the op before it was queued (the engine's code between them
// and the op's own), keyed by the Backend method that queued it.

// stepPart is one measured part of a step, in the order of the table.
type stepPart int

const (
	partGap      stepPart = iota // previous EndStep's return → BeginStep
	partBuild                    // BeginStep → EndStep (the ops queued)
	partHandover                 // EndStep → the device thread runs it
	partUploads                  // the queued uploads and copies
	partLaunch                   // runStepL: trace + graph launch, or eager launches
	partWait                     // cuStreamSynchronize
	partReturn                   // the device thread's done → EndStep returns
	partCount
)

var stepPartNames = [partCount]string{"gap", "build", "handover", "uploads", "launch", "wait", "return"}

// Kinds of step.
const (
	stepReplayed = iota
	stepCaptured
	stepEager
	stepKinds
)

var stepKindNames = [stepKinds]string{"replayed", "captured", "eager"}

// stepTimer accumulates step times. Host fields are written by the
// runtime's goroutine (BeginStep, EndStep) and, inside the synchronous
// device call, by the device thread; the events are the device thread's.
type stepTimer struct {
	// the step under way
	begin, enter, start, uploaded, launched, synced time.Time
	lastEnd                                         time.Time // the previous step's EndStep return; zero before the first
	gap                                             time.Duration

	sums   [stepKinds][partCount]time.Duration
	counts [stepKinds]int

	period []float64 // replayed steps: µs from BeginStep to the next BeginStep (the step's gap after it)
	wall   []float64 // replayed steps: µs from the gap before to EndStep's return
	gpu    []float64 // replayed steps: µs of the graph on the stream (events)
	idle   []float64 // replayed steps: µs of GPU idle between the previous replay's end and this one's start

	lastReplay bool          // the previous step was a replay (its period waits for the next gap)
	lastGap    time.Duration // the gap before the previous step

	events   [4]uintptr // two begin/end pairs, alternating
	pair     int        // the pair the last replay used
	recorded bool       // a pair holds a replay not yet harvested
	prevEnd  uintptr    // the last harvested replay's end event; 0 for none

	gc0 uint64 // GC cycles at reset

	// ops (FERRITE_CUDA_STEPTIME=ops): host time charged to each op,
	// by the Backend method that queued it, and the time of the last queue.
	ops     map[string]*opTime
	lastOp  time.Time
	opSteps int // steps whose ops were timed
}

// opTime is one op's charged time and count.
type opTime struct {
	d time.Duration
	n int
}

// stepTimeEnabled reports FERRITE_CUDA_STEPTIME=1 or ops.
func stepTimeEnabled() bool {
	v := os.Getenv("FERRITE_CUDA_STEPTIME")
	return v == "1" || v == "ops"
}

// stepTimeOps reports FERRITE_CUDA_STEPTIME=ops.
func stepTimeOps() bool { return os.Getenv("FERRITE_CUDA_STEPTIME") == "ops" }

// queued charges the time since the step's last op (or its BeginStep) to
// the Backend method that called queue.
func (t *stepTimer) queued() {
	now := time.Now()
	d := now.Sub(t.lastOp)
	name := "?"
	pcs := make([]uintptr, 8)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		// The first Backend method that is not a helper of another.
		if i := strings.Index(f.Function, "(*Backend)."); i >= 0 {
			m := f.Function[i+len("(*Backend)."):]
			if m != "" && m[0] >= 'A' && m[0] <= 'Z' {
				name = m
				break
			}
			name = m
		}
		if !more {
			break
		}
	}
	t.charge(name, d)
	t.lastOp = time.Now() // the lookup's own time is not charged
}

// charge adds d to op name's time and one call.
func (t *stepTimer) charge(name string, d time.Duration) {
	o := t.ops[name]
	if o == nil {
		o = &opTime{}
		t.ops[name] = o
	}
	o.d += d
	o.n++
}

// newStepTimerL makes the timer's events (device thread).
func newStepTimerL() (*stepTimer, error) {
	t := &stepTimer{}
	for i := range t.events {
		if err := check("cuEventCreate", call(driver.cuEventCreate, uintptr(unsafe.Pointer(&t.events[i])), 0)); err != nil {
			t.closeL()
			return nil, err
		}
	}
	t.reset()
	return t, nil
}

// closeL destroys the events.
func (t *stepTimer) closeL() {
	for i, e := range t.events {
		if e != 0 {
			call(driver.cuEventDestroy, e)
			t.events[i] = 0
		}
	}
}

// gcCycles is the number of completed Go GC cycles.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// reset forgets what was counted (the events' pair state too).
func (t *stepTimer) reset() {
	t.sums, t.counts = [stepKinds][partCount]time.Duration{}, [stepKinds]int{}
	t.period, t.wall, t.gpu, t.idle = t.period[:0], t.wall[:0], t.gpu[:0], t.idle[:0]
	t.lastEnd, t.lastReplay, t.recorded, t.prevEnd = time.Time{}, false, false, 0
	t.gc0 = gcCycles()
	if t.ops != nil {
		t.ops, t.opSteps = map[string]*opTime{}, 0
	}
}

// beginStep notes BeginStep.
func (t *stepTimer) beginStep() {
	t.begin = time.Now()
	t.lastOp = t.begin
	if t.ops != nil {
		t.opSteps++
	}
	t.gap = 0
	if !t.lastEnd.IsZero() {
		t.gap = t.begin.Sub(t.lastEnd)
		if t.lastReplay {
			n := len(t.wall) - 1
			t.period = append(t.period, t.wall[n]-us(t.lastGap)+us(t.gap))
		}
	}
}

// us is d in µs.
func us(d time.Duration) float64 { return float64(d) / 1e3 }

// recordL records event i of the current pair on the stream (device thread).
func (t *stepTimer) recordL(d *Device, end bool) {
	i := 2 * t.pair
	if end {
		i++
	}
	call(driver.cuEventRecord, t.events[i], d.stream)
}

// harvestL reads the last replay's events after the stream is synchronized.
func (t *stepTimer) harvestL() {
	if !t.recorded {
		return
	}
	t.recorded = false
	b, e := t.events[2*t.pair], t.events[2*t.pair+1]
	var ms float32
	if call(driver.cuEventTime, uintptr(unsafe.Pointer(&ms)), b, e) == 0 {
		t.gpu = append(t.gpu, 1000*float64(ms))
	}
	if t.prevEnd != 0 && call(driver.cuEventTime, uintptr(unsafe.Pointer(&ms)), t.prevEnd, b) == 0 {
		t.idle = append(t.idle, 1000*float64(ms))
	}
	t.prevEnd = e
	t.pair ^= 1
}

// endStep adds the finished step (kind) to the sums.
func (t *stepTimer) endStep(kind int) {
	end := time.Now()
	if t.start.IsZero() { // the device call did not run (a failed device)
		t.start, t.uploaded, t.launched, t.synced = t.enter, t.enter, t.enter, t.enter
	}
	parts := [partCount]time.Duration{
		partGap: t.gap, partBuild: t.enter.Sub(t.begin), partHandover: t.start.Sub(t.enter),
		partUploads: t.uploaded.Sub(t.start), partLaunch: t.launched.Sub(t.uploaded),
		partWait: t.synced.Sub(t.launched), partReturn: end.Sub(t.synced),
	}
	for i, p := range parts {
		t.sums[kind][i] += p
	}
	t.counts[kind]++
	t.lastReplay = kind == stepReplayed
	if t.lastReplay {
		t.wall = append(t.wall, us(t.gap)+us(end.Sub(t.begin)))
		t.lastGap = t.gap
	}
	t.lastEnd = end
	t.start = time.Time{}
}

// pct is the p-th percentile of sorted v (nearest rank).
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	i := int(p/100*float64(len(v))+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// write writes the table.
func (t *stepTimer) write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "step times (FERRITE_CUDA_STEPTIME=1), µs a step\tsteps")
	for _, n := range stepPartNames {
		fmt.Fprintf(tw, "\t%s", n)
	}
	fmt.Fprintf(tw, "\ttotal\t\n")
	for k := range stepKinds {
		if t.counts[k] == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d", stepKindNames[k], t.counts[k])
		var tot time.Duration
		for _, s := range t.sums[k] {
			fmt.Fprintf(tw, "\t%.1f", us(s)/float64(t.counts[k]))
			tot += s
		}
		fmt.Fprintf(tw, "\t%.1f\t\n", us(tot)/float64(t.counts[k]))
	}
	fmt.Fprintf(tw, "replayed steps, µs\tn\tmin\tp10\tp50\tp90\tmax\tmean\t\n")
	for _, s := range []struct {
		name string
		v    []float64
	}{{"period (begin to next begin)", t.period}, {"wall (gap before + step)", t.wall}, {"graph on the GPU (events)", t.gpu}, {"GPU idle before the graph", t.idle}} {
		if len(s.v) == 0 {
			continue
		}
		v := slices.Sorted(slices.Values(s.v))
		var sum float64
		for _, x := range v {
			sum += x
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", s.name, len(v), v[0], pct(v, 10), pct(v, 50), pct(v, 90), v[len(v)-1], sum/float64(len(v)))
	}
	fmt.Fprintf(tw, "Go GC cycles meanwhile\t%d\t\n", gcCycles()-t.gc0)
	if t.ops != nil && t.opSteps > 0 {
		names := slices.SortedFunc(maps.Keys(t.ops), func(a, b string) int { return cmp.Compare(t.ops[b].d, t.ops[a].d) })
		fmt.Fprintf(tw, "build by op (time since the op before), %d steps\tcalls/step\tµs/step\tµs/call\t\n", t.opSteps)
		for _, n := range names {
			o := t.ops[n]
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t\n", n, float64(o.n)/float64(t.opSteps), us(o.d)/float64(t.opSteps), us(o.d)/float64(o.n))
		}
	}
	return tw.Flush()
}
