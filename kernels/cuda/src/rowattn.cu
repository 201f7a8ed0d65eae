// Paged causal attention for decode batches (Attention when every row is
// a decode row of its own sequence, or at least no tile of prefill.cu's
// can be one sequence): split-KV like ops.cu's attn_block, but with the
// lanes across the head dims instead of across the keys, so that each key
// row is one coalesced warp load, and with more parallelism a block.
//
// Block (row i, KV head · chunks + chunk, split z), 4 warps, handles up to
// kRowGroup (4) query heads of the KV head's group over the keys of
// positions [z·split, min((z+1)·split, pos[i]+1)), split ≤ kRowMaxKeys.
// Lane l holds dims [DPL·l, DPL·l + DPL) of the queries and of each key
// and value row. Scores: a warp takes 16 keys at a time (two groups of
// 8, their loads issued together); each lane multiplies its dims of the 4
// queries with the 8 keys of a group, and a reduce-scatter over the warp
// (31 shuffles) leaves the score of (key l/4, head l%4) in lane l, scaled
// into shared memory. The block's max and sum per head follow, the
// scores become exp(s − max), and the warps add their keys' values times
// those into per-lane sums, merged over the warps in shared memory (the
// scores' space). One split: out = sum / total. More: each block writes
// (max, total, sum[hd]) per head to part (ferrite_attn_combine's layout),
// and the last block of (row, head chunk) to finish (counters, reset by
// it) merges the splits as ferrite_attn_combine does.
//
// Launch: grid (n, kvHeads·chunks, splits), 128 threads; hd ≤ 32·DPL and
// a multiple of DPL; counters hold n·kvHeads·chunks zeros when splits > 1.
#include <stdint.h>

namespace {

constexpr int kRowGroup = 4;       // query heads a block
constexpr int kRowWarps = 4;       // warps a block
constexpr int kRowKeys = 8;        // keys a group (8 keys × 4 heads = 32 lanes)
constexpr int kRowMaxKeys = 1024;  // keys a split

// RowKV is DPL consecutive cache values of one row at a lane: loaded raw,
// widened to float32 on use.
template <int DPL, bool BF>
struct RowKV;

template <>
struct RowKV<1, true> {
    uint16_t r;
    __device__ void load(const void* c, size_t e) { r = __ldg(static_cast<const unsigned short*>(c) + e); }
    __device__ void zero() { r = 0; }
    __device__ void get(float (&v)[1]) const { v[0] = __uint_as_float(uint32_t(r) << 16); }
};
template <>
struct RowKV<2, true> {
    uint32_t r;
    __device__ void load(const void* c, size_t e) { r = __ldg(reinterpret_cast<const unsigned*>(static_cast<const uint16_t*>(c) + e)); }
    __device__ void zero() { r = 0; }
    __device__ void get(float (&v)[2]) const { BF16W::pair(r, v); }
};
template <>
struct RowKV<4, true> {
    uint2 r;
    __device__ void load(const void* c, size_t e) { r = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(c) + e)); }
    __device__ void zero() { r = make_uint2(0, 0); }
    __device__ void get(float (&v)[4]) const {
        BF16W::pair(r.x, v);
        BF16W::pair(r.y, v + 2);
    }
};
template <>
struct RowKV<8, true> {
    uint4 r;
    __device__ void load(const void* c, size_t e) { r = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(c) + e)); }
    __device__ void zero() { r = make_uint4(0, 0, 0, 0); }
    __device__ void get(float (&v)[8]) const { BF16W::vec(r, v); }
};
template <int DPL>
struct RowKV<DPL, false> {
    float r[DPL];
    __device__ void load(const void* c, size_t e) {
        const float* p = static_cast<const float*>(c) + e;
        if (DPL % 4 == 0) {
#pragma unroll
            for (int j = 0; j < DPL; j += 4) {
                const float4 f = __ldg(reinterpret_cast<const float4*>(p + j));
                r[j] = f.x;
                r[j + 1] = f.y;
                r[j + 2] = f.z;
                r[j + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int j = 0; j < DPL; j++) r[j] = __ldg(p + j);
        }
    }
    __device__ void zero() {
#pragma unroll
        for (int j = 0; j < DPL; j++) r[j] = 0.f;
    }
    __device__ void get(float (&v)[DPL]) const {
#pragma unroll
        for (int j = 0; j < DPL; j++) v[j] = r[j];
    }
};

// rs_stage is one halving of reduce_scatter32: lanes with bit O keep
// elements [O, 2·O), the others [0, O), each adding its partner's.
template <int O>
__device__ __forceinline__ void rs_stage(float (&v)[32], bool up) {
#pragma unroll
    for (int j = 0; j < O; j++) {
        const float a = v[j], b = v[j + O];
        v[j] = (up ? b : a) + __shfl_xor_sync(0xffffffffu, up ? a : b, O);
    }
}

// reduce_scatter32 sums v over the warp so that lane l ends with the total
// of element l in v[0] (the other elements are left partial). Every index
// is a constant, so v stays in registers.
__device__ __forceinline__ void reduce_scatter32(float (&v)[32]) {
    const int lane = threadIdx.x & 31;
    rs_stage<16>(v, lane & 16);
    rs_stage<8>(v, lane & 8);
    rs_stage<4>(v, lane & 4);
    rs_stage<2>(v, lane & 2);
    rs_stage<1>(v, lane & 1);
}

// row_slot is the cache element of position p's row, KV head offset off.
__device__ inline size_t row_slot(const int* bt, int bs, int p, size_t kw, size_t off) {
    return (size_t(bt[p / bs]) * bs + p % bs) * kw + off;
}

// row_load loads group g's kRowKeys rows (keys t0 + 8g + u of the split
// starting at position k0, nk keys) of cache c at this lane's dims.
template <int DPL, bool BF>
__device__ inline void row_load(RowKV<DPL, BF> (&r)[kRowKeys], const void* c, const int* bt, int bs, int k0, int t0, int nk,
                                size_t kw, size_t off, int dim, bool dl) {
#pragma unroll
    for (int u = 0; u < kRowKeys; u++) {
        const int t = t0 + u;
        if (dl && t < nk) r[u].load(c, row_slot(bt, bs, k0 + t, kw, off) + dim);
        else r[u].zero();
    }
}

template <int DPL, bool BF>
__device__ void attn_rows(const AttnArgs& a, int* counters) {
    constexpr int G = kRowGroup, KG = kRowKeys, W = kRowWarps;
    // The split's scores as [key][head], then exp(s − max); afterwards the
    // warps' value sums [warp][head][dim] (both 16 KiB).
    __shared__ __align__(16) float sm[kRowMaxKeys * G];
    __shared__ float wred[W][G];
    __shared__ float hmax[G], hsum[G];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x;
    const int kvh = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks;
    const int grp = a.heads / a.kvh;
    const int h0 = kvh * grp + chunk * G;
    const int ng = min(G, grp - chunk * G);
    const int hd = a.hd;
    const int len = a.pos[i] + 1;
    const int k0 = blockIdx.z * a.split, nk = max(0, min(len, k0 + a.split) - k0);
    const int* bt = a.blocks + size_t(a.seq[i]) * a.max_blocks;
    const size_t kw = size_t(a.kvh) * hd, off = size_t(kvh) * hd;
    const int dim = DPL * lane;
    const bool dl = dim < hd;

    float qv[G][DPL];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < DPL; e++) qv[g][e] = g < ng && dl ? a.q[(size_t(i) * a.heads + h0 + g) * hd + dim + e] : 0.f;

    // Scores, 16 keys a warp at a time.
    for (int t0 = warp * 2 * KG; t0 < nk; t0 += W * 2 * KG) {
        RowKV<DPL, BF> kr[2][KG];
        row_load<DPL, BF>(kr[0], a.kc, bt, a.bs, k0, t0, nk, kw, off, dim, dl);
        row_load<DPL, BF>(kr[1], a.kc, bt, a.bs, k0, t0 + KG, nk, kw, off, dim, dl);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s[KG * G];
#pragma unroll
            for (int u = 0; u < KG; u++) {
                float kv[DPL];
                kr[h][u].get(kv);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float acc = 0.f;
#pragma unroll
                    for (int e = 0; e < DPL; e++) acc = fmaf(qv[g][e], kv[e], acc);
                    s[u * G + g] = acc;
                }
            }
            reduce_scatter32(s);
            const int t = t0 + h * KG + lane / G, g = lane % G;
            if (t < nk) sm[t * G + g] = g < ng ? s[0] * a.scale : -INFINITY;
        }
    }
    __syncthreads();

    // Each head's max and exp-sum over the split; thread tid takes head
    // tid % 4 of the keys tid / 4, + 32, + 64, …
    {
        const int g = threadIdx.x % G;
        float mx = -INFINITY;
        for (int t = threadIdx.x / G; t < nk; t += W * 32 / G) mx = fmaxf(mx, sm[t * G + g]);
#pragma unroll
        for (int o = G; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane < G) wred[warp][lane] = mx;
        __syncthreads();
        if (threadIdx.x < G) {
            float m = -INFINITY;
            for (int w = 0; w < W; w++) m = fmaxf(m, wred[w][threadIdx.x]);
            hmax[threadIdx.x] = m;
        }
        __syncthreads();
        const float m = hmax[g];
        float sum = 0.f;
        for (int t = threadIdx.x / G; t < nk; t += W * 32 / G) {
            const float e = m == -INFINITY ? 0.f : expf(sm[t * G + g] - m);
            sm[t * G + g] = e;
            sum += e;
        }
#pragma unroll
        for (int o = G; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncthreads();  // wred's maxima read
        if (lane < G) wred[warp][lane] = sum;
        __syncthreads();
        if (threadIdx.x < G) {
            float l = 0.f;
            for (int w = 0; w < W; w++) l += wred[w][threadIdx.x];
            hsum[threadIdx.x] = l;
        }
    }

    // Values: warp w adds its keys' rows times their weights.
    float acc[G][DPL];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[g][e] = 0.f;
    for (int t0 = warp * 2 * KG; t0 < nk; t0 += W * 2 * KG) {
        RowKV<DPL, BF> vr[2][KG];
        row_load<DPL, BF>(vr[0], a.vc, bt, a.bs, k0, t0, nk, kw, off, dim, dl);
        row_load<DPL, BF>(vr[1], a.vc, bt, a.bs, k0, t0 + KG, nk, kw, off, dim, dl);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int u = 0; u < KG; u++) {
                const int t = t0 + h * KG + u;
                if (t >= nk) continue;
                const float4 p = *reinterpret_cast<const float4*>(&sm[t * G]);
                const float pg[G] = {p.x, p.y, p.z, p.w};
                float vv[DPL];
                vr[h][u].get(vv);
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int e = 0; e < DPL; e++) acc[g][e] = fmaf(pg[g], vv[e], acc[g][e]);
            }
    }
    __syncthreads();  // every warp is done with the weights: sm becomes [warp][head][dim]
    if (dl) {
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int e = 0; e < DPL; e++) sm[(warp * G + g) * kAttnMaxHD + dim + e] = acc[g][e];
    }
    __syncthreads();
    const bool split = gridDim.z > 1;
    for (int t = threadIdx.x; t < ng * hd; t += blockDim.x) {
        const int g = t / hd, d = t % hd;
        float A = 0.f;
        for (int w = 0; w < W; w++) A += sm[(w * G + g) * kAttnMaxHD + d];
        const int h = h0 + g;
        if (!split) {
            a.out[(size_t(i) * a.heads + h) * hd + d] = A / hsum[g];
            continue;
        }
        float* pp = a.part + ((size_t(i) * a.heads + h) * gridDim.z + blockIdx.z) * (hd + 2);
        if (d == 0) {
            pp[0] = hmax[g];
            pp[1] = hsum[g];
        }
        pp[2 + d] = A;
    }
    if (!split) return;

    // The last split of (row, head chunk) to finish merges them, as
    // ferrite_attn_combine does.
    __threadfence();
    __syncthreads();
    int* cnt = counters + size_t(i) * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == int(gridDim.z) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int splits = gridDim.z;
    for (int t = threadIdx.x; t < ng * hd; t += blockDim.x) {
        const int g = t / hd, d = t % hd, h = h0 + g;
        const float* pp = a.part + (size_t(i) * a.heads + h) * splits * (hd + 2);
        float mx = -INFINITY;
        for (int z = 0; z < splits; z++) mx = fmaxf(mx, __ldcg(pp + z * (hd + 2)));
        float L = 0.f, A = 0.f;
        for (int z = 0; z < splits; z++) {
            const float mz = __ldcg(pp + z * (hd + 2));
            if (mz == -INFINITY) continue;
            const float c = expf(mz - mx);
            L += __ldcg(pp + z * (hd + 2) + 1) * c;
            A += __ldcg(pp + z * (hd + 2) + 2 + d) * c;
        }
        a.out[(size_t(i) * a.heads + h) * hd + d] = A / L;
    }
    if (threadIdx.x == 0) *cnt = 0;
}

}  // namespace

#define FERRITE_ATTN_ROWS(NAME, DPL, BF)                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        NAME(float* out, const float* q, const void* kc, const void* vc, const int* pos, const int* seq,  \
             const int* blocks, float* part, int max_blocks, int bs, int n, int heads, int kvh, int hd,   \
             int chunks, int split, float scale, int* counters) {                                         \
        FERRITE_PDL_WAIT();                                                                               \
        AttnArgs a{out, q, kc, vc, pos, seq, blocks, part, max_blocks, bs, n, heads, kvh, hd, chunks, split, scale, 0}; \
        attn_rows<DPL, BF>(a, counters);                                                                  \
    }

FERRITE_ATTN_ROWS(ferrite_attn_rows_f32_1, 1, false)
FERRITE_ATTN_ROWS(ferrite_attn_rows_f32_2, 2, false)
FERRITE_ATTN_ROWS(ferrite_attn_rows_f32_4, 4, false)
FERRITE_ATTN_ROWS(ferrite_attn_rows_f32_8, 8, false)
FERRITE_ATTN_ROWS(ferrite_attn_rows_bf16_1, 1, true)
FERRITE_ATTN_ROWS(ferrite_attn_rows_bf16_2, 2, true)
FERRITE_ATTN_ROWS(ferrite_attn_rows_bf16_4, 4, true)
FERRITE_ATTN_ROWS(ferrite_attn_rows_bf16_8, 8, true)
