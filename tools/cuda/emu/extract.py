#!/usr/bin/env python3
"""Prints the definitions tools/cuda/emu's harness needs from kernels/cuda/src
(the helpers ops_decode.cu, or with "linattn" the linear-attention files,
"quant" the quantized products, "quant_mla" ops_mla.cu's kernel over
a GGUF's blocks (printed after ops_common_quant.cu), "moe" ops_moe_tc.cu and moe_mma, use
from the files sorted before them), by their
first line: a definition runs to the next line that is "}" or "};", a
one-line one (or a constexpr line) ends at its ";". A "template <...>" or
'extern "C"' line just before is kept (a kernel is named by its indented
second line)."""
import sys

src = sys.argv[1]
suite = sys.argv[2] if len(sys.argv) > 2 else "decode"
want = {
    "convert.cu": ["__device__ inline uint16_t f32_to_bf16("],
    "gemv.cu": ["constexpr int kWarpsPerBlock", "struct F32W {", "struct BF16W {", "__device__ inline float warp_sum(",
                "__device__ inline double warp_sum_f64(", "__device__ inline float dot_x(",
                "__device__ inline void store(",
                "constexpr int kSplit =", "__device__ inline void split_prefetch(",
                "__device__ float split_dot(", "__device__ inline float split_total(", "__device__ void gemv_split("],
    "ops.cu": ["__device__ inline float warp_max(", "struct PrepArgs {", "__device__ bool prep_norm(",
               "__device__ inline void prep_rotate(", "__device__ inline void head_put("],
}
if suite == "linattn":  # what ops_linattn.cu and ops_linattn_chunk.cu use
    want = {
        "gemv.cu": ["__device__ inline double warp_sum_f64("],
        "ops_common.cu": ["__device__ inline double block_sum_f64("],
    }
if suite == "quant":  # what ops_common_quant.cu and ops_quant.cu use
    want = {
        "convert.cu": ["__device__ inline uint16_t f32_to_bf16("],
        "gemv.cu": ["__device__ inline float warp_sum(", "__device__ inline void store("],
        "ops.cu": ["__device__ inline float swiglu1(", "__device__ inline float swiglu_clamp1(", "__device__ inline int embed_id("],
        "ops_common.cu": ["struct MatDesc {"],
        "ops_moe.cu": ["constexpr int kTileM =", "__device__ int tile_slots("],
    }
if suite == "quant_mla":  # after ops_common_quant.cu: the MLA projection over a GGUF's blocks
    want = {"ops_mla.cu": ["__device__ __forceinline__ void mla_proj_q("]}
if suite == "moe":  # what ops_moe_tc.cu uses
    want = {
        "convert.cu": ["__device__ inline uint16_t f32_to_bf16("],
        "ops.cu": ["constexpr int kF32 =", "__device__ inline float swiglu1(", "__device__ inline float swiglu_clamp1("],
        "ops_common.cu": ["struct MatDesc {"],
        "ops_moe.cu": ["__device__ inline const uint8_t* mat_row(", "constexpr int kTileM =", "constexpr int kTileN =",
                       "__device__ int tile_slots(", "constexpr int kMmaPad =", "constexpr int kMmaTerms =",
                       "__device__ void moe_mma("],
    }
out = []
for f, starts in want.items():
    lines = open(f"{src}/{f}").read().split("\n")
    for st in starts:
        idx = [i for i, l in enumerate(lines) if l.startswith(st)]
        if len(idx) != 1:
            sys.exit(f"extract: {f}: {st!r} found {len(idx)} times")
        i = idx[0]
        if i > 0 and (lines[i - 1].startswith("template <") or lines[i - 1].startswith('extern "C"')):
            i -= 1
        j = idx[0]
        if not lines[j].rstrip().endswith(";") and not lines[j].startswith("constexpr "):
            while lines[j] not in ("}", "};"):
                j += 1
        out += lines[i:j + 1] + [""]
print("namespace {\n" + "\n".join(out) + "}  // namespace")
