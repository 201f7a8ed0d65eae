//go:build !noasm

package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// BenchmarkQDecode is one decode MatMul (n x rows against a rows×1024
// quantized matrix) on one thread, as a worker runs its share: "hot"
// repeats one matrix (L2), "cold" cycles through 256 MiB of copies, as a
// decode step over a model larger than the caches does. cpu-ns/op is the
// thread's CPU time per call.
func BenchmarkQDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 3))
	const rows, cols = 512, 1024
	for _, n := range []int{1, 8} {
		for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q6K} {
			w := kerneltest.NewMat(rng, dt, rows, cols, 0, 0)
			x := kerneltest.RandN(rng, n*cols)
			y := make([]float32, n*rows)
			for _, cold := range []bool{false, true} {
				copies := 1
				if cold {
					copies = (256 << 20) / len(w.Data)
				}
				ws := make([]*kernels.Mat, copies)
				buf := make([]byte, copies*len(w.Data))
				for i := range ws {
					c := *w
					c.Data = buf[i*len(w.Data) : (i+1)*len(w.Data)]
					copy(c.Data, w.Data)
					ws[i] = &c
				}
				name := map[bool]string{false: "hot", true: "cold"}[cold]
				b.Run(fmt.Sprintf("%v/n=%d/%s", dt, n, name), func(b *testing.B) {
					var m matmul
					var xs xbufs
					var scratch []float32
					var x8 x8Cache // Q4_0 packed once per copy, before the timing
					serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
					for _, w := range ws {
						x8.packed(w, serial, false)
					}
					b.SetBytes(int64(len(w.Data)))
					i := 0
					cpuLoop(b, func() {
						m.init(y, x, ws[i], n, 1, &xs, false, x8.packed(ws[i], serial, false))
						m.convertX(0, m.convertUnits())
						for t := range m.tasks {
							m.task(t, &scratch)
						}
						if i++; i == len(ws) {
							i = 0
						}
					})
				})
			}
		}
	}
}

// BenchmarkQPaths runs one MatMul of n x rows against a 1024×1024
// quantized matrix on one thread (hot, all its tasks in turn) on each
// kernel path this CPU has: "rows" the row tiles alone (qtilesFor's r1
// and r4), "gemv" with the gemv kernels, "x8" (the default) with the x8
// kernels as well, and "avx2" the default with VNNI switched off.
// cpu-ns/op is the thread's CPU time per call.
func BenchmarkQPaths(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 3))
	const rows, cols = 1024, 1024
	for _, n := range []int{1, 4, 8, 512} {
		for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_0, kernels.Q4K, kernels.Q6K} {
			w := kerneltest.NewMat(rng, dt, rows, cols, 0, 0)
			x := kerneltest.RandN(rng, n*cols)
			y := make([]float32, n*rows)
			for _, path := range []string{"rows", "gemv", "x8", "avx2"} {
				if path == "avx2" && !cpuinfo.VNNI() {
					continue
				}
				b.Run(fmt.Sprintf("%v/n=%d/%s", dt, n, path), func(b *testing.B) {
					defer x8Off.Store(x8Off.Load())
					x8Off.Store(path == "rows" || path == "gemv")
					if path == "rows" {
						set := qtilesFor(dt)
						old := *set
						defer func() { *set = old }()
						set.gemv, set.gemv4 = nil, nil
					}
					if path == "avx2" {
						defer cpuinfo.DisableVNNI()()
					}
					var m matmul
					var xs xbufs
					var scratch []float32
					var x8 x8Cache
					serial := func(n int, fn func(lo, hi int)) { fn(0, n) }
					b.SetBytes(int64(len(w.Data)))
					cpuLoop(b, func() {
						m.init(y, x, w, n, 1, &xs, false, x8.packed(w, serial, false))
						m.convertX(0, m.convertUnits())
						for t := range m.tasks {
							m.task(t, &scratch)
						}
					})
				})
			}
		}
	}
}
