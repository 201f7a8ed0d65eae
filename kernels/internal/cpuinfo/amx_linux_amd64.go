package cpuinfo

import "syscall"

// requestAMX asks Linux for the AMX tile data state (XTILEDATA, feature 18)
// for the whole process, which it grants only on request (Linux ≥ 5.16),
// and reports whether it did.
func requestAMX() bool {
	const archReqXcompPerm, xfeatureXtiledata = 0x1023, 18
	_, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXtiledata, 0)
	return errno == 0
}
