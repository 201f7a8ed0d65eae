//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/ferrite-llm/ferrite/kernels"
)

// moeConfig picks Experts' kernels for a few tokens. A new Backend takes
// it from the environment (moeConfigFromEnv), so one GPU run can compare;
// tests and benchmarks set it directly.
type moeConfig struct {
	v1       bool // FERRITE_MOE_KERNELS=v1: no register tiles, slot a pass up to moeFewTokens, sorted tiles above (as before them)
	pipe     int  // FERRITE_MOE_KERNELS=pipe, pipe16, piped, pipe16d: the streamed kernels (moe_pipe.go's pipeMode: warps a block | moePipeDyn) where they apply, from moeGTFrom tokens (or tiles slots); 0: above moeGTTokens only (pipeFor), nopipe (−1): never
	slots8   bool // up to 8 slots of an expert a pass in ferrite_moe_few_* (tests, benchmarks)
	few      int  // FERRITE_MOE_FEW: the most tokens the register tiles take (0: moeGTTokens)
	tiles    int  // FERRITE_MOE_TILES: the register tiles from this many slots, also below moeGTFrom tokens (0: from moeGTFrom tokens only)
	sb       int  // FERRITE_MOE_SB: the slots a register-tile block takes (0: enough blocks for twice the SMs)
	gt       int  // FERRITE_MOE_GT: the register tiles' gate/up rows a warp, 1, 2 or 4 (0: moeGTRows); down takes twice as many
	b1       int  // FERRITE_MOE_B1: 1 to 3 tokens as ferrite_moe_b1_* (moeB1Fused: one launch, moeB1Two: two; 0: off)
	b1Most   int  // the most tokens b1 takes (0: moeB1Tokens); from the environment 1 unless FERRITE_MOE_B1 is set
	combine1 bool // FERRITE_MOE_COMBINE=1: ferrite_moe_combine one block a token (combineParts)
	q1       bool // FERRITE_MOE_Q1=1: quantized experts' slot-a-pass down kernel one row a block (ferrite_moe_few_down_1_q1), not 4
	tcU4     bool // FERRITE_MOE_TC_U4=1: the tensor-core decode kernels' _u4 forms (4 chunks of weights in flight a warp, not 2)
	tc       int  // FERRITE_MOE_TC: the most tokens of bf16 experts the tensor-core decode kernels take (moe_tc.go); 0 none (a config made in a test), moeTCTokens from the environment
	tcFrom   int  // FERRITE_MOE_TC_FROM: the fewest tokens they take, at least moeTCMin; moeTCFrom from the environment
	tcShared bool // FERRITE_MOE_TC_SHARED=1: they take experts with a folded shared expert too (for the A/B; off by default)
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
		tiles: num("FERRITE_MOE_TILES"), combine1: os.Getenv("FERRITE_MOE_COMBINE") == "1", q1: os.Getenv("FERRITE_MOE_Q1") == "1"}
	c.tc, c.tcU4 = moeTCTokens, os.Getenv("FERRITE_MOE_TC_U4") == "1"
	if v, err := strconv.Atoi(os.Getenv("FERRITE_MOE_TC")); err == nil && v >= 0 {
		c.tc = v
	}
	c.tcFrom, c.tcShared = moeTCFrom, os.Getenv("FERRITE_MOE_TC_SHARED") == "1"
	if v := num("FERRITE_MOE_TC_FROM"); v > 0 {
		c.tcFrom = v
	}
	if r := num("FERRITE_MOE_GT"); r == 1 || r == 2 || r == 4 {
		c.gt = r
	}
	// By default one token runs ferrite_moe_b1 in two launches: GPU run 2
	// measured Qwen3-30B-A3B at batch 1 at 223 tok/s against 208–213
	// (BenchmarkMoEB1: 35.3 against 37.3 µs a layer), while 2 and 3 tokens
	// are faster through the slot-a-pass kernels. FERRITE_MOE_B1=N picks a
	// form for 1 to 3 tokens, 0 none.
	c.b1, c.b1Most = moeB1Two, 1
	if v, ok := os.LookupEnv("FERRITE_MOE_B1"); ok {
		if m, err := strconv.Atoi(v); err == nil && m == 0 {
			c.b1 = 0
		} else if err == nil && m >= moeB1Fused && m <= moeB1Two {
			c.b1, c.b1Most = m, moeB1Tokens
		}
	}
	return c
}

// Experts runs one token through ferrite_moe_b1 (expertsB1, below), the
// grouped GEMV of a slot a pass (ferrite_moe_few_*) for 2 to moeGTFrom − 1
// tokens, its register-tile form (ferrite_moe_gt_*)
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

// gtLaunch names the register tiles' kernels for c.gt and their weight
// rows a block (8 warps of R rows).
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

// combineParts is the blocks ferrite_moe_combine splits a token's columns
// over for n tokens of hidden columns: enough to give every SM two (each
// block sums whole columns as before, so the bits do not change), or one
// with FERRITE_MOE_COMBINE=1 (as before session 15).
func (b *Backend) combineParts(n, hidden int) int {
	if b.moe.combine1 {
		return 1
	}
	return max(1, min(ceilDiv(hidden, 256), ceilDiv(2*b.dev.SMs, n)))
}

// moeCombine launches ferrite_moe_combine for y (n, hidden) of row stride
// yStride from ye (n·k, hidden) with ids and w (n, k), a token's columns
// over parts blocks (combineParts).
func (d *Device) moeCombine(y uint64, yStride int, ye, ids, w uint64, n, k, hidden, parts int) error {
	return d.launch3L("ferrite_moe_combine", [3]uint32{uint32(n), uint32(parts), 1}, 256, 0, y, i32(yStride), ye, ids, w,
		i32(k), i32(hidden))
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

// The persistent grouped GEMV for 1 to moeB1Tokens tokens
// (src/ops_moe_b1.cu): one block of 512 threads a multiprocessor,
// every chosen expert's gate/up and down rows spread over all of them.
// moeB1Fused runs gate/up and down in one launch with a grid barrier
// between (each warp's first down weights asked for before it),
// moeB1Two as two launches, the down one asking for its first weights
// before its PDL wait. The bits are the slot-a-pass kernels' (and so the
// register tiles').
const (
	moeB1Fused  = 1
	moeB1Two    = 2
	moeB1Tokens = 3
	moeB1Slots  = 192       // n·k
	moeB1Smem   = 160 << 10 // the most shared memory for h (every slot's) a block takes
	moeB1Fixed  = 24 << 10  // the shared memory before h: the plan and each warp's products (src B1::kFixed)
	// the kernel's modes (src/ops_moe_b1.cu kB1*)
	moeB1ModeGateUp, moeB1ModeDown, moeB1ModeBoth = 1, 2, 3
)

func init() {
	bigSmemKernels = append(bigSmemKernels, "ferrite_moe_b1_1", "ferrite_moe_b1_3")
}

// moeB1Bar returns the device address of ferrite_moe_b1's grid barrier
// (two zeroed words, allocated on first use; each launch leaves them ready
// for the next).
func (b *Backend) moeB1Bar() (uint64, error) {
	if !b.moeBar.Valid() {
		t, err := b.Alloc(kernels.I32, 1, 2)
		if err != nil {
			return 0, err
		}
		b.moeBar = t
	}
	return dptr(b.moeBar), nil
}

// b1Fits reports whether ferrite_moe_b1 takes Experts of x (n, hidden)
// and k slots a token: 1 to moeB1Tokens tokens, bf16 experts, rows of
// 16-byte loads, h (n·k, inter) in shared memory.
func (b *Backend) b1Fits(x kernels.Tensor, n, k int, experts []kernels.Expert) bool {
	hidden, inter := experts[0].Down.Rows, experts[0].Down.Cols
	smem := n * k * inter * 4
	if n < 1 || n > moeB1Tokens || n*k > moeB1Slots || hidden%8 != 0 || inter%8 != 0 || x.Stride%4 != 0 || dptr(x)%16 != 0 ||
		smem > moeB1Smem || moeB1Fixed+smem > max(48<<10, b.dev.SmemOptIn) {
		return false
	}
	key := &experts[0]
	b.mu.Lock()
	ok, seen := b.b1BF16[key]
	b.mu.Unlock()
	if !seen { // once per expert list: every weight bf16
		ok = true
		for _, ex := range experts {
			if ex.Down.DType != kernels.BF16 || (ex.GateUp != nil && ex.GateUp.DType != kernels.BF16) ||
				(ex.GateUp == nil && (ex.Gate.DType != kernels.BF16 || ex.Up.DType != kernels.BF16)) {
				ok = false
				break
			}
		}
		b.mu.Lock()
		if b.b1BF16 == nil {
			b.b1BF16 = map[*kernels.Expert]bool{}
		}
		b.b1BF16[key] = ok
		b.mu.Unlock()
	}
	return ok
}

// expertsB1 queues Experts (dst, x, ids, w as runExperts has them, h the
// (n·k, inter) scratch) as ferrite_moe_b1_* when b.moe.b1 asks for it and
// b1Fits, and reports whether it did.
func (b *Backend) expertsB1(dst, x, ids, w kernels.Tensor, experts []kernels.Expert, table *Buffer, h uint64, limit float32) bool {
	n, k := x.Rows, ids.Cols
	if b.moe.b1 == 0 || (b.moe.b1Most > 0 && n > b.moe.b1Most) || !b.b1Fits(x, n, k, experts) {
		return false
	}
	hidden, inter := experts[0].Down.Rows, experts[0].Down.Cols
	name, threads, fixed := "ferrite_moe_b1_1", 512, moeB1Fixed
	if n > 1 {
		name = "ferrite_moe_b1_3"
	}
	smem, xp := fixed+n*k*inter*4, dptr(x)
	bar, err := b.moeB1Bar()
	if err != nil {
		b.fail(err)
		return true
	}
	// The expert table goes to shared memory before the PDL wait where it
	// fits in h's room, or in moeB1Smem.
	tbytes, tcopy := 3*len(experts)*expertDescBytes, 0
	if tbytes <= moeB1Smem && fixed+tbytes <= max(48<<10, b.dev.SmemOptIn) {
		tcopy = 1
		smem = max(smem, fixed+tbytes)
	}
	grid, y, ip, wp := uint32(b.dev.SMs), dptr(dst), dptr(ids), dptr(w)
	args := func(mode, tc int) []uint64 {
		return []uint64{i32(mode), y, i32(dst.Stride), h, xp, i32(x.Stride), ip, wp, table.ptr, i32(len(experts)),
			i32(n), i32(k), i32(inter), i32(hidden), f32(limit), bar, i32(tc)}
	}
	fused := b.moe.b1 == moeB1Fused
	guSmem, block := uint32(fixed+tcopy*tbytes), uint32(threads)
	b.queue(func(d *Device) error {
		if fused {
			return d.launchL(name, grid, block, uint32(smem), args(moeB1ModeBoth, tcopy)...)
		}
		if err := d.launchL(name, grid, block, guSmem, args(moeB1ModeGateUp, tcopy)...); err != nil {
			return err
		}
		return d.launchL(name, grid, block, uint32(smem), args(moeB1ModeDown, 0)...)
	})
	return true
}
