//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// openOps returns a Backend on the GPU for an op-set test, closed when the
// test ends, after checking that no op failed.
func openOps(t testing.TB) *Backend {
	t.Helper()
	needGPU(t)
	b, err := OpenBackend(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Err(); err != nil {
			t.Errorf("device failure: %v", err)
		}
		b.Close()
	})
	return b
}

// TestOps runs the op-set conformance suite (kerneltest.RunOps, the
// tolerances written down there) on the GPU.
func TestOps(t *testing.T) {
	kerneltest.RunOps(t, openOps(t))
}

// TestFree runs the Memory.Free checks (kerneltest.FreeTest) on the GPU:
// cuMemFree through the device thread, the counters back at the baseline.
func TestFree(t *testing.T) { kerneltest.FreeTest(t, openOps(t)) }

// f32Tensor allocates (rows, cols) F32 holding v.
func f32Tensor(t testing.TB, b *Backend, rows, cols int, v []float32) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(kernels.F32, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteF32(x, v)
	return x
}

func i32Tensor(t testing.TB, b *Backend, rows, cols int, v []int32) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(kernels.I32, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteI32(x, v)
	return x
}

// TestOpsLinearGemm checks Linear's cuBLASLt paths on a bf16 weight, with
// bias and accumulation. Below gemmRoundRows rows x is split into two bf16
// terms: the result must meet the conformance tolerance against float32 x
// (LinearTol·Σ|x·w|). From gemmRoundRows rows x is rounded to bf16: against
// kernels/ref.Linear over the same rounded x the products are exact in
// float32 and only cuBLASLt's summation order differs, within 2⁻¹⁴·Σ|x·w|
// as TestGemmBF16 allows.
func TestOpsLinearGemm(t *testing.T) {
	b := openOps(t)
	if !b.useGemm() {
		t.Skipf("no cuBLASLt: %v", b.gemmErr)
	}
	for _, n := range []int{2, 9, 40, 165, gemmRoundRows + 44} {
		rng := rand.New(rand.NewPCG(uint64(n), 4))
		const rows, cols = 96, 256
		w := kerneltest.NewMat(rng, kernels.BF16, rows, cols, 0, 0)
		xv, y0, bv := randF32(rng, n*cols), randF32(rng, n*rows), randF32(rng, rows)
		x, y, bias := f32Tensor(t, b, n, cols, xv), f32Tensor(t, b, n, rows, y0), f32Tensor(t, b, 1, rows, bv)
		b.BeginStep()
		b.Linear(y, x, w, kernels.Epilogue{Bias: bias, Accumulate: true})
		b.EndStep()
		got := make([]float32, n*rows)
		b.ReadF32(got, y)
		xr, tol := xv, kerneltest.LinearTol
		if n >= gemmRoundRows {
			xr, tol = make([]float32, len(xv)), 1.0/(1<<14)
			for i, v := range xv {
				xr[i] = kernels.BF16ToF32(kernels.F32ToBF16(v))
			}
		}
		want := append([]float32(nil), y0...)
		ref.Linear(want, xr, w, bv, true, n)
		abs := make([]float64, len(want))
		row := make([]float32, cols)
		for j := range rows {
			w.RowF32(row, j)
			for i := range n {
				s := math.Abs(float64(bv[j])) + math.Abs(float64(y0[i*rows+j]))
				for k, v := range row {
					s += math.Abs(float64(v * xr[i*cols+k]))
				}
				abs[i*rows+j] = s
			}
		}
		t.Logf("n=%d: tolerance %.3g", n, tol)
		compare(t, got, want, abs, tol)
	}
}

// TestOpsAttentionSplits checks the split-KV path at decode shapes the
// conformance cases do not reach: long contexts split many ways, and a
// query group wider than one block's heads (MQA with 16 heads). The splits
// merged in the attention kernel (the default) and by
// ferrite_attn_combine, and the kernels of 4 and of 8
// query heads a block, must agree bit for bit.
func TestOpsAttentionSplits(t *testing.T) {
	b := openOps(t)
	defer b.SetFuse(false)
	defer func() { b.attnWide = false }()
	for _, c := range []struct{ heads, kvHeads, hd, ctx int }{{32, 8, 128, 1500}, {16, 1, 64, 700}, {4, 4, 256, 300}} {
		rng := rand.New(rand.NewPCG(uint64(c.ctx), 5))
		const bs = 16
		nb := (c.ctx + bs - 1) / bs
		qw, kw := c.heads*c.hd, c.kvHeads*c.hd
		perm := rng.Perm(nb + 2)
		table := make([]int32, nb)
		slots := make([]int32, c.ctx)
		pos := make([]int32, c.ctx)
		for i := range table {
			table[i] = int32(perm[i])
		}
		for p := range slots {
			slots[p] = table[p/bs]*bs + int32(p%bs)
			pos[p] = int32(p)
		}
		kv, vv := randF32(rng, c.ctx*kw), randF32(rng, c.ctx*kw)
		kc, err := b.Alloc(kernels.BF16, (nb+2)*bs, kw)
		if err != nil {
			t.Fatal(err)
		}
		vc, _ := b.Alloc(kernels.BF16, (nb+2)*bs, kw)
		all := &kernels.Paged{Pos: i32Tensor(t, b, c.ctx, 1, pos), Seq: i32Tensor(t, b, c.ctx, 1, make([]int32, c.ctx)),
			Slot: i32Tensor(t, b, c.ctx, 1, slots), Blocks: i32Tensor(t, b, 1, nb, table), BlockSize: bs}
		k, v := f32Tensor(t, b, c.ctx, kw, kv), f32Tensor(t, b, c.ctx, kw, vv)
		qv := randF32(rng, qw)
		q := f32Tensor(t, b, 1, qw, qv)
		out := f32Tensor(t, b, 1, qw, make([]float32, qw))
		last := &kernels.Paged{Pos: all.Pos.Slice(c.ctx-1, c.ctx), Seq: all.Seq.Slice(0, 1), Slot: all.Slot.Slice(c.ctx-1, c.ctx),
			Blocks: all.Blocks, BlockSize: bs}
		shape := kernels.AttnShape{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.hd, Scale: float32(1 / math.Sqrt(float64(c.hd)))}
		out2, out3 := f32Tensor(t, b, 1, qw, make([]float32, qw)), f32Tensor(t, b, 1, qw, make([]float32, qw))
		b.SetFuse(true)
		b.BeginStep()
		b.StoreKV(kc, vc, k, v, all)
		b.Attention(out, q, kc, vc, last, shape)
		b.EndStep()
		b.SetFuse(false)
		b.BeginStep()
		b.Attention(out2, q, kc, vc, last, shape)
		b.EndStep()
		b.SetFuse(true)
		b.attnWide = true
		b.BeginStep()
		b.Attention(out3, q, kc, vc, last, shape)
		b.EndStep()
		b.attnWide = false
		got, sep, wide := make([]float32, qw), make([]float32, qw), make([]float32, qw)
		b.ReadF32(got, out)
		b.ReadF32(sep, out2)
		b.ReadF32(wide, out3)
		for _, o := range []struct {
			name string
			v    []float32
		}{{"merged by ferrite_attn_combine", sep}, {"with 8 query heads a block", wide}} {
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(o.v[i]) {
					t.Errorf("%+v (4 heads a block: %v): out[%d] = %g, %g %s", c, b.attnG4(shape, 1), i, got[i], o.v[i], o.name)
					break
				}
			}
		}
		for i := range kv {
			kv[i] = kernels.BF16ToF32(kernels.F32ToBF16(kv[i]))
			vv[i] = kernels.BF16ToF32(kernels.F32ToBF16(vv[i]))
		}
		want := make([]float32, qw)
		ref.Attention(want, qv, c.ctx, func(p int) []float32 { return kv[p*kw : (p+1)*kw] },
			func(p int) []float32 { return vv[p*kw : (p+1)*kw] }, shape)
		vmax := 0.0
		for _, x := range vv {
			vmax = max(vmax, math.Abs(float64(x)))
		}
		abs := make([]float64, qw)
		for i := range abs {
			abs[i] = vmax
		}
		compare(t, got, want, abs, kerneltest.AttentionTol)
	}
}

// TestScratchStopsAllocating: after a step of the largest size, steps of
// that size or smaller reuse the arena's one chunk.
func TestScratchStopsAllocating(t *testing.T) {
	b := openOps(t)
	step := func(sizes ...int) {
		b.BeginStep()
		for _, n := range sizes {
			b.Scratch(kernels.F32, n, 1)
		}
		b.EndStep()
	}
	step(3<<20, 5<<20, 1) // 36 MiB: more than the first 16 MiB chunk
	step(1)
	if len(b.arena.chunks) != 1 {
		t.Fatalf("%d chunks after the reset, want 1", len(b.arena.chunks))
	}
	c := b.arena.chunks[0]
	for range 3 {
		step(3<<20, 5<<20, 1)
		if len(b.arena.chunks) != 1 || b.arena.chunks[0] != c {
			t.Fatal("a step of the peak size allocated again")
		}
	}
}

// TestGraphReplay runs one step shape five times with new inputs each
// time: the second step repeats the first one's launches, so it is
// captured into a CUDA graph, and it and the later ones replay the graph.
// Every step's outputs must match those of a Backend that launches eagerly
// (the same kernels; 1e-6 relative allows cuBLASLt a different reduction
// order), and a step of another shape must run eagerly again, then be
// captured too; back to the first shape, its graph replays at once.
func TestGraphReplay(t *testing.T) {
	g, e := openOps(t), openOps(t)
	g.graphs.enabled, e.graphs.enabled = true, false
	rng := rand.New(rand.NewPCG(8, 9))
	w1 := kerneltest.NewMat(rng, kernels.BF16, 48, 64, 0, 0)
	w2 := kerneltest.NewMat(rng, kernels.BF16, 64, 48, 0, 0)
	nw := randF32(rng, 48)
	type model struct {
		b          *Backend
		x, norm, y kernels.Tensor
	}
	setup := func(b *Backend) *model {
		m := &model{b: b, x: f32Tensor(t, b, 3, 64, make([]float32, 3*64)), norm: f32Tensor(t, b, 1, 48, nw)}
		m.y = f32Tensor(t, b, 3, 64, make([]float32, 3*64))
		return m
	}
	run := func(m *model, rows int, xv []float32) []float32 {
		b := m.b
		x, y := m.x.Slice(0, rows), m.y.Slice(0, rows)
		b.WriteF32(x, xv)
		b.BeginStep()
		h := b.Scratch(kernels.F32, rows, 48)
		b.Linear(h, x, w1, kernels.Epilogue{})
		b.RMSNorm(h, h, m.norm, 1e-6, false)
		b.Linear(y, h, w2, kernels.Epilogue{Accumulate: true})
		b.EndStep()
		out := make([]float32, rows*64)
		b.ReadF32(out, y)
		return out
	}
	mg, me := setup(g), setup(e)
	for i, rows := range []int{3, 3, 3, 3, 3, 1, 1, 1, 3, 3} {
		xv := randF32(rng, rows*64)
		got, want := run(mg, rows, xv), run(me, rows, xv)
		for j := range want {
			if d := math.Abs(float64(got[j] - want[j])); !(d <= 1e-6*(1+math.Abs(float64(want[j])))) {
				t.Fatalf("step %d: y[%d] = %g with graphs, %g eager", i, j, got[j], want[j])
			}
		}
	}
	captures, replays, err := g.GraphStats()
	if err != nil {
		t.Fatal(err)
	}
	if captures != 2 || replays != 8 {
		t.Errorf("%d captures and %d replays, want 2 and 8", captures, replays)
	}
	if c, r, _ := e.GraphStats(); c != 0 || r != 0 {
		t.Errorf("the eager backend captured %d graphs", c+r)
	}
}

// TestPDLGraphStep runs a chain of dependent one-row ops (the decode
// kernels: GEMVs, norms, the fused SwiGLU GEMV) for five steps with PDL
// and graphs on, against a Backend that launches eagerly without PDL: a
// kernel that started before its input was written would differ.
func TestPDLGraphStep(t *testing.T) {
	p, e := openOps(t), openOps(t)
	if !p.dev.SetPDL(true) {
		t.Skip("no programmatic dependent launch on this GPU or driver")
	}
	e.dev.SetPDL(false)
	p.graphs.enabled, e.graphs.enabled = true, false
	rng := rand.New(rand.NewPCG(10, 11))
	const hidden, inter = 256, 512
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
		return &model{b: b, x: f32Tensor(t, b, 1, hidden, make([]float32, hidden)), norm: f32Tensor(t, b, 1, hidden, nw),
			y: f32Tensor(t, b, 1, hidden, make([]float32, hidden))}
	}
	run := func(m *model, xv []float32) []float32 {
		b := m.b
		b.WriteF32(m.x, xv)
		b.BeginStep()
		for range 4 { // y feeds the next layer: every kernel reads its predecessor's output
			h := b.Scratch(kernels.F32, 1, hidden)
			g := b.Scratch(kernels.F32, 1, inter)
			b.AddRMSNorm(h, m.x, m.y, m.norm, 1e-6, false)
			b.Linear(m.y, h, w1, kernels.Epilogue{})
			b.RMSNorm(h, m.y, m.norm, 1e-6, false)
			b.SwiGLULinear(g, h, gate, up, 0)
			b.Linear(m.y, g, down, kernels.Epilogue{Accumulate: true})
		}
		b.EndStep()
		out := make([]float32, hidden)
		b.ReadF32(out, m.y)
		return out
	}
	mp, me := setup(p), setup(e)
	for i := range 5 {
		xv := randF32(rng, hidden)
		got, want := run(mp, xv), run(me, xv)
		for j := range want {
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				t.Fatalf("step %d: y[%d] = %g with PDL and graphs, %g eager", i, j, got[j], want[j])
			}
		}
	}
	if _, replays, err := p.GraphStats(); err != nil || replays != 4 {
		t.Errorf("%d graph replays (%v), want 4", replays, err)
	}
}

// TestSwiGLULinearRows checks SwiGLULinear's one-row GEMV in every
// variant (four warps a row, gemv_swiglu_rows with 4 and 8 weight rows a
// block; vector and scalar paths, a last block of fewer rows, the clamp)
// against kernels/ref: the products' errors reach y through the SwiGLU,
// scaled by |u| and silu'(g) ≤ 1.1.
func TestSwiGLULinearRows(t *testing.T) {
	b := openOps(t)
	defer b.dev.SetGEMVRows(gemvRowsDefault())
	for _, r := range []int{0, 4, 8} {
		for _, c := range []struct {
			inter, cols int
			dt          kernels.DType
			limit       float32
		}{{24, 64, kernels.BF16, 0}, {5, 33, kernels.F32, 0}, {37, 4096, kernels.BF16, 0.5}, {9, 1000, kernels.F16, 0}} {
			b.dev.SetGEMVRows(r)
			rng := rand.New(rand.NewPCG(uint64(c.inter), uint64(c.cols)))
			gate, up := kerneltest.NewMat(rng, c.dt, c.inter, c.cols, 0, 0), kerneltest.NewMat(rng, c.dt, c.inter, c.cols, 0, 0)
			xv := randF32(rng, c.cols)
			x, y := f32Tensor(t, b, 1, c.cols, xv), f32Tensor(t, b, 1, c.inter, make([]float32, c.inter))
			b.BeginStep()
			b.SwiGLULinear(y, x, gate, up, c.limit)
			b.EndStep()
			got := make([]float32, c.inter)
			b.ReadF32(got, y)
			g, u, want := make([]float32, c.inter), make([]float32, c.inter), make([]float32, c.inter)
			ref.Linear(g, xv, gate, nil, false, 1)
			ref.Linear(u, xv, up, nil, false, 1)
			ref.SwiGLUClamp(want, g, u, c.limit)
			ga, ua := kerneltest.AbsDot(xv, gate, 1), kerneltest.AbsDot(xv, up, 1)
			for i := range want {
				lim := kerneltest.Tol*(1.1*ga[i]*math.Abs(float64(u[i]))+ua[i]*math.Abs(float64(g[i]))+ga[i]*ua[i]) + 1e-6*max(1, math.Abs(float64(want[i])))
				if d := math.Abs(float64(got[i] - want[i])); !(d <= lim) {
					t.Errorf("rows=%d %v %dx%d limit %v: y[%d] = %g, want %g ± %.3g", r, c.dt, c.inter, c.cols, c.limit, i, got[i], want[i], lim)
					break
				}
			}
		}
	}
}
