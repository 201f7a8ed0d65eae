//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestMLAWide runs the MLA and DSA cases at real model widths
// (kerneltest.MLAWide and SparseWide, the tolerances written down there):
// the 512-wide latent (two dims a thread), contexts split over many
// blocks, 2048-wide selections, the 64×128 indexer query staged in shared
// memory and the top-k radix select over thousands of tied columns, which
// TestOps' small cases do not reach.
//
// With a BF16 cache these shapes take the tensor-core latent attention
// (src/tensor_mla.cu) unless FERRITE_MLA_TC=0; the test fails when that
// kernel is not planned for GLM-4.7-Flash's shape, so that a GPU with too
// little shared memory does not pass on the CUDA-core kernels alone
// unnoticed.
func TestMLAWide(t *testing.T) {
	b := openOps(t)
	glm := kernels.MLAShape{Heads: 20, Nope: 192, Rope: 64, V: 256, KVLora: 512}
	for _, c := range []struct{ n, keys int }{{1, 4096}, {32, 256}, {121, 1024}} {
		plan := b.tcPlan(true, glm, c.n, c.keys)
		t.Logf("tensor-core MLA plan, %d rows, %d keys: %+v (shared memory opt-in %d B)", c.n, c.keys, plan, b.dev.SmemOptIn)
		if plan.nt == 0 && mlaTCEnabled {
			t.Errorf("tensor-core MLA not planned for GLM-4.7-Flash's shape at %d rows", c.n)
		}
	}
	t.Run("Sparse", func(t *testing.T) { kerneltest.SparseWide(t, b, b) })
	t.Run("MLA", func(t *testing.T) { kerneltest.MLAWide(t, b, b) })
}

// BenchmarkMLADecode times GLM-4.7-Flash's attention core on the GPU, as
// engine/models/mla issues it per layer: StoreLatent then AttentionMLA (20
// heads, 192 + 64 query dims, 256 value dims, a 512-wide latent, bf16
// kv_b_proj and cache) for 47 layers in one step, rows decode rows at ctx
// positions each, optionally with a DSA selection of 2048 positions, or a
// 1024-token prompt in one step (prefill). GB/s counts the latents read
// once per row plus kv_b_proj once per step; graphs/step is 1 when the
// steps replay a CUDA graph. The sublayer cases run the whole attention
// sublayer of a layer (q_a_proj, its norm, q_b_proj, kv_a_proj_with_mqa,
// the MLA ops, o_proj; GB/s then counts those weights too). The cases run the default latent attention
// (on tensor cores), and those marked cores the CUDA-core kernels too
// ("/cores", what FERRITE_MLA_TC=0 runs); the 1-row cases at contexts of
// 4,096 and 192 and the 32-row one also with the tensor-core attention's
// plan changed, to tune it: splits capped ("/splits<=2", "/splits<=1"),
// heads a block ("/heads=32", 16, 8), key tiles a split at least
// ("/tiles>=2", 4).
func BenchmarkMLADecode(b *testing.B) {
	be := openOps(b)
	const heads, nope, rope, dv, kl, layers, bs = 20, 192, 64, 256, 512, 47, 64
	kw := kl + rope
	s := kernels.MLAShape{Heads: heads, Nope: nope, Rope: rope, V: dv, KVLora: kl, Scale: 1 / float32(math.Sqrt(nope+rope))}
	seed := uint64(7)
	fill := func(t kernels.Tensor, scale float32) {
		tb, _ := t.Buffer()
		seed++
		if err := be.dev.FillBF16(tb.(*tensorBuf).buf, int64(t.Elems()), seed, scale); err != nil {
			b.Fatal(err)
		}
	}
	alloc := func(dt kernels.DType, rows, cols int) kernels.Tensor {
		t, err := be.Alloc(dt, rows, cols)
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	kvB := &kernels.Mat{DType: kernels.BF16, Rows: heads * (nope + dv), Cols: kl}
	w := alloc(kernels.BF16, kvB.Rows, kvB.Cols)
	fill(w, 1/float32(math.Sqrt(kl)))
	tb, _ := w.Buffer()
	be.weights[kvB] = &Weight{Buf: tb.(*tensorBuf).buf, DType: kernels.BF16, Rows: kvB.Rows, Cols: kvB.Cols}
	inv := make([]float32, rope/2)
	for i := range inv {
		inv[i] = float32(math.Pow(1e6, -float64(2*i)/rope))
	}
	r := &kernels.Rotary{InvFreq: alloc(kernels.F32, 1, rope/2), Dim: rope, Interleaved: true, Scale: 1}
	be.WriteF32(r.InvFreq, inv)
	norm := alloc(kernels.F32, 1, kl)
	ones := make([]float32, kl)
	for i := range ones {
		ones[i] = 1
	}
	be.WriteF32(norm, ones)
	// The sublayer's projections, per layer (made on first use):
	// q_a_proj, q_b_proj, kv_a_proj_with_mqa, o_proj.
	const hidden, qLora = 2048, 768
	var projs [][4]*kernels.Mat
	qNorm := alloc(kernels.F32, 1, qLora)
	qOnes := make([]float32, qLora)
	for i := range qOnes {
		qOnes[i] = 1
	}
	be.WriteF32(qNorm, qOnes)
	mat := func(rows, cols int) *kernels.Mat {
		m := &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols}
		t := alloc(kernels.BF16, rows, cols)
		fill(t, 1/float32(math.Sqrt(float64(cols))))
		tb, _ := t.Buffer()
		be.weights[m] = &Weight{Buf: tb.(*tensorBuf).buf, DType: kernels.BF16, Rows: rows, Cols: cols}
		return m
	}

	for _, c := range []struct {
		name           string
		rows, ctx, top int
		prefill        bool // the rows are one sequence's positions 0 … rows−1 (ctx = rows)
		cores          bool // also time the CUDA-core kernels (FERRITE_MLA_TC=0's), "/cores"
		sub            bool // the whole attention sublayer: q_a, its norm, q_b, kv_a, the MLA ops, o
		tune           bool // also the tensor-core attention with its splits or heads a block capped
	}{
		{"rows=1/ctx=4096", 1, 4096, 0, false, true, false, true}, {"rows=8/ctx=4096", 8, 4096, 0, false, false, false, false},
		{"rows=1/ctx=192", 1, 192, 0, false, true, false, true},
		{"rows=32/ctx=192", 32, 192, 0, false, true, false, true}, {"rows=32/ctx=192/sublayer", 32, 192, 0, false, true, true, false},
		{"rows=1/ctx=192/sublayer", 1, 192, 0, false, true, true, false},
		{"rows=1/ctx=32768", 1, 32768, 0, false, false, false, false},
		{"rows=1/ctx=32768/top=2048", 1, 32768, 2048, false, false, false, false},
		{"prefill/rows=1024", 1024, 1024, 0, true, false, false, false},
	} {
		if c.sub && projs == nil {
			for range layers {
				projs = append(projs, [4]*kernels.Mat{mat(qLora, hidden), mat(heads*(nope+rope), qLora), mat(kw, hidden), mat(hidden, heads*dv)})
			}
		}
		nb, seqs := c.ctx/bs, c.rows
		if c.prefill {
			seqs = 1
		}
		caches := make([]kernels.Tensor, layers)
		for i := range caches {
			caches[i] = alloc(kernels.BF16, seqs*c.ctx, kw)
			fill(caches[i], 1)
		}
		table, pos, seq, slot := make([]int32, seqs*nb), make([]int32, c.rows), make([]int32, c.rows), make([]int32, c.rows)
		for i := range table {
			table[i] = int32(i)
		}
		for i := range c.rows {
			pos[i], seq[i], slot[i] = int32(c.ctx-1), int32(i), int32((i+1)*c.ctx-1)
			if c.prefill {
				pos[i], seq[i], slot[i] = int32(i), 0, int32(i)
			}
		}
		p := &kernels.Paged{Pos: alloc(kernels.I32, c.rows, 1), Seq: alloc(kernels.I32, c.rows, 1), Slot: alloc(kernels.I32, c.rows, 1),
			Blocks: alloc(kernels.I32, seqs, nb), BlockSize: bs}
		be.WriteI32(p.Pos, pos)
		be.WriteI32(p.Seq, seq)
		be.WriteI32(p.Slot, slot)
		be.WriteI32(p.Blocks, table)
		var sel kernels.Tensor
		if c.top > 0 {
			sel = alloc(kernels.I32, c.rows, c.top)
			idx := make([]int32, c.rows*c.top)
			for i := range idx {
				idx[i] = int32((i % c.top) * (c.ctx / c.top))
			}
			be.WriteI32(sel, idx)
		}
		q0 := make([]float32, c.rows*heads*(nope+rope))
		for i := range q0 {
			q0[i] = float32(i%11)*0.05 - 0.25
		}
		kv0 := make([]float32, c.rows*kw)
		for i := range kv0 {
			kv0[i] = float32(i%5)*0.2 - 0.4
		}
		x0 := make([]float32, c.rows*hidden)
		for i := range x0 {
			x0[i] = float32(i%13)*0.1 - 0.6
		}
		step := func() {
			be.BeginStep()
			q, kv := be.Scratch(kernels.F32, c.rows, heads*(nope+rope)), be.Scratch(kernels.F32, c.rows, kw)
			o := be.Scratch(kernels.F32, c.rows, heads*dv)
			be.exec(func(d *Device) error {
				if err := d.uploadL(dptr(q), f32Bytes(q0)); err != nil {
					return err
				}
				return d.uploadL(dptr(kv), f32Bytes(kv0))
			})
			if !c.sub {
				for _, kc := range caches {
					be.StoreLatent(kc, kv, norm, 1e-6, r, p)
					be.AttentionMLA(o, q, kc, kvB, r, p, s, sel)
				}
				be.EndStep()
				return
			}
			x, y := be.Scratch(kernels.F32, c.rows, hidden), be.Scratch(kernels.F32, c.rows, hidden)
			qr := be.Scratch(kernels.F32, c.rows, qLora)
			be.exec(func(d *Device) error { return d.uploadL(dptr(x), f32Bytes(x0)) })
			for li, kc := range caches {
				w := projs[li]
				be.Linear(qr, x, w[0], kernels.Epilogue{})
				be.RMSNorm(qr, qr, qNorm, 1e-6, false)
				be.Linear(q, qr, w[1], kernels.Epilogue{})
				be.Linear(kv, x, w[2], kernels.Epilogue{})
				be.StoreLatent(kc, kv, norm, 1e-6, r, p)
				be.AttentionMLA(o, q, kc, kvB, r, p, s, sel)
				be.Linear(y, o, w[3], kernels.Epilogue{})
			}
			be.EndStep()
		}
		type variant struct {
			cores bool // the CUDA-core kernels
			cap   int  // at most this many splits (the tensor-core kernels)
			heads int  // heads a block (the tensor-core kernels)
			tiles int  // key tiles a split at least (the tensor-core kernels)
		}
		vars := []variant{{}}
		if c.cores {
			vars = append(vars, variant{cores: true})
		}
		if c.tune {
			vars = append(vars, variant{cap: 2}, variant{cap: 1}, variant{heads: 32}, variant{heads: 16}, variant{heads: 8},
				variant{tiles: 2}, variant{tiles: 4})
		}
		for _, v := range vars {
			name := c.name
			switch {
			case v.cores:
				name += "/cores"
			case v.cap > 0:
				name += fmt.Sprintf("/splits<=%d", v.cap)
			case v.heads > 0:
				name += fmt.Sprintf("/heads=%d", v.heads)
			case v.tiles > 0:
				name += fmt.Sprintf("/tiles>=%d", v.tiles)
			}
			be.mlaNoTC, be.mlaSplitCap, be.mlaHeads, be.mlaTiles = v.cores, v.cap, v.heads, v.tiles
			b.Run(name, func(b *testing.B) {
				step() // warm up; with graphs the second step is captured
				step()
				_, replays0, gerr := be.GraphStats()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					step()
				}
				sec := time.Since(start).Seconds() / float64(b.N)
				if err := be.Err(); err != nil {
					b.Fatal(err)
				}
				_, replays, _ := be.GraphStats()
				if gerr != nil {
					b.Logf("graphs: %v", gerr)
				}
				b.ReportMetric(float64(replays-replays0)/float64(b.N), "graphs/step")
				keys := c.ctx
				switch {
				case c.top > 0:
					keys = c.top
				case c.prefill:
					keys = (c.ctx + 1) / 2 // on average
				}
				bytes := float64(layers) * (float64(c.rows*keys*kw*2) + float64(kvB.Rows*kvB.Cols*2))
				if c.sub { // the projections' weights too
					bytes += float64(layers) * 2 * float64(qLora*hidden+heads*(nope+rope)*qLora+kw*hidden+hidden*heads*dv)
				}
				b.ReportMetric(sec*1e6/layers, "us/layer")
				b.ReportMetric(bytes/sec/1e9, "GB/s")
			})
		}
		be.mlaNoTC, be.mlaSplitCap, be.mlaHeads, be.mlaTiles = false, 0, 0, 0
		for _, kc := range caches {
			be.Free(kc)
		}
	}
}

// TestMLAUKTranspose checks the transposed W_UK the absorbed queries
// multiply by (ukWeight, ferrite_mla_uk_t): row h·kl + c of it is column c
// of W_UK_h (kv_b_proj's rows h·(dn+dv) … h·(dn+dv)+dn−1), the same bits
// for BF16 and decoded to F32 with the block scales for F8E4M3.
func TestMLAUKTranspose(t *testing.T) {
	b := openOps(t)
	s := kernels.MLAShape{Heads: 3, Nope: 5, V: 4, KVLora: 24}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F8E4M3} {
		rng := rand.New(rand.NewPCG(1, uint64(dt)))
		kvB := kerneltest.NewMat(rng, dt, s.Heads*(s.Nope+s.V), s.KVLora, 4, 8)
		dw, err := b.weight(kvB)
		if err != nil {
			t.Fatal(err)
		}
		uk, err := b.ukWeight(kvB, dw, s)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := b.ukWeight(kvB, dw, s); again != uk {
			t.Fatalf("%v: not cached", dt)
		}
		want := kernels.F32
		if dt == kernels.BF16 {
			want = kernels.BF16
		}
		if uk.DType != want || uk.Rows != s.Heads*s.KVLora || uk.Cols != s.Nope {
			t.Fatalf("%v: transposed W_UK is %v (%d, %d)", dt, uk.DType, uk.Rows, uk.Cols)
		}
		raw := make([]byte, uk.Rows*uk.Cols*uk.DType.Size())
		if err := b.dev.do(func() error { return b.dev.downloadL(raw, uk.Buf.ptr) }); err != nil {
			t.Fatal(err)
		}
		got := ref.MatF32(&kernels.Mat{DType: uk.DType, Rows: uk.Rows, Cols: uk.Cols, Data: raw})
		full := ref.MatF32(kvB)
		for h := range s.Heads {
			for c := range s.KVLora {
				for d := range s.Nope {
					w := full[(h*(s.Nope+s.V)+d)*s.KVLora+c]
					if g := got[(h*s.KVLora+c)*s.Nope+d]; g != w {
						t.Fatalf("%v: head %d W_UKᵀ[%d][%d] = %g, want %g", dt, h, c, d, g, w)
					}
				}
			}
		}
	}
}

// mlaRig is an AttentionMLA setup at GLM-4.7-Flash's shape (20 heads of
// 192 + 64 query dims, 256 value dims, a 512-wide latent): a random BF16
// cache of two sequences of 1,024 positions in interleaved blocks of 16,
// the rotary table, and three random query rows.
type mlaRig struct {
	t             *testing.T
	be            *Backend
	s             kernels.MLAShape
	cache, blocks kernels.Tensor
	r             *kernels.Rotary
	q0            []float32 // (3, heads·(nope+rope))
}

const mlaRigBS = 16 // the rig's cache block size

func newMLARig(t *testing.T, be *Backend) *mlaRig {
	const heads, nope, rope, dv, kl = 20, 192, 64, 256, 512
	g := &mlaRig{t: t, be: be, s: kernels.MLAShape{Heads: heads, Nope: nope, Rope: rope, V: dv, KVLora: kl, Scale: 1 / float32(math.Sqrt(nope+rope))}}
	const nb = 64 // blocks a sequence: 1,024 positions
	g.cache = g.alloc(kernels.BF16, 2*nb*mlaRigBS, kl+rope)
	g.fill(g.cache, 4, 1)
	table := make([]int32, 2*nb)
	for i := range table {
		table[i] = int32((i * 37) % (2 * nb)) // interleaved blocks
	}
	g.blocks = g.alloc(kernels.I32, 2, nb)
	be.WriteI32(g.blocks, table)
	inv := make([]float32, rope/2)
	for i := range inv {
		inv[i] = float32(math.Pow(1e6, -float64(2*i)/rope))
	}
	g.r = &kernels.Rotary{InvFreq: g.alloc(kernels.F32, 1, rope/2), Dim: rope, Interleaved: true, Scale: 1}
	be.WriteF32(g.r.InvFreq, inv)
	rng := rand.New(rand.NewPCG(5, 6))
	g.q0 = make([]float32, 3*heads*(nope+rope))
	for i := range g.q0 {
		g.q0[i] = float32(rng.NormFloat64())
	}
	return g
}

func (g *mlaRig) alloc(dt kernels.DType, rows, cols int) kernels.Tensor {
	x, err := g.be.Alloc(dt, rows, cols)
	if err != nil {
		g.t.Fatal(err)
	}
	return x
}

// fill sets x (BF16) to seeded random values of the given scale.
func (g *mlaRig) fill(x kernels.Tensor, seed uint64, scale float32) {
	tb, _ := x.Buffer()
	if err := g.be.dev.FillBF16(tb.(*tensorBuf).buf, int64(x.Elems()), seed, scale); err != nil {
		g.t.Fatal(err)
	}
}

// run attends rows (sequence, position) with the queries of q0's rows
// qrows over kv_b_proj kvB and returns their outputs (rows, heads·v).
func (g *mlaRig) run(kvB *kernels.Mat, seq, pos []int32, qrows []int) []float32 {
	be, s := g.be, g.s
	n, qw := len(seq), s.Heads*(s.Nope+s.Rope)
	p := &kernels.Paged{Pos: g.alloc(kernels.I32, n, 1), Seq: g.alloc(kernels.I32, n, 1), Blocks: g.blocks, BlockSize: mlaRigBS}
	be.WriteI32(p.Pos, pos)
	be.WriteI32(p.Seq, seq)
	q, out := g.alloc(kernels.F32, n, qw), g.alloc(kernels.F32, n, s.Heads*s.V)
	qh := make([]float32, 0, n*qw)
	for _, j := range qrows {
		qh = append(qh, g.q0[j*qw:(j+1)*qw]...)
	}
	be.WriteF32(q, qh)
	be.BeginStep()
	be.AttentionMLA(out, q, g.cache, kvB, g.r, p, s, kernels.Tensor{})
	be.EndStep()
	got := make([]float32, n*s.Heads*s.V)
	be.ReadF32(got, out)
	for _, x := range []kernels.Tensor{p.Pos, p.Seq, q, out} {
		be.Free(x)
	}
	return got
}

// rowExactDiffs runs the batch seq, pos (queries q0[:len(seq)]) and each
// of its rows alone and counts the output values whose bits differ (or
// that are NaN), logging the first.
func (g *mlaRig) rowExactDiffs(kvB *kernels.Mat, name string, seq, pos []int32) int {
	qrows := []int{0, 1, 2}[:len(seq)]
	width := g.s.Heads * g.s.V
	batch := g.run(kvB, seq, pos, qrows)
	diff := 0
	for i := range seq {
		alone := g.run(kvB, seq[i:i+1], pos[i:i+1], qrows[i:i+1])
		for k, x := range alone {
			if y := batch[i*width+k]; math.Float32bits(x) != math.Float32bits(y) || math.IsNaN(float64(x)) {
				if diff == 0 {
					g.t.Logf("%s: row %d value %d: batch %g, alone %g", name, i, k, y, x)
				}
				diff++
			}
		}
	}
	return diff
}

// mlaRowCases are the batches the row-exact tests run: two decode rows of
// different sequences and contexts, and a verification of three rows of
// one sequence.
var mlaRowCases = []struct {
	name     string
	seq, pos []int32
}{
	{"two sequences", []int32{0, 1}, []int32{1000, 230}},
	{"verification", []int32{1, 1, 1}, []int32{700, 701, 702}},
}

// TestMLARowExact checks AttentionMLA at GLM-4.7-Flash's shape with
// SetRowExact on: every row of a batch (mlaRowCases) gets the bits it gets
// alone, through the per-head projections and the split latent attention;
// and, as a control, that the batch is not bit-identical with SetRowExact
// off when the split plan depends on the rows (logged only: equal bits
// there are allowed).
func TestMLARowExact(t *testing.T) {
	be := openOps(t)
	g := newMLARig(t, be)
	if be.tcPlan(true, g.s, 1, 1024).nt == 0 {
		t.Skip("the tensor-core MLA kernels are off (FERRITE_MLA_TC=0) or do not fit; the CUDA-core ones split by the batch")
	}
	s := g.s
	kvB := &kernels.Mat{DType: kernels.BF16, Rows: s.Heads * (s.Nope + s.V), Cols: s.KVLora}
	w := g.alloc(kernels.BF16, kvB.Rows, kvB.Cols)
	g.fill(w, 3, 1/float32(math.Sqrt(float64(s.KVLora))))
	tb, _ := w.Buffer()
	be.weights[kvB] = &Weight{Buf: tb.(*tensorBuf).buf, DType: kernels.BF16, Rows: kvB.Rows, Cols: kvB.Cols}
	for _, c := range mlaRowCases {
		for _, exact := range []bool{true, false} {
			be.SetRowExact(exact)
			diff := g.rowExactDiffs(kvB, fmt.Sprintf("%s, row exact %v", c.name, exact), c.seq, c.pos)
			switch {
			case exact && diff > 0:
				t.Errorf("%s: %d values differ between the batch and the rows alone with SetRowExact", c.name, diff)
			case !exact:
				t.Logf("%s: %d values differ between the batch and the rows alone without SetRowExact", c.name, diff)
			}
		}
	}
	be.SetRowExact(false)
}

// TestMLAKVBParts runs AttentionMLA at GLM-4.7-Flash's shape on kv_b_proj
// stored split as a GGUF stores it (Mat.KVB, kerneltest.SplitKVB): Q8_0
// W_UK beside Q6_K W_UV, and F16 W_UK beside Q8_0 W_UV. The halves go to
// the device as stored and the float32 matrix does not (kvbWeights); the
// outputs are those of the float32 matrix (the same exact weights, float32
// x: only the sums' order differs, which the softmax carries on) to 1e-4
// of each row's largest; and with SetRowExact every row of a batch gets
// the bits it gets alone.
func TestMLAKVBParts(t *testing.T) {
	be := openOps(t)
	g := newMLARig(t, be)
	s := g.s
	if !quantOn {
		t.Skip("FERRITE_CUDA_QUANT=0: quantized halves are decoded to float32")
	}
	for i, dts := range [][2]kernels.DType{{kernels.Q8_0, kernels.Q6K}, {kernels.F16, kernels.Q8_0}} {
		name := fmt.Sprintf("%v+%v", dts[0], dts[1])
		kvB := kerneltest.SplitKVB(rand.New(rand.NewPCG(uint64(i), 9)), s, dts[0], dts[1])
		whole := &kernels.Mat{DType: kvB.DType, Rows: kvB.Rows, Cols: kvB.Cols, Data: kvB.Data} // no parts
		seq, pos := mlaRowCases[0].seq, mlaRowCases[0].pos
		got := g.run(kvB, seq, pos, []int{0, 1})
		if be.weights[kvB] != nil {
			t.Errorf("%s: the float32 kv_b_proj went to the device beside its halves", name)
		}
		for h, want := range []struct {
			m    *kernels.Mat
			rows int
		}{{kvB.KVB.UK[0], s.Heads * s.KVLora}, {kvB.KVB.UV[0], s.Heads * s.V}} {
			if w := be.kvbParts[want.m]; w == nil || w.DType != want.m.DType || w.Rows != want.rows || w.Cols != want.m.Cols {
				t.Errorf("%s: half %d on the device: %+v, want %v (%d, %d)", name, h, w, want.m.DType, want.rows, want.m.Cols)
			}
		}
		ref := g.run(whole, seq, pos, []int{0, 1})
		width := s.Heads * s.V
		for r := range len(seq) {
			var big float64
			for _, x := range ref[r*width : (r+1)*width] {
				big = max(big, math.Abs(float64(x)))
			}
			for k := r * width; k < (r+1)*width; k++ {
				if d := math.Abs(float64(got[k] - ref[k])); !(d <= 1e-4*big) {
					t.Errorf("%s: row %d value %d = %g, %g from the float32 kv_b_proj (largest %g)", name, r, k-r*width, got[k], ref[k], big)
					break
				}
			}
		}
		if be.tcPlan(true, s, 1, 1024).nt == 0 {
			continue // the CUDA-core latent attention splits by the batch
		}
		be.SetRowExact(true)
		for _, c := range mlaRowCases {
			if diff := g.rowExactDiffs(kvB, name+", "+c.name, c.seq, c.pos); diff > 0 {
				t.Errorf("%s, %s: %d values differ between the batch and the rows alone with SetRowExact", name, c.name, diff)
			}
		}
		be.SetRowExact(false)
	}
}
