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
)

// prefillCase is one sequence's prefill chunk on the device: rows n at
// positions [start, start+n), every position's key and value stored in a
// cache of dtype dt (block size 16, blocks in order), and the queries.
type prefillCase struct {
	q, kc, vc kernels.Tensor
	p         *kernels.Paged
	shape     kernels.AttnShape
	maxV      float64 // the largest |value|
}

func newPrefillCase(tb testing.TB, be *Backend, dt kernels.DType, heads, kvHeads, hd, start, n int) *prefillCase {
	tb.Helper()
	const bs = 16
	ctx := start + n
	rng := rand.New(rand.NewPCG(uint64(ctx), uint64(hd)))
	alloc := func(dt kernels.DType, rows, cols int) kernels.Tensor {
		t, err := be.Alloc(dt, rows, cols)
		if err != nil {
			tb.Fatal(err)
		}
		return t
	}
	ints := func(rows int, f func(i int) int32) kernels.Tensor {
		v := make([]int32, rows)
		for i := range v {
			v[i] = f(i)
		}
		t := alloc(kernels.I32, rows, 1)
		be.WriteI32(t, v)
		return t
	}
	kw := kvHeads * hd
	c := &prefillCase{shape: kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}}
	nb := (ctx + bs - 1) / bs
	c.kc, c.vc = alloc(dt, nb*bs, kw), alloc(dt, nb*bs, kw)
	kv := randF32(rng, ctx*kw)
	k, v := alloc(kernels.F32, ctx, kw), alloc(kernels.F32, ctx, kw)
	be.WriteF32(k, kv)
	kv = randF32(rng, ctx*kw)
	for _, x := range kv {
		c.maxV = max(c.maxV, math.Abs(float64(x)))
	}
	be.WriteF32(v, kv)
	all := &kernels.Paged{Slot: ints(ctx, func(i int) int32 { return int32(i) })}
	be.BeginStep()
	be.StoreKV(c.kc, c.vc, k, v, all)
	be.EndStep()
	c.q = alloc(kernels.F32, n, heads*hd)
	be.WriteF32(c.q, randF32(rng, n*heads*hd))
	c.p = &kernels.Paged{Pos: ints(n, func(i int) int32 { return int32(start + i) }), Seq: ints(n, func(int) int32 { return 0 }),
		Blocks: ints(nb, func(i int) int32 { return int32(i) }).Reshape(1, nb), BlockSize: bs}
	if err := be.Err(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// run returns Attention's output over the case, with the prefill kernel at
// row tiles of rows, or the split-KV kernel alone (rows 0).
func (c *prefillCase) run(tb testing.TB, be *Backend, rows int) []float32 {
	tb.Helper()
	out, err := be.Alloc(kernels.F32, c.q.Rows, c.q.Cols)
	if err != nil {
		tb.Fatal(err)
	}
	defer be.Free(out)
	defer be.setPrefill(rows)()
	be.BeginStep()
	be.Attention(out, c.q, c.kc, c.vc, c.p, c.shape)
	be.EndStep()
	got := make([]float32, out.Elems())
	be.ReadF32(got, out)
	if err := be.Err(); err != nil {
		tb.Fatal(err)
	}
	return got
}

// setPrefill makes Attention use the prefill kernel at row tiles of rows,
// or only the split-KV kernel (rows 0), until the returned func restores
// the defaults.
func (b *Backend) setPrefill(rows int) func() {
	b.splitKVOnly, b.prefillRows = rows == 0, rows
	return func() { b.splitKVOnly, b.prefillRows = false, 0 }
}

// TestPrefillAttention checks the prefill kernel at model sizes (Qwen3-8B's
// GQA 32/8 at head dim 128, and 8/2 at 64) against the split-KV kernel,
// which the conformance suite holds to float32 precision: within
// kerneltest.AttentionBF16Tol·max|v|, the bfloat16 rounding of queries,
// probabilities (and an F32 cache's keys and values) it declares.
func TestPrefillAttention(t *testing.T) {
	be := openOps(t)
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F32} {
		for _, c := range []struct{ heads, kvHeads, hd, start, n int }{
			{32, 8, 128, 200, 300}, {32, 8, 128, 0, 64}, {8, 2, 64, 0, 130}, {8, 2, 64, 70, 1000},
		} {
			t.Run(fmt.Sprintf("%v/%d-%d-%d/start=%d,n=%d", dt, c.heads, c.kvHeads, c.hd, c.start, c.n), func(t *testing.T) {
				pc := newPrefillCase(t, be, dt, c.heads, c.kvHeads, c.hd, c.start, c.n)
				if !be.AttentionRoundsToBF16(pc.shape, c.n) {
					t.Fatal("the prefill kernel is not used")
				}
				want := pc.run(t, be, 0)
				for _, rows := range []int{64, 128} {
					got := pc.run(t, be, rows)
					lim := kerneltest.AttentionBF16Tol * pc.maxV
					worst, at, bad := 0.0, 0, 0
					for i := range want {
						d := math.Abs(float64(got[i]) - float64(want[i]))
						if !(d <= lim) {
							bad++
						}
						if !(d <= worst) {
							worst, at = d, i
						}
					}
					qw := c.heads * c.hd
					t.Logf("tile %d rows: max |prefill − split-KV| %.3g = %.3g·max|v| at row %d head %d dim %d (tol %.3g·max|v|)",
						rows, worst, worst/pc.maxV, at/qw, at%qw/c.hd, at%c.hd, kerneltest.AttentionBF16Tol)
					if bad > 0 {
						t.Errorf("tile %d rows: %d of %d outputs off by more than %.3g (got %g want %g at %d)",
							rows, bad, len(want), lim, got[at], want[at], at)
					}
				}
			})
		}
	}
}

// BenchmarkPrefillAttention times one Qwen3-8B layer's attention (32 query
// and 8 KV heads of 128, bf16 cache) over a fresh prompt of n tokens in one
// step: the prefill kernel at row tiles of 64 and 128, and the split-KV
// kernel alone for comparison. TFLOP/s counts 4·heads·hd flops per (row,
// visible key) pair; ms/36-layers is the whole model's attention.
func BenchmarkPrefillAttention(b *testing.B) {
	be := openOps(b)
	const heads, kvHeads, hd = 32, 8, 128
	for _, n := range []int{512, 4096} {
		pc := newPrefillCase(b, be, kernels.BF16, heads, kvHeads, hd, 0, n)
		out, err := be.Alloc(kernels.F32, n, heads*hd)
		if err != nil {
			b.Fatal(err)
		}
		flops := 4 * float64(heads*hd) * float64(n) * float64(n+1) / 2
		for _, rows := range []int{64, 128, 0} {
			name := fmt.Sprintf("n=%d/prefill%d", n, rows)
			if rows == 0 {
				name = fmt.Sprintf("n=%d/splitkv", n)
			}
			b.Run(name, func(b *testing.B) {
				defer be.setPrefill(rows)()
				step := func(reps int) {
					be.BeginStep()
					for range reps {
						be.Attention(out, pc.q, pc.kc, pc.vc, pc.p, pc.shape)
					}
					be.EndStep()
				}
				step(1) // warm up
				b.ResetTimer()
				start := time.Now()
				step(b.N)
				sec := time.Since(start).Seconds() / float64(b.N)
				if err := be.Err(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(sec*1e3, "ms/layer")
				b.ReportMetric(flops/sec/1e12, "TFLOP/s")
				b.ReportMetric(sec*1e3*36, "ms/36-layers")
			})
		}
	}
}

// TestPreferredBatchTokens checks the step budget's scaling with device
// memory (no GPU needed).
func TestPreferredBatchTokens(t *testing.T) {
	for _, c := range []struct {
		mem  int64
		want int
	}{{141 << 30, 4096}, {80 << 30, 4096}, {48 << 30, 2048}, {24 << 30, 1024}, {16 << 30, 1024}, {8 << 30, 512}, {0, 512}} {
		b := &Backend{dev: &Device{TotalMem: c.mem}}
		if got := b.PreferredBatchTokens(); got != c.want {
			t.Errorf("%d GiB: %d tokens, want %d", c.mem>>30, got, c.want)
		}
	}
}
