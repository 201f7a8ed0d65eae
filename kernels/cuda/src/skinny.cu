// The skinny GEMM of decode batches: y (n, R) = x (n, K) · Wᵀ for 2 ≤ n ≤ 64
// rows of float32 x and a bf16 weight W (R, K), on tensor cores
// (mma.sync m16n8k16, float32 accumulation) with the weight streamed from
// memory once. The weight is the MMA's A side (16 weight rows a tile) and
// x its B side (8 rows of x a tile, NT tiles: n ≤ 8·NT). x is split into
// two bf16 terms, hi = bf16(x) and lo = bf16(x − hi) (the difference exact
// in float32), both multiplied into the same float32 sums: about
// 2⁻¹⁷·Σ|x·w| from the float32 product, as the cuBLASLt path (opset.go's
// linearSplit), in one kernel instead of a split kernel, the GEMM and an
// epilogue kernel (and, for SwiGLULinear, a fourth).
//
// Layout. A block is 8 warps and 256 weight rows (warp w: two m16 tiles).
// K is read in chunks of 64 columns: the block's 256 × 64 weight tile
// streams into a ring of kSkStages shared-memory stages with cp.async
// (each thread copies 16 bytes of 8 rows, a row's 128 bytes from 8
// consecutive threads), kSkStages − 1 chunks in flight while one is
// multiplied; a row's eight 16-byte groups are stored swizzled (group g
// of row r at g ^ r % 8), so ldmatrix reads the A fragments without bank
// conflicts. x's chunk goes through shared memory as its two terms (64
// bf16 a row, swizzled alike), split once per block and read as B
// fragments with ldmatrix; it is loaded a chunk ahead.
//
// Split K. gridDim.y splits the chunks (cps each); with more than one,
// every block writes its sums to part (gridDim.y · gridDim.x blocks of
// 8 · 2 · NT · 4 · 32 float32, in fragment order) and the last block of a
// row block to arrive (counters[blockIdx.x], which it resets to 0) adds
// them in split order, so the result does not depend on which block came
// last, and runs the epilogue.
//
// Epilogue: y = sum (+ bias[r]) (+ y when acc), or with SWIGLU (the weight
// is [gate; up], (2·R, K), R = inter) y[j, r] = swiglu(gate row r, up row
// r): warp w's tiles are then gate rows [128·b + 16·w, +16) and the same
// up rows (tile rows 16·w and 128 + 16·w), so each lane holds both
// operands of its outputs.
//
// Launch: 256 threads, grid (ceil(R / 256), splits) or, SWIGLU,
// (ceil(R / 128), splits); kSkStages·32 KiB + 4·8·NT·128 + 16 bytes of
// dynamic shared memory (skinny.go's skinnySmem); K a multiple of 8, x
// 16-byte aligned.
#include <stdint.h>

namespace {

constexpr int kSkWarps = 8;     // warps a block
constexpr int kSkChunk = 64;    // k a pipeline stage
constexpr int kSkRows = 256;    // weight rows a block
constexpr int kSkStages = 4;    // weight stages in shared memory
constexpr int kSkRowBytes = 128;  // a shared row: 64 bf16

// sk_at is the byte offset of 16-byte group g of shared row r (rows of 128
// bytes, groups swizzled by r % 8).
__device__ inline uint32_t sk_at(int r, int g) { return uint32_t(r * kSkRowBytes + ((g ^ (r & 7)) << 4)); }

template <int NT, bool SWIGLU>
__device__ void skinny(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w, int n,
                       int rows, int K, const float* __restrict__ bias, int acc_y, float limit, float* part,
                       int* counters, int cps) {
    constexpr int XR = 8 * NT;                               // rows of x a block stages
    constexpr int XV = (XR * kSkChunk / 4 + 255) / 256;      // float4 of x a thread stages a chunk
    constexpr uint32_t kStage = kSkRows * kSkRowBytes;       // bytes of a weight stage
    constexpr uint32_t kXTerm = XR * kSkRowBytes;            // bytes of one term of x's chunk
    extern __shared__ __align__(128) uint8_t sk_smem[];
    // No static shared memory: the kernel's dynamic limit is raised to the
    // device's whole opt-in (module.go's raiseSmem). The split hand-over's
    // flag follows x's buffers.
    int& last = *reinterpret_cast<int*>(sk_smem + kSkStages * kStage + 4 * kXTerm);
    const uint32_t wsm = smem_addr(sk_smem), xsm = wsm + kSkStages * kStage;  // [stage] weights; [buffer][term] x
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;

    // The weight rows this thread copies: tile rows threadIdx.x / 8 + 32·j,
    // 16-byte group threadIdx.x % 8 of each chunk.
    const int cg = threadIdx.x & 7;
    const uint16_t* src[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int i = (threadIdx.x >> 3) + 32 * j;  // tile row
        int r = blockIdx.x * kSkRows + i, stored = r;
        if (SWIGLU) {
            r = blockIdx.x * (kSkRows / 2) + (i & (kSkRows / 2 - 1));  // the row within gate or up
            stored = i < kSkRows / 2 ? r : rows + r;
        }
        src[j] = r < rows ? w + size_t(stored) * K + 8 * cg : nullptr;
    }
    // issue_w copies chunk c of the weight tile into stage st (zeros past
    // the rows or K).
    auto issue_w = [&](int c, int st) {
        const int k = c * kSkChunk;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = (threadIdx.x >> 3) + 32 * j;
            const bool ok = src[j] && k + 8 * cg < K;
            cp16(wsm + st * kStage + sk_at(i, cg), ok ? src[j] + k : w, ok ? 16 : 0);
        }
    };
    // load_x and store_x stage x's chunk c (zeros past n or K) as its two
    // bf16 terms into buffer b.
    auto load_x = [&](float4 (&xr)[XV], int c) {
#pragma unroll
        for (int v = 0; v < XV; v++) {
            const int e = threadIdx.x + 256 * v, row = e >> 4, k = c * kSkChunk + 4 * (e & 15);
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < n && k < K) f = __ldg(reinterpret_cast<const float4*>(x + size_t(row) * K + k));
            xr[v] = f;
        }
    };
    auto store_x = [&](const float4 (&xr)[XV], int b) {
#pragma unroll
        for (int v = 0; v < XV; v++) {
            const int e = threadIdx.x + 256 * v, row = e >> 4, q = e & 15;
            if (row >= XR) continue;
            const uint32_t h01 = pack_bf16(xr[v].x, xr[v].y), h23 = pack_bf16(xr[v].z, xr[v].w);
            const uint32_t l01 = pack_bf16(__fsub_rn(xr[v].x, __uint_as_float(h01 << 16)),
                                           __fsub_rn(xr[v].y, __uint_as_float(h01 & 0xffff0000u)));
            const uint32_t l23 = pack_bf16(__fsub_rn(xr[v].z, __uint_as_float(h23 << 16)),
                                           __fsub_rn(xr[v].w, __uint_as_float(h23 & 0xffff0000u)));
            const uint32_t at = sk_at(row, q >> 1) + 8 * (q & 1);  // columns 4q … 4q + 3
            uint8_t* hi = sk_smem + kSkStages * kStage + b * 2 * kXTerm;
            *reinterpret_cast<uint2*>(hi + at) = make_uint2(h01, h23);
            *reinterpret_cast<uint2*>(hi + kXTerm + at) = make_uint2(l01, l23);
        }
    };

    // The first tile row of each of this warp's m16 tiles.
    const int trow[2] = {SWIGLU ? 16 * warp : 32 * warp, SWIGLU ? kSkRows / 2 + 16 * warp : 32 * warp + 16};
    // Weight row of tile row trow[t] + i: base[t] + i (within gate or up).
    int base[2];
    if (SWIGLU) {
        base[0] = blockIdx.x * (kSkRows / 2) + 16 * warp;
        base[1] = base[0];
    } else {
        base[0] = blockIdx.x * kSkRows + 32 * warp;
        base[1] = base[0] + 16;
    }
    float acc[2][NT][4];
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[t][nt][e] = 0.f;

    const int chunks = (K + kSkChunk - 1) / kSkChunk;
    const int c0 = min(chunks, int(blockIdx.y) * cps), c1 = min(chunks, c0 + cps);
    if (c0 < c1) {
#pragma unroll
        for (int st = 0; st < kSkStages - 1; st++) {
            if (c0 + st < c1) issue_w(c0 + st, st);
            cp_commit();
        }
        {
            float4 xr[XV];
            load_x(xr, c0);
            store_x(xr, 0);
        }
        // ldmatrix lane addresses: A (matrix lane/8: rows +8 for odd, the
        // upper 8 columns of the k-step from 2), B (both terms, matrix
        // lane/8: the upper 8 columns for odd, the lo term from 2).
        const int am = lane >> 3, ar = lane & 7;
        for (int c = c0; c < c1; c++) {
            cp_wait<kSkStages - 2>();
            __syncthreads();
            const int cn = c + kSkStages - 1;
            if (cn < c1) issue_w(cn, (cn - c0) % kSkStages);
            cp_commit();
            float4 xr[XV];
            if (c + 1 < c1) load_x(xr, c + 1);
            const uint32_t ws = wsm + ((c - c0) % kSkStages) * kStage;
            const uint32_t xs = xsm + ((c - c0) & 1) * 2 * kXTerm;
#pragma unroll
            for (int s = 0; s < kSkChunk / 16; s++) {
                uint32_t a[2][4];
#pragma unroll
                for (int t = 0; t < 2; t++) ldsm_x4(a[t], ws + sk_at(trow[t] + 8 * (am & 1) + ar, 2 * s + (am >> 1)));
                uint32_t b[NT][4];  // per x tile: hi b0, hi b1, lo b0, lo b1
#pragma unroll
                for (int nt = 0; nt < NT; nt++) ldsm_x4(b[nt], xs + (am >> 1) * kXTerm + sk_at(8 * nt + ar, 2 * s + (am & 1)));
                // Term by term, so that consecutive products go to different
                // sums (2·NT apart).
#pragma unroll
                for (int term = 0; term < 2; term++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int t = 0; t < 2; t++) mma_bf16(acc[t][nt], a[t], b[nt][2 * term], b[nt][2 * term + 1]);
            }
            if (c + 1 < c1) store_x(xr, (c + 1 - c0) & 1);
        }
    }

    // acc[t][nt][e] is weight row base[t] + gid + 8·(e / 2) times x row
    // 8·nt + 2·tig + e % 2.
    if (gridDim.y > 1) {
        const int per = 2 * NT * 4 * 32;  // floats a warp
        float* mine = part + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * (kSkWarps * per) + warp * per + lane;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[((t * NT + nt) * 4 + e) * 32] = acc[t][nt][e];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == int(gridDim.y) - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float* p = part + size_t(blockIdx.x) * (kSkWarps * per) + warp * per + lane + ((t * NT + nt) * 4 + e) * 32;
                    float v = 0.f;
                    for (int sp = 0; sp < int(gridDim.y); sp++) v += __ldcg(p + size_t(sp) * gridDim.x * (kSkWarps * per));
                    acc[t][nt][e] = v;
                }
        if (threadIdx.x == 0) counters[blockIdx.x] = 0;
    }

#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 8 * nt + 2 * tig + (e & 1);
            if (j >= n) continue;
            if (SWIGLU) {
                const int r = base[0] + gid + 8 * (e >> 1);
                if (r < rows) y[size_t(j) * rows + r] = swiglu_clamp1(acc[0][nt][e], acc[1][nt][e], limit);
                continue;
            }
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int r = base[t] + gid + 8 * (e >> 1);
                if (r >= rows) continue;
                float v = acc[t][nt][e];
                if (bias) v = __fadd_rn(v, bias[r]);
                float* o = y + size_t(j) * rows + r;
                if (acc_y) v = __fadd_rn(v, *o);
                *o = v;
            }
        }
}

}  // namespace

// ferrite_skinny_bf16_NT: y (n, rows) = x (n, cols) · wᵀ (+ bias) (+ y);
// ferrite_skinny_swiglu_bf16_NT: y (n, rows) = swiglu of the stacked [gate;
// up] (2·rows, cols) weight's products (clamped at limit > 0). n ≤ 8·NT.
#define FERRITE_SKINNY(NAME, NT, SWIGLU)                                                                    \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(float* y, const float* x, const uint16_t* w, int n, int rows, int cols, const float* bias,      \
             int acc_y, float limit, float* part, int* counters, int cps) {                                  \
        FERRITE_PDL_WAIT();                                                                                  \
        skinny<NT, SWIGLU>(y, x, w, n, rows, cols, bias, acc_y, limit, part, counters, cps);                 \
    }

FERRITE_SKINNY(ferrite_skinny_bf16_1, 1, false)
FERRITE_SKINNY(ferrite_skinny_bf16_2, 2, false)
FERRITE_SKINNY(ferrite_skinny_bf16_4, 4, false)
FERRITE_SKINNY(ferrite_skinny_bf16_8, 8, false)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_1, 1, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_2, 2, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_4, 4, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_8, 8, true)
