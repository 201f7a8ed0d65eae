//go:build !linux

package cpu

// hugeBytes returns n zeroed bytes: huge pages are asked for on Linux only.
func hugeBytes(n int) []byte { return make([]byte, n) }

// meminfo is 0: unknown here.
func meminfo(key string) int64 { return 0 }

// hugeOff is true: hugeBytes asks for no huge pages here.
const hugeOff = true

// prefault does nothing here (MADV_POPULATE_WRITE is Linux's) and reports
// false.
func prefault(b []byte) bool { return false }
