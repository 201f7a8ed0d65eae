// One-row decode kernels, for a batch-1 decode step where every kernel is
// latency, not throughput: the attention of a single query row over many
// small key splits (ferrite_dattn_*, kernels/cuda/decode.go), with or
// without PrepareQKV inside, and the one-row RMSNorm (ferrite_rmsnorm_row).
//
// The sources compile as one translation unit in name order
// (tools/cuda/build_fatbin.sh): this file uses ops.cu's PrepArgs, head_put
// and warp_max, gemv.cu's warp_sum, warp_sum_f64 and weight decoders, and
// convert.cu's f32_to_bf16.
#include <stdint.h>

namespace {

constexpr int kDecThreads = 128;
constexpr int kDecWarps = kDecThreads / 32;
constexpr int kDecMaxSplits = 64;  // splits a merge takes (decode.go's decSplits keeps to it)

// DecTile is a key/value tile in shared memory: up to kKeys positions of
// one KV head, the rows as the cache stores them (HD values of kEsz
// bytes). Key rows are kPitch bytes apart, 16 more than a row, so that the
// eight lanes of a 16-byte shared load phase read eight rows in distinct
// banks (the score loop gives each lane a key).
template <int HD, bool BF>
struct DecTile {
    static constexpr int kEsz = BF ? 2 : 4;
    static constexpr int kRowB = HD * kEsz;
    static constexpr int kPitch = kRowB + 16;
    static constexpr int kKeys = 16384 / kRowB < 64 ? 16384 / kRowB : 64;
    static constexpr int kSeg = kRowB / 16;  // 16-byte pieces a row
};

// The asynchronous copies and the counter's memory-model operations (a
// host emulation, tools/cuda/emu, supplies its own with FERRITE_HOST_EMU).
#ifndef FERRITE_HOST_EMU
// dec_cp16 copies 16 bytes from global src to shared dst asynchronously
// (cp.async, through L2 only: it may read what the kernel before wrote).
__device__ inline void dec_cp16(void* dst, const void* src) {
    const uint32_t s = uint32_t(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

__device__ inline void dec_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ inline void dec_cp_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#endif

// DecArgs are a ferrite_dattn launch's arguments. Block (x, y, z): KV
// head x / chunks, its query heads from (x % chunks)·G on, keys [y·split,
// min((y+1)·split, pos + 1)) of row z's sequence.
struct DecArgs {
    float* out;        // (rows, heads·HD)
    const float* q;    // (rows, heads·HD), the plain form only
    void* kc;          // (slots, kvh·HD) F32 or BF16
    void* vc;          // (slots, kvh·HD)
    const int* pos;    // the rows' positions
    const int* seq;    // the rows' sequences (their block table rows)
    const int* blocks; // (sequences, max_blocks) block table
    float* part;       // per row: (splits, heads, HD) sums, then (splits, heads, 2) max and sum
    int* cnt;          // a zeroed counter per (row, block column); the merging block zeroes it again
    int max_blocks, bs, heads, kvh, chunks, split;
    float scale;
    // The QKV form (QKVAttention): the q/k/v product's row, row 0's cache
    // slot, the cache's slots and PrepareQKV's parameters.
    const float* qkv;
    const int* slot;
    int slots;
    PrepArgs prep;
    // Every row is a sequence of its own (a decode batch): no other row of
    // the step stores keys a row reads, so every row copies its first tile
    // before the wait, as one row does.
    bool distinct;
};

// dec_load issues the copies of the keys and values of positions [t0, t1)
// but skip into tile rows 0, 1, … (cp.async, not committed).
template <int HD, bool BF>
__device__ inline void dec_load(const DecArgs& a, uint8_t* sk, uint8_t* sv, const int* bt, int t0, int t1, int skip,
                                size_t kvw, size_t off) {
    using T = DecTile<HD, BF>;
    const int n = (t1 - t0) * T::kSeg;
    for (int c = threadIdx.x; c < n; c += kDecThreads) {
        const int j = c / T::kSeg, s = c % T::kSeg, p = t0 + j;
        if (p == skip) continue;
        const size_t e = ((size_t(bt[p / a.bs]) * a.bs + p % a.bs) * kvw + off) * T::kEsz + size_t(s) * 16;
        dec_cp16(sk + j * T::kPitch + s * 16, static_cast<const uint8_t*>(a.kc) + e);
        dec_cp16(sv + j * T::kRowB + s * 16, static_cast<const uint8_t*>(a.vc) + e);
    }
}

// dec_prep is ops.cu's prep_head (one warp's PrepareQKV of a head into vw)
// with the rotation's cos and sin read from cs and sn, which the block
// computed before its PDL wait as prep_head computes them: the same bits.
__device__ void dec_prep(float* vw, const float* src, int hd, int kind, const PrepArgs& a, const float* cs,
                         const float* sn) {
    if (!prep_norm(vw, src, hd, kind, a)) return;
    for (int k = threadIdx.x & 31; k < a.half; k += 32) prep_rotate(vw, k, cs[k], sn[k], a);
    __syncwarp();
}

// dec_block is the whole of a ferrite_dattn kernel: one query row's
// attention for G query heads of a KV head over one split of its keys.
//
// Before its PDL wait it reads the step's inputs (position, sequence,
// block table) and starts copying its first tile of past keys and values
// into shared memory (earlier steps stored them; the row's own position,
// which the kernel before may still be writing, is left out), and in the
// QKV form computes the rotation's cos and sin. After the wait: the
// queries (from q, or prepared from the qkv row, whose split holding the
// row's position also prepares and stores its key and value), then per
// tile the scores (a lane a key, a warp a head), the tile's online
// softmax, and the values (a thread a dim). A split writes its running
// max, sum and unnormalised output to part; the last split to finish
// (a counter per block column) merges them, in split order. With one split
// the block writes out itself. Launch: grid (kvh·chunks, splits, rows),
// 128 threads; G ∈ {4, 8}, HD ∈ {64, 128}; the QKV form one row. At the
// same split, every row's sums are those of a call with that row alone (a
// verification's rows get plain decoding's bits); more than one row copy
// the first tile after the wait unless they are distinct sequences.
template <int HD, bool BF, int G, bool QKV>
__device__ void dec_block(const DecArgs& a) {
    using T = DecTile<HD, BF>;
    constexpr int kR = T::kKeys / 32;     // keys a lane scores a tile
    constexpr int kNH = G / kDecWarps;    // heads a warp scores (1 or 2)
    constexpr int kHS = kDecThreads / HD; // head sets of the value loop (a thread a dim)
    constexpr int kGT = G / kHS;          // heads a thread sums values for
    __shared__ __align__(16) uint8_t sk[T::kKeys * T::kPitch];
    __shared__ __align__(16) uint8_t sv[T::kKeys * T::kRowB];
    __shared__ __align__(16) float sq[G][HD];
    __shared__ __align__(16) float sp[G][T::kKeys];  // the tile's probabilities
    __shared__ __align__(16) float skv[2][HD];       // the QKV form: the row's key and value
    __shared__ float cs[HD / 2], sn[HD / 2];          // the QKV form: cos and sin at the row's position
    __shared__ float wn[2][HD];                       // the QKV form: the q and k norm weights
    __shared__ float sc[G], sm[G], sl[G];
    __shared__ bool last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks;
    const int grp = a.heads / a.kvh, h0 = kvh * grp + chunk * G, ng = min(G, grp - chunk * G);
    const int row = blockIdx.z;  // the step's row (a verification's rows, a few decoding sequences)
    const int self = a.pos[row], len = self + 1;
    const int k0 = blockIdx.y * a.split;
    if (k0 >= len) return;  // an empty split: the merge counts only the others
    const int k1 = min(len, k0 + a.split);
    const int* bt = a.blocks + size_t(a.seq[row]) * a.max_blocks;
    const size_t kvw = size_t(a.kvh) * HD, off = size_t(kvh) * HD;
    // One row, or rows of distinct sequences (a decode batch): no other row
    // of the step stores keys its split reads, so the first tile is copied
    // before the wait. Rows of one sequence (a verification's) copy after it.
    const bool early = gridDim.z == 1 || a.distinct;
    if (early) {
        dec_load<HD, BF>(a, sk, sv, bt, k0, min(k1, k0 + T::kKeys), self, kvw, off);
        dec_cp_commit();
    }
    PrepArgs pa = a.prep;  // the QKV form: with the norm weights in shared memory
    if (QKV) {
        for (int k = threadIdx.x; k < HD; k += kDecThreads) {
            if (a.prep.qn) wn[0][k] = a.prep.qn[k];
            if (a.prep.kn) wn[1][k] = a.prep.kn[k];
        }
        if (a.prep.inv) {
            for (int k = threadIdx.x; k < a.prep.half; k += kDecThreads) {
                const double ang = double(__fmul_rn(float(self), a.prep.inv[k]));
                cs[k] = __fmul_rn(float(cos(ang)), a.prep.scale);
                sn[k] = __fmul_rn(float(sin(ang)), a.prep.scale);
            }
        }
        if (pa.qn) pa.qn = wn[0];
        if (pa.kn) pa.kn = wn[1];
    }
    FERRITE_PDL_WAIT();
    if (!early) {
        dec_load<HD, BF>(a, sk, sv, bt, k0, min(k1, k0 + T::kKeys), self, kvw, off);
        dec_cp_commit();
    }

    const bool has_self = self < k1;  // self ≥ k0: k0 < len
    if (QKV) {
        // The row's q heads (and with the row's position its k and v
        // heads) in one round of loads, then prepared in place.
        const float* row = a.qkv;
        for (int t = threadIdx.x; t < (G + 2) * HD / 4; t += kDecThreads) {
            const int g = t / (HD / 4), e = (t % (HD / 4)) * 4;
            if (g < G) {
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (g < ng) v = *reinterpret_cast<const float4*>(row + size_t(h0 + g) * HD + e);
                *reinterpret_cast<float4*>(&sq[g][e]) = v;
            } else if (has_self) {
                const int kind = g - G + 1;  // 1: key, 2: value
                *reinterpret_cast<float4*>(&skv[kind - 1][e]) =
                    *reinterpret_cast<const float4*>(row + size_t(a.heads + (kind - 1) * a.kvh + kvh) * HD + e);
            }
        }
        __syncthreads();  // the heads, cs, sn, wn
        for (int t = warp; t < G + 2; t += kDecWarps) {
            if (t < G) {
                if (t < ng) dec_prep(sq[t], sq[t], HD, 0, pa, cs, sn);
            } else if (has_self) {
                const int kind = t - G + 1;
                dec_prep(skv[kind - 1], skv[kind - 1], HD, kind, pa, cs, sn);
                const int sl = a.slot[0];
                if (chunk == 0 && sl >= 0 && sl < a.slots)
                    head_put(kind == 1 ? a.kc : a.vc, BF, size_t(sl) * kvw + off, skv[kind - 1], HD);
            }
        }
    } else {
        for (int t = threadIdx.x; t < G * HD / 4; t += kDecThreads) {
            const int g = t / (HD / 4), d = (t % (HD / 4)) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (g < ng) v = *reinterpret_cast<const float4*>(a.q + (size_t(row) * a.heads + h0 + g) * HD + d);
            *reinterpret_cast<float4*>(&sq[g][d]) = v;
        }
    }
    __syncthreads();  // sq (and skv)

    float mr[kNH], lr[kNH];  // the running max and sum of heads warp + kDecWarps·i
#pragma unroll
    for (int i = 0; i < kNH; i++) mr[i] = -INFINITY, lr[i] = 0.f;
    float acc[kGT];  // dim threadIdx.x % HD of heads threadIdx.x / HD + kHS·i
#pragma unroll
    for (int i = 0; i < kGT; i++) acc[i] = 0.f;
    const int d = threadIdx.x % HD, hs = threadIdx.x / HD;

    for (int t0 = k0; t0 < k1; t0 += T::kKeys) {
        const int t1 = min(k1, t0 + T::kKeys), tn = t1 - t0;
        if (t0 != k0) {  // a later tile (a split of more than kKeys keys)
            __syncthreads();  // the last tile's rows have been read
            dec_load<HD, BF>(a, sk, sv, bt, t0, t1, self, kvw, off);
            dec_cp_commit();
        }
        if (self >= t0 && self < t1) {  // the row's own key and value
            const int j = self - t0;
            if (QKV) {
                for (int e = threadIdx.x; e < HD; e += kDecThreads) {
                    if (BF) {
                        reinterpret_cast<uint16_t*>(sk + j * T::kPitch)[e] = f32_to_bf16(skv[0][e]);
                        reinterpret_cast<uint16_t*>(sv + j * T::kRowB)[e] = f32_to_bf16(skv[1][e]);
                    } else {
                        reinterpret_cast<float*>(sk + j * T::kPitch)[e] = skv[0][e];
                        reinterpret_cast<float*>(sv + j * T::kRowB)[e] = skv[1][e];
                    }
                }
            } else {
                const size_t e = ((size_t(bt[self / a.bs]) * a.bs + self % a.bs) * kvw + off) * T::kEsz;
                for (int s = threadIdx.x; s < T::kSeg; s += kDecThreads) {
                    dec_cp16(sk + j * T::kPitch + s * 16, static_cast<const uint8_t*>(a.kc) + e + size_t(s) * 16);
                    dec_cp16(sv + j * T::kRowB + s * 16, static_cast<const uint8_t*>(a.vc) + e + size_t(s) * 16);
                }
                dec_cp_commit();
            }
        }
        dec_cp_wait();
        __syncthreads();

        // Scores, a lane a key (rows lane, lane + 32, …), the warp's heads
        // at once, each head's dot product summed over d in order.
        float s[kNH][kR];
#pragma unroll
        for (int r = 0; r < kR; r++) {
            if (r > 0 && 32 * r >= tn) {  // no keys for this round (the warp alike)
#pragma unroll
                for (int i = 0; i < kNH; i++) s[i][r] = -INFINITY;
                continue;
            }
            const int j = min(lane + 32 * r, tn - 1);
            const uint8_t* kr = sk + j * T::kPitch;
            float sum[kNH];
#pragma unroll
            for (int i = 0; i < kNH; i++) sum[i] = 0.f;
#pragma unroll 4
            for (int e = 0; e < HD; e += 8) {
                float kd[8];
                if (BF) {
                    BF16W::vec(*reinterpret_cast<const uint4*>(kr + e * 2), kd);
                } else {
                    F32W::vec(*reinterpret_cast<const uint4*>(kr + e * 4), kd);
                    F32W::vec(*reinterpret_cast<const uint4*>(kr + e * 4 + 16), kd + 4);
                }
#pragma unroll
                for (int i = 0; i < kNH; i++) {
                    const float* qg = sq[warp + kDecWarps * i];
                    const float4 q0 = *reinterpret_cast<const float4*>(qg + e);
                    const float4 q1 = *reinterpret_cast<const float4*>(qg + e + 4);
                    const float qe[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                    for (int u = 0; u < 8; u++) sum[i] = fmaf(qe[u], kd[u], sum[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < kNH; i++) s[i][r] = lane + 32 * r < tn ? sum[i] * a.scale : -INFINITY;
        }
        // The tile's online softmax per head; probabilities of rows past
        // the tile are 0.
#pragma unroll
        for (int i = 0; i < kNH; i++) {
            const int g = warp + kDecWarps * i;
            float mt = s[i][0];
#pragma unroll
            for (int r = 1; r < kR; r++) mt = fmaxf(mt, s[i][r]);
            const float mn = fmaxf(mr[i], warp_max(mt));  // finite: the tile has a key
            const float c = expf(mr[i] - mn);              // 0 on the first tile
            float ps = 0.f;
#pragma unroll
            for (int r = 0; r < kR; r++) {
                const float p = expf(s[i][r] - mn);  // 0 for −∞
                sp[g][lane + 32 * r] = p;
                ps += p;
            }
            lr[i] = lr[i] * c + warp_sum(ps);
            mr[i] = mn;
            if (lane == 0) sc[g] = c;
        }
        __syncthreads();

        // Values: a thread a dim, for its heads; four keys a step.
#pragma unroll
        for (int i = 0; i < kGT; i++) acc[i] *= sc[hs + kHS * i];
        for (int j = 0; j < tn; j += 4) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int jj = min(j + u, tn - 1);  // a real row: its probability is 0 past tn
                if (BF) {
                    v[u] = __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(sv + jj * T::kRowB)[d]) << 16);
                } else {
                    v[u] = reinterpret_cast<const float*>(sv + jj * T::kRowB)[d];
                }
            }
#pragma unroll
            for (int i = 0; i < kGT; i++) {
                const float4 p = *reinterpret_cast<const float4*>(&sp[hs + kHS * i][j]);
                acc[i] = fmaf(p.x, v[0], acc[i]);
                acc[i] = fmaf(p.y, v[1], acc[i]);
                acc[i] = fmaf(p.z, v[2], acc[i]);
                acc[i] = fmaf(p.w, v[3], acc[i]);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < kNH; i++) sm[warp + kDecWarps * i] = mr[i], sl[warp + kDecWarps * i] = lr[i];
    }
    __syncthreads();

    const int splits = gridDim.y;
    if (splits == 1) {
#pragma unroll
        for (int i = 0; i < kGT; i++) {
            const int g = hs + kHS * i;
            if (g < ng) a.out[(size_t(row) * a.heads + h0 + g) * HD + d] = acc[i] / sl[g];
        }
        return;
    }
    float* part = a.part + size_t(row) * splits * a.heads * (HD + 2);  // the row's (splits, heads, HD) sums
    float* pml = part + size_t(splits) * a.heads * HD;                   // then (splits, heads, 2)
#pragma unroll
    for (int i = 0; i < kGT; i++) {
        const int g = hs + kHS * i;
        if (g < ng) part[(size_t(blockIdx.y) * a.heads + h0 + g) * HD + d] = acc[i];
    }
    if (threadIdx.x < ng) {
        pml[(size_t(blockIdx.y) * a.heads + h0 + threadIdx.x) * 2] = sm[threadIdx.x];
        pml[(size_t(blockIdx.y) * a.heads + h0 + threadIdx.x) * 2 + 1] = sl[threadIdx.x];
    }
    // The last of the filled splits to finish merges them (threadfence
    // reduction; it sets the counter back to 0 for the next launch).
    const int nz = (len + a.split - 1) / a.split;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* c = a.cnt + size_t(row) * gridDim.x + blockIdx.x;
        last = atomicAdd(c, 1) == nz - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Up to kDecPre splits' sums load at once with the maxima and sums
    // below: one round of loads for a short context's merge.
    constexpr int kDecPre = 8;
    float av[kGT][kDecPre];
#pragma unroll
    for (int i = 0; i < kGT; i++) {
        const float* pa = part + size_t(h0 + hs + kHS * i) * HD + d;
#pragma unroll
        for (int z = 0; z < kDecPre; z++) av[i][z] = z < nz && hs + kHS * i < ng ? __ldcg(pa + size_t(z) * a.heads * HD) : 0.f;
    }
    float* zw = reinterpret_cast<float*>(sk);  // (G, kDecMaxSplits) the splits' weights exp(m_z − M)
    for (int g = warp; g < ng; g += kDecWarps) {
        float mz[kDecMaxSplits / 32], lz[kDecMaxSplits / 32];
        float mx = -INFINITY;
#pragma unroll
        for (int r = 0; r < kDecMaxSplits / 32; r++) {
            const int z = lane + 32 * r;
            mz[r] = -INFINITY, lz[r] = 0.f;
            if (z < nz) {
                mz[r] = __ldcg(pml + (size_t(z) * a.heads + h0 + g) * 2);
                lz[r] = __ldcg(pml + (size_t(z) * a.heads + h0 + g) * 2 + 1);
            }
            mx = fmaxf(mx, mz[r]);
        }
        mx = warp_max(mx);
        float L = 0.f;
#pragma unroll
        for (int r = 0; r < kDecMaxSplits / 32; r++) {
            const float e = lane + 32 * r < nz ? expf(mz[r] - mx) : 0.f;
            zw[g * kDecMaxSplits + lane + 32 * r] = e;
            L += lz[r] * e;
        }
        L = warp_sum(L);
        if (lane == 0) sl[g] = L;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kGT; i++) {
        const int g = hs + kHS * i;
        if (g >= ng) continue;
        const float* pa = part + size_t(h0 + g) * HD + d;
        const float* w = zw + g * kDecMaxSplits;
        float A = 0.f;
#pragma unroll
        for (int z = 0; z < kDecPre; z++) A = z < nz ? fmaf(av[i][z], w[z], A) : A;
#pragma unroll 8
        for (int z = kDecPre; z < nz; z++) A = fmaf(__ldcg(pa + size_t(z) * a.heads * HD), w[z], A);
        a.out[(size_t(row) * a.heads + h0 + g) * HD + d] = A / sl[g];
    }
}

}  // namespace

#define FERRITE_DATTN(name, HD, BF, G, QKV)                                                                  \
    extern "C" __global__ void __launch_bounds__(kDecThreads) name(                                          \
        float* out, const float* q, void* kc, void* vc, const int* pos, const int* seq, const int* blocks,   \
        float* part, int* cnt, int max_blocks, int bs, int heads, int kvh, int chunks, int split, float scale, \
        const float* qkv, const int* slot, int slots, const float* qn, float qeps, const float* kn, float keps, \
        const float* inv, int half, float rscale, int flags, int distinct) {                                 \
        DecArgs a{out, q, kc, vc, pos, seq, blocks, part, cnt, max_blocks, bs, heads, kvh, chunks, split, scale, \
                  qkv, slot, slots, PrepArgs{qn, kn, inv, qeps, keps, rscale, half, flags}, distinct != 0};  \
        dec_block<HD, BF, G, QKV>(a);                                                                        \
    }

FERRITE_DATTN(ferrite_dattn_f32_64_g4, 64, false, 4, false)
FERRITE_DATTN(ferrite_dattn_f32_64_g8, 64, false, 8, false)
FERRITE_DATTN(ferrite_dattn_f32_128_g4, 128, false, 4, false)
FERRITE_DATTN(ferrite_dattn_f32_128_g8, 128, false, 8, false)
FERRITE_DATTN(ferrite_dattn_bf16_64_g4, 64, true, 4, false)
FERRITE_DATTN(ferrite_dattn_bf16_64_g8, 64, true, 8, false)
FERRITE_DATTN(ferrite_dattn_bf16_128_g4, 128, true, 4, false)
FERRITE_DATTN(ferrite_dattn_bf16_128_g8, 128, true, 8, false)
FERRITE_DATTN(ferrite_dattn_qkv_f32_64_g4, 64, false, 4, true)
FERRITE_DATTN(ferrite_dattn_qkv_f32_64_g8, 64, false, 8, true)
FERRITE_DATTN(ferrite_dattn_qkv_f32_128_g4, 128, false, 4, true)
FERRITE_DATTN(ferrite_dattn_qkv_f32_128_g8, 128, false, 8, true)
FERRITE_DATTN(ferrite_dattn_qkv_bf16_64_g4, 64, true, 4, true)
FERRITE_DATTN(ferrite_dattn_qkv_bf16_64_g8, 64, true, 8, true)
FERRITE_DATTN(ferrite_dattn_qkv_bf16_128_g4, 128, true, 4, true)
FERRITE_DATTN(ferrite_dattn_qkv_bf16_128_g8, 128, true, 8, true)

namespace {

// row_sq adds the squares of v's four values to ss in float64, in order.
__device__ inline double row_sq(double ss, float4 v) {
    ss += double(v.x) * double(v.x);
    ss += double(v.y) * double(v.y);
    ss += double(v.z) * double(v.z);
    ss += double(v.w) * double(v.w);
    return ss;
}

// row_norm_store ends a one-row RMSNorm of dim values whose block holds
// float4 i = threadIdx.x + j·blockDim.x (i < n4) of the row in xv[j] and
// of the weight in wv[j], and its share ss of Σx²: it sums ss over the
// block (part: a double a warp; each warp adds the warps' sums itself, so
// one barrier), rounds the mean to float32 before eps as kernels/ref.RMSNorm
// and writes s ⊙ (x·inv) (s = 1 + w with off) to out.
template <int kV>
__device__ inline void row_norm_store(double ss, const float4 (&xv)[kV], const float4 (&wv)[kV], int n4, int dim,
                                      float eps, int off, double* part, float* out) {
    const int lane = threadIdx.x & 31;
    ss = warp_sum_f64(ss);
    if (lane == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    const double t = warp_sum_f64(lane < int(blockDim.x >> 5) ? part[lane] : 0.0);
    const float ms = float(t / double(dim));
    const float inv = float(1.0 / sqrt(double(__fadd_rn(ms, eps))));
#pragma unroll
    for (int j = 0; j < kV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i >= n4) continue;
        const float4 s = off ? make_float4(__fadd_rn(1.0f, wv[j].x), __fadd_rn(1.0f, wv[j].y), __fadd_rn(1.0f, wv[j].z),
                                           __fadd_rn(1.0f, wv[j].w))
                             : wv[j];
        float4 o;
        o.x = __fmul_rn(s.x, __fmul_rn(xv[j].x, inv));
        o.y = __fmul_rn(s.y, __fmul_rn(xv[j].y, inv));
        o.z = __fmul_rn(s.z, __fmul_rn(xv[j].z, inv));
        o.w = __fmul_rn(s.w, __fmul_rn(xv[j].w, inv));
        reinterpret_cast<float4*>(out)[i] = o;
    }
}

}  // namespace

// ferrite_rmsnorm_row is ferrite_add_rmsnorm for rows of dim values, one
// block a row, each row summed as alone (a row-exact step's rows get the
// bits of one-row steps), dim a multiple of 4 up to 16·blockDim.x, every pointer at
// a 16-byte address: a thread's up to 4 float4 of the row and of the
// weight stay in registers, the weight loaded before the PDL wait (no
// kernel of a step writes it), and every warp reduces the warps' partial
// sums itself (one barrier). The mean of squares is summed in float64 and
// rounded to float32 before eps as kernels/ref.RMSNorm. Launch: a block a
// row of 32·ceil(dim / 128) threads, at most 1024.
extern "C" __global__ void __launch_bounds__(1024)
    ferrite_rmsnorm_row(float* y, float* res, const float* delta, const float* w, int dim, float eps, int offset,
                        float* sum) {
    constexpr int kV = 4;
    const int n4 = dim >> 2;
    const size_t ro = size_t(blockIdx.x) * dim;  // the block's row
    y += ro, res += ro;
    if (delta) delta += ro;
    if (sum) sum += ro;
    float4 wv[kV];
#pragma unroll
    for (int j = 0; j < kV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < n4 ? __ldg(reinterpret_cast<const float4*>(w) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    FERRITE_PDL_WAIT();
    __shared__ double part[32];
    float* xr = sum && delta ? sum : res;  // where res + delta goes
    float4 xv[kV];
    double ss = 0;
#pragma unroll
    for (int j = 0; j < kV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        xv[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            float4 v = reinterpret_cast<const float4*>(res)[i];
            if (delta) {
                const float4 dv = reinterpret_cast<const float4*>(delta)[i];
                v.x = __fadd_rn(v.x, dv.x), v.y = __fadd_rn(v.y, dv.y);
                v.z = __fadd_rn(v.z, dv.z), v.w = __fadd_rn(v.w, dv.w);
                reinterpret_cast<float4*>(xr)[i] = v;
            }
            xv[j] = v;
            ss = row_sq(ss, v);
        }
    }
    row_norm_store<kV>(ss, xv, wv, n4, dim, eps, offset, part, y);
}

// The one-row GEMV that also norms its product (FERRITE_CUDA_DNORM=gemv,
// decode.go's pendNorm): a product whose output is the residual stream (o
// and down, adding into it) and whose next op is that stream's RMSNorm.
// ferrite_gemv_*_1n is ferrite_gemv_*_1 (four warps a row) and then h =
// RMSNorm(y) (rows values, the weight nw, 1 + nw with off) as
// ferrite_rmsnorm_row computes it, in the grid's last block: every other
// block, once its rows are stored, counts itself (a release add by thread
// 0 after the block's barrier, not waited for); the last block, after its
// own rows, waits until the others have counted (acquire loads; it is
// scheduled last, so the blocks it waits for are running or done), norms
// y into h and sets the counter back to 0. That saves the norm kernel and
// its kernel boundary. rows a multiple of 4 up to 4,096, y, h and nw at
// 16-byte addresses.
namespace {

#ifndef FERRITE_HOST_EMU
__device__ inline void dec_arrive(int* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(p) : "memory");
#else
    __threadfence();
    atomicAdd(p, 1);
#endif
}

__device__ inline int dec_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#endif

template <class W>
__device__ void gemv_split_norm(float* y, const float* x, const uint8_t* w, int rows, int cols, const float* bias,
                                int acc_y, float* h, const float* nw, float eps, int off, int* cnt) {
    constexpr int kV = 4;  // float4 a thread: rows ≤ 4·4·256
    gemv_split<W>(y, x, w, rows, cols, bias, acc_y);
    __syncthreads();  // the block's rows are stored before thread 0 counts
    if (blockIdx.x != gridDim.x - 1) {
        if (threadIdx.x == 0) dec_arrive(cnt);
        return;
    }
    const int n4 = rows >> 2;
    float4 wv[kV];
#pragma unroll
    for (int j = 0; j < kV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < n4 ? __ldg(reinterpret_cast<const float4*>(nw) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (threadIdx.x == 0) {
        while (dec_acquire(cnt) < int(gridDim.x) - 1) {
        }
        *cnt = 0;  // every other block has counted: ready for the next launch
    }
    __syncthreads();
    __shared__ double part[8];
    float4 xv[kV];
    double ss = 0;
#pragma unroll
    for (int j = 0; j < kV; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < n4 ? __ldcg(reinterpret_cast<const float4*>(y) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        ss = row_sq(ss, xv[j]);
    }
    row_norm_store<kV>(ss, xv, wv, n4, rows, eps, off, part, h);
}

}  // namespace

#define FERRITE_GEMV_1N(name, W)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y, int pf, float* h, const float* nw, \
                                                           float eps, int off, int* cnt) {             \
        split_prefetch<W>(pf, w, rows, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_split_norm<W>(y, x, w, rows, cols, bias, acc_y, h, nw, eps, off, cnt);                 \
    }

FERRITE_GEMV_1N(ferrite_gemv_f32_1n, F32W)
FERRITE_GEMV_1N(ferrite_gemv_bf16_1n, BF16W)
