//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package weights

import (
	"fmt"
	"os"
)

// mapping is one file's contents, read into memory (no mmap on this system).
type mapping struct {
	path string
	data []byte
}

// mapFile reads the whole of path.
func mapFile(path string) (*mapping, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &mapping{path: path, data: data}, nil
}

// close drops the contents.
func (m *mapping) close() error {
	m.data = nil
	return nil
}

// ReleasePages does nothing here: a file read into memory has no file
// pages to give back (see the mmap form).
func ReleasePages(b []byte) bool { return false }
