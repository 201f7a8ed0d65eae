//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// TestDecodeBatchSplits checks, without a GPU, that a decode batch's
// splits are counted over all its rows' blocks: no more splits than one
// row of the same table gets, at least one, and one once the rows alone
// give the blocks the target asks for.
func TestDecodeBatchSplits(t *testing.T) {
	const sms, cols = 132, 8
	for _, n := range []int{2, 8, 32, 64, 256} {
		one, _ := decSplits(cols, 256, sms, 0, 0, 0)
		s, split := decSplits(cols*n, 256, sms, 0, 0, 0)
		if s < 1 || s*split < 256 || s > one {
			t.Errorf("%d rows over 256 keys: %d splits of %d (one row: %d)", n, s, split, one)
		}
		if cols*n >= 2*sms && s != 1 {
			t.Errorf("%d rows over 256 keys: %d splits, want 1 (%d blocks already)", n, s, cols*n)
		}
	}
}

// TestDecodeBatch checks ferrite_dattn on decode batches (every row a
// sequence of its own, each at its own length) against
// kernels/ref.Attention: 2 to 200 rows at Qwen3-8B's and Qwen3-30B-A3B's
// heads, head dims 64 and 128, F32 and BF16 caches, with the default
// splits, one split a row, and many small ones. The step stores the rows'
// own keys and values just before the attention, as the model's step does,
// so a row that read its own position before the kernel's PDL wait would
// fail. Each case runs twice: the split counters must be back at zero.
func TestDecodeBatch(t *testing.T) {
	b := openOps(t)
	defer b.SetDecodeBatch(b.SetDecodeBatch(decBatchRowsDef, 0), 0)
	for _, c := range []struct {
		heads, kvh, hd, n, maxLen int
		dt                        kernels.DType
	}{
		{32, 8, 128, 2, 300, kernels.BF16},
		{32, 8, 128, 33, 700, kernels.BF16},
		{32, 8, 128, 64, 256, kernels.BF16},
		{32, 8, 128, 200, 130, kernels.BF16},
		{32, 4, 128, 16, 1500, kernels.BF16},
		{32, 8, 128, 9, 200, kernels.F32},
		{16, 2, 64, 24, 500, kernels.BF16},
		{8, 8, 64, 5, 90, kernels.F32},
	} {
		for _, blocks := range []int{0, 1, 100000} {
			b.SetDecodeBatch(decBatchRowsDef, blocks)
			name := fmt.Sprintf("%d-%d-%d/%v/n=%d/len<=%d/blocks=%d", c.heads, c.kvh, c.hd, c.dt, c.n, c.maxLen, blocks)
			t.Run(name, func(t *testing.T) {
				decodeBatchCase(t, b, c.dt, c.heads, c.kvh, c.hd, c.n, c.maxLen, uint64(c.n*7+blocks))
			})
		}
	}
	// The op-set attention cases with decode batches on ferrite_dattn (the
	// default) and on the split-KV kernel.
	b.SetDecodeBatch(decBatchRowsDef, 0)
	t.Run("ops", func(t *testing.T) { kerneltest.RunAttentionOps(t, b) })
	b.SetDecodeBatch(0, 0)
	t.Run("ops/splitkv", func(t *testing.T) { kerneltest.RunAttentionOps(t, b) })
}

// decodeBatchCase runs n rows, row i the last position of sequence i of a
// random length up to maxLen, in one Attention call over a shared paged
// cache, and compares every row with kernels/ref.Attention over the stored
// (rounded) keys and values, within kerneltest.AttentionTol of the
// largest value.
func decodeBatchCase(t *testing.T, b *Backend, dt kernels.DType, heads, kvh, hd, n, maxLen int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 43))
	const bs = 16
	kw, qw := kvh*hd, heads*hd
	lens := make([]int, n)
	need := 1
	for i := range lens {
		lens[i] = 1 + rng.IntN(maxLen)
		need = max(need, ceilDiv(lens[i], bs))
	}
	lens[0] = maxLen
	need = max(need, ceilDiv(maxLen, bs))
	width := 4 // the block table's width, a power of two as the engine rounds it
	for width < need {
		width *= 2
	}
	pool := n*width + 5
	perm := rng.Perm(pool)
	table := make([]int32, n*width)
	for i := range table {
		table[i] = int32(perm[i])
	}
	slotOf := func(i, p int) int32 { return table[i*width+p/bs]*bs + int32(p%bs) }
	keys, vals := make([][]float32, n), make([][]float32, n)
	var hPos, hSeq, hSlot, sPos, sSeq, sSlot []int32
	var hk, hv, sk, sv []float32
	for i, ln := range lens {
		keys[i], vals[i] = randF32(rng, ln*kw), randF32(rng, ln*kw)
		for p := range ln {
			k, v := keys[i][p*kw:(p+1)*kw], vals[i][p*kw:(p+1)*kw]
			if p < ln-1 {
				hPos, hSeq, hSlot = append(hPos, int32(p)), append(hSeq, int32(i)), append(hSlot, slotOf(i, p))
				hk, hv = append(hk, k...), append(hv, v...)
			} else {
				sPos, sSeq, sSlot = append(sPos, int32(p)), append(sSeq, int32(i)), append(sSlot, slotOf(i, p))
				sk, sv = append(sk, k...), append(sv, v...)
			}
		}
		if dt == kernels.BF16 {
			for j := range keys[i] {
				keys[i][j] = kernels.BF16ToF32(kernels.F32ToBF16(keys[i][j]))
				vals[i][j] = kernels.BF16ToF32(kernels.F32ToBF16(vals[i][j]))
			}
		}
	}
	kc, err := b.Alloc(dt, pool*bs, kw)
	if err != nil {
		t.Fatal(err)
	}
	vc, err := b.Alloc(dt, pool*bs, kw)
	if err != nil {
		t.Fatal(err)
	}
	bt := i32Tensor(t, b, n, width, table)
	if len(hPos) > 0 {
		h := len(hPos)
		p := &kernels.Paged{Pos: i32Tensor(t, b, h, 1, hPos), Seq: i32Tensor(t, b, h, 1, hSeq), Slot: i32Tensor(t, b, h, 1, hSlot),
			Blocks: bt, BlockSize: bs}
		b.BeginStep()
		b.StoreKV(kc, vc, f32Tensor(t, b, h, kw, hk), f32Tensor(t, b, h, kw, hv), p)
		b.EndStep()
	}
	p := &kernels.Paged{Pos: i32Tensor(t, b, n, 1, sPos), Seq: i32Tensor(t, b, n, 1, sSeq), Slot: i32Tensor(t, b, n, 1, sSlot),
		Blocks: bt, BlockSize: bs}
	qv := randF32(rng, n*qw)
	q, out := f32Tensor(t, b, n, qw, qv), f32Tensor(t, b, n, qw, make([]float32, n*qw))
	k, v := f32Tensor(t, b, n, kw, sk), f32Tensor(t, b, n, kw, sv)
	s := kernels.AttnShape{Heads: heads, KVHeads: kvh, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	if !b.decAttnFits(out, q, kc, vc, p, s) {
		t.Fatal("ferrite_dattn does not take the decode batch")
	}
	want := make([]float32, n*qw)
	scale := make([]float64, n)
	for i := range n {
		ref.Attention(want[i*qw:(i+1)*qw], qv[i*qw:(i+1)*qw], lens[i],
			func(p int) []float32 { return keys[i][p*kw : (p+1)*kw] },
			func(p int) []float32 { return vals[i][p*kw : (p+1)*kw] }, s)
		for _, x := range vals[i] {
			scale[i] = max(scale[i], math.Abs(float64(x)))
		}
	}
	for run := range 2 {
		b.BeginStep()
		b.StoreKV(kc, vc, k, v, p)
		b.Attention(out, q, kc, vc, p, s)
		b.EndStep()
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n*qw)
		b.ReadF32(got, out)
		bad := 0
		for i := range want {
			if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= kerneltest.AttentionTol*scale[i/qw]) {
				if bad++; bad <= 3 {
					t.Errorf("run %d: row %d (%d keys): out[%d] = %g, want %g", run, i/qw, lens[i/qw], i%qw, got[i], want[i])
				}
			}
		}
	}
}

// randCaches allocates layers pairs of bf16 key and value caches of
// (rows, cols) filled on the device with random values (pair l's keys from
// seed 2l+1, its values from 2l+2).
func randCaches(t testing.TB, be *Backend, layers, rows, cols int) (kc, vc []kernels.Tensor) {
	t.Helper()
	for l := range 2 * layers {
		c, err := be.Alloc(kernels.BF16, rows, cols)
		if err == nil {
			cb, _ := c.Buffer()
			err = be.dev.FillBF16(cb.(*tensorBuf).buf, int64(c.Elems()), uint64(l+1), 1)
		}
		if err != nil {
			t.Fatal(err)
		}
		if l%2 == 0 {
			kc = append(kc, c)
		} else {
			vc = append(vc, c)
		}
	}
	return kc, vc
}

// sameOutput reads a benchmark variant's output out (when it ran) into
// *base for the first variant, and fails b when a later one differs from
// it by 1e-3 or more.
func sameOutput(b *testing.B, be *Backend, out kernels.Tensor, base *[]float32, what string) {
	if !out.Valid() {
		return
	}
	got := make([]float32, out.Elems())
	be.ReadF32(got, out)
	if *base == nil {
		*base = got
		return
	}
	diff := 0.0
	for i := range got {
		diff = max(diff, math.Abs(float64(got[i]-(*base)[i])))
	}
	if !(diff < 1e-3) {
		b.Errorf("%s: differs from the first variant by %g", what, diff)
	}
}

// BenchmarkDecodeBatchAttention times Attention of a Qwen3-8B decode batch
// (32/8 heads of 128, bf16 cache, every row its own sequence at positions
// ctx−17 to ctx−1, or with /spread ctx/2 to ctx−1 as a 128 + 128 bench's
// rows are) on the split-KV kernel and on ferrite_dattn with its splits
// aimed at 2 (the default), 4 and 8 blocks a multiprocessor: 36 calls a
// step over 8 distinct cache layers (none in L2 when it is read again),
// the step replayed as a graph. µs/call is the step's host wall time over
// 36; GB/s counts the keys and values each call reads. The variants'
// outputs are compared with the split-KV kernel's.
func BenchmarkDecodeBatchAttention(b *testing.B) {
	be := openOps(b)
	const heads, kvHeads, hd, bs, ctx, layers, caches = 32, 8, 128, 16, 256, 36, 8
	defer be.SetDecodeBatch(be.SetDecodeBatch(decBatchRowsDef, 0), 0)
	for _, c := range []struct {
		n      int
		spread bool
	}{{8, false}, {32, false}, {64, false}, {32, true}, {64, true}, {128, true}} {
		n := c.n
		nb := ctx / bs
		table := make([]int32, n*nb)
		pos, seq := make([]int32, n), make([]int32, n)
		for i := range n {
			for j := range nb {
				table[i*nb+j] = int32(i*nb + j)
			}
			pos[i], seq[i] = int32(ctx-1-i%17), int32(i)
			if c.spread {
				pos[i] = int32(ctx/2 + (37*i)%(ctx/2))
			}
		}
		kc, vc := randCaches(b, be, caches, n*ctx, kvHeads*hd)
		var bytes float64
		for _, p := range pos {
			bytes += float64(p+1) * kvHeads * hd * 2 * 2
		}
		p := &kernels.Paged{Pos: i32TensorB(b, be, pos), Seq: i32TensorB(b, be, seq), BlockSize: bs}
		bt, err := be.Alloc(kernels.I32, n, nb)
		if err != nil {
			b.Fatal(err)
		}
		be.WriteI32(bt, table)
		p.Blocks = bt
		qv := make([]float32, n*heads*hd)
		for i := range qv {
			qv[i] = float32(math.Sin(float64(i))) * 0.3
		}
		q, err := be.Alloc(kernels.F32, n, heads*hd)
		if err != nil {
			b.Fatal(err)
		}
		be.WriteF32(q, qv)
		shape := kernels.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 1 / float32(math.Sqrt(hd))}
		var base []float32
		for _, v := range []struct {
			name         string
			rows, blocks int
		}{{"splitkv", 0, 0}, {"dattn", decBatchRowsDef, 0}, {"dattn/4sm", decBatchRowsDef, 4 * be.dev.SMs},
			{"dattn/8sm", decBatchRowsDef, 8 * be.dev.SMs}} {
			be.SetDecodeBatch(v.rows, v.blocks)
			var out kernels.Tensor
			step := func() {
				be.BeginStep()
				out = be.Scratch(kernels.F32, n, heads*hd)
				for l := range layers {
					be.Attention(out, q, kc[l%caches], vc[l%caches], p, shape)
				}
				be.EndStep()
			}
			label := fmt.Sprintf("n=%d/ctx=%d", n, ctx)
			if c.spread {
				label += "/spread"
			}
			b.Run(label+"/"+v.name, func(b *testing.B) {
				sec := timeSteps(b, be, step) / layers
				b.ReportMetric(sec*1e6, "us/call")
				b.ReportMetric(bytes/sec/1e9, "GB/s")
			})
			sameOutput(b, be, out, &base, label+"/"+v.name)
		}
	}
}
