//go:build linux

package cpu

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// madvHugepage is MADV_HUGEPAGE, which the syscall package does not name:
// back the range with transparent huge pages when first touched.
const madvHugepage = 14

// hugeOff makes hugeBytes return ordinary memory (FERRITE_CPU_HUGEPAGES=0
// in the environment), so one build can run both.
var hugeOff = os.Getenv("FERRITE_CPU_HUGEPAGES") == "0"

// hugePage is the size of an x86-64 transparent huge page.
const hugePage = 2 << 20

// hugeBytes returns n zeroed bytes of Go memory that start at a 2 MiB
// boundary and that the kernel is asked to back with transparent huge
// pages (at most 2 MiB more is allocated, to align). The advice takes
// effect where the pages are first touched after it, as they are in memory
// fresh from the system (where Go reuses memory it already touched, or THP
// is off, the bytes are ordinary). The garbage collector owns the memory
// like any slice's.
func hugeBytes(n int) []byte {
	if hugeOff {
		return make([]byte, n)
	}
	b := make([]byte, n+hugePage)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	off := int((hugePage - p%hugePage) % hugePage)
	d := b[off : off+n : off+n]
	if end := min(len(b), off+(n+hugePage-1)/hugePage*hugePage); end > off {
		_ = syscall.Madvise(b[off:end], madvHugepage) // a hint: nothing to do if refused
	}
	return d
}

// meminfo is the value of key ("MemTotal", "MemAvailable") in
// /proc/meminfo in bytes, or 0 where it cannot be read.
func meminfo(key string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14), which the syscall
// package does not name: fault in every page of the range, writable, now,
// as writing each would, without writing.
const madvPopulateWrite = 23

// prefault has the kernel map every whole page of b, writable, in one call
// (MADV_POPULATE_WRITE), before b is written, and reports whether it did:
// memory fresh from the system otherwise takes a fault per 4 KiB page as it
// is first written, each a trap into the kernel. b's contents do not
// change. A kernel without it (EINVAL before Linux 5.14) leaves b to fault
// as it is written.
func prefault(b []byte) bool {
	page := uintptr(os.Getpagesize())
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	from, to := (lo+page-1)/page*page, (lo+uintptr(len(b)))/page*page
	if len(b) == 0 || to <= from {
		return false
	}
	return syscall.Madvise(b[from-lo:to-lo], madvPopulateWrite) == nil
}
