//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// stagingBytes is the size of each pinned host staging buffer (one for
// uploads, one for downloads); larger copies go through in chunks.
const stagingBytes = 32 << 20

// ErrClosed is returned by calls on a closed Device.
var ErrClosed = errors.New("cuda: device is closed")

// Device is one GPU with its primary context current on a dedicated, locked
// OS thread. Its methods may be called from any goroutine; they run in
// order on that thread. Work is queued on one stream: kernel launches return
// before the GPU finishes, copies to the host wait for it.
type Device struct {
	Ordinal      int    // the CUDA device ordinal
	Name         string // "NVIDIA H200"
	Major, Minor int    // compute capability
	SMs          int    // multiprocessors
	TotalMem     int64  // bytes of device memory
	// SmemOptIn is the dynamic shared memory a block of a bigSmemKernels
	// kernel may take (the device's opt-in limit); 0 when the driver
	// cannot raise it, and those kernels are not used.
	SmemOptIn int

	mu     sync.Mutex  // serialises callers and guards closed
	calls  chan func() // run on the device thread
	closed bool

	// Owned by the device thread.
	dev      int32
	ctx      uintptr
	stream   uintptr
	mod      uintptr
	fns      map[string]uintptr
	stageIn  []byte // pinned host memory (cuMemHostAlloc), stagingBytes
	stageOut []byte
	// stageInOff is where uploadAsyncL's next copy goes in stageIn: the
	// bytes before it may still be read by queued copies (0 after every
	// successful syncL).
	stageInOff int
	args       *launchBlock
	pinner     runtime.Pinner
	live       map[*Buffer]struct{}
	dead       error // the sticky error that killed the context, if any
	lt         *blasLt
	ltErr      error // why cuBLASLt is unavailable, once tried

	// pdl makes launch3L launch the kernels of pdlKernels with programmatic
	// dependent launch (pdl.go); set at Open, changed only on the device
	// thread.
	pdl bool

	// gemvRows is the n = 1 GEMV variant (ops.go, gemvRowsKernels): 0 for
	// gemv_split, else rows a block of gemv_rows; set at Open.
	gemvRows int

	// prefetch makes the split GEMVs ask L2 for their weight rows before
	// they wait for the kernel before them (pdl.go's weightPrefetch); set
	// at Open, changed only on the device thread.
	prefetch bool

	// trace, when set, makes launchL, launch3L and gemmL append what they
	// would launch (kernel, grid, block, arguments) to it instead of
	// launching: a step's launch trace, which graph.go compares.
	trace *[]uint64

	// prof, when set (FERRITE_CUDA_PROFILE at Open), times every launch,
	// GEMM, copy and memset on the stream, or every kernel and GEMM of the
	// replayed step graphs (profile.go).
	prof *profiler
}

// launchBlock is cuLaunchKernel's parameter array: ptrs[i] points at vals[i],
// each argument stored in the low bytes of its 8-byte slot. It is allocated
// once per Device and pinned for its lifetime.
type launchBlock struct {
	vals [32]uint64
	ptrs [32]uintptr
	cfg  launchConfig // cuLaunchKernelEx's configuration (pdl.go)
	attr launchAttr
}

// Open starts the device thread for GPU ordinal, makes its primary context
// current there and loads the embedded kernels. It fails with a one-line
// error when there is no driver, no such GPU, a GPU older than compute
// capability 8.0, or a fatbin the GPU cannot run.
func Open(ordinal int) (*Device, error) {
	if err := loadDriver(); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	d := &Device{Ordinal: ordinal, calls: make(chan func(), 1), live: map[*Buffer]struct{}{}}
	go d.thread()
	if err := d.run(d.setup); err != nil {
		d.run(d.teardown)
		close(d.calls)
		return nil, err
	}
	return d, nil
}

// Hand-overs to the device thread. A goroutine parked on a channel takes
// tens of microseconds to wake where waking a sleeping core means an
// inter-processor interrupt (on a virtual machine, a VM exit too), and a
// decode step hands work over a few times, each within a few hundred
// microseconds of the last. So after each call the device thread polls
// for the next one for up to spinIdle, and a caller polls for its result
// for up to spinWait, before either parks. With fewer than four CPUs, or
// FERRITE_CUDA_SPIN=0, they park at once.
var spinOn = runtime.NumCPU() >= 4 && os.Getenv("FERRITE_CUDA_SPIN") != "0"

const (
	spinIdle = time.Millisecond
	spinWait = 2 * time.Millisecond
)

// EndStep's caller polls for the end of a decode batch's step for up to
// stepSpinLong, not spinWait, before it parks: a step of several
// milliseconds outlasts spinWait, and a parked goroutine's wake-up cost
// 120–140 µs a step at 32 and 64 sequences (GPU runs 1–3 of session 15;
// with the long poll 5–9 µs, and 32 / 64 sequences 4,666 / 7,659 →
// 4,793 / 7,886 tok/s in run 3). It keeps a CPU core busy while the GPU
// runs the step, so it is bounded to decode batches of stepSpinRows rows or
// more (steps whose products run split, up to gemmRoundRows rows: not one
// row, not prompt chunks of gemmRoundRows tokens or more), where the
// throughput is the point. FERRITE_CUDA_STEPSPIN=0 turns it off; it is off
// wherever polling is (spinOn).
var stepSpinOn = stepSpinFor(spinOn, os.Getenv("FERRITE_CUDA_STEPSPIN"))

// stepSpinFor is stepSpinOn for the spin switch and FERRITE_CUDA_STEPSPIN's
// value.
func stepSpinFor(spin bool, env string) bool { return spin && env != "0" }

const (
	stepSpinLong = 50 * time.Millisecond
	stepSpinRows = 8
)

// thread is the device goroutine: it owns one OS thread for the Device's
// life, then clears the context and hands the thread back to the runtime.
func (d *Device) thread() {
	runtime.LockOSThread()
	for {
		f, ok := d.next()
		if !ok {
			break
		}
		f()
	}
	call(driver.cuCtxSetCurrent, 0)
	runtime.UnlockOSThread()
}

// next waits for the next call; ok is false once calls is closed.
func (d *Device) next() (f func(), ok bool) {
	if spinOn {
		for start := time.Now(); time.Since(start) < spinIdle; {
			select {
			case f, ok = <-d.calls:
				return f, ok
			default:
			}
		}
	}
	f, ok = <-d.calls
	return f, ok
}

// run executes f on the device thread and returns its error. Callers are
// serialised (do holds mu; Open and Close run before and after everyone),
// so the one-slot calls channel never makes a sender wait.
func (d *Device) run(f func() error) error { return d.runSpin(f, spinWait) }

// runSpin is run with the caller polling for up to spin before it parks.
func (d *Device) runSpin(f func() error, spin time.Duration) error {
	done := make(chan error, 1)
	d.calls <- func() { done <- f() }
	if spinOn {
		for start := time.Now(); time.Since(start) < spin; {
			select {
			case err := <-done:
				return err
			default:
			}
		}
	}
	return <-done
}

// do runs f on the device thread unless the Device is closed or dead; a
// sticky error from f marks it dead.
func (d *Device) do(f func() error) error { return d.doSpin(f, spinWait) }

// doSpin is do with the caller polling for up to spin (runSpin).
func (d *Device) doSpin(f func() error, spin time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	return d.runSpin(func() error {
		if d.dead != nil {
			return d.dead
		}
		err := f()
		var ce *Error
		if errors.As(err, &ce) && ce.Sticky() {
			d.dead = err
		}
		return err
	}, spin)
}

// Err returns the sticky error that made the device unusable, or nil.
func (d *Device) Err() error {
	var err error
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.run(func() error { err = d.dead; return nil })
	return err
}

// attribute reads a CUdevice_attribute.
func (d *Device) attribute(attr int) (int, error) {
	var v int32
	err := check("cuDeviceGetAttribute", call(driver.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(d.dev)))
	return int(v), err
}

const (
	attrSMs       = 16
	attrCCMajor   = 75
	attrCCMinor   = 76
	attrSmemOptIn = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
)

func (d *Device) setup() error {
	var n int32
	if err := check("cuDeviceGetCount", call(driver.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return err
	}
	if d.Ordinal < 0 || d.Ordinal >= int(n) {
		return fmt.Errorf("cuda: no GPU %d (%d found)", d.Ordinal, n)
	}
	if err := check("cuDeviceGet", call(driver.cuDeviceGet, uintptr(unsafe.Pointer(&d.dev)), uintptr(d.Ordinal))); err != nil {
		return err
	}
	var name [256]byte
	if err := check("cuDeviceGetName", call(driver.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(d.dev))); err != nil {
		return err
	}
	d.Name = gostring(uintptr(unsafe.Pointer(&name[0])))
	var err error
	if d.Major, err = d.attribute(attrCCMajor); err != nil {
		return err
	}
	if d.Minor, err = d.attribute(attrCCMinor); err != nil {
		return err
	}
	if d.SMs, err = d.attribute(attrSMs); err != nil {
		return err
	}
	if d.Major < 8 {
		return fmt.Errorf("cuda: GPU %d (%s) has compute capability %d.%d; ferrite needs 8.0 (Ampere) or newer",
			d.Ordinal, d.Name, d.Major, d.Minor)
	}
	var total uint64
	if err := check("cuDeviceTotalMem", call(driver.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(d.dev))); err != nil {
		return err
	}
	d.TotalMem = int64(total)
	if err := check("cuDevicePrimaryCtxRetain", call(driver.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev))); err != nil {
		return err
	}
	if err := check("cuCtxSetCurrent", call(driver.cuCtxSetCurrent, d.ctx)); err != nil {
		return err
	}
	const nonBlocking = 1
	if err := check("cuStreamCreate", call(driver.cuStreamCreate, uintptr(unsafe.Pointer(&d.stream)), nonBlocking)); err != nil {
		return err
	}
	var err2 error
	if d.stageIn, err2 = hostAlloc(stagingBytes); err2 != nil {
		return err2
	}
	if d.stageOut, err2 = hostAlloc(stagingBytes); err2 != nil {
		return err2
	}
	d.args = new(launchBlock)
	d.pinner.Pin(d.args)
	for i := range d.args.ptrs {
		d.args.ptrs[i] = uintptr(unsafe.Pointer(&d.args.vals[i]))
	}
	if mode := profileMode(); mode != profileOff {
		if d.prof, err2 = newProfilerL(mode); err2 != nil {
			return err2
		}
	}
	d.pdl = pdlEnabled(d.Major) && d.prof == nil
	d.gemvRows = gemvRowsDefault()
	d.prefetch = os.Getenv("FERRITE_CUDA_PREFETCH") == "1"
	return d.loadModule()
}

// hostAlloc returns n bytes of page-locked host memory.
func hostAlloc(n int) ([]byte, error) {
	var p uintptr
	if err := check("cuMemHostAlloc", call(driver.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), 0)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n), nil
}

// teardown releases everything setup made, in reverse; it is safe on a
// partly set up or dead device (errors past the first are dropped).
func (d *Device) teardown() error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil && d.dead == nil {
			first = err
		}
	}
	if d.ctx != 0 {
		call(driver.cuStreamSynchronize, d.stream)
	}
	for b := range d.live {
		keep(b.free())
	}
	if d.prof != nil {
		d.prof.closeL()
		d.prof = nil
	}
	if d.lt != nil {
		keep(d.lt.close())
		d.lt = nil
	}
	if d.mod != 0 {
		keep(check("cuModuleUnload", call(driver.cuModuleUnload, d.mod)))
		d.mod = 0
	}
	for _, s := range [][]byte{d.stageIn, d.stageOut} {
		if s != nil {
			keep(check("cuMemFreeHost", call(driver.cuMemFreeHost, uintptr(unsafe.Pointer(&s[0])))))
		}
	}
	d.stageIn, d.stageOut = nil, nil
	if d.args != nil {
		d.pinner.Unpin()
		d.args = nil
	}
	if d.stream != 0 {
		keep(check("cuStreamDestroy", call(driver.cuStreamDestroy, d.stream)))
		d.stream = 0
	}
	if d.ctx != 0 {
		call(driver.cuCtxSetCurrent, 0)
		keep(check("cuDevicePrimaryCtxRelease", call(driver.cuDevicePrimaryCtxRelease, uintptr(d.dev))))
		d.ctx = 0
	}
	return first
}

// Close waits for queued work, frees every Buffer still allocated, releases
// the context and ends the device thread. A dead device closes without
// error; later calls return ErrClosed.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	err := d.run(d.teardown)
	close(d.calls)
	return err
}

// Sync waits until all queued work on the device has finished.
func (d *Device) Sync() error {
	return d.do(d.syncL)
}

func (d *Device) syncL() error {
	err := check("cuStreamSynchronize", call(driver.cuStreamSynchronize, d.stream))
	if err == nil {
		d.stageInOff = 0 // the stream ran every queued upload
	}
	return err
}

// errNoMemInfo is MemInfo's error when the driver lacks cuMemGetInfo_v2.
var errNoMemInfo = errors.New("cuda: the driver has no cuMemGetInfo_v2")

// MemInfo returns the device's free and total memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	if driver.cuMemGetInfo == 0 {
		return 0, 0, errNoMemInfo
	}
	err = d.do(func() error {
		var f, t uint64
		err := check("cuMemGetInfo", call(driver.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))))
		free, total = int64(f), int64(t)
		return err
	})
	return free, total, err
}

// String describes the device: "cuda:0 NVIDIA H200 (sm_90, 132 SMs, 140 GiB)".
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d%d, %d SMs, %d GiB)", d.Ordinal, d.Name, d.Major, d.Minor, d.SMs, d.TotalMem>>30)
}

// Time runs f, which queues work on the device, between two CUDA events and
// returns the GPU time between them (it waits for the work to finish).
func (d *Device) Time(f func() error) (time.Duration, error) {
	var start, stop uintptr
	err := d.do(func() error {
		if err := check("cuEventCreate", call(driver.cuEventCreate, uintptr(unsafe.Pointer(&start)), 0)); err != nil {
			return err
		}
		if err := check("cuEventCreate", call(driver.cuEventCreate, uintptr(unsafe.Pointer(&stop)), 0)); err != nil {
			return err
		}
		return check("cuEventRecord", call(driver.cuEventRecord, start, d.stream))
	})
	defer d.do(func() error {
		for _, e := range []uintptr{start, stop} {
			if e != 0 {
				call(driver.cuEventDestroy, e)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	var ms float32
	err = d.do(func() error {
		if err := check("cuEventRecord", call(driver.cuEventRecord, stop, d.stream)); err != nil {
			return err
		}
		if err := check("cuEventSynchronize", call(driver.cuEventSynchronize, stop)); err != nil {
			return err
		}
		return check("cuEventElapsedTime", call(driver.cuEventTime, uintptr(unsafe.Pointer(&ms)), start, stop))
	})
	return time.Duration(float64(ms) * 1e6), err
}
