// Multi-head latent attention on tensor cores: the absorbed-form latent
// attention of AttentionMLA (kernels/cuda's mla.go) for a BF16 cache of
// 512 latent and 64 rope dims — DeepSeek-V3/V3.2, GLM-4.7-Flash, GLM-5 —
// with mma.sync m16n8k16 bf16 → f32 (sm_80 and up). ops_mla.cu's
// ferrite_mla_attn_* stay for the other shapes, the F32 cache, and as the
// A/B baseline (FERRITE_MLA_TC=0).
//
// Block (row i, head group y, split z), 8 warps: every head of the group
// (gs ≤ 32) shares each key tile, which is read from the cache once per
// block into shared memory (cp.async, double-buffered: the next tile
// streams in while this one is scored and summed). Per tile of 32 keys:
//   scores  Sᵀ (32 keys × 8·NT heads) = C (32 × 576) · Qᵀ: A the cached rows
//           (exact bf16), B the absorbed query [q̃ | q_pe] split into three
//           bf16 terms (hi + mid + lo carry 24 bits: float32's product up to
//           2⁻²⁴ relative), staged once per block in B-fragment order; warp
//           w takes key half w & 1 and dims quarter w >> 1 (9 k-steps), the
//           four quarters added in float32 through shared memory;
//   softmax one warp per head (heads w, w + 8, …), a lane per key, the
//           running max and sum in float32 registers as in ops_mla.cu;
//   values  Oᵀ (512 × 8·NT) += Cᵀ (512 × 32) · Pᵀ: A the tile's latents
//           transposed by ldmatrix, B the probabilities split into two bf16
//           terms (2⁻¹⁷ relative); warp w owns latent dims 64w … 64w + 63
//           in its accumulators.
// Every sum is float32. With one split the block writes lat; with several
// it writes its unnormalised sums and (max, sum) per head, merged by
// ferrite_mla_merge.
//
// The sources compile as one translation unit in name order, so this file
// uses prefill.cu's pack_bf16, ldsm_x4, ldsm_x4_t, cp16, cp_commit, cp_wait
// and smem_addr, ops_common.cu's mma_bf16, ops.cu's warp_max, gemv.cu's
// warp_sum and ops_mla.cu's MlaArgs.

namespace {

constexpr int kTcKL = 512;                // latent dims
constexpr int kTcDR = 64;                 // rope dims
constexpr int kTcKW = kTcKL + kTcDR;      // a cache row
constexpr int kTcKS = kTcKW / 16;         // k-steps of a cache row (36)
constexpr int kTcKeys = 32;               // keys per tile
constexpr int kTcStride = kTcKW + 8;      // shared row stride in elements: ldmatrix rows on distinct banks
constexpr int kTcWarps = 8;
constexpr int kTcQuarter = kTcKS / 4;     // k-steps a warp scores (9)
constexpr int kTcChunks = kTcKW / 8 / 8;  // 16-byte chunks a thread copies per tile (9): 8 threads a key

static_assert(kTcKS % 4 == 0, "score quarters");
static_assert(kTcKL == kTcWarps * 64, "a warp's 64 latent dims");
static_assert(kTcWarps * 32 == kTcKeys * 8, "8 copying threads a key");

// Shared memory of the NT-head-tile kernel, byte offsets from the base.
template <int NT>
struct TcSmem {
    static constexpr int q = 0;                                          // uint2 [3 terms][NT][36 k-steps][32 lanes]
    static constexpr int tile = q + 3 * NT * kTcKS * 32 * 8;             // bf16 [2][32 keys][kTcStride]
    static constexpr int s = tile + 2 * kTcKeys * kTcStride * 2;         // float [4 quarters][32 keys][8·NT + 1]
    static constexpr int p = s + 4 * kTcKeys * (8 * NT + 1) * 4;         // uint2 [2 terms][2 k-steps][NT][32 lanes]
    static constexpr int misc = p + 2 * 2 * NT * 32 * 8;                 // float corr, m, l [32]; int valid [2][32]
    static constexpr int bytes = misc + (3 * 32 + 2 * kTcKeys) * 4;
};

// bf16_bits rounds v to bf16 (nearest even).
__device__ inline uint32_t bf16_bits(float v) { return pack_bf16(v, 0.f) & 0xffffu; }

// Latent attention of block (row i, head group y, split z) on tensor
// cores; MlaArgs as ops_mla.cu's mla_attn_block reads them (kl = 512,
// dr = 64, a BF16 cache, gs ≤ 8·NT), part the per-split sums (n, heads,
// splits, 512) and ml their (max, sum) (n, heads, splits, 2).
template <int NT>
__device__ void mla_tc_block(const MlaArgs& a, float* ml) {
    extern __shared__ __align__(16) uint8_t tc_smem[];
    using L = TcSmem<NT>;
    uint32_t* sQ = reinterpret_cast<uint32_t*>(tc_smem + L::q);
    uint16_t* sC = reinterpret_cast<uint16_t*>(tc_smem + L::tile);
    float* sS = reinterpret_cast<float*>(tc_smem + L::s);
    uint16_t* sP = reinterpret_cast<uint16_t*>(tc_smem + L::p);
    float* sCorr = reinterpret_cast<float*>(tc_smem + L::misc);
    float* sM = sCorr + 32;
    float* sL = sM + 32;
    int* sValid = reinterpret_cast<int*>(sL + 32);
    constexpr int HS = 8 * NT + 1;  // sS row stride: the heads (8·NT), one more so a warp's keys hit distinct banks

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int i = blockIdx.x;
    const int h0 = blockIdx.y * a.gs;
    const int ng = min(a.gs, a.heads - h0);
    const int p_max = a.pos[i];
    const int* sel = a.sel ? a.sel + size_t(i) * a.k : nullptr;
    const int end = sel ? min(a.k, p_max + 1) : p_max + 1;  // the selection's valid prefix (mla_attn_block)
    const int k0 = blockIdx.z * a.split, k1 = min(end, k0 + a.split);
    const int* bt = a.blocks + size_t(a.seq[i]) * a.max_blocks;
    const int ntiles = k1 > k0 ? (k1 - k0 + kTcKeys - 1) / kTcKeys : 0;

    // Thread tid copies chunks (tid & 7) + 8c of key tid >> 3 of a tile.
    // slot_of is that key's cache slot in tile j, −1 for none (past the
    // tile count or k1, −1 in the selection, past the row's position): it
    // is read a tile ahead of issue, so that the copies do not wait on the
    // block table. issue starts the copy of a tile into buffer buf, zeros
    // for a key without a slot, and marks the key valid or not.
    auto slot_of = [&](int j) {
        const int kj = k0 + j * kTcKeys + (tid >> 3);
        int s = -1;
        if (j < ntiles && kj < k1) {
            const int p = sel ? sel[kj] : kj;
            if (p >= 0 && p <= p_max) s = bt[p / a.bs] * a.bs + p % a.bs;
        }
        return s;
    };
    auto issue = [&](int s, int buf) {
        const int key = tid >> 3;
        if ((tid & 7) == 0) sValid[buf * kTcKeys + key] = s >= 0;
        const uint16_t* src = static_cast<const uint16_t*>(a.cache) + size_t(max(s, 0)) * kTcKW;
        uint16_t* dst = sC + (buf * kTcKeys + key) * kTcStride;
#pragma unroll
        for (int c = 0; c < kTcChunks; c++) {
            const int part = (tid & 7) + 8 * c;
            cp16(smem_addr(dst + part * 8), src + part * 8, s >= 0 ? 16 : 0);
        }
    };
    if (ntiles > 0) issue(slot_of(0), 0);
    cp_commit();
    int s_next = slot_of(1);  // tile 1's slot, in flight while the queries are staged

    // The group's queries as B fragments (k = dims, n = heads): register
    // reg of lane ln of (n-tile nt, k-step ks) holds dims 16ks + 2(ln & 3)
    // + 8reg and the next of head 8nt + (ln >> 2), in three bf16 terms.
    // A constant trip count, unrolled, so that the loads of several
    // iterations are in flight together.
    constexpr int qn = NT * kTcKS * 32 * 2;  // registers a term
    static_assert(qn % (kTcWarps * 32) == 0, "whole rounds of the query staging");
#pragma unroll 9
    for (int it = 0; it < qn / (kTcWarps * 32); it++) {
        if (ntiles == 0) break;  // an empty split needs no query (block-uniform)
        const int e = tid + kTcWarps * 32 * it;
        const int reg = e & 1, ln = (e >> 1) & 31, rest = e >> 6;
        const int ks = rest % kTcKS, nt = rest / kTcKS;
        const int head = nt * 8 + (ln >> 2), d = ks * 16 + 2 * (ln & 3) + 8 * reg;
        float x0 = 0.f, x1 = 0.f;
        if (head < ng) {
            const size_t hh = size_t(i) * a.heads + h0 + head;
            // Pairs of adjacent dims, 8-byte aligned: d, dn and kl are even.
            const float* src = nullptr;
            if (d < kTcKL) {
                if (a.qc) src = a.qc + hh * kTcKL + d;
            } else {
                src = a.q + hh * (a.dn + kTcDR) + a.dn + (d - kTcKL);
            }
            if (src) {
                const float2 v = *reinterpret_cast<const float2*>(src);
                x0 = v.x;
                x1 = v.y;
            }
        }
#pragma unroll
        for (int term = 0; term < 3; term++) {
            const uint32_t v = pack_bf16(x0, x1);
            sQ[term * qn + e] = v;
            x0 -= __uint_as_float(v << 16);  // exact: x minus its bf16 rounding
            x1 -= __uint_as_float(v & 0xffff0000u);
        }
    }
    for (int e = tid; e < 2 * 2 * NT * 32 * 4; e += kTcWarps * 32) sP[e] = 0;  // heads past ng keep P = 0
    if (tid < 32) sCorr[tid] = 1.f;

    float o[4][NT][4];  // Oᵀ: dims 64·warp + 16mi + g (+8 for e ≥ 2), heads 8nt + 2t + (e & 1)
#pragma unroll
    for (int mi = 0; mi < 4; mi++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[mi][nt][e] = 0.f;
        }
    }
    float m_r[NT], l_r[NT];  // running max and sum of heads warp + 8u
#pragma unroll
    for (int u = 0; u < NT; u++) {
        m_r[u] = -INFINITY;
        l_r[u] = 0.f;
    }

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1;
        cp_wait<0>();
        __syncthreads();  // tile j is in; every thread is done with tile j − 1 (buffer buf ^ 1, sS, sP)
        if (j + 1 < ntiles) issue(s_next, buf ^ 1);
        cp_commit();
        s_next = slot_of(j + 2);  // read while this tile is scored and summed
        const uint16_t* cb = sC + buf * kTcKeys * kTcStride;

        {  // Scores: warp w, keys 16(w & 1) …, k-steps 9(w >> 1) …
            const int mt = warp & 1, kq = warp >> 1;
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            const int row = mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const uint32_t abase = smem_addr(cb + row * kTcStride + ((lane >> 4) & 1) * 8);
            const uint2* q2 = reinterpret_cast<const uint2*>(sQ);
#pragma unroll 3
            for (int kk = 0; kk < kTcQuarter; kk++) {
                const int ks = kq * kTcQuarter + kk;
                uint32_t af[4];
                ldsm_x4(af, abase + ks * 32);
#pragma unroll
                for (int term = 0; term < 3; term++) {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const uint2 b = q2[((term * NT + nt) * kTcKS + ks) * 32 + lane];
                        mma_bf16(s[nt], af, b.x, b.y);
                    }
                }
            }
            float* sp = sS + kq * kTcKeys * HS;
            const int key = mt * 16 + g;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int hd = nt * 8 + 2 * t;
                sp[key * HS + hd] = s[nt][0];
                sp[key * HS + hd + 1] = s[nt][1];
                sp[(key + 8) * HS + hd] = s[nt][2];
                sp[(key + 8) * HS + hd + 1] = s[nt][3];
            }
        }
        __syncthreads();

        // Softmax: warp w takes heads w + 8u, a lane per key; the
        // probabilities go to sP as B fragments (k = keys, n = heads) in
        // two bf16 terms.
#pragma unroll
        for (int u = 0; u < NT; u++) {
            const int h = warp + 8 * u;
            if (h >= ng) continue;  // warp-uniform
            float sc = 0.f;
#pragma unroll
            for (int kq = 0; kq < 4; kq++) sc += sS[(kq * kTcKeys + lane) * HS + h];
            const bool valid = sValid[buf * kTcKeys + lane] != 0;
            sc = valid ? sc * a.scale : -INFINITY;
            const float mn = fmaxf(m_r[u], warp_max(sc));
            const float c = mn == -INFINITY ? 1.f : expf(m_r[u] - mn);  // 0 while m is −∞
            const float p = valid ? expf(sc - mn) : 0.f;
            l_r[u] = l_r[u] * c + warp_sum(p);
            m_r[u] = mn;
            if (lane == 0) sCorr[h] = c;
            const uint32_t hi = bf16_bits(p);
            const uint32_t lo = bf16_bits(p - __uint_as_float(hi << 16));
            const int ks = lane >> 4, kk = lane & 15;
            const int idx = ((ks * NT + (h >> 3)) * 32 + (h & 7) * 4 + ((kk & 7) >> 1)) * 4 + (kk >> 3) * 2 + (kk & 1);
            sP[idx] = uint16_t(hi);
            sP[idx + 2 * NT * 32 * 4] = uint16_t(lo);
        }
        __syncthreads();

        {  // Values: warp w's dims 64w … 64w + 63 over the tile's 32 keys.
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float c0 = sCorr[nt * 8 + 2 * t], c1 = sCorr[nt * 8 + 2 * t + 1];
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    o[mi][nt][0] *= c0;
                    o[mi][nt][1] *= c1;
                    o[mi][nt][2] *= c0;
                    o[mi][nt][3] *= c1;
                }
            }
            const uint2* p2 = reinterpret_cast<const uint2*>(sP);
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                const int key = ks * 16 + (lane & 7) + ((lane >> 4) & 1) * 8;
                const uint32_t abase = smem_addr(cb + key * kTcStride + warp * 64 + ((lane >> 3) & 1) * 8);
                uint2 b[2][NT];
#pragma unroll
                for (int term = 0; term < 2; term++) {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) b[term][nt] = p2[((term * 2 + ks) * NT + nt) * 32 + lane];
                }
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    uint32_t af[4];
                    ldsm_x4_t(af, abase + mi * 32);
#pragma unroll
                    for (int term = 0; term < 2; term++) {
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) mma_bf16(o[mi][nt], af, b[term][nt].x, b[term][nt].y);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int u = 0; u < NT; u++) {
        const int h = warp + 8 * u;
        if (lane == 0 && h < ng) {
            sM[h] = m_r[u];
            sL[h] = l_r[u];
        }
    }
    __syncthreads();
    const int splits = gridDim.z;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int head = nt * 8 + 2 * t + (e & 1);
            if (head >= ng) continue;
            const size_t hrow = size_t(i) * a.heads + h0 + head;
            const float Ls = sL[head];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int d = warp * 64 + mi * 16 + g + (e >> 1) * 8;
                if (splits == 1) a.lat[hrow * kTcKL + d] = Ls > 0.f ? o[mi][nt][e] / Ls : 0.f;
                else a.part[(hrow * splits + blockIdx.z) * kTcKL + d] = o[mi][nt][e];
            }
        }
    }
    if (splits > 1 && tid < ng) {
        const size_t hrow = size_t(i) * a.heads + h0 + tid;
        ml[(hrow * splits + blockIdx.z) * 2] = sM[tid];
        ml[(hrow * splits + blockIdx.z) * 2 + 1] = sL[tid];
    }
}

}  // namespace

// Latent attention on tensor cores: lat (n, heads, 512) = the
// softmax(scale·(q̃·c + q_pe·k_pe)) weighted sum of the latents, as
// ferrite_mla_attn_* computes it, for a BF16 cache (slots, 576); with
// several splits part (n, heads, splits, 512) gets each split's
// unnormalised sums and ml (n, heads, splits, 2) its max and sum. Launch:
// grid (n, ceil(heads / gs), splits), 256 threads, dynamic shared memory
// TcSmem<NT>::bytes (above 48 KiB: the kernel's limit raised at load);
// gs ≤ 8·NT.
#define FERRITE_MLA_TC(name, NT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 1) name(                                                  \
        float* lat, float* part, float* ml, const float* qc, const float* q, const void* cache, const int* pos,  \
        const int* seq, const int* blocks, const int* sel, int k, int max_blocks, int bs, int heads, int gs,     \
        int dn, int split, float scale) {                                                                       \
        FERRITE_PDL_WAIT();                                                                                     \
        MlaArgs a{lat, part, qc, q, cache, pos, seq, blocks, sel, k, max_blocks, bs, heads, gs, kTcKL, dn, kTcDR, \
                  split, scale};                                                                                \
        mla_tc_block<NT>(a, ml);                                                                                \
    }

FERRITE_MLA_TC(ferrite_mla_tc_1, 1)
FERRITE_MLA_TC(ferrite_mla_tc_2, 2)
FERRITE_MLA_TC(ferrite_mla_tc_3, 3)
FERRITE_MLA_TC(ferrite_mla_tc_4, 4)

// Merges the splits of ferrite_mla_tc_*: lat (n, heads, kl) = Σ_z w_z·part_z
// / Σ_z w_z·l_z with w_z = exp(m_z − max m), zeros for a head whose row
// attended to nothing. The weights are computed once per (row, head) into
// shared memory, then every thread sums 4 dims over the splits with
// independent loads. Launch: grid (n, heads), 128 threads, dynamic shared
// memory splits·4 bytes; kl a multiple of 4.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_mla_merge(float* lat, const float* part, const float* ml, int heads, int kl, int splits) {
    FERRITE_PDL_WAIT();
    extern __shared__ float merge_w[];  // (splits)
    __shared__ float red[4];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t hrow = size_t(blockIdx.x) * heads + blockIdx.y;
    const float* m = ml + hrow * splits * 2;
    float mx = -INFINITY;
    for (int z = tid; z < splits; z += blockDim.x) mx = fmaxf(mx, m[2 * z]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    __syncthreads();  // red is reused for the sums
    float L = 0.f;
    for (int z = tid; z < splits; z += blockDim.x) {
        const float mz = m[2 * z];
        const float w = mz == -INFINITY ? 0.f : expf(mz - mx);
        merge_w[z] = w;
        L += m[2 * z + 1] * w;
    }
    L = warp_sum(L);
    if (lane == 0) red[warp] = L;
    __syncthreads();
    L = (red[0] + red[1]) + (red[2] + red[3]);
    const float* pp = part + hrow * splits * kl;
    for (int d = tid * 4; d < kl; d += blockDim.x * 4) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int z = 0; z < splits; z++) {
            const float w = merge_w[z];
            if (w == 0.f) continue;  // an empty split (or one far below the max)
            const float4 v = *reinterpret_cast<const float4*>(pp + size_t(z) * kl + d);
            acc.x = fmaf(w, v.x, acc.x);
            acc.y = fmaf(w, v.y, acc.y);
            acc.z = fmaf(w, v.z, acc.z);
            acc.w = fmaf(w, v.w, acc.w);
        }
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (L > 0.f) r = make_float4(acc.x / L, acc.y / L, acc.z / L, acc.w / L);
        *reinterpret_cast<float4*>(lat + hrow * kl + d) = r;
    }
}

// ---------------------------------------------------------------------------
// Per-head projection on tensor cores, ops_mla.cu's ferrite_mla_proj for a
// BF16 weight: y[i·y_rs + h·y_hs + r] = W[h·w_hrows + row0 + r]·x[i·x_rs +
// h·x_hs] (K values) for r < rows, i < n. Block (32 weight rows, head h,
// 8·NQ query rows), 8 warps: the block's query rows are staged once as B
// fragments (k = K, n = query rows) in three bf16 terms (float32's
// product, as in ferrite_mla_tc_*); warp w takes the m-tile of 16 weight
// rows w & 1 over k-quarter w >> 1, its A fragments read from the weight's
// rows in global memory (a 32-byte sector a row and k-step), and the
// quarters are added through shared memory in order. A row's sums do not
// depend on the other rows of the call. Launch: grid (ceil(rows / 32),
// heads, ceil(n / (8·NQ))), 256 threads, dynamic shared memory
// NQ·(48·K + 3,072) bytes; K a multiple of 16, x_rs and x_hs even.
template <int NQ>
__device__ void mla_proj_tc(float* y, int y_rs, int y_hs, const float* x, int x_rs, int x_hs, int n, int rows, int w_hrows,
                            const uint16_t* w, int K, int row0) {
    extern __shared__ __align__(16) uint8_t pj_smem[];
    const int KS = K / 16;
    const int qn = KS * NQ * 32 * 2;                                    // registers a term
    uint32_t* sB = reinterpret_cast<uint32_t*>(pj_smem);                 // [3 terms][KS][NQ n-tiles][32 lanes][2]
    float* sR = reinterpret_cast<float*>(pj_smem + size_t(3) * qn * 4);  // [3 quarters][2 m-tiles][NQ][32 lanes][4]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, r0 = blockIdx.x * 32, m0 = blockIdx.z * 8 * NQ;

    // Register reg of lane ln of (k-step ks, n-tile nt) holds k = 16ks +
    // 2(ln & 3) + 8reg and k + 1 of query row m0 + 8nt + (ln >> 2).
#pragma unroll 8
    for (int e = tid; e < qn; e += 256) {
        const int reg = e & 1, ln = (e >> 1) & 31, nt = (e >> 6) % NQ, ks = (e >> 6) / NQ;
        const int q = m0 + nt * 8 + (ln >> 2), k = ks * 16 + 2 * (ln & 3) + 8 * reg;
        float x0 = 0.f, x1 = 0.f;
        if (q < n) {
            const float2 v = *reinterpret_cast<const float2*>(x + size_t(q) * x_rs + size_t(h) * x_hs + k);
            x0 = v.x;
            x1 = v.y;
        }
#pragma unroll
        for (int term = 0; term < 3; term++) {
            const uint32_t v = pack_bf16(x0, x1);
            sB[term * qn + e] = v;
            x0 -= __uint_as_float(v << 16);
            x1 -= __uint_as_float(v & 0xffff0000u);
        }
    }

    const int mt = warp & 1, kq = warp >> 1;
    const int ksq = (KS + 3) / 4, ks0 = min(KS, kq * ksq), ks1 = min(KS, ks0 + ksq);
    const int ra = r0 + mt * 16 + g, rb = ra + 8;  // the lane's two weight rows
    const uint32_t* wa = ra < rows ? reinterpret_cast<const uint32_t*>(w + (size_t(h) * w_hrows + row0 + ra) * K) : nullptr;
    const uint32_t* wb = rb < rows ? reinterpret_cast<const uint32_t*>(w + (size_t(h) * w_hrows + row0 + rb) * K) : nullptr;
    float acc[NQ][4];
#pragma unroll
    for (int nt = 0; nt < NQ; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    __syncthreads();  // the query terms are staged
    const uint2* b2 = reinterpret_cast<const uint2*>(sB);
#pragma unroll 4
    for (int ks = ks0; ks < ks1; ks++) {
        const int kw = ks * 8 + t;  // the 32-bit word of k = 16ks + 2t
        uint32_t af[4];
        af[0] = wa ? wa[kw] : 0u;
        af[1] = wb ? wb[kw] : 0u;
        af[2] = wa ? wa[kw + 4] : 0u;
        af[3] = wb ? wb[kw + 4] : 0u;
#pragma unroll
        for (int term = 0; term < 3; term++) {
#pragma unroll
            for (int nt = 0; nt < NQ; nt++) {
                const uint2 b = b2[((term * KS + ks) * NQ + nt) * 32 + lane];
                mma_bf16(acc[nt], af, b.x, b.y);
            }
        }
    }
    if (kq > 0) {
#pragma unroll
        for (int nt = 0; nt < NQ; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) sR[((((kq - 1) * 2 + mt) * NQ + nt) * 32 + lane) * 4 + e] = acc[nt][e];
        }
    }
    __syncthreads();
    if (kq == 0) {
#pragma unroll
        for (int nt = 0; nt < NQ; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + mt * 16 + g + (e >> 1) * 8, q = m0 + nt * 8 + 2 * t + (e & 1);
                float v = acc[nt][e];
#pragma unroll
                for (int j = 0; j < 3; j++) v += sR[(((j * 2 + mt) * NQ + nt) * 32 + lane) * 4 + e];
                if (r < rows && q < n) y[size_t(q) * y_rs + size_t(h) * y_hs + r] = v;
            }
        }
    }
}

#define FERRITE_MLA_PROJ_TC(name, NQ)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, int y_rs, int y_hs, const float* x, int x_rs, \
                                                           int x_hs, int n, int rows, int w_hrows, const uint16_t* w, \
                                                           int K, int row0) {                                    \
        FERRITE_PDL_WAIT();                                                                                      \
        mla_proj_tc<NQ>(y, y_rs, y_hs, x, x_rs, x_hs, n, rows, w_hrows, w, K, row0);                              \
    }

FERRITE_MLA_PROJ_TC(ferrite_mla_proj_tc_8, 1)
FERRITE_MLA_PROJ_TC(ferrite_mla_proj_tc_32, 4)
