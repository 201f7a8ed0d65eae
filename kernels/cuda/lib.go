//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// minDriver is the oldest driver API version accepted: CUDA 13.0 (R580),
// the toolkit the fatbin is built with.
const minDriver = 13000

// libDirs lists the folders searched after FERRITE_CUDA_LIB_DIR and the
// dynamic linker's own path: driver mounts, the toolkit, pip wheels.
func libDirs() []string {
	dirs := []string{os.Getenv("FERRITE_CUDA_LIB_DIR")}
	if h := os.Getenv("CUDA_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "lib64"), filepath.Join(h, "lib"))
	}
	dirs = append(dirs, "/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
		"/usr/lib/wsl/lib", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	for _, pat := range []string{
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
		"/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
		"/usr/lib/python3/dist-packages/nvidia/*/lib",
	} {
		m, _ := filepath.Glob(pat)
		dirs = append(dirs, m...)
	}
	return dirs
}

// dlopen opens the first of names found: FERRITE_CUDA_LIB_DIR first, then
// the dynamic linker's search, then libDirs. The error names what was tried.
func dlopen(names ...string) (uintptr, error) {
	var first error
	try := func(path string) (uintptr, bool) {
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			if first == nil {
				first = err
			}
			return 0, false
		}
		return h, true
	}
	if d := os.Getenv("FERRITE_CUDA_LIB_DIR"); d != "" {
		for _, n := range names {
			if h, ok := try(filepath.Join(d, n)); ok {
				return h, nil
			}
		}
	}
	for _, n := range names {
		if h, ok := try(n); ok {
			return h, nil
		}
	}
	for _, d := range libDirs() {
		for _, n := range names {
			p := filepath.Join(d, n)
			if _, err := os.Stat(p); err == nil {
				if h, ok := try(p); ok {
					return h, nil
				}
			}
		}
	}
	return 0, loadError(first, names[0])
}

// loadError is dlopen's error for lib: the loader's own words
// ("libcuda.so.1: cannot open shared object file: ..."), where it gave
// any. dlerror's text is per OS thread, and a goroutine that moved
// between purego's dlopen and dlerror reads none (the chat's /stats once
// said "no GPU: no NVIDIA driver: " and nothing more): the message still
// names the library.
func loadError(first error, lib string) error {
	if first != nil && strings.Contains(first.Error(), ".so") {
		return first
	}
	return fmt.Errorf("%s not found", lib)
}

// symbols resolves every name in table into its *uintptr from lib.
func symbols(lib uintptr, libName string, table map[string]*uintptr) error {
	for name, p := range table {
		fn, err := purego.Dlsym(lib, name)
		if err != nil || fn == 0 {
			return fmt.Errorf("%s has no %s (driver too old?)", libName, name)
		}
		*p = fn
	}
	return nil
}

// optionalSymbols resolves the names of table that lib has, leaving the
// others 0: entry points ferrite can do without.
func optionalSymbols(lib uintptr, table map[string]*uintptr) {
	for name, p := range table {
		if fn, err := purego.Dlsym(lib, name); err == nil {
			*p = fn
		}
	}
}

// driver holds the CUDA driver API entry points, versioned where the API
// has versions (the _v2 symbols take 64-bit sizes and pointers).
var driver struct {
	once sync.Once
	err  error

	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString                  uintptr
	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute          uintptr
	cuDeviceTotalMem, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease         uintptr
	cuCtxSetCurrent, cuStreamCreate, cuStreamDestroy, cuStreamSynchronize         uintptr
	cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost                          uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemsetD32Async                        uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction, cuLaunchKernel         uintptr
	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventSynchronize, cuEventTime uintptr
	cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiate, cuGraphLaunch   uintptr
	cuGraphDestroy, cuGraphExecDestroy                                            uintptr

	// Optional (0 when the driver lacks them): what the chat reports, never
	// needed to run; cuLaunchKernelEx for programmatic dependent launch;
	// cuFuncSetAttribute for kernels above 48 KiB of shared memory;
	// cuFuncGetAttribute for the tests' register counts.
	cuMemGetInfo, cuLaunchKernelEx, cuFuncSetAttribute, cuFuncGetAttribute uintptr
	// cuEventRecordWithFlags: event record nodes in captured graphs, for
	// FERRITE_CUDA_PROFILE=graph.
	cuEventRecordWithFlags uintptr
}

// errNoDriver wraps every failure to load libcuda.so.1.
var errNoDriver = errors.New("no NVIDIA driver")

// loadDriver dlopens libcuda.so.1 and resolves the driver API once.
func loadDriver() error {
	driver.once.Do(func() {
		lib, err := dlopen("libcuda.so.1", "libcuda.so")
		if err != nil {
			driver.err = fmt.Errorf("%w: %v", errNoDriver, err)
			return
		}
		d := &driver
		driver.err = symbols(lib, "libcuda", map[string]*uintptr{
			"cuInit": &d.cuInit, "cuDriverGetVersion": &d.cuDriverGetVersion,
			"cuGetErrorName": &d.cuGetErrorName, "cuGetErrorString": &d.cuGetErrorString,
			"cuDeviceGetCount": &d.cuDeviceGetCount, "cuDeviceGet": &d.cuDeviceGet,
			"cuDeviceGetName": &d.cuDeviceGetName, "cuDeviceGetAttribute": &d.cuDeviceGetAttribute,
			"cuDeviceTotalMem_v2": &d.cuDeviceTotalMem, "cuDevicePrimaryCtxRetain": &d.cuDevicePrimaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease, "cuCtxSetCurrent": &d.cuCtxSetCurrent,
			"cuStreamCreate": &d.cuStreamCreate, "cuStreamDestroy_v2": &d.cuStreamDestroy,
			"cuStreamSynchronize": &d.cuStreamSynchronize,
			"cuMemAlloc_v2":       &d.cuMemAlloc, "cuMemFree_v2": &d.cuMemFree,
			"cuMemHostAlloc": &d.cuMemHostAlloc, "cuMemFreeHost": &d.cuMemFreeHost,
			"cuMemcpyHtoDAsync_v2": &d.cuMemcpyHtoDAsync, "cuMemcpyDtoHAsync_v2": &d.cuMemcpyDtoHAsync,
			"cuMemsetD32Async": &d.cuMemsetD32Async,
			"cuModuleLoadData": &d.cuModuleLoadData, "cuModuleUnload": &d.cuModuleUnload,
			"cuModuleGetFunction": &d.cuModuleGetFunction, "cuLaunchKernel": &d.cuLaunchKernel,
			"cuEventCreate": &d.cuEventCreate, "cuEventDestroy_v2": &d.cuEventDestroy,
			"cuEventRecord": &d.cuEventRecord, "cuEventSynchronize": &d.cuEventSynchronize,
			"cuEventElapsedTime":      &d.cuEventTime,
			"cuStreamBeginCapture_v2": &d.cuStreamBeginCapture, "cuStreamEndCapture": &d.cuStreamEndCapture,
			"cuGraphInstantiateWithFlags": &d.cuGraphInstantiate, "cuGraphLaunch": &d.cuGraphLaunch,
			"cuGraphDestroy": &d.cuGraphDestroy, "cuGraphExecDestroy": &d.cuGraphExecDestroy,
		})
		if driver.err != nil {
			return
		}
		optionalSymbols(lib, map[string]*uintptr{"cuMemGetInfo_v2": &d.cuMemGetInfo, "cuLaunchKernelEx": &d.cuLaunchKernelEx,
			"cuFuncSetAttribute": &d.cuFuncSetAttribute, "cuFuncGetAttribute": &d.cuFuncGetAttribute,
			"cuEventRecordWithFlags": &d.cuEventRecordWithFlags})
		if err := check("cuInit", call(d.cuInit, 0)); err != nil {
			driver.err = err
			return
		}
		var v int32
		if err := check("cuDriverGetVersion", call(d.cuDriverGetVersion, uintptr(unsafe.Pointer(&v)))); err != nil {
			driver.err = err
			return
		}
		if v < minDriver {
			driver.err = fmt.Errorf("NVIDIA driver supports CUDA %d.%d; ferrite needs %d.%d or newer",
				v/1000, v%1000/10, minDriver/1000, minDriver%1000/10)
		}
	})
	return driver.err
}
