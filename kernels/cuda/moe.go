//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// moeConfig picks Experts' kernels for a few tokens. A new Backend takes
// it from the environment (moeConfigFromEnv), so one GPU run can compare;
// tests and benchmarks set it directly.
type moeConfig struct {
	v1     bool // FERRITE_MOE_KERNELS=v1: no register tiles, slot a pass up to moeFewTokens, sorted tiles above (as before them)
	pipe   int  // FERRITE_MOE_KERNELS=pipe, pipe16, piped, pipe16d: the streamed kernels (moe_pipe.go's pipeMode: warps a block | moePipeDyn) where they apply, from moeGTFrom tokens (or tiles slots)
	slots8 bool // up to 8 slots of an expert a pass in ferrite_moe_few_* (tests, benchmarks)
	few    int  // FERRITE_MOE_FEW: the most tokens the register tiles take (0: moeGTTokens)
	tiles  int  // FERRITE_MOE_TILES: the register tiles from this many slots, also below moeGTFrom tokens (0: from moeGTFrom tokens only)
	sb     int  // FERRITE_MOE_SB: the slots a register-tile block takes (0: enough blocks for twice the SMs)
	gt     int  // FERRITE_MOE_GT: the register tiles' gate/up rows a warp, 1, 2 or 4 (0: moeGTRows); down takes twice as many
}

// moeConfigFromEnv reads the FERRITE_MOE_* switches; unset or malformed
// ones keep the defaults.
func moeConfigFromEnv() moeConfig {
	num := func(name string) int {
		v, err := strconv.Atoi(os.Getenv(name))
		if err != nil || v < 0 {
			return 0
		}
		return v
	}
	c := moeConfig{v1: os.Getenv("FERRITE_MOE_KERNELS") == "v1", pipe: pipeMode(os.Getenv("FERRITE_MOE_KERNELS")), few: num("FERRITE_MOE_FEW"), sb: num("FERRITE_MOE_SB"),
		tiles: num("FERRITE_MOE_TILES")}
	if r := num("FERRITE_MOE_GT"); r == 1 || r == 2 || r == 4 {
		c.gt = r
	}
	return c
}

// Experts runs the grouped GEMV of a slot a pass (ferrite_moe_few_*) for
// fewer than moeGTFrom tokens, its register-tile form (ferrite_moe_gt_*)
// from moeGTFrom up to moeGTTokens tokens and moeGEMVSlots slots (tokens ·
// top k): gate/up moeGTRows rows a warp (down twice as many) against up to
// 4 slots of one expert, each weight load serving every slot and each
// slot's load every row, 256 threads a block; its down kernel writes each
// slot's output and ferrite_moe_combine adds them. GPU run 3
// (BenchmarkMoE, BenchmarkMoEGLM, µs a layer): at 1 token 36.9 (slot a
// pass) against 39.8 (tiles) for Qwen3-30B-A3B, 32.5 against 37.1 for
// GLM-4.7-Flash; at 4 tokens 117.6 against 109.4; at 8 210.8 against
// 178.4 and 183.1 against 164.0; at 32 the sorted tiles took 952.5 and
// 964.2, the register tiles 433.7 and 409.5.
const (
	moeGTFrom    = 4
	moeGTTokens  = 32
	moeGEMVSlots = 256
	moeGEMVRows  = 8 // warps a block
	moeGTRows    = 4
)

// useGT reports whether n tokens of k slots each take the register tiles.
func (c moeConfig) useGT(n, k int) bool {
	if c.v1 || n*k > moeGEMVSlots {
		return false
	}
	most := moeGTTokens
	if c.few > 0 {
		most = c.few
	}
	if c.tiles > 0 && n*k >= c.tiles && n <= most {
		return true
	}
	return n >= moeGTFrom && n <= most
}

// gtLaunch names the register tiles' kernels and their weight rows a
// block (8 warps of R rows).
func (c moeConfig) gtLaunch() (gateUp string, guRows int, down string, downRows int) {
	switch c.gt {
	case 1:
		return "ferrite_moe_gt_gate_up_r1", 1 * moeGEMVRows, "ferrite_moe_gt_down_r2", 2 * moeGEMVRows
	case 2:
		return "ferrite_moe_gt_gate_up_r2", 2 * moeGEMVRows, "ferrite_moe_gt_down_r4", 4 * moeGEMVRows
	}
	return "ferrite_moe_gt_gate_up_r4", 4 * moeGEMVRows, "ferrite_moe_gt_down_r8", 8 * moeGEMVRows
}

// blockSlots is the sorted slots a block row of a register-tile kernel
// takes over rows weight rows in blocks of rowsPer: halved from all of them
// until the grid has twice as many blocks as the GPU has SMs (or one slot
// a block), unless the config fixes it.
func (c moeConfig) blockSlots(slots, rows, rowsPer, sms int) int {
	if c.sb > 0 {
		return min(c.sb, slots)
	}
	sb, blocks := slots, ceilDiv(rows, rowsPer)
	for sb > 1 && blocks*ceilDiv(slots, sb) < 2*sms {
		sb = ceilDiv(sb, 2)
	}
	return sb
}

// funcGetAttribute is the driver's cuFuncGetAttribute, looked up on first
// use (0 when the driver lacks it): only tests ask for kernel resources.
var funcGetAttribute = sync.OnceValue(func() uintptr {
	lib, err := dlopen("libcuda.so.1", "libcuda.so")
	if err != nil {
		return 0
	}
	fn, err := purego.Dlsym(lib, "cuFuncGetAttribute")
	if err != nil {
		return 0
	}
	return fn
})

// kernelResources returns kernel name's registers a thread and local
// memory (spills) a thread in bytes (cuFuncGetAttribute), for tests that
// report what the compiler made of a kernel.
func (d *Device) kernelResources(name string) (regs, local int, err error) {
	const attrLocalBytes, attrNumRegs = 3, 4
	get := funcGetAttribute()
	if get == 0 {
		return 0, 0, fmt.Errorf("cuda: the driver has no cuFuncGetAttribute")
	}
	err = d.do(func() error {
		f, ok := d.fns[name]
		if !ok {
			return fmt.Errorf("cuda: no kernel %s", name)
		}
		var r, l int32
		if err := check("cuFuncGetAttribute", call(get, uintptr(unsafe.Pointer(&r)), attrNumRegs, f)); err != nil {
			return err
		}
		if err := check("cuFuncGetAttribute", call(get, uintptr(unsafe.Pointer(&l)), attrLocalBytes, f)); err != nil {
			return err
		}
		regs, local = int(r), int(l)
		return nil
	})
	return regs, local, err
}

// FoldsSharedExperts implements kernels.SharedExperts: the grouped GEMV
// reads a shared expert's rows once for all the tokens, in the same two
// launches as the routed experts (FERRITE_MOE_FOLD=0 keeps them apart, for
// comparison; it is read when a model is loaded).
func (b *Backend) FoldsSharedExperts() bool { return os.Getenv("FERRITE_MOE_FOLD") != "0" }
