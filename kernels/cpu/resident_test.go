package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestResidentCopy checks that MatMul over a BF16 weight's resident copy
// (residentCache) gives the bits of the same MatMul reading the weight where
// it lies, for one and several x rows, on this CPU's bf16 path and on the
// Go twin; that the copy is counted in MemoryUse; and that Transient
// weights, routed experts and copies over the budget are not made.
func TestResidentCopy(t *testing.T) {
	const rows, cols = 600, 1024 // 1.2 MiB: above the copy's floor
	rng := rand.New(rand.NewPCG(21, 22))
	data := make([]byte, 2*rows*cols)
	for i := range rows * cols {
		v := kernels.F32ToBF16(float32(0.1 * rng.NormFloat64()))
		data[2*i], data[2*i+1] = byte(v), byte(v>>8)
	}
	x := make([]float32, 7*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, generic := range []bool{false, true} {
		t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
			if generic {
				old := forceGenericBF16.Swap(true)
				defer forceGenericBF16.Store(old)
			}
			if bf16TilesFor() == nil {
				t.Skip("no bf16 path on this CPU")
			}
			w := &kernels.Mat{DType: kernels.BF16, Rows: rows, Cols: cols, Data: data}
			if bf16Path(w, 1, true) != pathBF16 {
				t.Skip("BF16 weights take AMX here")
			}
			for _, n := range []int{1, 3, 7} {
				want := make([]float32, n*rows)
				func() {
					residentOff.Store(true)
					defer residentOff.Store(false)
					b := New(2)
					defer b.Close()
					b.SetBF16Activations(true)
					b.MatMul(want, x, w, n)
					if got := b.res.bytes.Load(); got != 0 {
						t.Fatalf("n=%d: %d bytes copied with the copies off", n, got)
					}
				}()
				b := New(2)
				defer b.Close()
				b.SetBF16Activations(true)
				got := make([]float32, n*rows)
				for range 2 { // the call that copies, then one on the copy
					clear(got)
					b.MatMul(got, x, w, n)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("n=%d: y[%d] = %g on the resident copy, %g in place", n, i, got[i], want[i])
						}
					}
				}
				if bf16Path(w, n, true) != pathBF16 {
					continue // the float tiles (n rows take another path here)
				}
				if c := b.res.bytes.Load(); c != int64(len(data)) {
					t.Errorf("n=%d: %d bytes copied, want %d", n, c, len(data))
				}
				if u := b.MemoryUse().Weights; u < int64(len(data)) {
					t.Errorf("n=%d: MemoryUse().Weights = %d, want at least the copy's %d", n, u, len(data))
				}
			}
			b := New(2)
			defer b.Close()
			b.SetBF16Activations(true)
			budget := residentBudget
			residentBudget = int64(len(data)) - 1
			y1 := make([]float32, rows)
			b.MatMul(y1, x, w, 1)
			residentBudget = budget
			if c := b.res.bytes.Load(); c != 0 {
				t.Errorf("%d bytes copied over a budget of %d", c, len(data)-1)
			}
			tw := *w
			tw.Transient = true
			y := make([]float32, rows)
			b.MatMul(y, x, &tw, 1)
			b.experts = true
			b.MatMul(y, x, w, 1)
			if c := b.res.bytes.Load(); c != 0 {
				t.Errorf("%d bytes copied of a Transient weight and an expert's", c)
			}
		})
	}
}

// TestHugeTensor checks that, with hugeTensorsOn, a tensor of hugeTensor bytes or more is
// zeroed, sized and counted like a small one, and on Linux starts at a 2
// MiB boundary (hugeBytes), with its bytes of its own (a second one does
// not overlap it).
func TestHugeTensor(t *testing.T) {
	defer func(on bool) { hugeTensorsOn = on }(hugeTensorsOn)
	hugeTensorsOn = true
	b := New(1)
	defer b.Close()
	var ts []kernels.Tensor
	for _, n := range []int{hugeTensor / 2, hugeTensor/2 + 1, 3 * hugeTensor} { // BF16 elements
		before := b.allocated.Load()
		x, err := b.Alloc(kernels.BF16, 1, n)
		if err != nil {
			t.Fatal(err)
		}
		d := raw(x)
		if len(d) != 2*n || b.allocated.Load()-before != int64(2*n) {
			t.Fatalf("n=%d: %d bytes, %d counted", n, len(d), b.allocated.Load()-before)
		}
		for i, v := range d {
			if v != 0 {
				t.Fatalf("n=%d: byte %d = %d, not zeroed", n, i, v)
			}
		}
		if p := uintptr(unsafe.Pointer(unsafe.SliceData(d))); runtime.GOOS == "linux" && !hugeOff && p%(2<<20) != 0 {
			t.Errorf("n=%d: data at %#x, not on a 2 MiB boundary", n, p)
		}
		for i := range d {
			d[i] = 0xff
		}
		ts = append(ts, x)
	}
	for i, x := range ts { // no tensor was overwritten by a later one
		for j, v := range raw(x) {
			if v != 0xff {
				t.Fatalf("tensor %d: byte %d = %d", i, j, v)
			}
		}
	}
}
