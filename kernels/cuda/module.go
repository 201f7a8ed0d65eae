//go:build linux && (amd64 || arm64)

package cuda

import (
	_ "embed"
	"fmt"
	"os"
	"unsafe"
)

// fatbin is every kernel in src/, built by tools/cuda/build_fatbin.sh.
//
//go:embed ferrite.fatbin
var fatbin []byte

// kernelNames are the entry points loadModule resolves.
var kernelNames = []string{
	"ferrite_gemv_f32_1", "ferrite_gemv_f32_8", "ferrite_gemv_bf16_1", "ferrite_gemv_bf16_8",
	"ferrite_gemv_f16_1", "ferrite_gemv_f16_8", "ferrite_gemv_f8e4m3_1", "ferrite_gemv_f8e4m3_8",
	"ferrite_gemv_f32_x", "ferrite_gemv_bf16_x", "ferrite_gemv_f16_x",
	// The decode step's fused and row-block kernels (src/gemv.cu, src/ops.cu).
	"ferrite_gemv_f32_r4", "ferrite_gemv_f32_r8", "ferrite_gemv_bf16_r4", "ferrite_gemv_bf16_r8",
	"ferrite_gemv_f16_r4", "ferrite_gemv_f16_r8",
	"ferrite_gemv_swiglu_f32", "ferrite_gemv_swiglu_bf16", "ferrite_gemv_swiglu_f16",
	"ferrite_gemv_swiglu_f32_r4", "ferrite_gemv_swiglu_f32_r8", "ferrite_gemv_swiglu_bf16_r4",
	"ferrite_gemv_swiglu_bf16_r8", "ferrite_gemv_swiglu_f16_r4", "ferrite_gemv_swiglu_f16_r8",
	"ferrite_gemv_norm_f32", "ferrite_gemv_norm_bf16", "ferrite_gemv_norm_f16",
	"ferrite_gemv_addnorm_f32", "ferrite_gemv_addnorm_bf16", "ferrite_gemv_addnorm_f16",
	"ferrite_gemv_norm_swiglu_f32", "ferrite_gemv_norm_swiglu_bf16", "ferrite_gemv_norm_swiglu_f16",
	"ferrite_swiglu_cat", "ferrite_add_halves_swiglu", "ferrite_prepare_qkv", "ferrite_prepare_qkv_halves",
	"ferrite_rmsnorm_f32", "ferrite_f32_to_bf16", "ferrite_fill_bf16",
	// The op set (src/ops.cu).
	"ferrite_swiglu", "ferrite_add_bias", "ferrite_f32_to_bf16x2", "ferrite_add_halves", "ferrite_copy_rows", "ferrite_embed", "ferrite_gather_rows",
	"ferrite_add_rmsnorm", "ferrite_rmsnorm_bf16x2", "ferrite_halves_rmsnorm_bf16x2", "ferrite_rope", "ferrite_store_kv",
	"ferrite_attn_f32_1", "ferrite_attn_f32_2", "ferrite_attn_f32_4", "ferrite_attn_f32_8",
	"ferrite_attn_bf16_1", "ferrite_attn_bf16_2", "ferrite_attn_bf16_4", "ferrite_attn_bf16_8",
	"ferrite_attn_f32_1_g4", "ferrite_attn_f32_2_g4", "ferrite_attn_f32_4_g4", "ferrite_attn_f32_8_g4",
	"ferrite_attn_bf16_1_g4", "ferrite_attn_bf16_2_g4", "ferrite_attn_bf16_4_g4", "ferrite_attn_bf16_8_g4",
	"ferrite_attn_qkv_f32_1", "ferrite_attn_qkv_f32_2", "ferrite_attn_qkv_f32_4", "ferrite_attn_qkv_f32_8",
	"ferrite_attn_qkv_bf16_1", "ferrite_attn_qkv_bf16_2", "ferrite_attn_qkv_bf16_4", "ferrite_attn_qkv_bf16_8",
	"ferrite_attn_combine", "ferrite_prefill_attn_f32_64_64", "ferrite_prefill_attn_f32_128_64",
	"ferrite_prefill_attn_bf16_64_64", "ferrite_prefill_attn_bf16_128_64", "ferrite_prefill_attn_f32_64_128",
	"ferrite_prefill_attn_f32_128_128", "ferrite_prefill_attn_bf16_64_128", "ferrite_prefill_attn_bf16_128_128",
	// Mixture of experts (src/ops_moe.cu).
	"ferrite_route", "ferrite_moe_combine", "ferrite_moe_few_gate_up_1", "ferrite_moe_few_gate_up_8",
	"ferrite_moe_few_down_1", "ferrite_moe_few_down_8", "ferrite_moe_sort", "ferrite_moe_tile_gate_up", "ferrite_moe_tile_down",
	"ferrite_moe_mma_gate_up", "ferrite_moe_mma_down", "ferrite_moe_gt_gate_up_r1", "ferrite_moe_gt_gate_up_r2", "ferrite_moe_gt_gate_up_r4", "ferrite_moe_gt_down_r2",
	"ferrite_moe_gt_down_r4", "ferrite_moe_gt_down_r8", "ferrite_moe_b1_1", "ferrite_moe_b1_3",
	// the forms that also read experts in GGML blocks (src/ops_common_quant.cu)
	"ferrite_moe_few_gate_up_1_q", "ferrite_moe_few_down_1_q",
	"ferrite_moe_gt_gate_up_r4_q", "ferrite_moe_gt_down_r8_q", "ferrite_moe_tile_gate_up_q", "ferrite_moe_tile_down_q",
	"ferrite_moe_qdecode", "ferrite_moe_few_down_1_q1", "ferrite_moe_few_gate_up_1_q8", "ferrite_moe_few_down_1_q8",
	"ferrite_moe_mmq_gate_up", "ferrite_moe_mmq_down",
	// Random weights (src/randfill.cu).
	"ferrite_random_fill",
}

// loadModule loads the fatbin (or the file FERRITE_CUDA_FATBIN names, for
// trying a freshly built one before it is committed) and resolves every
// kernel.
func (d *Device) loadModule() error {
	image := fatbin
	if p := os.Getenv("FERRITE_CUDA_FATBIN"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("cuda: FERRITE_CUDA_FATBIN: %w", err)
		}
		image = b
	}
	if len(image) == 0 {
		return fmt.Errorf("cuda: the embedded fatbin is empty; build it with tools/cuda/build_fatbin.sh")
	}
	if err := check("cuModuleLoadData", call(driver.cuModuleLoadData, uintptr(unsafe.Pointer(&d.mod)), uintptr(unsafe.Pointer(&image[0])))); err != nil {
		return fmt.Errorf("%w (GPU %s, sm_%d%d)", err, d.Name, d.Major, d.Minor)
	}
	d.fns = make(map[string]uintptr, len(kernelNames))
	for _, name := range kernelNames {
		var f uintptr
		cname := cstring(name)
		if err := check("cuModuleGetFunction "+name, call(driver.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), d.mod, uintptr(unsafe.Pointer(&cname[0])))); err != nil {
			return err
		}
		d.fns[name] = f
	}
	return d.raiseSmem()
}

// bigSmemKernels are the kernels that may take more than 48 KiB of dynamic
// shared memory: loadModule raises their limit to the device's opt-in
// maximum (Device.SmemOptIn).
var bigSmemKernels []string

// raiseSmem sets SmemOptIn and raises bigSmemKernels' dynamic shared
// memory limit to it, less the kernel's static shared memory (the driver
// refuses a limit whose sum with it passes the opt-in maximum; a kernel
// with static shared memory then takes up to SmemOptIn less that).
// Without cuFuncSetAttribute, or when the driver refuses, SmemOptIn stays
// 0 (the ops then take their other kernels).
func (d *Device) raiseSmem() error {
	if driver.cuFuncSetAttribute == 0 {
		return nil
	}
	optIn, err := d.attribute(attrSmemOptIn)
	if err != nil {
		return err
	}
	const (
		staticSmem     = 1 // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
		maxDynamicSmem = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	)
	for _, name := range bigSmemKernels {
		var static int32
		if driver.cuFuncGetAttribute != 0 &&
			check("cuFuncGetAttribute "+name, call(driver.cuFuncGetAttribute, uintptr(unsafe.Pointer(&static)), staticSmem, d.fns[name])) != nil {
			return nil
		}
		if check("cuFuncSetAttribute "+name, call(driver.cuFuncSetAttribute, d.fns[name], maxDynamicSmem, uintptr(optIn-int(static)))) != nil {
			return nil
		}
	}
	d.SmemOptIn = optIn
	return nil
}

// launchL queues kernel name on the stream with a 1-D grid. Each argument
// is one kernel parameter: device pointers and 64-bit integers as they are,
// 32-bit integers and floats in the low four bytes (see i32, f32).
func (d *Device) launchL(name string, grid, block, smem uint32, args ...uint64) error {
	return d.launch3L(name, [3]uint32{grid, 1, 1}, block, smem, args...)
}

// launch3L is launchL with a 3-D grid.
func (d *Device) launch3L(name string, grid [3]uint32, block, smem uint32, args ...uint64) error {
	fn := d.fns[name]
	if fn == 0 {
		return fmt.Errorf("cuda: no kernel %s", name)
	}
	if len(args) > len(d.args.vals) {
		return fmt.Errorf("cuda: %s: %d arguments, at most %d", name, len(args), len(d.args.vals))
	}
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return nil
	}
	if d.trace != nil {
		*d.trace = append(*d.trace, uint64(fn), uint64(grid[0]), uint64(grid[1]), uint64(grid[2]),
			uint64(block)<<32|uint64(smem), uint64(len(args)))
		*d.trace = append(*d.trace, args...)
		return nil
	}
	copy(d.args.vals[:], args)
	if d.prof != nil {
		return d.prof.spanL(d, profKey{name: name, dims: grid, block: block}, func() error {
			return d.launchNowL(name, fn, grid, block, smem)
		})
	}
	return d.launchNowL(name, fn, grid, block, smem)
}

// launchNowL launches kernel fn (name) with the arguments in d.args.
func (d *Device) launchNowL(name string, fn uintptr, grid [3]uint32, block, smem uint32) error {
	if d.pdl && pdlKernels[name] {
		return d.launchPDL(name, fn, grid, block, smem)
	}
	return check("cuLaunchKernel "+name, call(driver.cuLaunchKernel, fn,
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]), uintptr(block), 1, 1, uintptr(smem), d.stream,
		uintptr(unsafe.Pointer(&d.args.ptrs[0])), 0))
}

// i32 and f32 encode 32-bit kernel parameters for launchL.
func i32(v int) uint64     { return uint64(uint32(int32(v))) }
func f32(v float32) uint64 { return uint64(*(*uint32)(unsafe.Pointer(&v))) }

// b32 encodes a bool as a 32-bit integer parameter (0 or 1).
func b32(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}
