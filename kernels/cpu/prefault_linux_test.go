//go:build linux

package cpu

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// minorFaults is the page faults served without I/O of the calling thread
// (who = unix.RUSAGE_THREAD) or of the process (unix.RUSAGE_SELF).
func minorFaults(t *testing.T, who int) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// anonPages maps n pages of fresh anonymous memory in 4 KiB pages (no
// transparent huge pages), unmapped when the test ends.
func anonPages(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n*unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	_ = unix.Madvise(b, unix.MADV_NOHUGEPAGE)
	return b
}

// TestPrefault checks that prefault maps the whole pages inside a slice,
// so that writing them then takes no fault, and only those, without
// changing a byte.
func TestPrefault(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const pages = 1024
	ps := unix.Getpagesize()
	touch := func(b []byte) int64 { // faults of writing a byte of every page
		f0 := minorFaults(t, unix.RUSAGE_THREAD)
		for i := 0; i < len(b); i += ps {
			b[i]++
		}
		return minorFaults(t, unix.RUSAGE_THREAD) - f0
	}
	if f := touch(anonPages(t, pages)); f < pages/2 {
		t.Skipf("writing %d fresh pages took %d faults: nothing to measure here", pages, f)
	}

	b := anonPages(t, pages)
	b[0], b[len(b)-1] = 7, 9 // the first and last page, faulted in and written
	// One page short at either end: the pages b[1:len(b)-1] only partly
	// covers are left alone.
	if !prefault(b[1 : len(b)-1]) {
		t.Skip("the kernel refused MADV_POPULATE_WRITE (before Linux 5.14)")
	}
	if b[0] != 7 || b[len(b)-1] != 9 {
		t.Fatalf("prefault changed bytes: %d, %d", b[0], b[len(b)-1])
	}
	for i := ps; i < len(b)-ps; i++ {
		if b[i] != 0 {
			t.Fatalf("byte %d is %d after prefault of fresh memory, want 0", i, b[i])
		}
	}
	if f := touch(b[ps : len(b)-ps]); f > pages/16 {
		t.Errorf("writing %d prefaulted pages took %d faults", pages-2, f)
	}
	if !prefault(b) || b[0] != 7 || b[ps] != 1 {
		t.Errorf("prefault of written pages changed them: %d, %d", b[0], b[ps])
	}
	if prefault(b[1:2]) || prefault(nil) {
		t.Error("prefault reported pages of a slice holding none whole")
	}
}

// TestPrefaulted checks that the memory prefaulted returns (the x8
// packings') takes fewer faults, by at least half its pages, as it is
// written than a fresh allocation as large, which takes one a page. It is
// skipped where that allocation took few (memory the Go heap had in use
// already, or huge pages).
func TestPrefaulted(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if !prefault(anonPages(t, 1)) {
		t.Skip("the kernel refused MADV_POPULATE_WRITE (before Linux 5.14)")
	}
	if raceOn {
		// Every first write also faults in its shadow memory, about one
		// fault a page, so a fresh allocation that reuses resident heap
		// pages still counts a page's worth and the comparison says
		// nothing (it failed now and then).
		t.Skip("page-fault counts under the race detector")
	}
	const n = 16 << 20
	ps := unix.Getpagesize()
	write := func(b []byte) int64 { // faults of writing a byte of every page
		f0 := minorFaults(t, unix.RUSAGE_THREAD)
		for i := 0; i < len(b); i += ps {
			b[i] = 1
		}
		return minorFaults(t, unix.RUSAGE_THREAD) - f0
	}
	d := prefaulted(n)
	control := make([]byte, n)
	fresh := write(control)
	pages := int64(n / ps)
	if fresh < pages/2 {
		t.Skipf("a fresh %d-byte allocation written page by page took %d faults: nothing to measure here", n, fresh)
	}
	if f := write(d); fresh-f < pages/2 {
		t.Errorf("writing the %d pages of prefaulted(%d) took %d page faults, a fresh allocation %d: under half the pages' faults saved", pages, n, f, fresh)
	}
	if len(d) != n {
		t.Fatalf("prefaulted(%d) is %d bytes", n, len(d))
	}
}
