//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"testing"
	"time"

	"github.com/ferrite-llm/ferrite/kernels"
)

// BenchmarkTopKRows is what a decode step of Qwen3-8B's head costs the
// host per batch size: "read" copies the whole logits (rows, 151936) back
// (what a step did before kernels.SampleOps), "kN" runs TopKRows with
// k = N inside a step and reads its (rows, 2N) result back. us/step is host
// wall time: the kernels, the copy, the waits.
func BenchmarkTopKRows(b *testing.B) {
	be := openOps(b)
	const vocab = 151936
	for _, rows := range []int{1, 32, 64} {
		logits, err := be.Alloc(kernels.F32, rows, vocab)
		if err != nil {
			b.Fatal(err)
		}
		x := make([]float32, rows*vocab)
		for i := range x {
			x[i] = float32((i*7919)%100003)*1e-4 - 5 // distinct-ish values, a few ties
		}
		be.WriteF32(logits, x)
		for _, k := range []int{0, 1, 256} {
			name := fmt.Sprintf("rows=%d/k%d", rows, k)
			if k == 0 {
				name = fmt.Sprintf("rows=%d/read", rows)
			}
			b.Run(name, func(b *testing.B) {
				var out []float32
				step := func() {
					if k == 0 {
						out = make([]float32, rows*vocab)
						be.ReadF32(out, logits)
						return
					}
					be.BeginStep()
					top := be.Scratch(kernels.F32, rows, 2*k)
					be.TopKRows(top, logits)
					be.EndStep()
					out = make([]float32, top.Elems())
					be.ReadF32(out, top)
				}
				step()
				step()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					step()
				}
				if err := be.Err(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(time.Since(start).Seconds()*1e6/float64(b.N), "us/step")
			})
		}
		be.Free(logits)
	}
}
