//go:build !amd64 || noasm

package cpu

import "github.com/ferrite-llm/ferrite/kernels"

// tilesFor returns the pure-Go tiles: this build has no assembly.
func tilesFor(d kernels.DType) *tileSet { return &genericTiles[d] }

// haveAsm reports whether tilesFor returns assembly for some dtype.
func haveAsm() bool { return false }

// scale sets dst[i] = src[i] * s for i < len(src).
func scale(dst, src []float32, s float32) { scaleGo(dst, src, s) }

// axpyRow sets y[i] += a·w[i] for i < len(y), w an F32 or BF16 row.
func axpyRow(dt kernels.DType, y []float32, a float32, w []byte) { axpyGo(dt, y, a, w) }

// qtilesFor returns the pure-Go tiles of quantized dtype d.
func qtilesFor(d kernels.DType) *qtileSet { return &genericQTiles[d] }

// quantizeX is quantizeXGo: this build has no assembly.
func quantizeX(q []int8, ds []float32, bs []int16, x []float32, group int) {
	quantizeXGo(q, ds, bs, x, group)
}

// asmBF16Tiles returns nil: this build has no VDPBF16PS tiles.
func asmBF16Tiles() *bf16TileSet { return nil }

// roundBF16 sets dst[i] = kernels.F32ToBF16(src[i]) for i < len(src).
func roundBF16(dst []uint16, src []float32) { roundBF16Go(dst, src) }

// asmAMX returns nil: this build has no AMX kernels.
func asmAMX() *amxKernels { return nil }

// asmX8 returns nil: this build has no x8 kernels.
func asmX8(kernels.DType) *x8Set { return nil }

// packX8Asm returns false: this build has no assembly packers.
func packX8Asm(dst, w []byte, d kernels.DType, k, groups, G int) bool { return false }
