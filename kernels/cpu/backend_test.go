package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/cpu"
	"github.com/ferrite-llm/ferrite/kernels/internal/cpuinfo"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
)

// TestConformance runs the shared suite on the fastest path this CPU has,
// single- and multi-threaded, with x kept in float32 and with bfloat16
// activations allowed (VDPBF16PS and AMX where the CPU has them).
func TestConformance(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		for _, threads := range []int{1, 2, 3, 0} {
			t.Run(fmt.Sprintf("bf16=%v/threads=%d", bf16, threads), func(t *testing.T) {
				b := cpu.New(threads)
				defer b.Close()
				b.SetBF16Activations(bf16)
				kerneltest.Run(t, b)
			})
		}
	}
}

// TestConformanceFallbacks runs the suite on the slower paths this CPU
// would not pick: AVX2 without AVX-512, the pure-Go tiles, pure Go for F16
// and the quantized types only (no F16C), and VPMADDUBSW instead of VNNI.
func TestConformanceFallbacks(t *testing.T) {
	t.Run("noVNNI", func(t *testing.T) {
		defer cpuinfo.DisableVNNI()()
		b := cpu.New(2)
		defer b.Close()
		kerneltest.MatMulTest(t, b)
	})
	t.Run("noAVX512", func(t *testing.T) {
		defer cpuinfo.DisableAVX512()()
		b := cpu.New(2)
		defer b.Close()
		kerneltest.MatMulTest(t, b)
		kerneltest.RunOps(t, b)
	})
	t.Run("noAVX2", func(t *testing.T) {
		defer cpuinfo.DisableAVX2FMA()()
		b := cpu.New(2)
		defer b.Close()
		kerneltest.MatMulTest(t, b)
		kerneltest.RunOps(t, b)
	})
	t.Run("noAMX", func(t *testing.T) {
		defer cpuinfo.DisableAMX()()
		b := cpu.New(2)
		defer b.Close()
		b.SetBF16Activations(true)
		kerneltest.MatMulTest(t, b)
	})
	t.Run("noBF16", func(t *testing.T) {
		defer cpuinfo.DisableBF16()()
		defer cpuinfo.DisableAMX()()
		b := cpu.New(2)
		defer b.Close()
		b.SetBF16Activations(true)
		kerneltest.MatMulTest(t, b)
	})
	t.Run("goBF16", func(t *testing.T) { // the bf16 paths' drivers with the Go twins
		defer cpu.ForceGenericBF16()()
		for _, threads := range []int{1, 2} {
			b := cpu.New(threads)
			defer b.Close()
			b.SetBF16Activations(true)
			kerneltest.MatMulTest(t, b)
		}
	})
	t.Run("goX8", func(t *testing.T) { // the x8 path's driver with the Go twins
		defer cpu.ForceGenericX8()()
		for _, threads := range []int{1, 2} {
			b := cpu.New(threads)
			defer b.Close()
			kerneltest.MatMulTest(t, b)
		}
	})
	t.Run("noF16C", func(t *testing.T) {
		defer cpuinfo.DisableF16C()()
		b := cpu.New(2)
		defer b.Close()
		kerneltest.MatMulTest(t, b)
	})
}

// FuzzMatMul checks random shapes against the reference; the seeds run as a
// normal test. A quantized dtype's columns are rounded down to whole blocks,
// and its tolerance widened by kerneltest.QuantTol.
func FuzzMatMul(f *testing.F) {
	dtypes := kerneltest.DTypes
	for _, s := range [][5]uint16{{1, 1, 1, 1, 1}, {3, 9, 23, 2, 3}, {2, 4, 64, 128, 128}, {70, 5, 15, 1, 7}, {5, 3, 600, 1, 1}} {
		for dt := range dtypes {
			f.Add(uint8(dt), s[0], s[1], s[2], s[3], s[4], uint64(7))
		}
	}
	b := cpu.New(0)
	b.SetBF16Activations(true)
	f.Fuzz(func(t *testing.T, dt uint8, n, rows, cols, br, bc uint16, seed uint64) {
		d := dtypes[int(dt)%len(dtypes)]
		s := [5]int{int(n % 80), int(rows % 300), int(cols % 600), int(br%140) + 1, int(bc%140) + 1}
		s[2] -= s[2] % d.BlockElems()
		rng := rand.New(rand.NewPCG(seed, 1))
		w := kerneltest.NewMat(rng, d, s[1], s[2], s[3], s[4])
		x := kerneltest.RandN(rng, s[0]*s[2])
		got := make([]float32, s[0]*s[1])
		want := make([]float32, s[0]*s[1])
		b.MatMul(got, x, w, s[0])
		xr, _ := kerneltest.RoundX(b, x, w, s[0])
		kernels.MatMulRef(want, xr, w, s[0])
		tol := make([]float64, len(got))
		if d.Quantized() {
			tol = kerneltest.QuantTol(x, w, s[0])
		}
		for i := range got {
			if e := math.Abs(float64(got[i] - want[i])); !(e <= 1e-3+tol[i]) {
				t.Fatalf("%v n=%d %dx%d block %dx%d: y[%d] = %g, want %g ± %.3g", d, s[0], s[1], s[2], s[3], s[4], i, got[i], want[i], 1e-3+tol[i])
			}
		}
	})
}

func TestParallelNested(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	var total atomic.Int64
	b.Parallel(8, func(lo, hi int) {
		// The inner call finds the pool busy and runs inline.
		b.Parallel(hi-lo, func(lo2, hi2 int) { total.Add(int64(hi2 - lo2)) })
	})
	if total.Load() != 8 {
		t.Fatalf("nested Parallel covered %d indices, want 8", total.Load())
	}
}

func TestParallelPanic(t *testing.T) {
	b := cpu.New(4)
	defer b.Close()
	for _, bad := range []int{0, 3} { // on the caller, on a helper
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "boom") {
					t.Errorf("chunk %d: recovered %v, want boom", bad, r)
				}
			}()
			b.Parallel(4, func(lo, hi int) {
				if lo == bad {
					panic("boom")
				}
			})
		}()
	}
	// The pool must still work afterwards.
	kerneltest.ParallelTest(t, b)
}

func TestClose(t *testing.T) {
	b := cpu.New(3)
	b.Close()
	b.Close()
	kerneltest.ParallelTest(t, b) // single-threaded now, still correct
}

// TestOps runs the op suite with x kept in float32 and with bfloat16
// activations allowed (AMX prefill attention over a BF16 cache, where the
// CPU has it).
func TestOps(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		t.Run(fmt.Sprintf("bf16=%v", bf16), func(t *testing.T) {
			b := cpu.New(0)
			defer b.Close()
			b.SetBF16Activations(bf16)
			kerneltest.RunOps(t, b)
		})
	}
}
