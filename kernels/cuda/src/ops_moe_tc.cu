// Grouped bf16 experts for decode batches on the tensor cores (kernels/cuda
// moe_tc.go, FERRITE_MOE_TC): the register tiles (ops_moe.cu
// ferrite_moe_gt_*) and the streamed kernels (ops_moe_pipe.cu) widen every
// bf16 weight to float32 once per slot and multiply on the CUDA cores,
// which keeps them at 2.3–2.6 TB/s however their loops are arranged
// (BENCHMARKS.md, "MoE decode: what limits the register tiles"). Here the
// weights go from global memory straight into mma.sync fragments, one
// instruction for 16 weight rows × 16 columns × 8 slots, so a warp spends
// its issue on loads.
//
// Work. ferrite_moe_sort's tiles (ops_moe.cu: up to kTileM slots of one
// expert, tile_slots). Block (x, g) takes tile g and 4 warps of weight
// rows; a warp owns two A tiles of 16 rows — gate/up: gate rows [r0, r0 +
// 16) and the same rows of up, so the SwiGLU is the epilogue's; down: rows
// [r0, r0 + 32) — and every slot of the tile, kMtcSub · 8 at a pass (B
// tiles of 8 slots, m16n8k16).
//
// Fragments. A lane (g = lane / 4, t = lane % 4) loads 16 bytes of a row,
// columns [c + 8t, c + 8t + 8) of a 32-column chunk, for rows g and g + 8
// of each A tile, and the same 16 bytes of its slot g's input: words 0 and
// 1 are the first mma's k = 2t, 2t + 1 and 2t + 8, 2t + 9, words 2 and 3
// the second's. The chunk's columns are thus multiplied in another order
// than memory's, the same for A and B, so every product meets its partner.
//
// Precision. The input comes split into three bf16 terms (x = hi + mid +
// lo exactly, as moe_mma splits it; ferrite_bf16_terms3 for x, the
// gate/up epilogue for h), each multiplied into the float32 accumulator,
// so every product is exact as on the CUDA cores and only the order of the
// sums differs. A slot's outputs depend on its own input and the weights
// alone, in one order whatever the other slots: a token's bits do not
// depend on the batch (from moeTCFrom tokens on). They are not the
// one-token kernels' bits, so kernels/cuda keeps these kernels out of the
// row-exact mode (a speculative verification).
#include <stdint.h>

namespace {

constexpr int kMtcWarps = 4;   // warps a block (kernels/cuda moeTCWarps)
constexpr int kMtcSub = 4;     // 8-slot B tiles a pass

// bf16_terms3 splits v into three bf16 terms, hi = bf16(v), mid =
// bf16(v − hi), lo = bf16(v − hi − mid) (each difference exact in
// float32), as moe_mma does.
__device__ inline void bf16_terms3(float v, uint16_t (&t)[3]) {
#pragma unroll
    for (int i = 0; i < 3; i++) {
        t[i] = f32_to_bf16(v);
        v = __fsub_rn(v, __uint_as_float(uint32_t(t[i]) << 16));
    }
}

// moe_tc: see the file's comment. in is the input's three terms, planes of
// plane elements, a row (token for GU, slot for down) of kdim; GU writes
// the SwiGLU's terms into ht (three planes of slots × nout), down the
// slots' outputs into ye (slots, nout). nout is a multiple of 16 (GU) or
// 32 (down), kdim of 32, rows 16-byte aligned. A warp loads U chunks of
// 32 columns of its weights (4U 16-byte loads a lane) before it
// multiplies any: 2 by default, 4 in the _u4 kernels (FERRITE_MOE_TC_U4),
// for an A/B of bytes in flight against registers.
template <bool GU, int U>
__device__ void moe_tc(float* __restrict__ ye, uint16_t* __restrict__ ht, size_t out_plane, int nout,
                       const uint16_t* __restrict__ in, size_t plane, int kdim, const int* off, const int* tiles,
                       const int* perm, const MatDesc* table, int experts, int k, float limit) {
    __shared__ int row_in[kTileM], slot[kTileM];
    const int g = blockIdx.y;
    if (g >= tiles[experts]) return;
    const int e = tile_slots<GU>(slot, row_in, g, off, tiles, perm, experts, k);
    const int cnt = min(off[e + 1] - off[e] - (g - tiles[e]) * kTileM, kTileM);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    constexpr int RW = GU ? 16 : 32;  // output rows a warp
    const int r0 = (blockIdx.x * kMtcWarps + warp) * RW;
    if (r0 >= nout) return;  // no barrier follows
    // wr[2q + h]: A tile q's row r0 + gid + 8h (gate/up: q picks the view).
    const uint8_t* wr[4];
    const float* unused;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int q = i >> 1, r = r0 + gid + 8 * (i & 1) + (GU ? 0 : 16 * q);
        wr[i] = mat_row(table[3 * e + (GU ? q : 2)], r, &unused) + size_t(8 * tig) * 2;
    }
    for (int base = 0; base < cnt; base += 8 * kMtcSub) {
        const int ns = min(kMtcSub, (cnt - base + 7) / 8);  // B tiles with slots, the same in every lane
        const uint16_t* xr[kMtcSub];                        // this lane's slot's input row (column gid of B tile j)
        float acc[kMtcSub][2][4];
#pragma unroll
        for (int j = 0; j < kMtcSub; j++) {
            const int m = base + 8 * j + gid, r = m < cnt ? row_in[m] : -1;
            xr[j] = r >= 0 ? in + size_t(r) * kdim + 8 * tig : nullptr;
#pragma unroll
            for (int q = 0; q < 2; q++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[j][q][c] = 0.f;
        }
        for (int c0 = 0; c0 < kdim; c0 += 32 * U) {
            uint4 a[U][4];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    a[u][i] = c0 + 32 * u < kdim ? __ldg(reinterpret_cast<const uint4*>(wr[i] + size_t(c0 + 32 * u) * 2))
                                                 : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c0 + 32 * u >= kdim) break;
#pragma unroll
                for (int j = 0; j < kMtcSub; j++) {
                    if (j >= ns) break;
#pragma unroll
                    for (int term = 0; term < 3; term++) {
                        const uint4 b = xr[j] ? __ldg(reinterpret_cast<const uint4*>(xr[j] + term * plane + c0 + 32 * u))
                                              : make_uint4(0, 0, 0, 0);
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            const uint32_t f0[4] = {a[u][2 * q].x, a[u][2 * q + 1].x, a[u][2 * q].y, a[u][2 * q + 1].y};
                            const uint32_t f1[4] = {a[u][2 * q].z, a[u][2 * q + 1].z, a[u][2 * q].w, a[u][2 * q + 1].w};
                            mma_bf16(acc[j][q], f0, b.x, b.y);
                            mma_bf16(acc[j][q], f1, b.z, b.w);
                        }
                    }
                }
            }
        }
        // acc[j][q][2h + c]: A tile q's row gid + 8h by tile slot base +
        // 8j + 2·tig + c.
#pragma unroll
        for (int j = 0; j < kMtcSub; j++) {
            if (j >= ns) break;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int m = base + 8 * j + 2 * tig + c;
                if (m >= cnt) continue;
                const size_t s = size_t(slot[m]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = r0 + gid + 8 * h;
                    if (GU) {
                        uint16_t t[3];
                        bf16_terms3(swiglu_clamp1(acc[j][0][2 * h + c], acc[j][1][2 * h + c], limit), t);
#pragma unroll
                        for (int term = 0; term < 3; term++) ht[term * out_plane + s * nout + r] = t[term];
                    } else {
                        ye[s * nout + r] = acc[j][0][2 * h + c];
                        ye[s * nout + r + 16] = acc[j][1][2 * h + c];
                    }
                }
            }
        }
    }
}

}  // namespace

// x (rows, cols; row stride stride) split into three bf16 terms
// (bf16_terms3): out holds three planes of rows × cols, hi, mid, lo.
// Launch: any 1-D grid of 256 threads; cols and stride multiples of 4.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_bf16_terms3(uint16_t* __restrict__ out, const float* __restrict__ x, int stride, int rows, int cols) {
    FERRITE_PDL_WAIT();
    const size_t plane = size_t(rows) * cols, quads = plane / 4;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < quads; i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = 4 * i / cols, c = 4 * i % cols;
        const float4 v = __ldg(reinterpret_cast<const float4*>(x + r * stride + c));
        const float f[4] = {v.x, v.y, v.z, v.w};
        uint16_t t[4][3];
#pragma unroll
        for (int u = 0; u < 4; u++) bf16_terms3(f[u], t[u]);
#pragma unroll
        for (int term = 0; term < 3; term++)
            *reinterpret_cast<uint2*>(out + term * plane + 4 * i) =
                make_uint2(t[0][term] | uint32_t(t[1][term]) << 16, t[2][term] | uint32_t(t[3][term]) << 16);
    }
}

// Gate/up: ht (three planes of slots × inter bf16 terms of each slot's
// SwiGLU) from xt (three planes of n × hidden, ferrite_bf16_terms3's).
// Launch: grid (ceil(inter / 64), ceil(slots / kTileM) + experts), 128
// threads; every gate, up and down weight bf16, hidden and inter multiples
// of 32.
#define FERRITE_MOE_TC_GATE_UP(name, U)                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                                \
        name(uint16_t* ht, int slots, int inter, const uint16_t* xt, int n, int hidden, const int* off,               \
             const int* tiles, const int* perm, const MatDesc* table, int experts, int k, float limit) {              \
        FERRITE_PDL_WAIT();                                                                                          \
        moe_tc<true, U>(nullptr, ht, size_t(slots) * inter, inter, xt, size_t(n) * hidden, hidden, off, tiles, perm, \
                        table, experts, k, limit);                                                                   \
    }
FERRITE_MOE_TC_GATE_UP(ferrite_moe_tc_gate_up, 2)
FERRITE_MOE_TC_GATE_UP(ferrite_moe_tc_gate_up_u4, 4)

// Down: ye (slots, hidden) from ht. Launch: grid (ceil(hidden / 128),
// ceil(slots / kTileM) + experts), 128 threads.
#define FERRITE_MOE_TC_DOWN(name, U)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128)                                                                   \
        name(float* ye, int hidden, const uint16_t* ht, int slots, int inter, const int* off, const int* tiles,          \
             const int* perm, const MatDesc* table, int experts, int k) {                                               \
        FERRITE_PDL_WAIT();                                                                                             \
        moe_tc<false, U>(ye, nullptr, 0, hidden, ht, size_t(slots) * inter, inter, off, tiles, perm, table, experts, k, \
                         0.f);                                                                                          \
    }
FERRITE_MOE_TC_DOWN(ferrite_moe_tc_down, 2)
FERRITE_MOE_TC_DOWN(ferrite_moe_tc_down_u4, 4)
