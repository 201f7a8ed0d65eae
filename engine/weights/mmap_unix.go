//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package weights

import (
	"fmt"
	"math"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// mapping is one file's contents, memory-mapped read-only.
type mapping struct {
	path string
	data []byte
}

// mapFile maps the whole of path read-only and shared.
func mapFile(path string) (*mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping outlives the descriptor
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%s: %d bytes is too large to map", path, size)
	}
	if size == 0 {
		return &mapping{path: path, data: []byte{}}, nil
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %v", path, err)
	}
	m := &mapping{path: path, data: data}
	live.Lock()
	live.m[m] = struct{}{}
	live.Unlock()
	return m, nil
}

// close unmaps the file.
func (m *mapping) close() error {
	live.Lock()
	delete(live.m, m)
	data := m.data
	m.data = nil
	live.Unlock()
	if len(data) == 0 {
		return nil
	}
	return syscall.Munmap(data)
}

// live is every file mapping not yet closed, for ReleasePages.
var live = struct {
	sync.Mutex
	m map[*mapping]struct{}
}{m: map[*mapping]struct{}{}}

// ReleasePages drops the process's pages of b where b lies inside a live
// read-only file mapping of this package's (Open, MapFile), and reports
// whether it did: a backend that keeps its own copy of a weight no longer
// reads the mapping's pages, which otherwise stay in the process's
// resident set beside the copy. Nothing is lost: the mapping is PROT_READ
// and shared, so a later read faults the page back in from the file (the
// page cache). Only whole pages inside b are released. Memory of any other
// kind (the heap, where MADV_DONTNEED would zero it) is left alone.
func ReleasePages(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	live.Lock()
	defer live.Unlock() // held through madvise: close cannot unmap meanwhile
	for m := range live.m {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
		if len(m.data) == 0 || lo < base || hi > base+uintptr(len(m.data)) {
			continue
		}
		page := uintptr(os.Getpagesize())
		from, to := (lo+page-1)/page*page, hi/page*page
		if to <= from {
			return false
		}
		off := int(from - base)
		return syscall.Madvise(m.data[off:off+int(to-from)], syscall.MADV_DONTNEED) == nil
	}
	return false
}
