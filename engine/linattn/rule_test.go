package linattn

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// goPar is a ParallelFunc that runs one goroutine per item, to exercise
// concurrency under -race.
func goPar(n int, fn func(lo, hi int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); fn(i, i+1) }()
	}
	wg.Wait()
}

type ruleCase struct {
	name       string
	d          DeltaRule
	T          int
	gmin       float64
	tolO, tolS float64
}

func ruleCases() []ruleCase {
	return []ruleCase{
		{"GDN/T37C8", DeltaRule{Heads: 4, KeyHeads: 2, DK: 16, DV: 12, Chunk: 8}, 37, -3, 1e-6, 1e-6},
		{"KDA/T37C8", DeltaRule{Heads: 3, DK: 16, DV: 12, Chunk: 8, PerChannel: true}, 37, -5, 1e-6, 1e-6},
		{"GDN/odd", DeltaRule{Heads: 2, KeyHeads: 1, DK: 7, DV: 5, Chunk: 5}, 23, -3, 1e-6, 1e-6},
		{"KDA/odd", DeltaRule{Heads: 2, DK: 9, DV: 6, Chunk: 7, PerChannel: true}, 23, -5, 1e-6, 1e-6},
		{"GDN/T150C64", DeltaRule{Heads: 2, KeyHeads: 1, DK: 128, DV: 128}, 150, -3, 1e-6, 1e-6},
		{"KDA/T150C64", DeltaRule{Heads: 2, DK: 128, DV: 128, PerChannel: true}, 150, -5, 1e-6, 1e-6},
		{"GDN/strong", DeltaRule{Heads: 2, DK: 32, DV: 32, Chunk: 64}, 150, -60, 1e-6, 1e-6},
		{"KDA/strong", DeltaRule{Heads: 2, DK: 32, DV: 32, Chunk: 64, PerChannel: true}, 150, -60, 1e-6, 1e-6},
	}
}

func TestChunkedAndRecurrentMatchFloat64(t *testing.T) {
	for i, tc := range ruleCases() {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(i)))
			tc.d.Parallel = goPar
			p := gen(rng, tc.d, tc.T, tc.gmin)
			wantO, wantS := p.ref()
			var outs, states [2][]float32
			for i, form := range []string{"chunked", "recurrent"} {
				state := append([]float32(nil), p.s0...)
				out := make([]float32, len(wantO))
				s := p.seq(0, p.T, state, out)
				if form == "chunked" {
					tc.d.Chunked(s)
				} else {
					tc.d.Recurrent(s)
				}
				outs[i], states[i] = out, state
				eo, es := relErr(out, wantO), relErr(state, wantS)
				t.Logf("%-9s vs float64: out rel err %.2e  state rel err %.2e", form, eo, es)
				if !(eo <= tc.tolO && es <= tc.tolS) {
					t.Errorf("%s: out err %.3g (tol %.3g), state err %.3g (tol %.3g)", form, eo, tc.tolO, es, tc.tolS)
				}
			}
			// The two float32 results against each other.
			eo, es := relErr(outs[0], widen(outs[1])), relErr(states[0], widen(states[1]))
			t.Logf("chunked vs recurrent: out rel err %.2e  state rel err %.2e", eo, es)
			if !(eo <= 2*tc.tolO && es <= 2*tc.tolS) {
				t.Errorf("chunked vs recurrent: out err %.3g, state err %.3g", eo, es)
			}
		})
	}
}

// TestSplitCalls feeds a prompt in pieces through both forms, mixed, and
// checks against one call: the state carries over exactly.
func TestSplitCalls(t *testing.T) {
	for _, pc := range []bool{false, true} {
		t.Run(fmt.Sprint("perChannel=", pc), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 7))
			d := DeltaRule{Heads: 4, KeyHeads: 2, DK: 16, DV: 8, Chunk: 8, PerChannel: pc, Parallel: goPar}
			p := gen(rng, d, 61, -5)
			wantO, wantS := p.ref()

			whole := append([]float32(nil), p.s0...)
			outWhole := make([]float32, len(wantO))
			d.Chunked(p.seq(0, p.T, whole, outWhole))

			state := append([]float32(nil), p.s0...)
			out := make([]float32, len(wantO))
			cuts := []int{0, 10, 11, 30, 33, 34, 61}
			for i := 0; i+1 < len(cuts); i++ {
				s := p.seq(cuts[i], cuts[i+1], state, out)
				if i%2 == 0 {
					d.Chunked(s)
				} else {
					d.Recurrent(s)
				}
			}
			if e := relErr(out, wantO); e > 1e-5 {
				t.Errorf("split out err %.3g", e)
			}
			if e := relErr(state, wantS); e > 1e-5 {
				t.Errorf("split state err %.3g", e)
			}
			if e := relErr(out, widen(outWhole)); e > 1e-5 {
				t.Errorf("split vs whole out err %.3g", e)
			}
		})
	}
}

// TestExtremeDecays: every channel decays by the glm5_next bound (−5 per
// step, e^{−315} across a chunk of 64) or far more; nothing overflows or
// turns NaN and both forms still match the float64 reference.
func TestExtremeDecays(t *testing.T) {
	for _, tc := range []struct {
		name string
		pc   bool
		g    func(i int) float32
	}{
		{"KDA/all-5", true, func(int) float32 { return -5 }},
		{"KDA/mixed-800", true, func(i int) float32 { return []float32{-5, 0, -800, -0.01, -40}[i%5] }},
		{"GDN/-1000", false, func(i int) float32 { return []float32{-0.1, -1000, 0, -30}[i%4] }},
		{"GDN/zero", false, func(int) float32 { return 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 5))
			d := DeltaRule{Heads: 2, DK: 32, DV: 16, PerChannel: tc.pc, Parallel: goPar}
			p := gen(rng, d, 150, -1)
			for i := range p.g {
				p.g[i] = tc.g(i)
			}
			wantO, wantS := p.ref()
			for _, form := range []string{"chunked", "recurrent"} {
				state := append([]float32(nil), p.s0...)
				out := make([]float32, len(wantO))
				s := p.seq(0, p.T, state, out)
				if form == "chunked" {
					d.Chunked(s)
				} else {
					d.Recurrent(s)
				}
				eo, es := relErr(out, wantO), relErr(state, wantS)
				if !(eo <= 1e-6 && es <= 1e-6) {
					t.Errorf("%s: out err %.3g, state err %.3g", form, eo, es)
				}
			}
		})
	}
}

// TestStridedGQA reads q, k and v in place from one mixed conv-output
// buffer [T, 2·Hk·DK + H·DV] and writes into a wider output.
func TestStridedGQA(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	d := DeltaRule{Heads: 4, KeyHeads: 2, DK: 8, DV: 6, Chunk: 4, Parallel: goPar}
	p := gen(rng, d, 19, -2)
	kw, vw := d.keyHeads()*d.DK, d.Heads*d.DV
	W := 2*kw + vw
	mixed := make([]float32, p.T*W)
	for tt := 0; tt < p.T; tt++ {
		copy(mixed[tt*W:], p.q[tt*kw:(tt+1)*kw])
		copy(mixed[tt*W+kw:], p.k[tt*kw:(tt+1)*kw])
		copy(mixed[tt*W+2*kw:], p.v[tt*vw:(tt+1)*vw])
	}
	wantO, wantS := p.ref()
	for _, form := range []string{"chunked", "recurrent"} {
		state := append([]float32(nil), p.s0...)
		out := make([]float32, p.T*(vw+3))
		s := &Seq{T: p.T, Q: mixed, K: mixed[kw:], V: mixed[2*kw:], QStride: W, KStride: W, VStride: W,
			Beta: p.b, G: p.g, Out: out, OutStride: vw + 3, State: state}
		if form == "chunked" {
			d.Chunked(s)
		} else {
			d.Recurrent(s)
		}
		got := make([]float32, 0, len(wantO))
		for tt := 0; tt < p.T; tt++ {
			got = append(got, out[tt*(vw+3):tt*(vw+3)+vw]...)
		}
		if eo, es := relErr(got, wantO), relErr(state, wantS); eo > 1e-6 || es > 1e-6 {
			t.Errorf("%s: out err %.3g, state err %.3g", form, eo, es)
		}
	}
}

// TestStatesAfter checks the per-token states Recurrent records against
// running each prefix separately.
func TestStatesAfter(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	d := DeltaRule{Heads: 2, DK: 8, DV: 8, PerChannel: true}
	p := gen(rng, d, 5, -5)
	states := make([][]float32, p.T)
	for i := range states {
		if i != 2 {
			states[i] = make([]float32, d.StateLen())
		}
	}
	state := append([]float32(nil), p.s0...)
	out := make([]float32, p.T*d.Heads*d.DV)
	s := p.seq(0, p.T, state, out)
	s.StatesAfter = states
	d.Recurrent(s)
	for i := range states {
		if states[i] == nil {
			continue
		}
		want := append([]float32(nil), p.s0...)
		d.Recurrent(p.seq(0, i+1, want, make([]float32, len(out))))
		for j := range want {
			if want[j] != states[i][j] {
				t.Fatalf("state after token %d differs at %d: %g vs %g", i, j, states[i][j], want[j])
			}
		}
	}
}

func TestForwardDispatchAndEmpty(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 13))
	d := DeltaRule{Heads: 2, DK: 8, DV: 8}
	for _, T := range []int{0, 1, recurrentMaxT, recurrentMaxT + 1, 40} {
		p := gen(rng, d, T, -2)
		wantO, wantS := p.ref()
		state := append([]float32(nil), p.s0...)
		out := make([]float32, len(wantO))
		d.Forward(p.seq(0, T, state, out))
		if eo, es := relErr(out, wantO), relErr(state, wantS); eo > 1e-6 || es > 1e-6 {
			t.Errorf("T=%d: out err %.3g, state err %.3g", T, eo, es)
		}
	}
}

func TestCheckPanics(t *testing.T) {
	d := DeltaRule{Heads: 3, KeyHeads: 2, DK: 4, DV: 4}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for Heads not a multiple of KeyHeads")
		}
	}()
	d.Recurrent(&Seq{T: 1})
}
