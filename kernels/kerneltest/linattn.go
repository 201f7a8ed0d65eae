package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// DeltaRuleTol bounds the delta rule (outputs and states) against the
// recurrent float64 reference, scale max(1, |want|): a backend may use the
// chunked form, which keeps the state in float64 across a call where the
// reference rounds it to float32 after every row, so the two drift apart
// by a few float32 ulps per row.
const DeltaRuleTol = 2e-5

// linearAttentionTests runs the LinearAttentionOps cases when d has them.
func linearAttentionTests(t *testing.T, d kernels.Device) {
	la, ok := d.(kernels.LinearAttentionOps)
	if !ok {
		t.Skip("the backend has no linear-attention ops")
	}
	t.Run("ShortConv", func(t *testing.T) { shortConvTest(t, d, la) })
	t.Run("DeltaRule", func(t *testing.T) { deltaRuleTest(t, d, la) })
	t.Run("DeltaRuleSplit", func(t *testing.T) { deltaSplitTest(t, d, la) })
	t.Run("Record", func(t *testing.T) {
		if !kernels.RecordsStates(d) {
			t.Skip("the backend does not record states (kernels.StateRecorder)")
		}
		recordTest(t, d, la)
	})
	t.Run("GatedRMSNorm", func(t *testing.T) { gatedNormTest(t, d, la) })
	t.Run("SigmoidGate", func(t *testing.T) { sigmoidGateTest(t, d, la) })
}

// recurrentMap uploads the sequence map of rows lens with state slots
// slots.
func recurrentMap(t *testing.T, d kernels.Device, lens []int, slots []int32) *kernels.Recurrent {
	t.Helper()
	start := []int32{0}
	for _, n := range lens {
		start = append(start, start[len(start)-1]+int32(n))
	}
	return &kernels.Recurrent{Start: ints(t, d, len(start), 1, start), Slot: ints(t, d, len(slots), 1, slots)}
}

// stateCheck compares a state tensor's rows after an op: the slots of the
// step with want (per slot), every other row bit-identical to before.
func stateCheck(t *testing.T, what string, got, before []float32, width int, want map[int32][]float32, tol float64) {
	t.Helper()
	for r := range len(got) / width {
		g, b := got[r*width:(r+1)*width], before[r*width:(r+1)*width]
		if w, ok := want[int32(r)]; ok {
			compare(t, fmt.Sprintf("%s slot %d", what, r), g, w, tol, rowScale(w))
			continue
		}
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s: slot %d outside the step changed", what, r)
			}
		}
	}
}

func shortConvTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct {
		C, K    int
		lens    []int
		slots   []int32
		inPlace bool
	}{
		{20, 4, []int{1}, []int32{2}, false},
		{70, 4, []int{3, 1, 9}, []int32{4, 0, 2}, false}, // channel blocks, short and long rows
		{130, 2, []int{1, 2}, []int32{1, 3}, true},
	} {
		t.Run(fmt.Sprintf("C=%d,K=%d,%v,inPlace=%v", c.C, c.K, c.lens, c.inPlace), func(t *testing.T) {
			n := 0
			for _, l := range c.lens {
				n += l
			}
			const slots = 5
			sw := (c.K - 1) * c.C
			xv, wv, sv := randn(rng, n*c.C), randn(rng, c.C*c.K), randn(rng, slots*sw)
			x, w := newBuf(t, d, n, c.C, xv), newBuf(t, d, c.C, c.K, wv)
			st, err := d.Alloc(kernels.F32, slots, sw)
			if err != nil {
				t.Fatal(err)
			}
			d.WriteF32(st, sv)
			y := x
			if !c.inPlace {
				y = newBuf(t, d, n, c.C, nil)
			}
			r := recurrentMap(t, d, c.lens, c.slots)
			step(d, func() { la.ShortConv(y.t, x.t, w.t, st, r) })
			want := make([]float32, n*c.C)
			wantSt := map[int32][]float32{}
			row := 0
			for i, l := range c.lens {
				s := append([]float32(nil), sv[int(c.slots[i])*sw:int(c.slots[i]+1)*sw]...)
				ref.ShortConv(want[row*c.C:], xv[row*c.C:], wv, s, l, c.C, c.K)
				wantSt[c.slots[i]] = s
				row += l
			}
			compare(t, "y", y.read(t, "y"), want, RowOpTol, rowScale(want))
			got := make([]float32, slots*sw)
			d.ReadF32(got, st)
			stateCheck(t, "state", got, sv, sw, wantSt, 0)
		})
	}
}

// deltaCase is a delta-rule layer and the sequences of one call.
type deltaCase struct {
	name      string
	n         kernels.DeltaNet
	lens      []int
	slots     []int32
	decayLo   float32 // the raw decay input a is drawn from [decayLo, decayLo+2)
	aLogLo    float32
	nSlots    int
	gateWidth int
	qkvW, stW int
	aLog, dtB []float32 // the layer's A_log and dt_bias on the host
}

func deltaCases() []*deltaCase {
	return []*deltaCase{
		{name: "gdn/decode", n: kernels.DeltaNet{Heads: 4, KeyHeads: 2, DK: 16, DV: 12}, lens: []int{1, 1, 1}, slots: []int32{3, 0, 4}},
		{name: "gdn/mixed", n: kernels.DeltaNet{Heads: 4, KeyHeads: 2, DK: 16, DV: 12}, lens: []int{2, 70, 9, 33}, slots: []int32{1, 4, 0, 2}},
		{name: "gdn/strong-decay", n: kernels.DeltaNet{Heads: 2, KeyHeads: 1, DK: 8, DV: 8}, lens: []int{40}, slots: []int32{0}, decayLo: 25, aLogLo: 2},
		{name: "kda/bounded", n: kernels.DeltaNet{Heads: 3, KeyHeads: 3, DK: 16, DV: 16, PerChannel: true, LowerBound: -5}, lens: []int{1, 45, 7}, slots: []int32{2, 0, 1}},
		{name: "kda/softplus", n: kernels.DeltaNet{Heads: 2, KeyHeads: 2, DK: 10, DV: 10, PerChannel: true}, lens: []int{66, 3}, slots: []int32{4, 3}},
		{name: "kda/strong-decay", n: kernels.DeltaNet{Heads: 2, KeyHeads: 2, DK: 8, DV: 8, PerChannel: true}, lens: []int{50}, slots: []int32{1}, decayLo: 25, aLogLo: 2},
	}
}

// setup draws the layer's parameters and uploads them.
func (c *deltaCase) setup(t *testing.T, d kernels.Device, rng *rand.Rand) {
	c.nSlots = 5
	c.gateWidth = c.n.Heads
	if c.n.PerChannel {
		c.gateWidth *= c.n.DK
	}
	c.qkvW, c.stW = c.n.QKVWidth(), c.n.StateWidth()
	c.aLog, c.dtB = make([]float32, c.n.Heads), randn(rng, c.gateWidth)
	for i := range c.aLog {
		c.aLog[i] = c.aLogLo + float32(rng.Float64())
	}
	c.n.ALog, c.n.DtBias = newBuf(t, d, 1, c.n.Heads, c.aLog).t, newBuf(t, d, 1, c.gateWidth, c.dtB).t
}

// inputs draws rows of qkv, a and b.
func (c *deltaCase) inputs(rng *rand.Rand, n int) (qkv, a, b []float32) {
	qkv, b = randn(rng, n*c.qkvW), randn(rng, n*c.n.Heads)
	a = make([]float32, n*c.gateWidth)
	for i := range a {
		a[i] = c.decayLo + 2*float32(rng.Float64()) - 1
	}
	return qkv, a, b
}

// run calls DeltaRule on rows of lens sequences in the given slots and
// returns the outputs and the state tensor's contents.
func (c *deltaCase) run(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps, st kernels.Tensor, lens []int, slots []int32, qkv, a, b []float32) []float32 {
	t.Helper()
	n := len(qkv) / c.qkvW
	x, av, bv := newBuf(t, d, n, c.qkvW, qkv), newBuf(t, d, n, c.gateWidth, a), newBuf(t, d, n, c.n.Heads, b)
	out := newBuf(t, d, n, c.n.Heads*c.n.DV, nil)
	r := recurrentMap(t, d, lens, slots)
	step(d, func() { la.DeltaRule(out.t, x.t, av.t, bv.t, st, r, &c.n) })
	return out.read(t, "out")
}

func deltaRuleTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	for i, c := range deltaCases() {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 23))
			c.setup(t, d, rng)
			n := 0
			for _, l := range c.lens {
				n += l
			}
			qkv, a, b := c.inputs(rng, n)
			sv := make([]float32, c.nSlots*c.stW)
			for j := range sv {
				sv[j] = 0.3 * float32(rng.NormFloat64())
			}
			st, err := d.Alloc(kernels.F32, c.nSlots, c.stW)
			if err != nil {
				t.Fatal(err)
			}
			d.WriteF32(st, sv)
			got := c.run(t, d, la, st, c.lens, c.slots, qkv, a, b)
			want := make([]float32, n*c.n.Heads*c.n.DV)
			wantSt := map[int32][]float32{}
			row, ow, gw := 0, c.n.Heads*c.n.DV, c.gateWidth
			for j, l := range c.lens {
				s := append([]float32(nil), sv[int(c.slots[j])*c.stW:int(c.slots[j]+1)*c.stW]...)
				ref.DeltaRule(want[row*ow:], qkv[row*c.qkvW:], a[row*gw:], b[row*c.n.Heads:], s, l, &c.n, c.aLog, c.dtB)
				wantSt[c.slots[j]] = s
				row += l
			}
			for _, v := range got {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("non-finite output %g", v)
				}
			}
			compare(t, "out", got, want, DeltaRuleTol, rowScale(want))
			all := make([]float32, c.nSlots*c.stW)
			d.ReadF32(all, st)
			stateCheck(t, "state", all, sv, c.stW, wantSt, DeltaRuleTol)
		})
	}
}

// deltaSplitTest checks that a sequence fed in one call (the chunked form
// on a backend that has one) equals the same rows fed in calls of 1, 3 and
// the rest (token by token): the state carries across calls and the forms
// agree.
func deltaSplitTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	for i, c := range deltaCases() {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 24))
			c.setup(t, d, rng)
			const n = 75
			qkv, a, b := c.inputs(rng, n)
			st, err := d.Alloc(kernels.F32, 2, c.stW)
			if err != nil {
				t.Fatal(err)
			}
			whole := c.run(t, d, la, st, []int{n}, []int32{0}, qkv, a, b)
			var parts []float32
			gw := c.gateWidth
			for lo := 0; lo < n; {
				hi := min(n, lo+1+lo%5) // calls of 1, 2, 3, 4, 5, 1, … rows
				parts = append(parts, c.run(t, d, la, st, []int{hi - lo}, []int32{1}, qkv[lo*c.qkvW:hi*c.qkvW], a[lo*gw:hi*gw], b[lo*c.n.Heads:hi*c.n.Heads])...)
				lo = hi
			}
			compare(t, "split out", parts, whole, DeltaRuleTol, rowScale(whole))
			s := make([]float32, 2*c.stW)
			d.ReadF32(s, st)
			compare(t, "split state", s[c.stW:], s[:c.stW], DeltaRuleTol, rowScale(s[:c.stW]))
		})
	}
}

func gatedNormTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, gate := range []kernels.Gate{kernels.GateSiLU, kernels.GateSigmoid} {
		const rows, dim = 9, 24
		xv, zv, wv := randn(rng, rows*dim), randn(rng, rows*dim), randn(rng, dim)
		x, z, w, y := newBuf(t, d, rows, dim, xv), newBuf(t, d, rows, dim, zv), newBuf(t, d, 1, dim, wv), newBuf(t, d, rows, dim, nil)
		step(d, func() { la.GatedRMSNorm(y.t, x.t, z.t, w.t, 1e-6, gate) })
		want := make([]float32, rows*dim)
		ref.GatedRMSNorm(want, xv, zv, wv, 1e-6, gate)
		compare(t, fmt.Sprint("gate ", gate), y.read(t, "y"), want, RowOpTol, rowScale(want))
		step(d, func() { la.GatedRMSNorm(x.t, x.t, z.t, w.t, 1e-6, gate) }) // in place
		compare(t, fmt.Sprint("in place, gate ", gate), x.read(t, "x"), want, RowOpTol, rowScale(want))
	}
}

func sigmoidGateTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	rng := rand.New(rand.NewPCG(27, 28))
	const rows, cols = 7, 33
	for _, gc := range []int{cols, 1} {
		for _, acc := range []bool{false, true} {
			xv, gv := randn(rng, rows*cols), randn(rng, rows*gc)
			var y0 []float32
			if acc {
				y0 = randn(rng, rows*cols)
			}
			x, g, y := newBuf(t, d, rows, cols, xv), newBuf(t, d, rows, gc, gv), newBuf(t, d, rows, cols, y0)
			step(d, func() { la.SigmoidGate(y.t, x.t, g.t, acc) })
			want := make([]float32, rows*cols)
			copy(want, y0)
			ref.SigmoidGate(want, xv, gv, cols, acc)
			compare(t, fmt.Sprintf("gate cols %d, acc %v", gc, acc), y.read(t, "y"), want, RowOpTol, rowScale(want))
		}
	}
}

// recordTest checks Recurrent.Record on a KDA and a GDN layer and its
// convolution: a step of three sequences (3, 1 and 4 rows; the first and
// last record after some rows) leaves in each record slot, bit for bit,
// the state its sequence has after that row when the rows are fed one call
// at a time (plain decoding's states), the same outputs and final states
// as those calls, and every other slot as it was.
func recordTest(t *testing.T, d kernels.Device, la kernels.LinearAttentionOps) {
	lens, slots := []int{3, 1, 4}, []int32{0, 1, 2}
	rec := []int32{3, 4, -1, -1, 5, -1, 6, 7} // (8) record slot of each row, or −1
	const nSlots = 9                          // 0-2 the sequences', 3-7 records, 8 never written
	for i, c := range []*deltaCase{deltaCases()[3], deltaCases()[1]} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 29))
			c.setup(t, d, rng)
			_, a, b := c.inputs(rng, len(rec))
			K := 4
			cw, xv := randn(rng, c.qkvW*K), randn(rng, len(rec)*c.qkvW)
			convW := newBuf(t, d, c.qkvW, K, cw)
			sw := (K - 1) * c.qkvW
			init := func(width int) (kernels.Tensor, []float32) {
				v := randn(rng, nSlots*width)
				st, err := d.Alloc(kernels.F32, nSlots, width)
				if err != nil {
					t.Fatal(err)
				}
				d.WriteF32(st, v)
				return st, v
			}
			// The step with records.
			st, sv := init(c.stW)
			conv, cv := init(sw)
			r := recurrentMap(t, d, lens, slots)
			r.Record = ints(t, d, len(rec), 1, rec)
			x := newBuf(t, d, len(rec), c.qkvW, xv)
			y := newBuf(t, d, len(rec), c.qkvW, nil)
			av, bv := newBuf(t, d, len(rec), c.gateWidth, a), newBuf(t, d, len(rec), c.n.Heads, b)
			out := newBuf(t, d, len(rec), c.n.Heads*c.n.DV, nil)
			step(d, func() {
				la.ShortConv(y.t, x.t, convW.t, conv, r)
				la.DeltaRule(out.t, y.t, av.t, bv.t, st, r, &c.n)
			})
			gotY, gotOut := y.read(t, "conv out"), out.read(t, "out")
			gotSt, gotConv := make([]float32, nSlots*c.stW), make([]float32, nSlots*sw)
			d.ReadF32(gotSt, st)
			d.ReadF32(gotConv, conv)

			// The same rows one call at a time, on fresh copies of the
			// initial states.
			st1, _ := init(c.stW)
			conv1, _ := init(sw)
			d.WriteF32(st1, sv)
			d.WriteF32(conv1, cv)
			wantSt, wantConv := append([]float32(nil), sv...), append([]float32(nil), cv...)
			wantY, wantOut := make([]float32, len(rec)*c.qkvW), make([]float32, len(rec)*c.n.Heads*c.n.DV)
			row, ow, gw := 0, c.n.Heads*c.n.DV, c.gateWidth
			for s, l := range lens {
				for range l {
					r1 := recurrentMap(t, d, []int{1}, []int32{slots[s]})
					x1 := newBuf(t, d, 1, c.qkvW, xv[row*c.qkvW:(row+1)*c.qkvW])
					y1, o1 := newBuf(t, d, 1, c.qkvW, nil), newBuf(t, d, 1, ow, nil)
					a1, b1 := newBuf(t, d, 1, gw, a[row*gw:(row+1)*gw]), newBuf(t, d, 1, c.n.Heads, b[row*c.n.Heads:(row+1)*c.n.Heads])
					step(d, func() {
						la.ShortConv(y1.t, x1.t, convW.t, conv1, r1)
						la.DeltaRule(o1.t, y1.t, a1.t, b1.t, st1, r1, &c.n)
					})
					copy(wantY[row*c.qkvW:], y1.read(t, "conv out"))
					copy(wantOut[row*ow:], o1.read(t, "out"))
					all, allConv := make([]float32, nSlots*c.stW), make([]float32, nSlots*sw)
					d.ReadF32(all, st1)
					d.ReadF32(allConv, conv1)
					sl := int(slots[s])
					copy(wantSt[sl*c.stW:(sl+1)*c.stW], all[sl*c.stW:])
					copy(wantConv[sl*sw:(sl+1)*sw], allConv[sl*sw:])
					if to := int(rec[row]); to >= 0 {
						copy(wantSt[to*c.stW:(to+1)*c.stW], all[sl*c.stW:])
						copy(wantConv[to*sw:(to+1)*sw], allConv[sl*sw:])
					}
					row++
				}
			}
			compare(t, "conv out", gotY, wantY, 0, rowScale(wantY))
			compare(t, "out", gotOut, wantOut, 0, rowScale(wantOut))
			compare(t, "delta-rule states", gotSt, wantSt, 0, rowScale(wantSt))
			compare(t, "conv states", gotConv, wantConv, 0, rowScale(wantConv))
		})
	}
}
