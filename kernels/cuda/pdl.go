//go:build linux && (amd64 || arm64)

package cuda

import (
	"os"
	"unsafe"
)

// Programmatic dependent launch (PDL, compute capability 9.0): a kernel
// launched with the programmatic stream serialization attribute may have
// its blocks scheduled while the kernel before it on the stream drains;
// the kernel itself waits (FERRITE_PDL_WAIT, src/common.cu, its first
// statement) until that kernel has completed. What it saves is the launch
// latency and ramp-up between the step's small back-to-back kernels, in
// eager launches and in captured graphs (programmatic edges) alike.

// pdlKernels are the kernels that start with FERRITE_PDL_WAIT() (checked by
// TestPDLKernelsWait): only they may get the attribute. They are the
// kernels of a decode step (ferrite_attn_combine aside: it launches
// without, after the attention kernel has completed), the MoE router and
// grouped experts included.
var pdlKernels = map[string]bool{
	"ferrite_gemv_f32_1": true, "ferrite_gemv_bf16_1": true, "ferrite_gemv_f16_1": true,
	"ferrite_gemv_f32_x": true, "ferrite_gemv_bf16_x": true, "ferrite_gemv_f16_x": true,
	"ferrite_gemv_f32_r4": true, "ferrite_gemv_f32_r8": true, "ferrite_gemv_bf16_r4": true, "ferrite_gemv_bf16_r8": true,
	"ferrite_gemv_f16_r4": true, "ferrite_gemv_f16_r8": true,
	"ferrite_gemv_swiglu_f32_r4": true, "ferrite_gemv_swiglu_f32_r8": true, "ferrite_gemv_swiglu_bf16_r4": true,
	"ferrite_gemv_swiglu_bf16_r8": true, "ferrite_gemv_swiglu_f16_r4": true, "ferrite_gemv_swiglu_f16_r8": true,
	"ferrite_gemv_swiglu_f32": true, "ferrite_gemv_swiglu_bf16": true, "ferrite_gemv_swiglu_f16": true,
	"ferrite_gemv_norm_f32": true, "ferrite_gemv_norm_bf16": true, "ferrite_gemv_norm_f16": true,
	"ferrite_gemv_addnorm_f32": true, "ferrite_gemv_addnorm_bf16": true, "ferrite_gemv_addnorm_f16": true,
	"ferrite_gemv_norm_swiglu_f32": true, "ferrite_gemv_norm_swiglu_bf16": true, "ferrite_gemv_norm_swiglu_f16": true,
	"ferrite_embed": true, "ferrite_gather_rows": true, "ferrite_add_rmsnorm": true, "ferrite_prepare_qkv": true,
	// cuBLASLt's input conversions (they follow the norm or attention
	// kernels; its epilogues, which follow its GEMMs, launch without)
	"ferrite_f32_to_bf16x2": true, "ferrite_f32_to_bf16": true, "ferrite_rmsnorm_bf16x2": true,
	"ferrite_attn_f32_1": true, "ferrite_attn_f32_2": true, "ferrite_attn_f32_4": true, "ferrite_attn_f32_8": true,
	"ferrite_attn_bf16_1": true, "ferrite_attn_bf16_2": true, "ferrite_attn_bf16_4": true, "ferrite_attn_bf16_8": true,
	"ferrite_attn_f32_1_g4": true, "ferrite_attn_f32_2_g4": true, "ferrite_attn_f32_4_g4": true, "ferrite_attn_f32_8_g4": true,
	"ferrite_attn_bf16_1_g4": true, "ferrite_attn_bf16_2_g4": true, "ferrite_attn_bf16_4_g4": true, "ferrite_attn_bf16_8_g4": true,
	"ferrite_attn_qkv_f32_1": true, "ferrite_attn_qkv_f32_2": true, "ferrite_attn_qkv_f32_4": true, "ferrite_attn_qkv_f32_8": true,
	"ferrite_attn_qkv_bf16_1": true, "ferrite_attn_qkv_bf16_2": true, "ferrite_attn_qkv_bf16_4": true, "ferrite_attn_qkv_bf16_8": true,
	"ferrite_route": true, "ferrite_moe_combine": true, "ferrite_moe_few_gate_up_1": true, "ferrite_moe_few_gate_up_8": true,
	"ferrite_moe_few_down_1": true, "ferrite_moe_few_down_8": true, "ferrite_moe_gt_gate_up_r1": true, "ferrite_moe_gt_gate_up_r2": true,
	"ferrite_moe_gt_gate_up_r4": true, "ferrite_moe_gt_down_r2": true, "ferrite_moe_gt_down_r4": true, "ferrite_moe_gt_down_r8": true,
	"ferrite_moe_b1_1": true, "ferrite_moe_b1_3": true, "ferrite_moe_few_gate_up_1_q": true,
	"ferrite_moe_few_down_1_q": true, "ferrite_moe_gt_gate_up_r4_q": true, "ferrite_moe_gt_down_r8_q": true,
	"ferrite_moe_few_down_1_q1": true, "ferrite_moe_few_gate_up_1_q8": true, "ferrite_moe_few_down_1_q8": true,
	"ferrite_moe_mmq_gate_up": true, "ferrite_moe_mmq_down": true,
}

// pdlEnabled is whether a new Device of compute capability major uses PDL:
// on 9.0 and newer with a driver that has cuLaunchKernelEx, unless
// FERRITE_CUDA_PDL=0 (a switch for comparing).
func pdlEnabled(major int) bool {
	return major >= 9 && driver.cuLaunchKernelEx != 0 && os.Getenv("FERRITE_CUDA_PDL") != "0"
}

// SetPDL turns programmatic dependent launch on or off for later launches
// (where the GPU and driver support it) and reports whether it is on: a
// switch for benchmarks and tests.
func (d *Device) SetPDL(on bool) bool {
	d.do(func() error {
		d.pdl = on && d.prof == nil && d.Major >= 9 && driver.cuLaunchKernelEx != 0
		return nil
	})
	return d.pdl
}

// Weight prefetch: the split GEMVs (gemv.cu's gemv_split, gemv_split_rows,
// gemv_norm_split, ops.cu's gemv_swiglu and gemv_norm_swiglu) take an
// argument pf; each of the grid's first pf blocks first asks L2 for its
// weight rows (prefetch.global.L2) and only then waits for the kernel
// before it. A
// step's kernels never write weights, so under PDL the weight stream of
// the next product starts while the current kernel drains: the small
// kernels between products (norms, attention) and the products' tails
// overlap with it. It is off by default: GPU run 2 measured the bare
// GEMV step 0.7 ms slower with it (4.49 against 3.79 ms); FERRITE_CUDA_PREFETCH=1
// turns it on (SetPrefetch).

// prefetchBlocks is the split GEMVs' prefetch argument pf: with the
// prefetch on, the blocks of a first wave (8 of 256 threads a
// multiprocessor), which are the ones that can be resident before the
// kernel before has finished; the later blocks' own loads follow their
// prefetch at once, so it would only add requests. 0 with it off.
func (d *Device) prefetchBlocks() int {
	if !d.prefetch {
		return 0
	}
	return 8 * d.SMs
}

// SetPrefetch turns the GEMVs' weight prefetch on or off for later
// launches: a switch for benchmarks and tests.
func (d *Device) SetPrefetch(on bool) {
	d.do(func() error { d.prefetch = on; return nil })
}

// launchConfig is CUlaunchConfig.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	smem                   uint32
	_                      uint32
	stream                 uintptr
	attrs                  uintptr // *launchAttr
	numAttrs               uint32
	_                      uint32
}

// launchAttr is CUlaunchAttribute: an id and a 64-byte value union.
type launchAttr struct {
	id  uint32
	_   uint32
	val [64]byte
}

// attrProgrammaticSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const attrProgrammaticSerialization = 6

// launchPDL launches fn, its arguments already in d.args, through
// cuLaunchKernelEx with programmatic stream serialization allowed.
func (d *Device) launchPDL(name string, fn uintptr, grid [3]uint32, block, smem uint32) error {
	a := d.args
	a.attr = launchAttr{id: attrProgrammaticSerialization}
	a.attr.val[0] = 1 // programmaticStreamSerializationAllowed
	a.cfg = launchConfig{gridX: grid[0], gridY: grid[1], gridZ: grid[2], blockX: block, blockY: 1, blockZ: 1, smem: smem,
		stream: d.stream, attrs: uintptr(unsafe.Pointer(&a.attr)), numAttrs: 1}
	return check("cuLaunchKernelEx "+name, call(driver.cuLaunchKernelEx, uintptr(unsafe.Pointer(&a.cfg)), fn,
		uintptr(unsafe.Pointer(&a.ptrs[0])), 0))
}
