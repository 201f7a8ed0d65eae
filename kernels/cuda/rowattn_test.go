//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestRowAttnSplits checks rowattn's split choice: at least one, never a
// split over rowAttnMaxKeys keys, never under rowAttnMinKeys unless the
// table is that short, and about four blocks a multiprocessor when the
// keys allow.
func TestRowAttnSplits(t *testing.T) {
	for _, blocks := range []int{1, 8, 64, 256, 512, 4096} {
		for _, keys := range []int{16, 64, 256, 1024, 4096, 65536} {
			s := rowAttnSplits(blocks, keys, 132)
			per := ceilDiv(keys, s)
			if s < 1 || per > rowAttnMaxKeys || s > max(ceilDiv(keys, rowAttnMinKeys), ceilDiv(keys, rowAttnMaxKeys)) {
				t.Errorf("%d blocks over %d keys: %d splits of %d", blocks, keys, s, per)
			}
			if keys <= rowAttnMaxKeys && blocks*s > 4*132+blocks && s > 1 {
				t.Errorf("%d blocks over %d keys: %d splits, %d blocks", blocks, keys, s, blocks*s)
			}
		}
	}
	for _, c := range []struct{ n, keys, want int }{{64, 256, 2}, {32, 256, 3}, {8, 256, 4}} {
		if s := rowAttnSplits(c.n*8, c.keys, 132); s != c.want {
			t.Errorf("Qwen3-8B, %d rows over %d keys: %d splits, want %d", c.n, c.keys, s, c.want)
		}
	}
}

// TestRowAttention runs the op-set conformance suite with rowattn on from
// 2 rows (the device stage batch runs its Attention cases:
// -test.run 'TestRowAttention/^Attention$').
func TestRowAttention(t *testing.T) {
	batchTest(t)
	b := openOps(t)
	b.SetRowAttention(2)
	kerneltest.RunOps(t, b)
}

// BenchmarkRowAttention times Attention of a Qwen3-8B decode batch (32/8
// heads of 128, bf16 cache, every row its own sequence at positions
// ctx−17 to ctx−1, or with /spread ctx/2 to ctx−1 as a 128 + 128 bench's
// rows are) with rowattn (the default from 2 rows), the split-KV kernel
// (rows=0) and it after the prefill kernel as it ran before for 64 rows
// (/prefill: FERRITE_CUDA_DECODE_PREFILL=1, attnsplit.go): 36 calls a
// step over 8 distinct cache layers
// (none in L2 when it is read again), the step replayed as a graph. µs/call
// is the step's host wall time over 36; GB/s counts the keys and values
// each call reads.
func BenchmarkRowAttention(b *testing.B) {
	be := openOps(b)
	const heads, kvHeads, hd, bs, ctx, layers, caches = 32, 8, 128, 16, 256, 36, 8
	defer be.SetRowAttention(be.SetRowAttention(2))
	for _, c := range []struct {
		n      int
		spread bool
	}{{8, false}, {32, false}, {64, false}, {32, true}, {64, true}} {
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
		var kc, vc []kernels.Tensor
		var bytes float64
		for l := range 2 * caches {
			t, err := be.Alloc(kernels.BF16, n*ctx, kvHeads*hd)
			if err == nil {
				tb, _ := t.Buffer()
				err = be.dev.FillBF16(tb.(*tensorBuf).buf, int64(t.Elems()), uint64(l+1), 1)
			}
			if err != nil {
				b.Fatal(err)
			}
			if l%2 == 0 {
				kc = append(kc, t)
			} else {
				vc = append(vc, t)
			}
		}
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
		// rowattn, the split-KV kernel, and it after the prefill kernel.
		var outs [3][]float32
		for vi, v := range []struct {
			rows    int
			prefill bool
		}{{2, false}, {0, false}, {0, true}} {
			rows := v.rows
			name := "rowattn"
			if rows == 0 {
				name = "splitkv"
			}
			if v.prefill {
				name = "splitkv/prefill"
			}
			be.SetRowAttention(rows)
			decodePrefill = v.prefill
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
			b.Run(label+"/"+name, func(b *testing.B) {
				sec := timeSteps(b, be, step) / layers
				b.ReportMetric(sec*1e6, "us/call")
				b.ReportMetric(bytes/sec/1e9, "GB/s")
			})
			if out.Valid() {
				outs[vi] = make([]float32, n*heads*hd)
				be.ReadF32(outs[vi], out)
			}
		}
		decodePrefill = false
		for vi, o := range outs {
			if vi == 1 || o == nil || outs[1] == nil {
				continue
			}
			diff := 0.0
			for i, v := range o {
				diff = max(diff, math.Abs(float64(v-outs[1][i])))
			}
			b.Logf("n=%d: variant %d: max |Δ| to splitkv %.3g", n, vi, diff)
			if !(diff < 1e-3) {
				b.Errorf("n=%d: variant %d and the split-KV kernel differ by %g", n, vi, diff)
			}
		}
	}
}
