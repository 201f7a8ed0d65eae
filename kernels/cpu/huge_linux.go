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

// madvHugepage is MADV_HUGEPAGE (the syscall package does not name it).
const madvHugepage = 14

// allocHuge returns n zeroed bytes of anonymous memory that the kernel is
// asked to back with transparent huge pages (2 MiB on x86-64), or nil if
// the mapping fails, and the whole mapping, which freeHuge releases.
func allocHuge(n int) (d, mapping []byte) {
	const huge = 2 << 20
	// Map a huge page more than asked and use the aligned part, so every
	// 2 MiB of the data can be one huge page.
	m, err := syscall.Mmap(-1, 0, n+huge, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil
	}
	off := 0
	if a := uintptr(unsafe.Pointer(unsafe.SliceData(m))) % huge; a != 0 {
		off = int(huge - a)
	}
	d = m[off : off+n : off+n]
	_ = syscall.Madvise(d, madvHugepage) // a hint: without THP the copy still works
	return d, m
}

// freeHuge unmaps a mapping from allocHuge.
func freeHuge(mapping []byte) { _ = syscall.Munmap(mapping) }

// totalMemory is the machine's memory in bytes (MemTotal), or 0.
func totalMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
