//go:build !(linux || darwin || freebsd)

package hub

import (
	"errors"
	"io/fs"
	"os"
)

// tryLock takes a lock file by creating it exclusively; busy is true when
// it exists. Unlike flock on Unix, a pull that dies leaves the file behind.
func tryLock(path string) (f *os.File, busy bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil, true, nil
	}
	return f, false, err
}

// freeBytes is unknown on this system: the disk-space check is skipped.
func freeBytes(string) (int64, error) { return -1, nil }

func isNoSpace(error) bool { return false }
