package strict

import (
	"fmt"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

var _ kernels.LinearAttentionOps = (*Device)(nil)

// RecordsStates implements kernels.StateRecorder.
func (d *Device) RecordsStates() bool { return true }

// recurrent reads and checks r for n rows and a state tensor of slots
// rows: sequence boundaries that cover [0, n) in order, distinct slots
// inside the tensor and, with r.Record, record slots (nil without) that
// are distinct from them and each other, in sequences of at most
// kernels.RecordMaxRows rows.
func (d *Device) recurrent(op string, r *kernels.Recurrent, n, slots int) (start, slot, record []int32) {
	shape(op+" sequences", r.Slot, -1, 1)
	shape(op+" starts", r.Start, r.Slot.Rows+1, 1)
	start, slot = d.ints(op, r.Start), d.ints(op, r.Slot)
	if start[0] != 0 || int(start[len(start)-1]) != n {
		panic(fmt.Sprintf("strict: %s: sequence starts %v do not cover %d rows", op, start, n))
	}
	seen := map[int32]bool{}
	for s, sl := range slot {
		if start[s+1] < start[s] {
			panic("strict: " + op + ": sequence starts decrease")
		}
		if sl < 0 || int(sl) >= slots || seen[sl] {
			panic(fmt.Sprintf("strict: %s: state slot %d outside [0, %d) or repeated", op, sl, slots))
		}
		seen[sl] = true
	}
	if !r.Record.Valid() {
		return start, slot, nil
	}
	shape(op+" record", r.Record, n, 1)
	record = d.ints(op, r.Record)
	for s := range slot {
		for i := start[s]; i < start[s+1]; i++ {
			rec := record[i]
			if rec < 0 {
				continue
			}
			if start[s+1]-start[s] > kernels.RecordMaxRows {
				panic(fmt.Sprintf("strict: %s: a sequence of %d rows records states", op, start[s+1]-start[s]))
			}
			if int(rec) >= slots || seen[rec] {
				panic(fmt.Sprintf("strict: %s: record slot %d outside [0, %d) or repeated", op, rec, slots))
			}
			seen[rec] = true
		}
	}
	return start, slot, record
}

// recordRows runs one sequence's rows [lo, hi) through run: all at once
// without records, else one row at a time, copying the state after each
// recording row into its slot of state (run's rows are then [i, i+1)).
func (d *Device) recordRows(op string, state kernels.Tensor, sl int32, record []int32, lo, hi int, run func(lo, hi int, st []float32)) {
	row := state.Slice(int(sl), int(sl)+1)
	st := d.in(op+" state", row, kernels.F32)
	if record == nil {
		run(lo, hi, st)
		d.out(row, st)
		return
	}
	for i := lo; i < hi; i++ {
		run(i, i+1, st)
		if rec := record[i]; rec >= 0 {
			d.out(state.Slice(int(rec), int(rec)+1), st)
		}
	}
	d.out(row, st)
}

// ShortConv implements kernels.LinearAttentionOps.
func (d *Device) ShortConv(dst, x, w, state kernels.Tensor, r *kernels.Recurrent) {
	c, k := x.Cols, w.Cols
	shape("ShortConv", dst, x.Rows, c)
	shape("ShortConv weight", w, c, -1)
	shape("ShortConv state", state, -1, (k-1)*c)
	if k < 1 {
		panic("strict: ShortConv kernel width")
	}
	start, slot, record := d.recurrent("ShortConv", r, x.Rows, state.Rows)
	xs, ws := d.in("ShortConv", x, kernels.F32), d.in("ShortConv", w, kernels.F32)
	y := make([]float32, dst.Elems())
	for s, sl := range slot {
		d.recordRows("ShortConv", state, sl, record, int(start[s]), int(start[s+1]), func(lo, hi int, st []float32) {
			ref.ShortConv(y[lo*c:hi*c], xs[lo*c:hi*c], ws, st, hi-lo, c, k)
		})
	}
	d.out(dst, y)
}

// DeltaRule implements kernels.LinearAttentionOps with the recurrent
// reference.
func (d *Device) DeltaRule(out, qkv, a, b, state kernels.Tensor, r *kernels.Recurrent, n *kernels.DeltaNet) {
	if n.Heads <= 0 || n.KeyHeads <= 0 || n.Heads%n.KeyHeads != 0 || n.DK <= 0 || n.DV <= 0 || n.LowerBound > 0 {
		panic(fmt.Sprintf("strict: DeltaRule: bad layer %+v", *n))
	}
	gw := n.Heads
	if n.PerChannel {
		gw *= n.DK
	}
	rows := qkv.Rows
	shape("DeltaRule qkv", qkv, -1, n.QKVWidth())
	shape("DeltaRule out", out, rows, n.Heads*n.DV)
	shape("DeltaRule a", a, rows, gw)
	shape("DeltaRule b", b, rows, n.Heads)
	shape("DeltaRule A_log", n.ALog, 1, n.Heads)
	shape("DeltaRule dt_bias", n.DtBias, 1, gw)
	shape("DeltaRule state", state, -1, n.StateWidth())
	start, slot, record := d.recurrent("DeltaRule", r, rows, state.Rows)
	xs := d.in("DeltaRule", qkv, kernels.F32)
	as, bs := d.in("DeltaRule", a, kernels.F32), d.in("DeltaRule", b, kernels.F32)
	aLog, dtBias := d.in("DeltaRule", n.ALog, kernels.F32), d.in("DeltaRule", n.DtBias, kernels.F32)
	y := make([]float32, out.Elems())
	w, ow := n.QKVWidth(), n.Heads*n.DV
	for s, sl := range slot {
		d.recordRows("DeltaRule", state, sl, record, int(start[s]), int(start[s+1]), func(lo, hi int, st []float32) {
			ref.DeltaRule(y[lo*ow:hi*ow], xs[lo*w:hi*w], as[lo*gw:hi*gw], bs[lo*n.Heads:hi*n.Heads], st, hi-lo, n, aLog, dtBias)
		})
	}
	d.out(out, y)
}

// GatedRMSNorm implements kernels.LinearAttentionOps.
func (d *Device) GatedRMSNorm(dst, x, z, w kernels.Tensor, eps float32, gate kernels.Gate) {
	shape("GatedRMSNorm", dst, x.Rows, x.Cols)
	shape("GatedRMSNorm gate", z, x.Rows, x.Cols)
	shape("GatedRMSNorm weight", w, 1, x.Cols)
	if gate != kernels.GateSiLU && gate != kernels.GateSigmoid {
		panic("strict: GatedRMSNorm: unknown gate")
	}
	xs, zs := d.in("GatedRMSNorm", x, kernels.F32), d.in("GatedRMSNorm", z, kernels.F32)
	ref.GatedRMSNorm(xs, xs, zs, d.in("GatedRMSNorm", w, kernels.F32), eps, gate)
	d.out(dst, xs)
}

// SigmoidGate implements kernels.LinearAttentionOps.
func (d *Device) SigmoidGate(dst, x, gate kernels.Tensor, accumulate bool) {
	shape("SigmoidGate", dst, x.Rows, x.Cols)
	shape("SigmoidGate gate", gate, x.Rows, -1)
	if gate.Cols != x.Cols && gate.Cols != 1 {
		panic(fmt.Sprintf("strict: SigmoidGate: gate %v for x %v", gate, x))
	}
	xs, gs := d.in("SigmoidGate", x, kernels.F32), d.in("SigmoidGate", gate, kernels.F32)
	y := make([]float32, dst.Elems())
	if accumulate {
		y = d.in("SigmoidGate (accumulate)", dst, kernels.F32)
	}
	ref.SigmoidGate(y, xs, gs, x.Cols, accumulate)
	d.out(dst, y)
}
