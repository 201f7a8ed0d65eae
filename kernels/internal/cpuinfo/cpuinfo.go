// Package cpuinfo is the one place the kernels read CPU features. Each
// feature the fast paths depend on has a getter, read on every kernel
// dispatch, and a Disable hook so tests can cover the fallback paths on a
// machine that has the feature.
package cpuinfo

import (
	"sync/atomic"

	"golang.org/x/sys/cpu"
)

var (
	avx2FMA atomic.Bool // AVX2 and FMA3, with OS support for the ymm state
	f16c    atomic.Bool // VCVTPH2PS
	avx512  atomic.Bool // AVX-512 F and VL, with OS support for the zmm state
	vnni    atomic.Bool // AVX-512 VNNI (VPDPBUSD) and BW
	bf16    atomic.Bool // AVX-512 BF16 (VDPBF16PS) and BW
	amx     atomic.Bool // AMX tiles with BF16, and the OS's permission to use them
)

func init() {
	avx2FMA.Store(cpu.X86.HasAVX2 && cpu.X86.HasFMA)
	f16c.Store(cpu.X86.HasF16C)
	avx512.Store(cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL)
	vnni.Store(cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512BW)
	bf16.Store(cpu.X86.HasAVX512BF16 && cpu.X86.HasAVX512BW && cpu.X86.HasBMI2)
	amx.Store(cpu.X86.HasAMXTile && cpu.X86.HasAMXBF16 && requestAMX())
}

// AVX2FMA reports whether AVX2 and FMA3 may be used.
func AVX2FMA() bool { return avx2FMA.Load() }

// F16C reports whether the F16C half-precision conversions may be used.
func F16C() bool { return f16c.Load() }

// AVX512 reports whether AVX-512 F and VL may be used.
func AVX512() bool { return avx512.Load() }

// VNNI reports whether the AVX-512 VNNI integer dot product may be used,
// with AVX-512 BW for byte operations on 512-bit registers (and F and VL).
func VNNI() bool { return vnni.Load() && avx512.Load() }

// BF16 reports whether the AVX-512 BF16 dot product VDPBF16PS may be used,
// with AVX-512 BW for word operations on 512-bit registers, BMI2 (and F
// and VL).
func BF16() bool { return bf16.Load() && avx512.Load() }

// AMX reports whether the AMX tile instructions with BF16 (TDPBF16PS) may
// be used: the CPU has them and Linux granted this process the tile state.
func AMX() bool { return amx.Load() }

// DisableAMX turns AMX off until restore is called. For testing.
func DisableAMX() (restore func()) { return disable(&amx) }

// DisableBF16 turns AVX-512 BF16 off until restore is called. For testing.
func DisableBF16() (restore func()) { return disable(&bf16) }

// DisableVNNI turns AVX-512 VNNI off until restore is called. For testing.
func DisableVNNI() (restore func()) { return disable(&vnni) }

// DisableAVX512 turns AVX-512 off until restore is called. For testing.
func DisableAVX512() (restore func()) { return disable(&avx512) }

// DisableAVX2FMA turns AVX2/FMA off until restore is called. For testing.
func DisableAVX2FMA() (restore func()) { return disable(&avx2FMA) }

// DisableF16C turns F16C off until restore is called. For testing.
func DisableF16C() (restore func()) { return disable(&f16c) }

func disable(b *atomic.Bool) func() {
	old := b.Swap(false)
	return func() { b.Store(old) }
}
