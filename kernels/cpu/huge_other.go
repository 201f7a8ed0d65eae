//go:build !linux

package cpu

// allocHuge returns nil: huge pages are asked for on Linux only, and
// MatMul then reads the weights where they lie.
func allocHuge(n int) (d, mapping []byte) { return nil, nil }

// freeHuge does nothing (allocHuge allocates nothing here).
func freeHuge(mapping []byte) {}

// totalMemory is 0: unknown here.
func totalMemory() int64 { return 0 }
