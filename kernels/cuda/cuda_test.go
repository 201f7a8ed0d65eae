//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ferrite-llm/ferrite/kernels"
	"github.com/ferrite-llm/ferrite/kernels/kerneltest"
	"github.com/ferrite-llm/ferrite/kernels/ref"
)

// The tests share one Device; without a GPU every GPU test skips and
// TestNoGPU checks the error instead.
var (
	testDev    *Device
	testDevErr error
)

func TestMain(m *testing.M) {
	if os.Getenv(stickyChild) == "" {
		testDev, testDevErr = Open(0)
	}
	code := m.Run()
	if testDev != nil {
		if err := testDev.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func needGPU(t testing.TB) *Device {
	t.Helper()
	if testDev == nil {
		t.Skipf("no GPU: %v", testDevErr)
	}
	return testDev
}

// TestNoGPU checks the failure where no GPU can be used: one line that says
// why, and no crash.
func TestNoGPU(t *testing.T) {
	if testDev != nil {
		t.Skipf("a GPU is present: %s", testDev)
	}
	if testDevErr == nil || strings.Contains(testDevErr.Error(), "\n") || !strings.HasPrefix(testDevErr.Error(), "cuda: ") {
		t.Fatalf("Open without a GPU: %q, want a one-line \"cuda: ...\" error", testDevErr)
	}
	t.Logf("Open(0): %v", testDevErr)
	if _, err := OpenBackend(0, 1); err == nil {
		t.Fatal("OpenBackend succeeded without a GPU")
	}
}

// TestConformance runs the shared kernels.Backend suite on the GPU.
func TestConformance(t *testing.T) {
	needGPU(t)
	b, err := OpenBackend(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	kerneltest.Run(t, b)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	if b.WeightBytes() == 0 {
		t.Error("no weights cached")
	}
}

func randF32(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// upload returns a device copy of s (float32).
func upload(t testing.TB, d *Device, s []float32) *Buffer {
	t.Helper()
	b, err := d.Alloc(int64(max(len(s), 1)) * 4)
	if err == nil {
		err = b.UploadF32(0, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

// uploadMat returns a device copy of m, freed when the test ends.
func uploadMat(t testing.TB, d *Device, m *kernels.Mat) *Weight {
	t.Helper()
	w, err := d.UploadMat(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Free() })
	return w
}

// poisoned returns a device buffer of n float32 NaNs of a recognisable
// pattern, so an element the kernel skips shows up.
func poisoned(t testing.TB, d *Device, n int) *Buffer {
	t.Helper()
	b, err := d.Alloc(int64(n) * 4)
	if err == nil {
		err = b.Fill32(0, n, 0x7fc0dead)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func download(t testing.TB, b *Buffer, n int) []float32 {
	t.Helper()
	s := make([]float32, n)
	if err := b.DownloadF32(s, 0); err != nil {
		t.Fatal(err)
	}
	return s
}

// compare fails t where |got − want| > tol·abs, NaN included.
func compare(t *testing.T, got, want []float32, abs []float64, tol float64) {
	t.Helper()
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol*abs[i]) {
			if bad++; bad <= 5 {
				t.Errorf("out[%d] = %g, want %g ± %.3g", i, got[i], want[i], tol*abs[i])
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d of %d wrong", bad, len(want))
	}
}

// TestLinearBF16 checks the decode GEMV at model shapes (vector and scalar
// paths, n = 1 and n in chunks of 8) against kernels.MatMulRef within the
// conformance tolerance: the weights are decoded exactly and x stays
// float32, so only the float32 summation order differs.
func TestLinearBF16(t *testing.T) {
	d := needGPU(t)
	for _, s := range []struct{ n, rows, cols int }{
		{1, 1024, 4096}, {1, 333, 2056}, {1, 100, 1001}, {3, 512, 4096}, {13, 77, 640},
	} {
		t.Run(fmt.Sprintf("n=%d,%dx%d", s.n, s.rows, s.cols), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(s.rows), uint64(s.cols)))
			m := kerneltest.NewMat(rng, kernels.BF16, s.rows, s.cols, 0, 0)
			x := randF32(rng, s.n*s.cols)
			w := uploadMat(t, d, m)
			xb, yb := upload(t, d, x), poisoned(t, d, s.n*s.rows)
			if err := d.Linear(yb, xb, w, s.n); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, s.n*s.rows)
			kernels.MatMulRef(want, x, m, s.n)
			compare(t, download(t, yb, len(want)), want, kerneltest.AbsDot(x, m, s.n), kerneltest.Tol)
		})
	}
}

// TestGEMVRows checks the n = 1 GEMV of R rows a block (gemv_rows, 4 and
// 8 rows; vector and scalar paths; a last block of fewer rows) against
// kernels.MatMulRef as TestLinearBF16 does, with a bias and the residual
// add.
func TestGEMVRows(t *testing.T) {
	d := needGPU(t)
	defer d.SetGEMVRows(gemvRowsDefault())
	for _, r := range []int{4, 8} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.F32, kernels.F16} {
			for _, s := range []struct{ rows, cols int }{{1024, 4096}, {333, 2056}, {100, 1001}, {7, 64}, {3, 12288}} {
				t.Run(fmt.Sprintf("r=%d/%v/%dx%d", r, dt, s.rows, s.cols), func(t *testing.T) {
					d.SetGEMVRows(r)
					rng := rand.New(rand.NewPCG(uint64(s.rows), uint64(s.cols)))
					m := kerneltest.NewMat(rng, dt, s.rows, s.cols, 0, 0)
					x, bias, y0 := randF32(rng, s.cols), randF32(rng, s.rows), randF32(rng, s.rows)
					w := uploadMat(t, d, m)
					xb, bb, yb := upload(t, d, x), upload(t, d, bias), upload(t, d, y0)
					if err := d.do(func() error { return d.linearL(yb.ptr, xb.ptr, w, 1, bb.ptr, true) }); err != nil {
						t.Fatal(err)
					}
					want := make([]float32, s.rows)
					kernels.MatMulRef(want, x, m, 1)
					abs := kerneltest.AbsDot(x, m, 1)
					for i := range want {
						want[i] += bias[i] + y0[i]
						abs[i] += math.Abs(float64(bias[i])) + math.Abs(float64(y0[i]))
					}
					compare(t, download(t, yb, len(want)), want, abs, kerneltest.Tol)
				})
			}
		}
	}
}

// TestGemmBF16 checks the cuBLASLt path against kernels.MatMulRef on x
// rounded to bf16 (exactly as ToBF16 rounds it, which is checked bit for
// bit): tensor cores multiply bf16 exactly and accumulate in float32, so
// |Δ| ≤ 2⁻¹⁴·Σ|x·w| leaves room for their summation order and nothing for
// a wrong element. Against the unrounded x the bound is the bf16 rounding
// of x, 2⁻⁸·Σ|x·w|.
func TestGemmBF16(t *testing.T) {
	d := needGPU(t)
	if err := d.HasGemm(); err != nil {
		t.Skip(err)
	}
	for _, s := range []struct{ n, rows, cols int }{{64, 512, 1024}, {200, 384, 256}, {9, 1000, 4096}, {1, 64, 64}} {
		t.Run(fmt.Sprintf("n=%d,%dx%d", s.n, s.rows, s.cols), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(s.n), uint64(s.cols)))
			m := kerneltest.NewMat(rng, kernels.BF16, s.rows, s.cols, 0, 0)
			x := randF32(rng, s.n*s.cols)
			w := uploadMat(t, d, m)
			xf := upload(t, d, x)
			xh, err := d.Alloc(int64(len(x)) * 2)
			if err != nil {
				t.Fatal(err)
			}
			defer xh.Free()
			yb := poisoned(t, d, s.n*s.rows)
			if err := d.ToBF16(xh, xf, len(x)); err != nil {
				t.Fatal(err)
			}
			if err := d.GemmBF16(yb, xh, w, s.n); err != nil {
				t.Fatal(err)
			}
			bits := make([]byte, 2*len(x))
			if err := xh.Download(bits, 0); err != nil {
				t.Fatal(err)
			}
			xr := make([]float32, len(x))
			for i, v := range x {
				h := kernels.F32ToBF16(v)
				if got := uint16(bits[2*i]) | uint16(bits[2*i+1])<<8; got != h {
					t.Fatalf("ToBF16(%g) = %#04x, want %#04x", v, got, h)
				}
				xr[i] = kernels.BF16ToF32(h)
			}
			got := download(t, yb, s.n*s.rows)
			want := make([]float32, len(got))
			kernels.MatMulRef(want, xr, m, s.n)
			compare(t, got, want, kerneltest.AbsDot(xr, m, s.n), 1.0/(1<<14))
			kernels.MatMulRef(want, x, m, s.n)
			compare(t, got, want, kerneltest.AbsDot(x, m, s.n), 1.0/(1<<8))
		})
	}
}

// TestRMSNorm checks the kernel against kernels/ref's RMSNorm in both
// forms: the kernel sums x² in float32 where the reference sums in
// float64, so |Δ| ≤ 2⁻¹⁸·|want| + 1e-30.
func TestRMSNorm(t *testing.T) {
	d := needGPU(t)
	for _, s := range []struct {
		rows, dim int
		offset    bool
	}{{1, 4096, false}, {7, 128, false}, {3, 2048, true}, {5, 100, false}} {
		t.Run(fmt.Sprintf("%dx%d,offset=%v", s.rows, s.dim, s.offset), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(s.rows), uint64(s.dim)))
			x, w := randF32(rng, s.rows*s.dim), randF32(rng, s.dim)
			const eps = 1e-6
			want := make([]float32, len(x))
			ref.RMSNorm(want, x, w, eps, s.offset, s.rows)
			xb, wb, yb := upload(t, d, x), upload(t, d, w), poisoned(t, d, len(x))
			if err := d.RMSNorm(yb, xb, wb, s.rows, s.dim, eps, s.offset); err != nil {
				t.Fatal(err)
			}
			abs := make([]float64, len(want))
			for i, v := range want {
				abs[i] = math.Abs(float64(v)) + 1e-30
			}
			compare(t, download(t, yb, len(want)), want, abs, 1.0/(1<<18))
			// In place (y = x).
			if err := d.RMSNorm(xb, xb, wb, s.rows, s.dim, eps, s.offset); err != nil {
				t.Fatal(err)
			}
			compare(t, download(t, xb, len(want)), want, abs, 1.0/(1<<18))
		})
	}
}

// TestBufferErrors checks that misuse is an error, not a crash or a write
// out of bounds.
func TestBufferErrors(t *testing.T) {
	d := needGPU(t)
	if _, err := d.Alloc(0); err == nil {
		t.Error("Alloc(0) succeeded")
	}
	b, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(60, make([]byte, 8)); err == nil {
		t.Error("upload past the end succeeded")
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Errorf("second Free: %v", err)
	}
	if err := b.Upload(0, make([]byte, 8)); err == nil {
		t.Error("upload to a freed buffer succeeded")
	}
	if _, err := d.Alloc(1 << 62); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("Alloc(2⁶² bytes): %v, want CUDA_ERROR_OUT_OF_MEMORY", err)
	}
}

const stickyChild = "FERRITE_CUDA_STICKY_CHILD"

// TestStickyError runs a GEMV that writes to an illegal address in a child
// process (the fault ruins the process's context for good) and checks that
// it surfaces as errors naming CUDA_ERROR_ILLEGAL_ADDRESS, from the call
// that syncs and from every later one, and that the process lives on.
func TestStickyError(t *testing.T) {
	if os.Getenv(stickyChild) != "" {
		stickyChildMain(t)
		return
	}
	needGPU(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestStickyError$", "-test.v")
	cmd.Env = append(os.Environ(), stickyChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "sticky: ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func stickyChildMain(t *testing.T) {
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	m := kerneltest.NewMat(rand.New(rand.NewPCG(1, 1)), kernels.BF16, 64, 64, 0, 0)
	w, err := d.UploadMat(m)
	if err != nil {
		t.Fatal(err)
	}
	x := upload(t, d, make([]float32, 64))
	err = d.do(func() error { return d.linearL(8, x.ptr, w, 1, 0, false) }) // y at address 8
	if err == nil {
		err = d.Sync()
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_ILLEGAL_ADDRESS" || !ce.Sticky() {
		t.Fatalf("bad write: %v, want a sticky CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
	if _, err2 := d.Alloc(64); !errors.Is(err2, err) {
		t.Fatalf("Alloc after the fault: %v, want the sticky error", err2)
	}
	if d.Err() == nil {
		t.Fatal("Err() is nil after a sticky error")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close of a dead device: %v", err)
	}
	t.Log("sticky: ok:", err)
}

// TestDlopenNamesLibrary: a library that is not there gives a message
// naming it, also where the loader's text is empty (dlerror read on
// another OS thread).
func TestDlopenNamesLibrary(t *testing.T) {
	_, err := dlopen("libferrite-absent.so.1")
	if err == nil || !strings.Contains(err.Error(), "libferrite-absent.so.1") {
		t.Fatalf("dlopen of a missing library: %v, want a message naming it", err)
	}
	if err := loadError(errors.New(""), "libcuda.so.1"); err.Error() != "libcuda.so.1 not found" {
		t.Errorf("an empty loader message gives %q", err)
	}
}
