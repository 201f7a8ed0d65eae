//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// CUresult codes the package acts on.
const (
	cudaSuccess           = 0
	errIllegalAddress     = 700
	errLaunchFailed       = 719
	errNoDevice           = 100
	errNoBinaryForGPU     = 209
	errUnsupportedPTX     = 222
	errIllegalInstruction = 715
	errMisalignedAddress  = 716
	errInvalidPC          = 718
	errHardwareStack      = 714
	errAssert             = 710
)

// Error is a failed driver call: Op is the API function, Code the CUresult
// and Name its enum name from cuGetErrorName ("CUDA_ERROR_ILLEGAL_ADDRESS").
type Error struct {
	Op   string
	Code int
	Name string
	Desc string // cuGetErrorString's sentence, when the driver has one
}

func (e *Error) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("cuda: %s: %s (%s)", e.Op, e.Name, e.Desc)
	}
	return fmt.Sprintf("cuda: %s: %s", e.Op, e.Name)
}

// Sticky reports whether the error leaves the context unusable: after one,
// every call on the device fails until the process ends.
func (e *Error) Sticky() bool {
	switch e.Code {
	case errIllegalAddress, errLaunchFailed, errIllegalInstruction, errMisalignedAddress,
		errInvalidPC, errHardwareStack, errAssert:
		return true
	}
	return false
}

// call invokes a C function and returns its first result. Pointers to Go
// values must be converted in the call expression,
// call(fn, uintptr(unsafe.Pointer(&v))), so that the compiler moves v to the
// heap and keeps it alive for the call (go:uintptrescapes, as SyscallN).
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// check turns a CUresult into nil or an *Error naming op and the code.
func check(op string, r uintptr) error {
	if r == cudaSuccess {
		return nil
	}
	e := &Error{Op: op, Code: int(int32(r)), Name: fmt.Sprintf("CUresult %d", int32(r))}
	var s uintptr
	if driver.cuGetErrorName != 0 && call(driver.cuGetErrorName, r, uintptr(unsafe.Pointer(&s))) == cudaSuccess {
		e.Name = gostring(s)
	}
	if driver.cuGetErrorString != 0 && call(driver.cuGetErrorString, r, uintptr(unsafe.Pointer(&s))) == cudaSuccess {
		e.Desc = gostring(s)
	}
	return e
}

// gostring copies a NUL-terminated C string.
func gostring(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// cstring returns s as a NUL-terminated byte slice for a C call.
func cstring(s string) []byte { return append([]byte(s), 0) }
