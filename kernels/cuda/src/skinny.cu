// The skinny GEMM of decode batches: y (n, R) = x (n, K) · Wᵀ for 2 ≤ n ≤ 64
// rows of float32 x and a bf16 weight W (R, K), on tensor cores
// (mma.sync m16n8k16, float32 accumulation) with the weight streamed from
// memory once, straight into registers. The weight is the MMA's A side (16
// weight rows a tile) and x its B side (8 rows of x a tile, NT tiles: n ≤
// 8·NT). x is split into two bf16 terms, hi = bf16(x) and lo = bf16(x − hi)
// (the difference exact in float32), both multiplied into the same float32
// sums: about 2⁻¹⁷·Σ|x·w| from the float32 product, as the cuBLASLt path it
// replaces (opset.go's linearSplit), in one kernel instead of a split
// kernel, the GEMM and an epilogue kernel (and, for SwiGLULinear, a fourth).
//
// Layout. A block is 8 warps; warp w owns 32 weight rows, two m16 tiles
// (the block 256 rows), and all n rows of x. K is read in chunks of 64: a
// lane (gid = lane/4, tig = lane%4) loads, for each of its four weight rows
// (gid and gid + 8 of each tile), the values [8·tig, 8·tig + 8) and
// [32 + 8·tig, 32 + 8·tig + 8) of the chunk, 16 bytes each, so each load
// instruction reads whole 32-byte sectors (a quad reads 64 contiguous
// bytes of a row). The MMA's k order is permuted to match: in k-step
// s = 2v + u (v, u in 0..1) of the chunk, the fragment slots (2·tig,
// 2·tig + 1) and (2·tig + 8, 2·tig + 9) hold physical columns
// 32v + 8·tig + 4u + {0, 1} and + {2, 3}, for the weight (A) and for x
// (B) alike, so every product pairs the same column and the sum is the
// whole chunk. x's chunk goes through shared memory as its two terms,
// rows of 64 bf16 whose 16-byte groups are swizzled (group g of row r at
// g ^ 4·(r % 2)), so the 16-byte fragment loads of a quarter warp (two
// rows) hit distinct banks. The weight chunks stream through a ring of
// three register buffers (two chunks in flight while one is multiplied),
// x's a chunk ahead.
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
// up rows, so each lane holds both operands of its outputs.
//
// Launch: 256 threads, grid (ceil(R / 256), splits) or, SWIGLU,
// (ceil(R / 128), splits); K a multiple of 8, x 16-byte aligned.
#include <stdint.h>

namespace {

constexpr int kSkWarps = 8;   // warps a block
constexpr int kSkChunk = 64;  // k a pipeline stage

// sk_swz is where column col (a multiple of 4) of row row of a shared x
// chunk is stored: its 16-byte group g (8 columns) at g ^ 4·(row % 2).
__device__ inline int sk_swz(int row, int col) { return col ^ ((row & 1) << 5); }

// sk_word is word i (0..3) of v.
__device__ inline uint32_t sk_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

template <int NT, bool SWIGLU>
struct Skinny {
    static constexpr int kXRows = 8 * NT;                              // rows of x a block stages
    static constexpr int kXVec = (kXRows * kSkChunk / 4 + 255) / 256;  // float4 of x a thread stages a chunk

    // The shared x chunk: [buffer][term][row][column].
    typedef uint16_t XTile[2][2][kXRows][kSkChunk];

    const uint16_t* wrow[2][2];  // this lane's weight rows: [tile][gid, gid + 8], null past the end
    int K, n;
    const float* x;

    // load_w issues the 16-byte loads of chunk c into w: [tile][row][half].
    __device__ void load_w(uint4 (&w)[2][2][2], int c, int tig) const {
        const int k = c * kSkChunk + 8 * tig;
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    uint4 q = make_uint4(0, 0, 0, 0);
                    if (wrow[t][h] && k + 32 * v < K) q = __ldg(reinterpret_cast<const uint4*>(wrow[t][h] + k + 32 * v));
                    w[t][h][v] = q;
                }
    }

    // load_x issues the float4 loads of x's chunk c (zeros past n or K).
    __device__ void load_x(float4 (&xr)[kXVec], int c) const {
#pragma unroll
        for (int i = 0; i < kXVec; i++) {
            const int e = threadIdx.x + 256 * i, row = e >> 4, k = c * kSkChunk + 4 * (e & 15);
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < n && k < K) f = __ldg(reinterpret_cast<const float4*>(x + size_t(row) * K + k));
            xr[i] = f;
        }
    }

    // store_x writes the loaded chunk's two bf16 terms into buffer b.
    __device__ static void store_x(XTile& xs, int b, const float4 (&xr)[kXVec]) {
#pragma unroll
        for (int i = 0; i < kXVec; i++) {
            const int e = threadIdx.x + 256 * i, row = e >> 4, col = 4 * (e & 15);
            if (row >= kXRows) continue;
            const uint32_t h01 = pack_bf16(xr[i].x, xr[i].y), h23 = pack_bf16(xr[i].z, xr[i].w);
            const uint32_t l01 = pack_bf16(__fsub_rn(xr[i].x, __uint_as_float(h01 << 16)),
                                           __fsub_rn(xr[i].y, __uint_as_float(h01 & 0xffff0000u)));
            const uint32_t l23 = pack_bf16(__fsub_rn(xr[i].z, __uint_as_float(h23 << 16)),
                                           __fsub_rn(xr[i].w, __uint_as_float(h23 & 0xffff0000u)));
            const int at = sk_swz(row, col);
            *reinterpret_cast<uint2*>(&xs[b][0][row][at]) = make_uint2(h01, h23);
            *reinterpret_cast<uint2*>(&xs[b][1][row][at]) = make_uint2(l01, l23);
        }
    }

    // mul adds chunk w times x's chunk in buffer b to acc ([tile][x tile][4]).
    __device__ static void mul(float (&acc)[2][NT][4], const uint4 (&w)[2][2][2], const XTile& xs, int b, int gid,
                               int tig) {
#pragma unroll
        for (int v = 0; v < 2; v++) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int term = 0; term < 2; term++) {
                    const int row = 8 * nt + gid;
                    const uint4 xb = *reinterpret_cast<const uint4*>(&xs[b][term][row][sk_swz(row, 32 * v + 8 * tig)]);
#pragma unroll
                    for (int u = 0; u < 2; u++) {
#pragma unroll
                        for (int t = 0; t < 2; t++) {
                            const uint32_t a[4] = {sk_word(w[t][0][v], 2 * u), sk_word(w[t][1][v], 2 * u),
                                                   sk_word(w[t][0][v], 2 * u + 1), sk_word(w[t][1][v], 2 * u + 1)};
                            mma_bf16(acc[t][nt], a, sk_word(xb, 2 * u), sk_word(xb, 2 * u + 1));
                        }
                    }
                }
            }
        }
    }
};

// sk_stage is one pipeline stage of skinny: it issues the loads of chunk
// c + 2 into wn (and of x's chunk c + 1), multiplies chunk c (in wc and
// shared buffer (c − c0) % 2), stores x's next chunk and waits for the
// block. It reports whether chunk c + 1 exists.
template <int NT, bool SWIGLU>
__device__ __forceinline__ bool sk_stage(const Skinny<NT, SWIGLU>& s, float (&acc)[2][NT][4], uint4 (&wc)[2][2][2],
                                         uint4 (&wn)[2][2][2], typename Skinny<NT, SWIGLU>::XTile& xs, int c, int c0,
                                         int c1, int gid, int tig) {
    typedef Skinny<NT, SWIGLU> S;
    float4 xr[S::kXVec];
    if (c + 2 < c1) s.load_w(wn, c + 2, tig);
    if (c + 1 < c1) s.load_x(xr, c + 1);
    S::mul(acc, wc, xs, (c - c0) & 1, gid, tig);
    if (c + 1 < c1) S::store_x(xs, (c + 1 - c0) & 1, xr);
    __syncthreads();
    return c + 1 < c1;
}

template <int NT, bool SWIGLU>
__device__ void skinny(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w, int n,
                       int rows, int K, const float* __restrict__ bias, int acc_y, float limit, float* part,
                       int* counters, int cps) {
    typedef Skinny<NT, SWIGLU> S;
    __shared__ __align__(16) typename S::XTile xs;
    __shared__ int last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    S s;
    s.K = K;
    s.n = n;
    s.x = x;
    // The first weight row of each tile and whether row i of it exists.
    int base[2];
    if (SWIGLU) {
        base[0] = blockIdx.x * 128 + 16 * warp;
        base[1] = base[0];
    } else {
        base[0] = blockIdx.x * 256 + 32 * warp;
        base[1] = base[0] + 16;
    }
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = base[t] + gid + 8 * h;  // SWIGLU: the row within gate or up
            const int stored = SWIGLU && t == 1 ? rows + r : r;
            s.wrow[t][h] = r < rows ? w + size_t(stored) * K : nullptr;
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
        uint4 w0[2][2][2], w1[2][2][2], w2[2][2][2];
        s.load_w(w0, c0, tig);
        if (c0 + 1 < c1) s.load_w(w1, c0 + 1, tig);
        {
            float4 xr[S::kXVec];
            s.load_x(xr, c0);
            S::store_x(xs, 0, xr);
        }
        __syncthreads();
        // The ring: chunk c is in w0, w1, w2 for c − c0 ≡ 0, 1, 2 (mod 3).
        for (int c = c0;; c += 3) {
            if (!sk_stage<NT, SWIGLU>(s, acc, w0, w2, xs, c, c0, c1, gid, tig)) break;
            if (!sk_stage<NT, SWIGLU>(s, acc, w1, w0, xs, c + 1, c0, c1, gid, tig)) break;
            if (!sk_stage<NT, SWIGLU>(s, acc, w2, w1, xs, c + 2, c0, c1, gid, tig)) break;
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
