//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// Qwen3-8B's linear layers (hidden 4096, 32 query and 8 KV heads of 128,
// intermediate 12288, 36 layers, vocabulary 151936), q/k/v and gate/up
// fused as a GPU engine stores them.
var qwen3_8B = []struct {
	name       string
	rows, cols int
}{
	{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 24576, 4096}, {"down", 4096, 12288}, {"lm_head", 151936, 4096},
}

const qwen3_8BLayers = 36

// benchWeights allocates copies bf16 (rows, cols) weights filled with
// seeded random values on the device.
func benchWeights(b *testing.B, d *Device, copies, rows, cols int) []*Weight {
	b.Helper()
	ws := make([]*Weight, copies)
	for i := range ws {
		buf, err := d.Alloc(int64(rows) * int64(cols) * 2)
		if err == nil {
			err = d.FillBF16(buf, int64(rows)*int64(cols), uint64(i+1), 0.05)
		}
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = &Weight{Buf: buf, DType: kernels.BF16, Rows: rows, Cols: cols}
	}
	b.Cleanup(func() {
		for _, w := range ws {
			w.Free()
		}
	})
	return ws
}

// benchF32 returns a device buffer of n float32 values that are not zero.
func benchF32(b *testing.B, d *Device, n int) *Buffer {
	b.Helper()
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%17)*0.01 - 0.08
	}
	buf, err := d.Alloc(int64(n) * 4)
	if err == nil {
		err = buf.UploadF32(0, x)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { buf.Free() })
	return buf
}

// timeLaunches times reps rounds of launch, queued from the device thread
// back to back, on CUDA events.
func timeLaunches(b *testing.B, d *Device, reps int, launch func(i int) error) time.Duration {
	b.Helper()
	if err := d.do(func() error { return launch(0) }); err != nil { // warm up
		b.Fatal(err)
	}
	el, err := d.Time(func() error {
		return d.do(func() error {
			for i := range reps {
				if err := launch(i); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		b.Fatal(err)
	}
	return el
}

// BenchmarkGEMV measures the batch-1 bf16 GEMV at each Qwen3-8B shape,
// rotating over enough weight copies (≥ 1 GiB) that none is in L2 when it
// is read again. GB/s counts the weight, x and y bytes once per call.
// split is the decode kernel Linear runs by default (four warps a row).
// Launches are back to back, with PDL where the GPU has it.
func BenchmarkGEMV(b *testing.B) {
	d := needGPU(b)
	for _, s := range qwen3_8B {
		gemv := func(y, x uint64, w *Weight) error { return d.linearL(y, x, w, 1, 0, false) }
		benchGEMV(b, d, fmt.Sprintf("%s_%dx%d/split", s.name, s.rows, s.cols), s.rows, s.cols, gemv)
	}
}

// benchGEMV times gemv on a (rows, cols) bf16 weight as sub-benchmark name.
func benchGEMV(b *testing.B, d *Device, name string, rows, cols int, gemv func(y, x uint64, w *Weight) error) {
	b.Run(name, func(b *testing.B) {
		bytes := int64(rows) * int64(cols) * 2
		ws := benchWeights(b, d, int(max(2, (1<<30)/bytes)), rows, cols)
		x, y := benchF32(b, d, cols), benchF32(b, d, rows)
		b.ResetTimer()
		el := timeLaunches(b, d, b.N, func(i int) error { return gemv(y.ptr, x.ptr, ws[i%len(ws)]) })
		moved := float64(bytes+int64(cols+rows)*4) * float64(b.N)
		b.ReportMetric(moved/el.Seconds()/1e9, "GB/s")
		b.ReportMetric(el.Seconds()*1e6/float64(b.N), "us/call")
	})
}

// BenchmarkDecodeStep8B times the GEMVs of one Qwen3-8B decode step (36
// layers × qkv, o, gate_up, down, then the LM head: 15.1 GB of distinct bf16
// weights) launched eagerly, one op after another: the floor a batch-1 step
// of this model reaches with these kernels, before attention and the small
// kernels. tok/s is 1 / step time. Variants: the GEMV layout (rows=0 four
// warps a row, 4 or 8 rows a block), programmatic dependent launch and the
// split GEMVs' weight prefetch before their PDL wait (pdl.go).
func BenchmarkDecodeStep8B(b *testing.B) {
	d := needGPU(b)
	var step []*Weight
	var bytes int64
	for _, s := range qwen3_8B {
		n := qwen3_8BLayers
		if s.name == "lm_head" {
			n = 1
		}
		step = append(step, benchWeights(b, d, n, s.rows, s.cols)...)
		bytes += int64(n) * int64(s.rows) * int64(s.cols) * 2
	}
	x, y := benchF32(b, d, 12288), benchF32(b, d, 151936)
	defer d.SetGEMVRows(gemvRowsDefault())
	defer d.SetPDL(pdlEnabled(d.Major))
	defer d.SetPrefetch(false)
	for _, c := range []struct {
		rows          int // 0: gemv_split; 4, 8: gemv_rows with that many rows a block
		pdl, prefetch bool
	}{{0, false, false}, {0, true, false}, {4, true, false}} {
		d.SetGEMVRows(c.rows)
		d.SetPrefetch(c.prefetch)
		if d.SetPDL(c.pdl) != c.pdl {
			continue // no PDL on this GPU or driver
		}
		b.Run(fmt.Sprintf("rows=%d/pdl=%v/prefetch=%v", c.rows, c.pdl, c.prefetch), func(b *testing.B) {
			el := timeLaunches(b, d, b.N, func(int) error {
				for _, w := range step {
					if err := d.linearL(y.ptr, x.ptr, w, 1, 0, false); err != nil {
						return err
					}
				}
				return nil
			})
			sec := el.Seconds() / float64(b.N)
			b.ReportMetric(sec*1e3, "ms/step")
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
		})
	}
}

// BenchmarkGemmBF16 measures cuBLASLt's bf16 GEMM (float32 output) at
// Qwen3-8B prefill shapes: tokens × each linear layer. TFLOP/s counts
// 2·tokens·rows·cols.
func BenchmarkGemmBF16(b *testing.B) {
	d := needGPU(b)
	if err := d.HasGemm(); err != nil {
		b.Skip(err)
	}
	for _, tokens := range []int{512, 4096} {
		for _, s := range qwen3_8B[:4] {
			b.Run(fmt.Sprintf("tokens=%d/%s_%dx%d", tokens, s.name, s.rows, s.cols), func(b *testing.B) {
				ws := benchWeights(b, d, 2, s.rows, s.cols)
				xb, err := d.Alloc(int64(tokens) * int64(s.cols) * 2)
				if err == nil {
					err = d.FillBF16(xb, int64(tokens)*int64(s.cols), 99, 1)
				}
				if err != nil {
					b.Fatal(err)
				}
				defer xb.Free()
				y := benchF32(b, d, tokens*s.rows)
				gemm := func(i int) error { return d.gemmL(y.ptr, xb.ptr, ws[i%2], tokens, false) }
				b.ResetTimer()
				el := timeLaunches(b, d, b.N, gemm)
				flops := 2 * float64(tokens) * float64(s.rows) * float64(s.cols) * float64(b.N)
				b.ReportMetric(flops/el.Seconds()/1e12, "TFLOP/s")
				b.ReportMetric(el.Seconds()*1e6/float64(b.N), "us/call")
			})
		}
	}
}

// BenchmarkOpsDecodeStep8B times one batch-1 Qwen3-8B decode step through
// the op set, on seeded random bf16 weights made on the device and a bf16
// KV cache of ctx positions (the norm-fused GEMVs and the weight prefetch
// off unless a variant says so). The "fused" variants are the step engine/gqa
// issues now (36 layers of NormLinearCat (the attention norm and q/k/v),
// QKVAttention (QK-norm, RoPE, KV store and paged attention), o added to
// the residual in its epilogue, NormSwiGLULinear (the FFN norm, gate, up,
// SwiGLU), down added likewise, then the final RMSNorm and the LM head: 4
// products and 1 other op a layer); the others the step before the fused
// norms (q/k/v as one LinearCat, PrepareQKV, attention, o, AddRMSNorm,
// SwiGLULinear, down, AddRMSNorm: 4 products and 4 other ops a layer).
// "linear" runs only the products (in the fused step: with their norms),
// "other" only the rest, so the wall times split the step; the steps
// replay a CUDA graph (graphs/step 1) except in the "eager" variants.
// ms/step is host wall time from BeginStep to the end of EndStep,
// queue-ms/step the part before EndStep (the model's ops queued on the
// host while the GPU waits).
func BenchmarkOpsDecodeStep8B(b *testing.B) {
	be := openOps(b)
	const hidden, heads, kvHeads, hd, inter, vocab, layers = 4096, 32, 8, 128, 12288, 151936, 36
	seed := uint64(1)
	mat := func(rows, cols int) *kernels.Mat {
		m := &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols}
		buf, err := be.dev.Alloc(int64(rows) * int64(cols) * 2)
		if err == nil {
			seed++
			err = be.dev.FillBF16(buf, int64(rows)*int64(cols), seed, 1/float32(math.Sqrt(float64(cols))))
		}
		if err != nil {
			b.Fatal(err)
		}
		be.weights[m] = &Weight{Buf: buf, DType: kernels.BF16, Rows: rows, Cols: cols}
		return m
	}
	vec := func(n int, v float32) kernels.Tensor {
		t, err := be.Alloc(kernels.F32, 1, n)
		if err != nil {
			b.Fatal(err)
		}
		s := make([]float32, n)
		for i := range s {
			s[i] = v * (1 + float32(i%7)*0.01)
		}
		be.WriteF32(t, s)
		return t
	}
	ints := func(v ...int32) kernels.Tensor {
		t, err := be.Alloc(kernels.I32, len(v), 1)
		if err != nil {
			b.Fatal(err)
		}
		be.WriteI32(t, v)
		return t
	}
	// stack makes the device weight of ms stacked (what stacked uploads),
	// filled on the device; ms themselves have no data.
	stack := func(ms ...*kernels.Mat) []*kernels.Mat {
		rows := 0
		for _, m := range ms {
			rows += m.Rows
		}
		w := mat(rows, ms[0].Cols)
		var key stackKey
		copy(key[:], ms)
		if be.stacks == nil {
			be.stacks = map[stackKey]*Weight{}
		}
		be.stacks[key] = be.weights[w]
		return ms
	}
	part := func(rows, cols int) *kernels.Mat { return &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols} }
	type layer struct {
		qkv               []*kernels.Mat
		o, gate, up, down *kernels.Mat
	}
	ls := make([]layer, layers)
	for i := range ls {
		l := layer{qkv: stack(part(heads*hd, hidden), part(kvHeads*hd, hidden), part(kvHeads*hd, hidden)),
			o: mat(hidden, heads*hd), gate: part(inter, hidden), up: part(inter, hidden), down: mat(hidden, inter)}
		stack(l.gate, l.up)
		ls[i] = l
	}
	head := mat(vocab, hidden)
	norm, qkNorm := vec(hidden, 1), vec(hd, 1)
	inv := make([]float32, hd/2)
	for i := range inv {
		inv[i] = float32(math.Pow(1e6, -float64(2*i)/hd))
	}
	rope := &kernels.Rotary{InvFreq: vec(hd/2, 1), Dim: hd, Scale: 1}
	be.WriteF32(rope.InvFreq, inv)
	shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 1 / float32(math.Sqrt(hd))}

	var logits0 []float32 // the first variant's logits, which the other full unfused steps must match
	var logitsF []float32 // the first fused variant's, which the other fused steps must match
	caches := map[int][2][]kernels.Tensor{}
	defer be.dev.SetGEMVRows(gemvRowsDefault())
	defer be.dev.SetPrefetch(false)
	defer be.SetFuseNorm(false)
	defer be.SetFuse(false)
	defer func() { be.noAttnPrefetch = false }()
	defer be.SetDecodeAttention(decAttnOff, 0, 0)
	defer be.SetDecodeNorm(false)
	defer be.SetGemvNorm(false)
	for _, c := range []struct {
		name                  string
		ctx                   int
		lin, rest, eager, pdl bool
		rows                  int  // the n = 1 GEMV: 0 gemv_split, else gemv_rows with rows a block
		fused                 bool // the step engine/gqa issues now (NormLinearCat, QKVAttention, …)
		fuseNorm, prefetch    bool // with the norm-fused GEMVs (SetFuseNorm), with the weight prefetch (pdl.go)
		fuseAttn, noAttnPf    bool // with the fused attention (SetFuse), without the attention's key prefetch
	}{
		{name: "fused/ctx=512/pdl/fuseattn", ctx: 512, lin: true, rest: true, pdl: true, fused: true, fuseAttn: true},
		{name: "fused/other/ctx=512/pdl/fuseattn", ctx: 512, rest: true, pdl: true, fused: true, fuseAttn: true},
		{name: "fused/ctx=512/pdl/noattnprefetch", ctx: 512, lin: true, rest: true, pdl: true, fused: true, noAttnPf: true},
		{name: "fused/other/ctx=512/pdl/noattnprefetch", ctx: 512, rest: true, pdl: true, fused: true, noAttnPf: true},
		{name: "fused/ctx=512/pdl", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/eager/pdl", ctx: 512, lin: true, rest: true, eager: true, pdl: true, fused: true},
		{name: "fused/linear/pdl", ctx: 512, lin: true, pdl: true, fused: true},
		{name: "fused/other/ctx=512/pdl", ctx: 512, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=4096/pdl", ctx: 4096, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/fusenorm", ctx: 512, lin: true, rest: true, pdl: true, fused: true, fuseNorm: true},
		{name: "fused/linear/pdl/fusenorm", ctx: 512, lin: true, pdl: true, fused: true, fuseNorm: true},
		{name: "fused/ctx=512/pdl/prefetch", ctx: 512, lin: true, rest: true, pdl: true, fused: true, prefetch: true},
		// The one-row decode kernels (decode.go), by name.
		{name: "fused/ctx=512/pdl/dattn", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/dattnqkv", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/dnorm", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/dattnqkv/dnorm", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/other/ctx=512/pdl/dattnqkv", ctx: 512, rest: true, pdl: true, fused: true},
		{name: "fused/other/ctx=512/pdl/dattnqkv/dnorm", ctx: 512, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=4096/pdl/dattnqkv/dnorm", ctx: 4096, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/gnorm", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/ctx=512/pdl/dattnqkv/gnorm", ctx: 512, lin: true, rest: true, pdl: true, fused: true},
		{name: "fused/linear/pdl/gnorm", ctx: 512, lin: true, pdl: true, fused: true},
		{"all/ctx=512", 512, true, true, false, false, 0, false, false, false, false, false}, {"all/ctx=512/eager", 512, true, true, true, false, 0, false, false, false, false, false},
		{"all/ctx=512/pdl", 512, true, true, false, true, 0, false, false, false, false, false}, {"all/ctx=512/eager/pdl", 512, true, true, true, true, 0, false, false, false, false, false},
		{"all/ctx=512/pdl/rows=4", 512, true, true, false, true, 4, false, false, false, false, false}, {"all/ctx=512/pdl/rows=8", 512, true, true, false, true, 8, false, false, false, false, false},
		{"linear/pdl", 512, true, false, false, true, 0, false, false, false, false, false}, {"other/ctx=512/pdl", 512, false, true, false, true, 0, false, false, false, false, false},
		{"linear", 512, true, false, false, false, 0, false, false, false, false, false}, {"linear/eager", 512, true, false, true, false, 0, false, false, false, false, false},
		{"linear/rows=4", 512, true, false, false, false, 4, false, false, false, false, false}, {"linear/rows=8", 512, true, false, false, false, 8, false, false, false, false, false},
		{"other/ctx=512", 512, false, true, false, false, 0, false, false, false, false, false}, {"other/ctx=512/eager", 512, false, true, true, false, 0, false, false, false, false, false},
		{"all/ctx=4096", 4096, true, true, false, false, 0, false, false, false, false, false},
	} {
		be.dev.SetGEMVRows(c.rows)
		be.dev.SetPrefetch(c.prefetch)
		be.SetFuseNorm(c.fuseNorm)
		be.SetFuse(c.fuseAttn)
		be.noAttnPrefetch = c.noAttnPf
		dmode := decAttnOff
		switch {
		case strings.Contains(c.name, "/dattnqkv"):
			dmode = decAttnQKV
		case strings.Contains(c.name, "/dattn"):
			dmode = decAttnPlain
		}
		gnorm := strings.Contains(c.name, "/gnorm")
		dnorm := strings.Contains(c.name, "/dnorm") || gnorm
		be.SetDecodeAttention(dmode, 0, 0)
		be.SetDecodeNorm(dnorm)
		be.SetGemvNorm(gnorm)
		const bs = 16
		nb := c.ctx / bs
		table := make([]int32, nb)
		for i := range table {
			table[i] = int32(i)
		}
		kc, vc := caches[c.ctx][0], caches[c.ctx][1] // shared by the variants of one ctx, so their logits agree
		for range layers - len(kc) {
			for _, l := range []*[]kernels.Tensor{&kc, &vc} {
				t, err := be.Alloc(kernels.BF16, c.ctx, kvHeads*hd)
				if err == nil {
					seed++
					tb, _ := t.Buffer()
					err = be.dev.FillBF16(tb.(*tensorBuf).buf, int64(t.Elems()), seed, 1)
				}
				if err != nil {
					b.Fatal(err)
				}
				*l = append(*l, t)
			}
		}
		caches[c.ctx] = [2][]kernels.Tensor{kc, vc}
		p := &kernels.Paged{Pos: ints(int32(c.ctx - 1)), Seq: ints(0), Slot: ints(int32(c.ctx - 1)), BlockSize: bs}
		bt, err := be.Alloc(kernels.I32, 1, nb)
		if err != nil {
			b.Fatal(err)
		}
		be.WriteI32(bt, table)
		p.Blocks = bt
		x0 := make([]float32, hidden)
		for i := range x0 {
			x0[i] = float32(i%13)*0.1 - 0.6
		}
		var logits kernels.Tensor
		var queued time.Duration // host time spent queueing the steps' ops (BeginStep to EndStep)
		step := func() {
			t0 := time.Now()
			be.BeginStep()
			x, h, y := be.Scratch(kernels.F32, 1, hidden), be.Scratch(kernels.F32, 1, hidden), be.Scratch(kernels.F32, 1, hidden)
			qkv := be.Scratch(kernels.F32, 1, (heads+2*kvHeads)*hd)
			q, o, g := be.Scratch(kernels.F32, 1, heads*hd), be.Scratch(kernels.F32, 1, heads*hd), be.Scratch(kernels.F32, 1, inter)
			logits = be.Scratch(kernels.F32, 1, vocab)
			be.exec(func(d *Device) error { return d.uploadL(dptr(x), f32Bytes(x0)) })
			qn := &kernels.HeadNorm{W: qkNorm, Eps: 1e-6}
			if c.fused {
				xn, acc := &kernels.HeadNorm{W: norm, Eps: 1e-6}, kernels.Epilogue{Accumulate: true}
				for i, l := range ls {
					if c.lin {
						be.NormLinearCat(qkv, x, xn, l.qkv, kernels.Epilogue{})
					}
					if c.rest {
						be.QKVAttention(o, kc[i], vc[i], qkv, qn, qn, rope, p, shape)
					}
					if c.lin {
						be.Linear(x, o, l.o, acc)
						be.NormSwiGLULinear(g, x, xn, l.gate, l.up, 0)
						be.Linear(x, g, l.down, acc)
					}
				}
				if c.rest {
					be.RMSNorm(h, x, norm, 1e-6, false)
				}
				if c.lin {
					be.Linear(logits, h, head, kernels.Epilogue{})
				}
				queued += time.Since(t0)
				be.EndStep()
				return
			}
			for i, l := range ls {
				if c.rest && i == 0 {
					be.RMSNorm(h, x, norm, 1e-6, false)
				}
				if c.lin {
					be.LinearCat(qkv, h, l.qkv, kernels.Epilogue{})
				}
				if c.rest {
					be.PrepareQKV(q, kc[i], vc[i], qkv, qn, qn, rope, p, shape)
					be.Attention(o, q, kc[i], vc[i], p, shape)
				}
				if c.lin {
					be.Linear(y, o, l.o, kernels.Epilogue{})
				}
				if c.rest {
					be.AddRMSNorm(h, x, y, norm, 1e-6, false)
				}
				if c.lin {
					be.SwiGLULinear(g, h, l.gate, l.up, 0)
					be.Linear(y, g, l.down, kernels.Epilogue{})
				}
				if c.rest {
					be.AddRMSNorm(h, x, y, norm, 1e-6, false)
				}
			}
			if c.lin {
				be.Linear(logits, h, head, kernels.Epilogue{})
			}
			queued += time.Since(t0)
			be.EndStep()
		}
		be.dev.do(func() error { be.graphs.enabled = !c.eager; return nil })
		if be.dev.SetPDL(c.pdl) != c.pdl {
			b.Logf("%s: no programmatic dependent launch here", c.name)
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			step() // warm up; with graphs the second step is captured
			step()
			_, replays0, _ := be.GraphStats()
			b.ResetTimer()
			start := time.Now()
			queued = 0
			for range b.N {
				step()
			}
			sec := time.Since(start).Seconds() / float64(b.N)
			if err := be.Err(); err != nil {
				b.Fatal(err)
			}
			_, replays, _ := be.GraphStats()
			b.ReportMetric(sec*1e3, "ms/step")
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(float64(replays-replays0)/float64(b.N), "graphs/step")
			b.ReportMetric(queued.Seconds()*1e3/float64(b.N), "queue-ms/step")
		})
		if c.ctx != 512 || !c.lin || !c.rest || !logits.Valid() { // (not run: filtered out)
			continue
		}
		got := make([]float32, vocab)
		be.ReadF32(got, logits)
		if c.fused && (c.fuseNorm || dmode != decAttnOff || dnorm) { // other bits: how far the logits moved
			diff, top := 0.0, 0.0
			for i, v := range got {
				diff, top = max(diff, math.Abs(float64(v-logitsF[i]))), max(top, math.Abs(float64(logitsF[i])))
			}
			b.Logf("%s: max |Δlogit| %.3g against the step without fused norms (max |logit| %.3g)", c.name, diff, top)
			if !(diff <= 0.01*top) {
				b.Errorf("%s: the logits moved by %.3g (max |logit| %.3g)", c.name, diff, top)
			}
			continue
		}
		if c.fused {
			if logitsF == nil {
				logitsF = got
				continue
			}
			for i, v := range got {
				if math.Float32bits(v) != math.Float32bits(logitsF[i]) {
					b.Errorf("%s: logit %d = %g, %g in the first fused variant", c.name, i, v, logitsF[i])
					break
				}
			}
			continue
		}
		if logits0 == nil {
			logits0 = got
			continue
		}
		if c.rows != 0 { // another summation order: report how far the logits moved
			diff, top := 0.0, 0.0
			for i, v := range got {
				diff, top = max(diff, math.Abs(float64(v-logits0[i]))), max(top, math.Abs(float64(logits0[i])))
			}
			b.Logf("%s: max |Δlogit| %.3g against gemv_split (max |logit| %.3g)", c.name, diff, top)
			continue
		}
		for i, v := range got {
			if math.Float32bits(v) != math.Float32bits(logits0[i]) {
				b.Errorf("%s: logit %d = %g, %g in the first variant", c.name, i, v, logits0[i])
				break
			}
		}
	}
	if logits0 != nil && logitsF != nil { // another PrepareQKV and summation order: how far the logits moved
		diff, top := 0.0, 0.0
		for i, v := range logitsF {
			diff, top = max(diff, math.Abs(float64(v-logits0[i]))), max(top, math.Abs(float64(logits0[i])))
		}
		b.Logf("fused step: max |Δlogit| %.3g against the old step (max |logit| %.3g)", diff, top)
		if !(diff <= 0.01*top) {
			b.Errorf("fused step: the logits moved by %.3g (max |logit| %.3g)", diff, top)
		}
	}
	be.dev.SetPDL(false)
}
