//go:build !linux

package cpu

import "testing"

// cpuLoop runs f under b.Loop (no per-thread CPU time outside Linux).
func cpuLoop(b *testing.B, f func()) {
	for b.Loop() {
		f()
	}
}
