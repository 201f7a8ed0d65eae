//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/ferrite-llm/ferrite/kernels"
)

// TestMemAccount checks the tally without a GPU: counters by kind, the
// driver asked at most once per memInfoEvery, a failed answer reported as
// unknown.
func TestMemAccount(t *testing.T) {
	var a memAccount
	a.weights.Add(16 << 30)
	a.tensors.Add(2 << 30)
	calls := 0
	free, total := int64(100<<30), int64(139<<30)
	var fail error
	query := func() (int64, int64, error) {
		calls++
		return free, total, fail
	}
	t0 := time.Unix(1000, 0)
	want := kernels.MemoryUse{OnDevice: true, Weights: 16 << 30, Tensors: 2 << 30, Arena: 64 << 20, Total: 139 << 30, Free: 100 << 30}
	if got := a.use(64<<20, t0, query); got != want {
		t.Errorf("use = %+v, want %+v", got, want)
	}
	free = 90 << 30
	if got := a.use(64<<20, t0.Add(memInfoEvery/2), query); got.Free != 100<<30 || calls != 1 {
		t.Errorf("within %v: free %d after %d driver calls, want the cached answer after 1", memInfoEvery, got.Free, calls)
	}
	if got := a.use(64<<20, t0.Add(memInfoEvery), query); got.Free != 90<<30 || calls != 2 {
		t.Errorf("after %v: free %d after %d driver calls, want a fresh answer", memInfoEvery, got.Free, calls)
	}
	fail = errNoMemInfo
	got := a.use(0, t0.Add(3*memInfoEvery), query)
	if got.Total != 0 || got.Free != 0 || got.Weights != 16<<30 || got.Used() != 18<<30 {
		t.Errorf("after a failed query: %+v, want total and free unknown, the counters kept", got)
	}
}

// TestArenaCapacity checks that the arena reports its chunks' bytes.
func TestArenaCapacity(t *testing.T) {
	a := arena{chunks: []*Buffer{{size: 16 << 20}, {size: 32 << 20}}}
	if got := a.capacity(); got != 48<<20 {
		t.Errorf("capacity = %d, want %d", got, 48<<20)
	}
}

// TestOptionalSymbols checks that a missing optional entry point stays 0
// instead of failing, on a library every Linux has.
func TestOptionalSymbols(t *testing.T) {
	lib, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		t.Skipf("no libc.so.6: %v", err)
	}
	var have, missing uintptr
	optionalSymbols(lib, map[string]*uintptr{"strlen": &have, "cuFerriteNoSuchSymbol": &missing})
	if have == 0 || missing != 0 {
		t.Errorf("strlen %#x, missing symbol %#x: want one resolved and one 0", have, missing)
	}
}

// TestMemoryUseOnGPU checks the counters against the GPU: Alloc's tensors
// and an uploaded weight are counted at their sizes, and the driver's total
// is the device's.
func TestMemoryUseOnGPU(t *testing.T) {
	needGPU(t)
	b, err := OpenBackend(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	before := b.MemoryUse()
	if _, err := b.Alloc(kernels.BF16, 1024, 128); err != nil {
		t.Fatal(err)
	}
	m := &kernels.Mat{DType: kernels.BF16, Rows: 64, Cols: 32, Data: make([]byte, 64*32*2)}
	y := make([]float32, 64)
	b.MatMul(y, make([]float32, 32), m, 1)
	u := b.MemoryUse()
	if u.Tensors-before.Tensors != 1024*128*2 {
		t.Errorf("Alloc of 256 KiB counted as %d bytes", u.Tensors-before.Tensors)
	}
	if u.Weights < 64*32*2 || u.Weights != b.WeightBytes() {
		t.Errorf("weights %d bytes (WeightBytes %d) after uploading a 64×32 matrix", u.Weights, b.WeightBytes())
	}
	if !u.OnDevice || u.Total <= 0 || u.Free <= 0 || u.Free > u.Total {
		t.Errorf("device memory %+v: want total and free from the driver", u)
	}
}

// TestMemAccountRelease checks Free's bookkeeping without a GPU: the
// tensor's Buffer leaves the tally and is handed back once, the freed
// tensor panics with kernels.ErrFreed on use and on a second Free, and a
// Scratch tensor cannot be freed.
func TestMemAccountRelease(t *testing.T) {
	var a memAccount
	a.tensors.Add(3 << 20)
	buf := &Buffer{ptr: 0x1000, size: 1 << 20}
	x := kernels.NewTensor(&tensorBuf{ptr: buf.ptr, elems: 1 << 18, buf: buf}, kernels.F32, 1<<10, 1<<8, 1<<8, 0)
	if got := a.release(tensorBufOf(x)); got != buf {
		t.Fatalf("release returned %p, want the tensor's Buffer %p", got, buf)
	}
	if got := a.tensors.Load(); got != 2<<20 {
		t.Errorf("tensors = %d after release, want %d", got, 2<<20)
	}
	for name, use := range map[string]func(){
		"dptr":       func() { dptr(x.Slice(1, 2)) },
		"Free again": func() { a.release(tensorBufOf(x)) },
	} {
		func() {
			defer func() {
				if err, _ := recover().(error); !errors.Is(err, kernels.ErrFreed) {
					t.Errorf("%s of a freed tensor: panic %v, want kernels.ErrFreed", name, err)
				}
			}()
			use()
		}()
	}
	s := kernels.NewTensor(&tensorBuf{ptr: 0x2000, elems: 4}, kernels.F32, 1, 4, 4, 0)
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Error("release of a Scratch tensor did not panic")
			}
		}()
		a.release(tensorBufOf(s))
	}()
	if got := a.tensors.Load(); got != 2<<20 {
		t.Errorf("tensors = %d, want %d: only the freed tensor leaves the tally", got, 2<<20)
	}
}
