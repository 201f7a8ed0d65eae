//go:build linux && (amd64 || arm64)

package cuda

import (
	"strings"
	"testing"
	"time"
)

// TestStepTimerBook checks the step timer's bookkeeping without a GPU:
// parts add up per kind, a replayed step's period runs from its begin to
// the next begin, and the table names every kind that ran.
func TestStepTimerBook(t *testing.T) {
	st := &stepTimer{}
	st.reset()
	step := func(kind int, hold time.Duration) {
		st.beginStep()
		st.enter = time.Now()
		st.start, st.uploaded, st.launched = st.enter, st.enter, st.enter
		time.Sleep(hold)
		st.synced = time.Now()
		st.endStep(kind)
	}
	step(stepEager, time.Millisecond)
	step(stepCaptured, time.Millisecond)
	for range 3 {
		step(stepReplayed, 2*time.Millisecond)
		time.Sleep(time.Millisecond) // host work between steps
	}
	step(stepEager, 0)
	if st.counts != [stepKinds]int{3, 1, 2} {
		t.Fatalf("counts %v, want [3 1 2]", st.counts)
	}
	if len(st.wall) != 3 || len(st.period) != 3 {
		t.Fatalf("%d walls, %d periods, want 3 and 3", len(st.wall), len(st.period))
	}
	for i, p := range st.period {
		if p < 3000 || st.sums[stepReplayed][partWait] < 6*time.Millisecond {
			t.Errorf("period %d = %.0f µs (wait sum %v), want ≥ 3,000 µs (2 ms step + 1 ms gap)", i, p, st.sums[stepReplayed][partWait])
		}
	}
	var sb strings.Builder
	if err := st.write(&sb); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	for _, want := range []string{"replayed", "captured", "eager", "period", "GC cycles"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
	st.reset()
	if st.counts != [stepKinds]int{} || len(st.period) != 0 || !st.lastEnd.IsZero() {
		t.Errorf("reset left counts %v, %d periods", st.counts, len(st.period))
	}
	// FERRITE_CUDA_STEPTIME=ops: the time between ops charged to each.
	st.ops = map[string]*opTime{}
	st.reset()
	for range 2 {
		st.beginStep()
		time.Sleep(time.Millisecond)
		st.queued() // not from a Backend method: "?"
		st.queued()
	}
	o := st.ops["?"]
	if o == nil || o.n != 4 || o.d < 2*time.Millisecond || st.opSteps != 2 {
		t.Fatalf("ops %v (steps %d), want 4 calls of \"?\" charged ≥ 2 ms", o, st.opSteps)
	}
	sb.Reset()
	if err := st.write(&sb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "build by op") {
		t.Errorf("table lacks the ops:\n%s", sb.String())
	}
}

// TestStepSpin checks EndStep's poll: on unless FERRITE_CUDA_STEPSPIN=0
// or polling is off, and long only for a step with a split product of
// stepSpinRows rows or more.
func TestStepSpin(t *testing.T) {
	for _, c := range []struct {
		spin bool
		env  string
		want bool
	}{{true, "", true}, {true, "1", true}, {true, "0", false}, {false, "", false}} {
		if got := stepSpinFor(c.spin, c.env); got != c.want {
			t.Errorf("spin %v, %q: %v, want %v", c.spin, c.env, got, c.want)
		}
	}
	defer func(on bool) { stepSpinOn = on }(stepSpinOn)
	stepSpinOn = true
	b := &Backend{}
	for _, c := range []struct {
		rows int
		want time.Duration
	}{{0, spinWait}, {1, spinWait}, {stepSpinRows - 1, spinWait}, {stepSpinRows, stepSpinLong}, {64, stepSpinLong}} {
		b.splitRows = c.rows
		if got := b.stepSpin(); got != c.want {
			t.Errorf("%d split rows: %v, want %v", c.rows, got, c.want)
		}
	}
}
