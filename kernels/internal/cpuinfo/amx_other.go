//go:build !linux || !amd64

package cpuinfo

// requestAMX reports false: the AMX tiles are used on Linux only.
func requestAMX() bool { return false }
