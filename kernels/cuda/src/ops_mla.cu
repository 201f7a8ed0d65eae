// Multi-head latent attention and DeepSeek sparse attention on the GPU
// (kernels.MLAOps, kernels.SparseOps), launched by kernels/cuda's mla.go:
// the latent and index-key stores, the absorbed-form attention (the query
// folded through W_UK, scores and the softmax-weighted sum straight off the
// latent cache, W_UV applied to the sum), the DSA indexer scores and the
// device top-k.
//
// The sources compile as one translation unit in name order, so this file
// (after ops.cu and ops_common.cu) uses ops_common.cu's MatDesc, warp_dot,
// block_sum_f64, layer_norm_stats, put, rank_key and flag_scan, ops.cu's
// kv_at, kv8, warp_max and warp_sum_f64 and gemv.cu's warp_sum.
#include <math.h>
#include <stdint.h>

namespace {

// rotate_into rotates the pairs of x's first 2·half values by the angles of
// position p (kernels/ref.RopeAngles and Rotate: angle float32(p)·inv[i],
// cos and sin in float64, rounded and scaled) and stores them at element e
// of the cache; f(j) gives x's value j (already normed). Threads stride
// over the pairs.
template <typename F>
__device__ inline void rotate_into(void* cache, int bf16, size_t e, F f, int p, const float* inv, int half,
                                   int interleaved, float rscale) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double a = double(__fmul_rn(float(p), inv[i]));
        const float c = __fmul_rn(float(cos(a)), rscale), s = __fmul_rn(float(sin(a)), rscale);
        const int ja = interleaved ? 2 * i : i, jb = interleaved ? 2 * i + 1 : i + half;
        const float a0 = f(ja), b0 = f(jb);
        put(cache, bf16, e + ja, __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, s)));
        put(cache, bf16, e + jb, __fadd_rn(__fmul_rn(b0, c), __fmul_rn(a0, s)));
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// Cache stores. Launch: one block of 256 threads per row; a slot outside
// [0, slots) is skipped.

// Latent store: cache[slot[r]] (width) = [RMSNorm(kv[r][:kl])·norm |
// RoPE(kv[r][kl:])], the mean of squares a float64 sum rounded to float32
// before eps (kernels/ref.LatentRow). inv is null when nothing rotates
// (half = 0); dims past kl + 2·half are copied.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_mla_store_latent(void* cache, int bf16, int slots, const float* kv, int kv_stride, const float* norm,
                             int kl, int width, float eps, const int* pos, int pos_stride, const int* slot,
                             int slot_stride, const float* inv, int half, int interleaved, float rscale) {
    FERRITE_PDL_WAIT();
    __shared__ double partial[8];
    const int r = blockIdx.x;
    const int s = slot[size_t(r) * slot_stride];
    if (s < 0 || s >= slots) return;
    const float* x = kv + size_t(r) * kv_stride;
    const size_t e = size_t(s) * width;
    double ss = 0;
    for (int c = threadIdx.x; c < kl; c += blockDim.x) ss += double(x[c]) * double(x[c]);
    ss = block_sum_f64(ss, partial);
    const float ms = float(ss / double(kl));
    const float rinv = float(1.0 / sqrt(double(__fadd_rn(ms, eps))));
    for (int c = threadIdx.x; c < kl; c += blockDim.x) put(cache, bf16, e + c, __fmul_rn(norm[c], __fmul_rn(x[c], rinv)));
    const float* k = x + kl;
    if (half > 0)
        rotate_into(cache, bf16, e + kl, [k](int j) { return k[j]; }, pos[size_t(r) * pos_stride], inv, half, interleaved,
                    rscale);
    for (int c = kl + 2 * half + threadIdx.x; c < width; c += blockDim.x) put(cache, bf16, e + c, x[c]);
}

// Index-key store: cache[slot[r]] (dim) = RoPE(LayerNorm(k[r])·w + b) over
// the first 2·half dims, the mean and the biased variance float64 sums
// rounded to float32 (kernels/ref.IndexKeyRow).
extern "C" __global__ void __launch_bounds__(256)
    ferrite_dsa_store_key(void* cache, int bf16, int slots, const float* k, int k_stride, const float* w,
                          const float* b, int dim, float eps, const int* pos, int pos_stride, const int* slot,
                          int slot_stride, const float* inv, int half, int interleaved, float rscale) {
    __shared__ double partial[8];
    const int r = blockIdx.x;
    const int s = slot[size_t(r) * slot_stride];
    if (s < 0 || s >= slots) return;
    const float* x = k + size_t(r) * k_stride;
    const size_t e = size_t(s) * dim;
    float mean, rinv;
    layer_norm_stats(x, dim, eps, partial, &mean, &rinv);
    auto normed = [=](int j) { return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[j], mean), rinv), w[j]), b[j]); };
    if (half > 0) rotate_into(cache, bf16, e, normed, pos[size_t(r) * pos_stride], inv, half, interleaved, rscale);
    for (int c = 2 * half + threadIdx.x; c < dim; c += blockDim.x) put(cache, bf16, e + c, normed(c));
}

// ---------------------------------------------------------------------------
// MLA, absorbed form. A query head is [q_nope (dn) | q_pe (dr)], a cache row
// [c (kl) | k_pe (dr)]; kv_b_proj (heads·(dn + dv), kl) holds per head W_UK
// (dn rows) then W_UV (dv rows). The absorbed query W_UK_hᵀ·q_nope and the
// output W_UV_h·lat are both per-head matrix-vector products
// (ferrite_mla_proj): the first over W_UK transposed once per weight
// ((heads·kl, dn), ferrite_mla_uk_t), the second over kv_b_proj's W_UV
// rows.

// Per-head projection: y[i·y_rs + h·y_hs + r] = W[h·w_hrows + r]·x[i·x_rs +
// h·x_hs] (cols values) for rows r < rows of every head h and query row i <
// n, the weight W (wcols wide) in its stored dtype (F8E4M3 with br × bc
// block scales; row0 is head 0's first row), float32 sums (ops.cu's
// warp_dot: 16-byte loads when aligned). A warp per output row, the block's
// 8 query rows in turn. Launch: grid (ceil(rows / 8), heads, ceil(n / 8)),
// 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_mla_proj(float* y, int y_rs, int y_hs, const float* x, int x_rs, int x_hs, int n, int rows, int w_hrows,
                     const uint8_t* wdata, const float* wscale, int wdtype, int wcols, int br, int bc, int row0) {
    FERRITE_PDL_WAIT();
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    if (r >= rows) return;
    const MatDesc w{wdata, wscale, wdtype, 0, wcols, br, bc, row0};
    const int i1 = min(n, int(blockIdx.z + 1) * 8);
    for (int i = blockIdx.z * 8; i < i1; i++) {
        const float v = warp_dot(w, h * w_hrows + r, x + size_t(i) * x_rs + size_t(h) * x_hs);
        if ((threadIdx.x & 31) == 0) y[size_t(i) * y_rs + size_t(h) * y_hs + r] = v;
    }
}

// mla_proj_q is ferrite_mla_proj over a block-quantized weight
// (ops_common_quant.cu's device layout, wd the byte address of its d
// section): the halves of kv_b_proj as a GGUF stores them, attn_k_b
// (heads·kl, dn) and attn_v_b (heads·dv, kl) (kernels.Mat.KVB), head h's
// rows from h·w_hrows. A warp per output row decodes each part of the row
// once for the block's up to NB query rows (float32 x), the parts' sums
// added in part order, so a row's bits depend neither on the query rows
// beside it nor on NB (quant_row_dot). Launch: grid (ceil(rows / 8),
// heads, ceil(n / NB)), 256 threads.
template <int NB>
__device__ __forceinline__ void mla_proj_q(float* y, int y_rs, int y_hs, const float* x, int x_rs, int x_hs, int n, int rows,
                                           int w_hrows, const uint8_t* wdata, const uint8_t* wd, int wdtype, int wcols) {
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    if (r >= rows) return;
    const MatDesc w{wdata, reinterpret_cast<const float*>(wd), wdtype, 0, wcols, 1, 1, 0};
    const int i0 = blockIdx.z * NB, nx = min(n - i0, NB);
    const float* xs[NB];
    bool al = true;
#pragma unroll
    for (int j = 0; j < NB; j++) {
        xs[j] = x + size_t(i0 + min(j, nx - 1)) * x_rs + size_t(h) * x_hs;
        al = al && (reinterpret_cast<uintptr_t>(xs[j]) & 15) == 0;
    }
    float o[NB], unused[NB];
    quant_desc_dot<NB>(w, h * w_hrows + r, nullptr, 0, xs, nx, al, o, unused);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < NB; j++)
            if (j < nx) y[size_t(i0 + j) * y_rs + size_t(h) * y_hs + r] = o[j];
    }
}

// ferrite_mla_proj_q_1 (a decode row: fewer registers, more warps
// resident) and ferrite_mla_proj_q_8 (8 query rows a block) are mla_proj_q
// after the PDL wait.
#define FERRITE_MLA_PROJ_Q(name, NB)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                                   \
        name(float* y, int y_rs, int y_hs, const float* x, int x_rs, int x_hs, int n, int rows, int w_hrows,            \
             const uint8_t* wdata, const uint8_t* wd, int wdtype, int wcols) {                                           \
        FERRITE_PDL_WAIT();                                                                                             \
        mla_proj_q<NB>(y, y_rs, y_hs, x, x_rs, x_hs, n, rows, w_hrows, wdata, wd, wdtype, wcols);                     \
    }
FERRITE_MLA_PROJ_Q(ferrite_mla_proj_q_1, 1)
FERRITE_MLA_PROJ_Q(ferrite_mla_proj_q_8, 8)

// W_UK transposed, once per kv_b_proj: dst (heads·kl, dn), its row h·kl + c
// being column c of W_UK_h (rows h·(dn + dv) … h·(dn + dv) + dn − 1 of w,
// kl wide). F32, BF16 and F16 keep their bits; F8E4M3 is decoded with its
// br × bc block scales to float32. Launch: any 1-D grid, 256 threads.
extern "C" __global__ void ferrite_mla_uk_t(void* dst, const uint8_t* w, const float* wscale, int wdtype, int heads,
                                            int dn, int dv, int kl, int br, int bc) {
    const uint64_t total = uint64_t(heads) * kl * dn;
    for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total; t += uint64_t(gridDim.x) * blockDim.x) {
        const int d = int(t % dn), c = int((t / dn) % kl), h = int(t / (uint64_t(dn) * kl));
        const size_t r = size_t(h) * (dn + dv) + d, e = r * kl + c;
        if (wdtype == kF32) {
            static_cast<uint32_t*>(dst)[t] = reinterpret_cast<const uint32_t*>(w)[e];
        } else if (wdtype == kBF16 || wdtype == kF16) {
            static_cast<uint16_t*>(dst)[t] = reinterpret_cast<const uint16_t*>(w)[e];
        } else {
            const float* srow = wscale + (r / br) * ((kl + bc - 1) / bc);
            static_cast<float*>(dst)[t] = __fmul_rn(f8e4m3(w[e]), srow[c / bc]);
        }
    }
}

namespace {

constexpr int kMlaG = 16;     // query heads an attention block handles
constexpr int kMlaTile = 32;  // keys an attention block scores at a time
constexpr int kMlaWarps = 8;  // warps of an attention block (256 threads)
constexpr int kMlaKeys = kMlaTile / kMlaWarps;  // keys a warp scores a tile
constexpr int kMlaCh = 5;     // 128-dim chunks of a cache row the prefetching score path holds (kl + dr ≤ 640)

// kv4 widens the 4 cache values at element e (a multiple of 4) into o.
template <bool BF>
__device__ inline void kv4(const void* c, size_t e, float* o) {
    if (BF) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(c) + e);
        BF16W::pair(p[0], o);
        BF16W::pair(p[1], o + 2);
    } else {
        const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(c) + e);
        o[0] = v.x;
        o[1] = v.y;
        o[2] = v.z;
        o[3] = v.w;
    }
}

struct MlaArgs {
    float* lat;          // (n, heads, kl) with one split; may be qc (the block stages its queries first)
    float* part;         // (n, heads, splits, kl + 2) per split: max, sum, kl unnormalised sums
    const float* qc;     // (n, heads, kl) absorbed queries W_UK_hᵀ·q_nope; null for zeros (dn = 0)
    const float* q;      // (n, heads·(dn + dr)) the rotated queries (their q_pe)
    const void* cache;   // (slots, kl + dr) F32 or BF16
    const int* pos;
    const int* seq;
    const int* blocks;
    const int* sel;      // (n, k) selections, or null (dense)
    int k, max_blocks, bs, heads, gs, kl, dn, dr, split;
    float scale;
};

// Latent attention of block (row i, head group y, split z): heads
// [y·gs, min(heads, (y+1)·gs)) over the keys [z·split, (z+1)·split) of the
// row's key list (positions 0..pos[i], or its selection; −1 entries and
// positions past pos[i] are skipped). Per tile of 32 keys: the warps score
// the keys (a key per warp at a time, lanes across its kl + dr dims, every
// head of the group), one warp per head updates its online softmax, then
// every thread adds the tile's latents to its DPT dims of each head's sum.
template <int DPT, bool BF>
__device__ void mla_attn_block(const MlaArgs& a) {
    extern __shared__ float sq[];  // (gs, kw) the group's absorbed queries
    __shared__ float sp[kMlaG][kMlaTile];  // scaled scores, then probabilities
    __shared__ float scorr[kMlaG];         // the tile's rescale factor per head
    __shared__ float sm[kMlaG], sl[kMlaG]; // final max and sum per head
    __shared__ int sslot[kMlaTile];        // cache slot of each key of the tile, −1 for none
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x;
    const int h0 = blockIdx.y * a.gs;
    const int ng = min(a.gs, a.heads - h0);
    const int kl = a.kl, kw = a.kl + a.dr;
    const int p_max = a.pos[i];
    const int* sel = a.sel ? a.sel + size_t(i) * a.k : nullptr;
    // A selection lists distinct positions ≤ p_max first, −1 after them
    // (kernels/ref SelectTopK, KPoolTokens): its first p_max + 1 entries
    // hold them all, so a short context skips the width's −1 tail.
    const int end = sel ? min(a.k, p_max + 1) : p_max + 1;
    const int k0 = blockIdx.z * a.split, k1 = min(end, k0 + a.split);
    const int* bt = a.blocks + size_t(a.seq[i]) * a.max_blocks;

    for (int t = threadIdx.x; t < a.gs * kw; t += blockDim.x) {
        const int g = t / kw, d = t % kw;
        const size_t hh = size_t(i) * a.heads + h0 + g;
        float v = 0.f;
        if (g < ng && d < kl) v = a.qc ? a.qc[hh * kl + d] : 0.f;
        if (g < ng && d >= kl) v = a.q[hh * (a.dn + a.dr) + a.dn + d - kl];
        sq[t] = v;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // heads warp and warp + 8
    float acc[kMlaG][DPT];
#pragma unroll
    for (int g = 0; g < kMlaG; g++) {
#pragma unroll
        for (int j = 0; j < DPT; j++) acc[g][j] = 0.f;
    }
    __syncthreads();

    for (int t0 = k0; t0 < k1; t0 += kMlaTile) {
        if (threadIdx.x < kMlaTile) {
            const int j = t0 + threadIdx.x;
            int s = -1;
            if (j < k1) {
                const int p = sel ? sel[j] : j;
                if (p >= 0 && p <= p_max) s = bt[p / a.bs] * a.bs + p % a.bs;
            }
            sslot[threadIdx.x] = s;
        }
        __syncthreads();
        // Scores: sp[g][kk] = scale·(q̃_g·c_kk + q_pe_g·k_pe_kk), −∞ for no key.
        auto store = [&](const float (&part)[kMlaG], int kk, int s) {
#pragma unroll
            for (int g = 0; g < kMlaG; g++) {
                const float v = g < a.gs ? warp_sum(part[g]) : 0.f;  // the group's heads (gs is block-uniform)
                if (lane == 0) sp[g][kk] = s >= 0 ? v * a.scale : -INFINITY;
            }
        };
        if (kw % 4 == 0 && kw <= 128 * kMlaCh) {
            // The warp's keys are all loaded before any is scored (one round
            // of memory latency a tile): 4 dims a lane, 8-byte (bf16) or
            // 16-byte loads, the queries read as float4.
            float kd[kMlaKeys][kMlaCh][4];
#pragma unroll
            for (int u = 0; u < kMlaKeys; u++) {
                const int s = sslot[warp + kMlaWarps * u];
#pragma unroll
                for (int c = 0; c < kMlaCh; c++) {
                    const int d = lane * 4 + 128 * c;
                    if (s >= 0 && d < kw) kv4<BF>(a.cache, size_t(s) * kw + d, kd[u][c]);
                    else kd[u][c][0] = kd[u][c][1] = kd[u][c][2] = kd[u][c][3] = 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < kMlaKeys; u++) {
                float part[kMlaG];
#pragma unroll
                for (int g = 0; g < kMlaG; g++) part[g] = 0.f;
#pragma unroll
                for (int c = 0; c < kMlaCh; c++) {
                    const int d = lane * 4 + 128 * c;
                    if (d < kw) {
#pragma unroll
                        for (int g = 0; g < kMlaG; g++) {
                            if (g < a.gs) {
                                const float4 qv = *reinterpret_cast<const float4*>(sq + g * kw + d);
                                const float* k4 = kd[u][c];
                                part[g] = fmaf(qv.x, k4[0], fmaf(qv.y, k4[1], fmaf(qv.z, k4[2], fmaf(qv.w, k4[3], part[g]))));
                            }
                        }
                    }
                }
                store(part, warp + kMlaWarps * u, sslot[warp + kMlaWarps * u]);
            }
        } else {  // other widths: a key at a time, a dim a lane
            for (int kk = warp; kk < kMlaTile; kk += kMlaWarps) {
                const int s = sslot[kk];
                float part[kMlaG];
#pragma unroll
                for (int g = 0; g < kMlaG; g++) part[g] = 0.f;
                if (s >= 0) {
                    for (int d = lane; d < kw; d += 32) {
                        const float kv = kv_at<BF>(a.cache, size_t(s) * kw + d);
#pragma unroll
                        for (int g = 0; g < kMlaG; g++)
                            if (g < a.gs) part[g] = fmaf(sq[g * kw + d], kv, part[g]);
                    }
                }
                store(part, kk, s);
            }
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int g = warp + kMlaWarps * u;
            const float sc = sp[g][lane];
            const float mn = fmaxf(m[u], warp_max(sc));
            const float c = mn == -INFINITY ? 1.f : expf(m[u] - mn);  // 0 while m is −∞
            const float p = sc == -INFINITY ? 0.f : expf(sc - mn);
            l[u] = l[u] * c + warp_sum(p);
            m[u] = mn;
            sp[g][lane] = p;
            if (lane == 0) scorr[g] = c;
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < kMlaG; g++) {
            const float c = scorr[g];
#pragma unroll
            for (int j = 0; j < DPT; j++) acc[g][j] *= c;
        }
        // Values: a key without a slot has probability 0 and adds nothing.
#pragma unroll 4
        for (int kk = 0; kk < kMlaTile; kk++) {
            const int s = sslot[kk];
            float cv[DPT];
#pragma unroll
            for (int j = 0; j < DPT; j++) {
                const int d = threadIdx.x + 256 * j;
                cv[j] = s >= 0 && d < kl ? kv_at<BF>(a.cache, size_t(s) * kw + d) : 0.f;
            }
#pragma unroll
            for (int g = 0; g < kMlaG; g++) {
                if (g >= a.gs) break;
                const float p = sp[g][kk];
#pragma unroll
                for (int j = 0; j < DPT; j++) acc[g][j] = fmaf(p, cv[j], acc[g][j]);
            }
        }
        __syncthreads();  // sslot and sp are rewritten by the next tile
    }

    if (lane == 0) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            sm[warp + kMlaWarps * u] = m[u];
            sl[warp + kMlaWarps * u] = l[u];
        }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kMlaG; g++) {
        if (g >= ng) break;
        const size_t hrow = size_t(i) * a.heads + h0 + g;
        if (gridDim.z == 1) {
            const float L = sl[g];
#pragma unroll
            for (int j = 0; j < DPT; j++) {
                const int d = threadIdx.x + 256 * j;
                if (d < kl) a.lat[hrow * kl + d] = L > 0.f ? acc[g][j] / L : 0.f;
            }
        } else {
            float* pp = a.part + (hrow * gridDim.z + blockIdx.z) * (kl + 2);
            if (threadIdx.x == 0) {
                pp[0] = sm[g];
                pp[1] = sl[g];
            }
#pragma unroll
            for (int j = 0; j < DPT; j++) {
                const int d = threadIdx.x + 256 * j;
                if (d < kl) pp[2 + d] = acc[g][j];
            }
        }
    }
}

}  // namespace

// Latent attention: lat (n, heads, kl) = the softmax(scale·(q̃·c + q_pe·k_pe))
// weighted sum of the latents c, from the absorbed queries q̃ = qc (n,
// heads, kl) and the q_pe of q (n, heads·(dn + dr)); per split into part
// when there are several (merged by ferrite_mla_combine). A row that
// attends to nothing gets zeros. Launch: grid (n, ceil(heads / gs), splits), 256 threads, dynamic
// shared memory gs·(kl + dr)·4 bytes; gs ≤ 16, kl ≤ 256·DPT.
#define FERRITE_MLA_ATTN(name, DPT, BF)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) name(                                                    \
        float* lat, float* part, const float* qc, const float* q, const void* cache, const int* pos,            \
        const int* seq, const int* blocks, const int* sel, int k, int max_blocks, int bs, int heads, int gs,     \
        int kl, int dn, int dr, int split, float scale) {                                                       \
        MlaArgs a{lat, part, qc, q, cache, pos, seq, blocks, sel, k, max_blocks, bs, heads, gs, kl, dn, dr,      \
                  split, scale};                                                                                \
        mla_attn_block<DPT, BF>(a);                                                                             \
    }

FERRITE_MLA_ATTN(ferrite_mla_attn_f32_1, 1, false)
FERRITE_MLA_ATTN(ferrite_mla_attn_f32_2, 2, false)
FERRITE_MLA_ATTN(ferrite_mla_attn_f32_4, 4, false)
FERRITE_MLA_ATTN(ferrite_mla_attn_bf16_1, 1, true)
FERRITE_MLA_ATTN(ferrite_mla_attn_bf16_2, 2, true)
FERRITE_MLA_ATTN(ferrite_mla_attn_bf16_4, 4, true)

// Merges the splits of ferrite_mla_attn_*: lat (n, heads·kl) from part (n,
// heads, splits, kl + 2), as ops.cu's ferrite_attn_combine does for GQA
// but with zeros for a head whose row attended to nothing (an empty DSA
// selection), which GQA attention never meets. Launch: grid (n, heads),
// 128 threads.
extern "C" __global__ void ferrite_mla_combine(float* lat, const float* part, int heads, int kl, int splits) {
    const int i = blockIdx.x, h = blockIdx.y;
    const float* pp = part + (size_t(i) * heads + h) * splits * (kl + 2);
    float mx = -INFINITY;
    for (int z = 0; z < splits; z++) mx = fmaxf(mx, pp[z * (kl + 2)]);
    for (int d = threadIdx.x; d < kl; d += blockDim.x) {
        float L = 0.f, A = 0.f;
        for (int z = 0; z < splits; z++) {
            const float mz = pp[z * (kl + 2)];
            if (mz == -INFINITY) continue;
            const float c = expf(mz - mx);
            L += pp[z * (kl + 2) + 1] * c;
            A += pp[z * (kl + 2) + 2 + d] * c;
        }
        lat[(size_t(i) * heads + h) * kl + d] = L > 0.f ? A / L : 0.f;
    }
}

// ---------------------------------------------------------------------------
// DSA indexer scores: scores[i, t] (L columns, row stride L) =
// Σ_h w[i, h]·ReLU(scale·q[i, h]·key_t) for t ≤ pos[i] (float32 dot
// products, the heads added in order), −∞ for t > pos[i], 0 for every
// visible t of a row with pos[i] + 1 ≤ topk. A thread per column, heads in
// groups of 8 against the key read 8 dims at a time; the row's query is
// staged in shared memory when it fits (staged). Launch: grid (n,
// ceil(L / 128)), 128 threads, dynamic shared memory heads·dim·4 bytes when
// staged.
template <bool BF>
__device__ void dsa_scores(float* scores, int L, const float* q, const float* w, const void* keys, const int* pos,
                           const int* seq, const int* blocks, int max_blocks, int bs, int heads, int dim, float scale,
                           int topk, int staged) {
    extern __shared__ float sqk[];
    const int i = blockIdx.x;
    const int t0 = blockIdx.y * blockDim.x, t = t0 + threadIdx.x;
    const int len = pos[i] + 1;
    float* row = scores + size_t(i) * L;
    if (t0 >= len || len <= topk) {  // block-uniform: no scores to compute
        if (t < L) row[t] = t < len ? 0.f : -INFINITY;
        return;
    }
    const float* qr = q + size_t(i) * heads * dim;
    if (staged) {
        for (int j = threadIdx.x; j < heads * dim; j += blockDim.x) sqk[j] = qr[j];
        __syncthreads();
        qr = sqk;
    }
    if (t >= L) return;
    if (t >= len) {
        row[t] = -INFINITY;
        return;
    }
    const size_t base = (size_t(blocks[size_t(seq[i]) * max_blocks + t / bs]) * bs + t % bs) * dim;
    const float* wr = w + size_t(i) * heads;
    float v = 0.f;
    for (int hg = 0; hg < heads; hg += 8) {
        float s[8];
#pragma unroll
        for (int g = 0; g < 8; g++) s[g] = 0.f;
        if (dim % 8 == 0) {
            for (int d = 0; d < dim; d += 8) {
                float kd[8];
                kv8<BF>(keys, base + d, kd);
#pragma unroll
                for (int g = 0; g < 8; g++) {
                    const float* qh = qr + size_t(min(hg + g, heads - 1)) * dim + d;
#pragma unroll
                    for (int e = 0; e < 8; e++) s[g] = fmaf(qh[e], kd[e], s[g]);
                }
            }
        } else {
            for (int d = 0; d < dim; d++) {
                const float kd = kv_at<BF>(keys, base + d);
#pragma unroll
                for (int g = 0; g < 8; g++) s[g] = fmaf(qr[size_t(min(hg + g, heads - 1)) * dim + d], kd, s[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < 8; g++) {
            const float dt = __fmul_rn(s[g], scale);
            if (hg + g < heads && dt > 0.f) v = __fadd_rn(v, __fmul_rn(wr[hg + g], dt));
        }
    }
    row[t] = v;
}

#define FERRITE_DSA_SCORES(name, BF)                                                                               \
    extern "C" __global__ void __launch_bounds__(128) name(                                                       \
        float* scores, int L, const float* q, const float* w, const void* keys, const int* pos, const int* seq,  \
        const int* blocks, int max_blocks, int bs, int heads, int dim, float scale, int topk, int staged) {      \
        dsa_scores<BF>(scores, L, q, w, keys, pos, seq, blocks, max_blocks, bs, heads, dim, scale, topk, staged); \
    }

FERRITE_DSA_SCORES(ferrite_dsa_scores_f32, false)
FERRITE_DSA_SCORES(ferrite_dsa_scores_bf16, true)

// ---------------------------------------------------------------------------
// Top-k selection, one block per row: sel[i] (k) = the columns of the k
// largest scores[i] (L), ties to the lower column, in ascending column
// order, −∞ ones left out, −1 after them — kernels/ref.SelectTopK exactly
// (its order: cmp.Compare, so NaN ranks below −∞ and −0 equals +0). A
// radix select over an order-preserving 32-bit key finds the k-th key T in
// four passes of 8 bits; a last pass writes, in column order, the columns
// above T and the first of those equal to T. Launch: grid n, 512 threads.

namespace {

constexpr int kTopKThreads = 512;

constexpr uint32_t kNegInfKey = 0x007fffffu;  // rank_key(−∞)

}  // namespace

extern "C" __global__ void __launch_bounds__(kTopKThreads)
    ferrite_topk(int* sel, int k, const float* scores, int stride, int L) {
    __shared__ int hist[256];
    __shared__ int cnt[kTopKThreads / 32];
    __shared__ int s_bin, s_need;
    const float* row = scores + size_t(blockIdx.x) * stride;
    int* out = sel + size_t(blockIdx.x) * k;
    uint32_t T = 0;  // the k-th largest key (0 with k ≥ L: every column)
    int need = L;    // how many columns with key T to take, in column order
    if (k < L) {
        uint32_t mask = 0;
        need = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int c = threadIdx.x; c < L; c += blockDim.x) {
                const uint32_t u = rank_key(row[c]);
                if ((u & mask) == T) atomicAdd(&hist[(u >> shift) & 255u], 1);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                // The keys matching T number at least need: find the digit
                // whose bin holds the need-th largest of them.
                int cum = 0, b = 255;
                for (; b > 0 && cum + hist[b] < need; b--) cum += hist[b];
                s_bin = b;
                s_need = need - cum;
            }
            __syncthreads();
            T |= uint32_t(s_bin) << shift;
            mask |= 255u << shift;
            need = s_need;
            __syncthreads();  // s_bin and s_need are rewritten by the next pass
        }
    }
    int written = 0;
    for (int c0 = 0; c0 < L; c0 += blockDim.x) {
        const int c = c0 + threadIdx.x;
        const uint32_t u = c < L ? rank_key(row[c]) : 0u;
        const bool eq = c < L && u == T;
        int tie;
        const int ties = flag_scan(eq, &tie, cnt);
        const bool take = c < L && (u > T || (eq && tie < need));
        const bool emit = take && u != kNegInfKey;
        int at;
        const int emitted = flag_scan(emit, &at, cnt);
        if (emit) out[written + at] = c;
        written += emitted;
        need -= min(ties, need);
    }
    for (int j = written + threadIdx.x; j < k; j += blockDim.x) out[j] = -1;
}
