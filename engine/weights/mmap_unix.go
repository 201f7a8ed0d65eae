//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package weights

import (
	"fmt"
	"math"
	"os"
	"syscall"
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
	return &mapping{path: path, data: data}, nil
}

// close unmaps the file.
func (m *mapping) close() error {
	data := m.data
	m.data = nil
	if len(data) == 0 {
		return nil
	}
	return syscall.Munmap(data)
}
