//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package weights

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestReleasePages: the pages of a live file mapping are given back and
// read again from the file, unchanged; heap memory, where MADV_DONTNEED
// would zero the pages, and a closed mapping are left alone.
func TestReleasePages(t *testing.T) {
	page := os.Getpagesize()
	want := make([]byte, 8*page)
	for i := range want {
		want[i] = byte(i*7 + i/page)
	}
	path := filepath.Join(t.TempDir(), "w.bin")
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	data, unmap, err := MapFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, want) {
		t.Fatal("mapping differs from the file")
	}
	if !ReleasePages(data[page/2 : 6*page+3]) {
		t.Error("ReleasePages of a mapped range did nothing")
	}
	if !bytes.Equal(data, want) {
		t.Error("the mapping reads differently after ReleasePages")
	}
	if ReleasePages(data[10:20]) {
		t.Error("ReleasePages released a range holding no whole page")
	}

	heap := bytes.Clone(want)
	if ReleasePages(heap) {
		t.Error("ReleasePages released heap memory")
	}
	if !bytes.Equal(heap, want) {
		t.Error("heap memory changed under ReleasePages")
	}

	if err := unmap(); err != nil {
		t.Fatal(err)
	}
	if ReleasePages(data) {
		t.Error("ReleasePages released a closed mapping's range")
	}
}
