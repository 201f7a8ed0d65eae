package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// The benchmarks report weight bytes read per second (b.SetBytes), so the
// decode numbers (n = 1) compare directly with BenchmarkStreamRead
// (stream_test.go), the memory-bandwidth roofline. "hot" multiplies one matrix over and over (it
// sits in L2/L3); "cold" cycles through 1 GiB of matrices, as a decode step
// over a model larger than the caches does.

const coldBytes = 1 << 30

type benchShape struct {
	dt         kernels.DType
	n          int
	rows, cols int
}

var benchShapes = []benchShape{
	{kernels.BF16, 1, 1024, 1024},
	{kernels.BF16, 1, 4096, 1024},
	{kernels.BF16, 1, 3072, 1024},
	{kernels.BF16, 1, 1024, 4096},
	{kernels.F32, 1, 1024, 1024},
	{kernels.F32, 1, 4096, 1024},
	{kernels.F32, 1, 3072, 1024},
	{kernels.F16, 1, 4096, 1024},
	{kernels.F8E4M3, 1, 4096, 1024},
	{kernels.BF16, 4, 4096, 1024},
	{kernels.BF16, 64, 1024, 1024},
	{kernels.BF16, 64, 4096, 1024},
	{kernels.F32, 64, 4096, 1024},
	{kernels.F16, 64, 4096, 1024},
	{kernels.F8E4M3, 64, 4096, 1024},
	{kernels.Q8_0, 1, 4096, 1024},
	{kernels.Q4K, 1, 4096, 1024},
	{kernels.Q6K, 1, 4096, 1024},
	{kernels.Q8_0, 64, 4096, 1024},
	{kernels.Q4K, 64, 4096, 1024},
}

func BenchmarkMatMul(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	for _, s := range benchShapes {
		name := fmt.Sprintf("%v/n=%d/%dx%d", s.dt, s.n, s.rows, s.cols)
		b.Run(name+"/hot", func(b *testing.B) { benchMatMul(b, be, s, 1) })
		if s.n == 1 {
			b.Run(name+"/cold", func(b *testing.B) {
				benchMatMul(b, be, s, max(1, coldBytes/(s.rows*s.dt.RowBytes(s.cols))))
			})
		}
	}
}

// BenchmarkMatMulPaths compares the instruction sets at a decode and a
// prefill shape (hot).
func BenchmarkMatMulPaths(b *testing.B) {
	for _, path := range []struct {
		name    string
		disable []func() func()
	}{
		{"avx512", nil},
		{"avx2", []func() func(){cpuinfo.DisableAVX512}},
		{"go", []func() func(){cpuinfo.DisableAVX2FMA}},
	} {
		for _, s := range []benchShape{{kernels.BF16, 1, 4096, 1024}, {kernels.BF16, 64, 1024, 1024}} {
			b.Run(fmt.Sprintf("%s/%v/n=%d/%dx%d", path.name, s.dt, s.n, s.rows, s.cols), func(b *testing.B) {
				for _, d := range path.disable {
					defer d()()
				}
				be := cpu.New(0)
				defer be.Close()
				benchMatMul(b, be, s, 1)
			})
		}
	}
}

// BenchmarkMatMulBF16 compares BF16 and quantized weights with x kept in
// float32 (int8 for the quantized) and x rounded to bfloat16
// (SetBF16Activations: VDPBF16PS for decode, AMX for prefill where the CPU
// has them), hot.
func BenchmarkMatMulBF16(b *testing.B) {
	for _, s := range []benchShape{{kernels.BF16, 1, 4096, 1024}, {kernels.BF16, 64, 3072, 1024},
		{kernels.BF16, 512, 1024, 1024}, {kernels.BF16, 512, 3072, 1024}, {kernels.BF16, 512, 1024, 3072},
		{kernels.Q8_0, 512, 3072, 1024}, {kernels.Q4K, 512, 3072, 1024}, {kernels.Q6K, 512, 1024, 3072},
		{kernels.BF16, 4, 3072, 1024}, {kernels.BF16, 8, 3072, 1024}, {kernels.BF16, 16, 3072, 1024},
		{kernels.Q4K, 16, 3072, 1024}, {kernels.Q4K, 64, 3072, 1024}, {kernels.Q4K, 128, 3072, 1024}, {kernels.Q8_0, 128, 3072, 1024}} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("%v/bf16x=%v/n=%d/%dx%d", s.dt, on, s.n, s.rows, s.cols), func(b *testing.B) {
				be := cpu.New(0)
				defer be.Close()
				be.SetBF16Activations(on)
				benchMatMul(b, be, s, 1)
			})
		}
	}
}

// BenchmarkMatMulRef is the naive reference, for scale.
func BenchmarkMatMulRef(b *testing.B) {
	s := benchShape{kernels.BF16, 1, 1024, 1024}
	w := kerneltest.NewMat(rand.New(rand.NewPCG(1, 1)), s.dt, s.rows, s.cols, 128, 128)
	x, y := make([]float32, s.cols), make([]float32, s.rows)
	b.SetBytes(int64(len(w.Data)))
	for b.Loop() {
		kernels.MatMulRef(y, x, w, 1)
	}
}

func benchMatMul(b *testing.B, be *cpu.Backend, s benchShape, copies int) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := kerneltest.NewMat(rng, s.dt, s.rows, s.cols, 128, 128)
	ws := []*kernels.Mat{w}
	if copies > 1 {
		// One backing buffer, as a memory-mapped checkpoint would be.
		size := len(w.Data)
		buf := make([]byte, copies*size)
		ws = ws[:0]
		for i := range copies {
			c := *w
			c.Data = buf[i*size : (i+1)*size : (i+1)*size]
			copy(c.Data, w.Data)
			ws = append(ws, &c)
		}
	}
	x := kerneltest.RandN(rng, s.n*s.cols)
	y := make([]float32, s.n*s.rows)
	b.SetBytes(int64(len(w.Data)))
	i := 0
	for b.Loop() {
		be.MatMul(y, x, ws[i], s.n)
		if i++; i == len(ws) {
			i = 0
		}
	}
	b.ReportMetric(float64(2*s.n*s.rows*s.cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkParallel is the cost of one empty Parallel call: the floor under
// every per-layer parallel op.
func BenchmarkParallel(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	for b.Loop() {
		be.Parallel(be.Threads(), func(lo, hi int) {})
	}
}
