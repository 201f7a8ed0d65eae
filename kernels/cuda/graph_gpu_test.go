//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestGraphAlternating runs steps of three shapes in the order speculative
// decoding gives them (a verification of 2 rows in the row-exact mode, a
// draft pass of 1 row, alternating; later a verification of 4 rows) with
// new inputs every step. Each shape is captured on its second sighting
// although another shape ran in between, and replays after; every step's
// outputs must equal, bit for bit, those of a Backend that launches
// eagerly (the same kernels: the GEMV sums at 1 row and in the row-exact
// mode do not depend on how they were launched).
func TestGraphAlternating(t *testing.T) {
	g, e := openOps(t), openOps(t)
	g.graphs.enabled, e.graphs.enabled = true, false
	rng := rand.New(rand.NewPCG(12, 13))
	const hidden, inter, rowsMax = 128, 256, 4
	w1 := kerneltest.NewMat(rng, kernels.BF16, hidden, hidden, 0, 0)
	gate := kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)
	up := kerneltest.NewMat(rng, kernels.BF16, inter, hidden, 0, 0)
	down := kerneltest.NewMat(rng, kernels.BF16, hidden, inter, 0, 0)
	nw := randF32(rng, hidden)
	type model struct {
		b          *Backend
		x, norm, y kernels.Tensor
	}
	setup := func(b *Backend) *model {
		zero := make([]float32, rowsMax*hidden)
		return &model{b: b, x: f32Tensor(t, b, rowsMax, hidden, zero), norm: f32Tensor(t, b, 1, hidden, nw),
			y: f32Tensor(t, b, rowsMax, hidden, zero)}
	}
	run := func(m *model, rows int, xv []float32) []float32 {
		b := m.b
		x, y := m.x.Slice(0, rows), m.y.Slice(0, rows)
		b.SetRowExact(rows > 1)
		b.WriteF32(x, xv)
		b.BeginStep()
		h := b.Scratch(kernels.F32, rows, hidden)
		u := b.Scratch(kernels.F32, rows, inter)
		b.RMSNorm(h, x, m.norm, 1e-6, false)
		b.Linear(y, h, w1, kernels.Epilogue{})
		b.RMSNorm(h, y, m.norm, 1e-6, false)
		b.SwiGLULinear(u, h, gate, up, 0)
		b.Linear(y, u, down, kernels.Epilogue{Accumulate: true})
		b.EndStep()
		b.SetRowExact(false)
		out := make([]float32, rows*hidden)
		b.ReadF32(out, y)
		return out
	}
	mg, me := setup(g), setup(e)
	before, _ := kernels.StepGraphStats(g)
	for i, rows := range []int{2, 1, 2, 1, 2, 1, 4, 2, 4, 2} {
		xv := randF32(rng, rows*hidden)
		got, want := run(mg, rows, xv), run(me, rows, xv)
		for j := range want {
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				t.Fatalf("step %d (%d rows): y[%d] = %g with graphs, %g eager", i, rows, j, got[j], want[j])
			}
		}
	}
	n, _ := kernels.StepGraphStats(g)
	n = n.Sub(before)
	t.Logf("graphs: %+v", n)
	if n.Err != nil || n.Captures != 3 || n.Replays != 7 || n.Eager != 3 {
		t.Errorf("%d captures, %d replays, %d eager steps (%v); want 3, 7, 3", n.Captures, n.Replays, n.Eager, n.Err)
	}
	if ne, _ := kernels.StepGraphStats(e); ne.Replays != 0 || ne.Eager < 10 {
		t.Errorf("the eager backend: %+v", ne)
	}
}
