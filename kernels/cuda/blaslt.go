//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"unsafe"

	"github.com/ferrite-llm/ferrite/kernels"
)

// cuBLASLt, loaded on first use; GEMMs work without it only through Linear.
var lt struct {
	once sync.Once
	err  error

	create, destroy, getStatusName                                   uintptr
	descCreate, descDestroy, descSetAttr                             uintptr
	layoutCreate, layoutDestroy                                      uintptr
	prefCreate, prefDestroy, prefSetAttr, heuristic, matmul, version uintptr
}

func loadBlasLt() error {
	lt.once.Do(func() {
		lib, err := dlopen("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
		if err != nil {
			lt.err = fmt.Errorf("cuBLASLt: %w", err)
			return
		}
		lt.err = symbols(lib, "libcublasLt", map[string]*uintptr{
			"cublasLtCreate": &lt.create, "cublasLtDestroy": &lt.destroy, "cublasLtGetStatusName": &lt.getStatusName,
			"cublasLtMatmulDescCreate": &lt.descCreate, "cublasLtMatmulDescDestroy": &lt.descDestroy,
			"cublasLtMatmulDescSetAttribute": &lt.descSetAttr,
			"cublasLtMatrixLayoutCreate":     &lt.layoutCreate, "cublasLtMatrixLayoutDestroy": &lt.layoutDestroy,
			"cublasLtMatmulPreferenceCreate": &lt.prefCreate, "cublasLtMatmulPreferenceDestroy": &lt.prefDestroy,
			"cublasLtMatmulPreferenceSetAttribute": &lt.prefSetAttr,
			"cublasLtMatmulAlgoGetHeuristic":       &lt.heuristic, "cublasLtMatmul": &lt.matmul,
			"cublasLtGetVersion": &lt.version,
		})
	})
	return lt.err
}

// BlasError is a failed cuBLASLt call with its cublasStatus_t.
type BlasError struct {
	Op     string
	Status int
	Name   string
}

func (e *BlasError) Error() string { return fmt.Sprintf("cuda: %s: %s", e.Op, e.Name) }

func checkLt(op string, r uintptr) error {
	if r == 0 {
		return nil
	}
	return &BlasError{Op: op, Status: int(int32(r)), Name: gostring(call(lt.getStatusName, r))}
}

// cuBLASLt and CUDA enum values.
const (
	cudaR32F          = 0
	cudaR16BF         = 14
	computeF32        = 68 // CUBLAS_COMPUTE_32F
	descTransA        = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	opT               = 1  // CUBLAS_OP_T
	prefMaxWorkspace  = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	gemmWorkspaceSize = 32 << 20
)

// heuristicResult is cublasLtMatmulHeuristicResult_t.
type heuristicResult struct {
	algo          [8]uint64 // cublasLtMatmulAlgo_t
	workspaceSize uint64
	state         int32
	wavesCount    float32
	reserved      [4]int32
}

// blasLt is a Device's cuBLASLt handle, workspace and per-shape plans.
type blasLt struct {
	handle    uintptr
	workspace *Buffer
	plans     map[[3]int]*gemmPlan
}

// gemmPlan is a matmul descriptor, its layouts and the algorithm chosen
// for one (n, rows, cols), kept for the Device's life so that a shape always
// runs the same algorithm.
type gemmPlan struct {
	desc, a, b, c uintptr
	algo          heuristicResult
	cands         []heuristicResult // the heuristic's other candidates, until tuneL has timed them
}

// blasLtL returns the device's cuBLASLt state, creating it on first use.
func (d *Device) blasLtL() (*blasLt, error) {
	if d.lt != nil || d.ltErr != nil {
		return d.lt, d.ltErr
	}
	if d.ltErr = loadBlasLt(); d.ltErr != nil {
		return nil, d.ltErr
	}
	b := &blasLt{plans: map[[3]int]*gemmPlan{}}
	if d.ltErr = checkLt("cublasLtCreate", call(lt.create, uintptr(unsafe.Pointer(&b.handle)))); d.ltErr != nil {
		return nil, d.ltErr
	}
	if b.workspace, d.ltErr = d.allocL(gemmWorkspaceSize); d.ltErr != nil {
		call(lt.destroy, b.handle)
		return nil, d.ltErr
	}
	d.lt = b
	return b, nil
}

func (b *blasLt) close() error {
	for _, p := range b.plans {
		p.destroy()
	}
	err := b.workspace.free()
	if e := checkLt("cublasLtDestroy", call(lt.destroy, b.handle)); err == nil {
		err = e
	}
	return err
}

func (p *gemmPlan) destroy() {
	for _, l := range []uintptr{p.a, p.b, p.c} {
		if l != 0 {
			call(lt.layoutDestroy, l)
		}
	}
	if p.desc != 0 {
		call(lt.descDestroy, p.desc)
	}
}

// plan returns the plan for y (n, rows) f32 = x (n, cols) bf16 · w (rows,
// cols) bf16ᵀ. In cuBLASLt's column-major terms y is (rows × n, ld rows) =
// op_T(W: cols × rows, ld cols) · (X: cols × n, ld cols).
func (b *blasLt) plan(n, rows, cols int) (*gemmPlan, error) {
	key := [3]int{n, rows, cols}
	if p := b.plans[key]; p != nil {
		return p, nil
	}
	p := &gemmPlan{}
	fail := func(err error) (*gemmPlan, error) { p.destroy(); return nil, err }
	if err := checkLt("cublasLtMatmulDescCreate", call(lt.descCreate, uintptr(unsafe.Pointer(&p.desc)), computeF32, cudaR32F)); err != nil {
		return fail(err)
	}
	trans := int32(opT)
	if err := checkLt("cublasLtMatmulDescSetAttribute", call(lt.descSetAttr, p.desc, descTransA, uintptr(unsafe.Pointer(&trans)), 4)); err != nil {
		return fail(err)
	}
	for _, l := range []struct {
		out      *uintptr
		dtype    uintptr
		r, c, ld int
	}{{&p.a, cudaR16BF, cols, rows, cols}, {&p.b, cudaR16BF, cols, n, cols}, {&p.c, cudaR32F, rows, n, rows}} {
		if err := checkLt("cublasLtMatrixLayoutCreate", call(lt.layoutCreate, uintptr(unsafe.Pointer(l.out)), l.dtype, uintptr(l.r), uintptr(l.c), uintptr(l.ld))); err != nil {
			return fail(err)
		}
	}
	var pref uintptr
	if err := checkLt("cublasLtMatmulPreferenceCreate", call(lt.prefCreate, uintptr(unsafe.Pointer(&pref)))); err != nil {
		return fail(err)
	}
	defer call(lt.prefDestroy, pref)
	ws := uint64(gemmWorkspaceSize)
	if err := checkLt("cublasLtMatmulPreferenceSetAttribute", call(lt.prefSetAttr, pref, prefMaxWorkspace, uintptr(unsafe.Pointer(&ws)), 8)); err != nil {
		return fail(err)
	}
	var found int32
	var res [gemmTuneAlgos]heuristicResult
	want := 1
	if gemmTunes(n) {
		want = gemmTuneAlgos
	}
	if err := checkLt("cublasLtMatmulAlgoGetHeuristic", call(lt.heuristic, b.handle, p.desc, p.a, p.b, p.c, p.c, pref, uintptr(want),
		uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&found)))); err != nil {
		return fail(err)
	}
	if found == 0 {
		return fail(fmt.Errorf("cuda: cuBLASLt has no bf16 algorithm for %d×%d×%d", n, rows, cols))
	}
	p.algo = res[0]
	if found > 1 {
		p.cands = slices.Clone(res[:found])
	}
	b.plans[key] = p
	return p, nil
}

// The few-row products of decode batches (the split input's 2·rows up to
// gemmTuneRows) take the fastest of the heuristic's first gemmTuneAlgos
// algorithms, timed once per shape on its first call (tuneL), which runs
// eagerly: a step is captured as a graph only on its trace's second
// sighting. Off by default (FERRITE_CUDA_GEMM_TUNE=1 turns it on): GPU run
// 4 measured no gain at 32 and 64 sequences (BENCHMARKS.md, 9), and an
// algorithm picked by timing can differ from run to run, and with it the
// products' rounding.
const (
	gemmTuneAlgos = 8
	gemmTuneRows  = 512
	gemmTuneReps  = 3
)

// gemmTunes reports whether a product of n rows of x is tuned.
func gemmTunes(n int) bool { return n <= gemmTuneRows && os.Getenv("FERRITE_CUDA_GEMM_TUNE") == "1" }

// tuneL times each of p's candidates on this product (x, w, n rows), its
// output into scratch memory, and keeps the fastest as p.algo; a
// candidate that fails or a timing that cannot be taken leaves the
// heuristic's choice. Candidates are tried once: p.cands is cleared.
func (d *Device) tuneL(b *blasLt, p *gemmPlan, x uint64, w *Weight, n int) {
	cands := p.cands
	p.cands = nil
	out, err := d.allocL(int64(n) * int64(w.Rows) * 4)
	if err != nil {
		return
	}
	defer out.free()
	var ev [2]uintptr
	for i := range ev {
		if check("cuEventCreate", call(driver.cuEventCreate, uintptr(unsafe.Pointer(&ev[i])), 0)) != nil {
			return
		}
		defer call(driver.cuEventDestroy, ev[i])
	}
	alpha, beta := float32(1), float32(0)
	run := func(a *heuristicResult) error {
		return checkLt("cublasLtMatmul", call(lt.matmul, b.handle, p.desc,
			uintptr(unsafe.Pointer(&alpha)), uintptr(w.Buf.ptr), p.a, uintptr(x), p.b,
			uintptr(unsafe.Pointer(&beta)), uintptr(out.ptr), p.c, uintptr(out.ptr), p.c,
			uintptr(unsafe.Pointer(&a.algo)), uintptr(b.workspace.ptr), gemmWorkspaceSize, d.stream))
	}
	best, bestMs := -1, float32(0)
	for i := range cands {
		if cands[i].state != 0 || run(&cands[i]) != nil { // warm-up; an algorithm that does not run is skipped
			continue
		}
		if check("cuEventRecord", call(driver.cuEventRecord, ev[0], d.stream)) != nil {
			return
		}
		var err error
		for range gemmTuneReps {
			if err = run(&cands[i]); err != nil {
				break
			}
		}
		if err != nil {
			continue
		}
		var ms float32
		if check("cuEventRecord", call(driver.cuEventRecord, ev[1], d.stream)) != nil ||
			check("cuEventSynchronize", call(driver.cuEventSynchronize, ev[1])) != nil ||
			check("cuEventElapsedTime", call(driver.cuEventTime, uintptr(unsafe.Pointer(&ms)), ev[0], ev[1])) != nil {
			return
		}
		if best < 0 || ms < bestMs {
			best, bestMs = i, ms
		}
	}
	if best >= 0 {
		p.algo = cands[best]
	}
}

// GemmBF16 queues y (n, w.Rows) float32 = x (n, w.Cols) bf16 · wᵀ with a
// bf16 weight, on cuBLASLt's tensor cores with float32 accumulation: the
// prefill-size MatMul. The algorithm is chosen once per shape.
func (d *Device) GemmBF16(y, x *Buffer, w *Weight, n int) error {
	if w == nil || w.DType != kernels.BF16 || n <= 0 {
		return fmt.Errorf("cuda: GemmBF16 needs a bf16 weight and n > 0")
	}
	if err := x.span(0, int64(n)*int64(w.Cols)*2); err != nil {
		return fmt.Errorf("GemmBF16 x: %w", err)
	}
	if err := y.span(0, int64(n)*int64(w.Rows)*4); err != nil {
		return fmt.Errorf("GemmBF16 y: %w", err)
	}
	return d.do(func() error { return d.gemmL(y.ptr, x.ptr, w, n, false) })
}

// gemmL runs on the device thread: GemmBF16 for device addresses y and x;
// with acc it adds to y (β = 1) instead.
func (d *Device) gemmL(y, x uint64, w *Weight, n int, acc bool) error {
	if d.trace != nil {
		*d.trace = append(*d.trace, traceGemm, y, x, w.Buf.ptr, uint64(n), uint64(w.Rows), uint64(w.Cols), uint64(b32(acc)))
		return nil
	}
	b, err := d.blasLtL()
	if err != nil {
		return err
	}
	p, err := b.plan(n, w.Rows, w.Cols)
	if err != nil {
		return err
	}
	if p.cands != nil && d.prof == nil {
		d.tuneL(b, p, x, w, n)
	}
	alpha, beta := float32(1), float32(0)
	if acc {
		beta = 1
	}
	k := profKey{kind: profGemm, dims: [3]uint32{uint32(n), uint32(w.Rows), uint32(w.Cols)}, block: uint32(b32(acc))}
	return d.profiledL(k, func() error {
		return checkLt("cublasLtMatmul", call(lt.matmul, b.handle, p.desc,
			uintptr(unsafe.Pointer(&alpha)), uintptr(w.Buf.ptr), p.a, uintptr(x), p.b,
			uintptr(unsafe.Pointer(&beta)), uintptr(y), p.c, uintptr(y), p.c,
			uintptr(unsafe.Pointer(&p.algo.algo)), uintptr(b.workspace.ptr), gemmWorkspaceSize, d.stream))
	})
}

// HasGemm reports whether cuBLASLt loaded (GemmBF16 works), or why not.
func (d *Device) HasGemm() error {
	return d.do(func() error { _, err := d.blasLtL(); return err })
}
