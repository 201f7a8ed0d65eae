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
	v1     bool // FERRITE_MOE_KERNELS=v1: the first grouped GEMV kernels (ferrite_moe_few_*), up to moeFewTokens
	slots8 bool // with v1: up to 8 slots of an expert a pass
	few    int  // FERRITE_MOE_FEW: the most tokens the grouped GEMV takes (0: moeGEMVTokens)
	pass   int  // FERRITE_MOE_PASS: gate/up slots a pass, 2, 4 or 8 (0: by the block's slots)
	sb     int  // FERRITE_MOE_SB: gate/up slots a block (0: enough blocks for twice the SMs)
	tiles  int  // FERRITE_MOE_TILES: the fewest slots that take the register tiles (0: moeTileSlots)
	gt     int  // FERRITE_MOE_GT: the register tiles' rows a warp, −1 half, +1 double the default (0)
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
	c := moeConfig{v1: os.Getenv("FERRITE_MOE_KERNELS") == "v1", few: num("FERRITE_MOE_FEW"), sb: num("FERRITE_MOE_SB"),
		tiles: num("FERRITE_MOE_TILES")}
	switch os.Getenv("FERRITE_MOE_GT") {
	case "half":
		c.gt = -1
	case "double":
		c.gt = 1
	}
	if p := num("FERRITE_MOE_PASS"); p == 2 || p == 4 || p == 8 {
		c.pass = p
	}
	return c
}

// The grouped GEMV (src/ops_moe.cu's ferrite_moe_gv_*) takes up to
// moeGEMVTokens tokens and moeGEMVSlots slots (tokens · top k) a call;
// its blocks are 256 threads, one weight row a warp. From moeTileSlots
// slots its register-tile form (ferrite_moe_gt_*) runs instead: several
// rows a warp (gtLaunch) against up to 4 slots of one expert, each weight
// load serving every slot and each slot's load every row; its down kernel
// writes each slot's output and ferrite_moe_combine adds them.
const (
	moeGEMVTokens = 32
	moeGEMVSlots  = 256
	moeGEMVRows   = 8
	moeTileSlots  = 32
)

// gtLaunch names the register tiles' kernels and their weight rows a
// block (8 warps of R rows): gate/up R = 2, down R = 4 by default.
func (c moeConfig) gtLaunch() (gateUp string, guRows int, down string, downRows int) {
	switch c.gt {
	case -1:
		return "ferrite_moe_gt_gate_up_r1", 1 * moeGEMVRows, "ferrite_moe_gt_down_r2", 2 * moeGEMVRows
	case 1:
		return "ferrite_moe_gt_gate_up_r4", 4 * moeGEMVRows, "ferrite_moe_gt_down_r8", 8 * moeGEMVRows
	}
	return "ferrite_moe_gt_gate_up_r2", 2 * moeGEMVRows, "ferrite_moe_gt_down_r4", 4 * moeGEMVRows
}

// useTiles reports whether n·k slots take the register tiles.
func (c moeConfig) useTiles(slots int) bool {
	t := moeTileSlots
	if c.tiles > 0 {
		t = c.tiles
	}
	return slots >= t
}

// blockSlots is the sorted slots a block row of a grouped kernel takes
// over rows weight rows in blocks of rowsPer: halved from all of them
// until the grid has twice as many blocks as the GPU has SMs (or floor
// slots a block), unless the config fixes it.
func (c moeConfig) blockSlots(slots, rows, rowsPer, floor, sms int) int {
	if c.sb > 0 {
		return min(c.sb, slots)
	}
	sb, blocks := slots, ceilDiv(rows, rowsPer)
	for sb > floor && blocks*ceilDiv(slots, sb) < 2*sms {
		sb = ceilDiv(sb, 2)
	}
	return sb
}

// gemvTokens is the most tokens Experts runs through grouped GEMVs for
// top-k k: the rest are prefill-sized (sorted tiles).
func (c moeConfig) gemvTokens(k int) int {
	if c.v1 {
		return moeFewTokens
	}
	n := moeGEMVTokens
	if c.few > 0 {
		n = c.few
	}
	return min(n, moeGEMVSlots/k)
}

// gemvLaunch is the grouped GEMV's plan for n tokens of k experts: the
// gate/up kernel, the slots a block row of it takes (sb) and its grid's
// rows, and the down kernel. A block row of gate/up covers every
// expert row for sb sorted slots; sb halves from all the slots until the
// grid has twice as many blocks as the GPU has SMs (or 2 slots a block),
// and a pass takes up to 8, 4 or 2 of them as sb allows (more slots a
// pass, fewer loads of each in flight: the registers are the same).
func (c moeConfig) gemvLaunch(n, k, inter, sms int) (gateUp string, sb, gy int, down string) {
	slots := n * k
	sb = c.blockSlots(slots, inter, moeGEMVRows, 2, sms)
	p := c.pass
	if p == 0 {
		p = 2
		if sb >= 8 {
			p = 8
		} else if sb >= 4 {
			p = 4
		}
	}
	gateUp = map[int]string{8: "ferrite_moe_gv_gate_up_p8_u1", 4: "ferrite_moe_gv_gate_up_p4_u2", 2: "ferrite_moe_gv_gate_up_p2_u4"}[p]
	down = "ferrite_moe_gv_down_p8_u2"
	if k <= 4 {
		down = "ferrite_moe_gv_down_p4_u4"
	}
	return gateUp, sb, ceilDiv(slots, sb), down
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
