// The skinny GEMM of decode batches (version 3): y (n, R) = x (n, K) · Wᵀ
// for 2 ≤ n ≤ 64 rows of float32 x and a bf16 weight W (R, K), on tensor
// cores (mma.sync m16n8k16, float32 accumulation), built to stream the
// weight from memory once at the full bandwidth. The weight is the MMA's A
// side (16 weight rows a tile), x its B side (8 rows of x a tile, NT
// tiles: n ≤ 8·NT). x is split into two bf16 terms, hi = bf16(x) and lo =
// bf16(x − hi) (the difference exact in float32), both multiplied into the
// same float32 sums: about 2⁻¹⁷·Σ|x·w| from the float32 product, as the
// cuBLASLt path (opset.go's linearSplit), in one kernel instead of a split
// kernel, the GEMM and an epilogue kernel (and, for SwiGLULinear, a
// fourth).
//
// Work. A row block is 128 weight rows (with SWIGLU 64 gate rows and the
// same 64 up rows: 64 outputs); K is cut into chunks of 64 columns; a unit
// is (row block, chunk), numbered row block by row block. The grid is G
// blocks, one a multiprocessor (skinny.go), and block b takes units
// [b·U/G, (b+1)·U/G) of the U in all (stream-K): every multiprocessor
// streams the same number of chunks whatever the layer's height. A block's
// units fall into segments, one a row block; a segment that holds all of
// its row block's chunks ends in the epilogue, the others (at most the
// first and the last of a block) write their sums to part, and the last
// block of that row block to arrive (counters[row block], which it resets
// to 0) adds the pieces in block order, so the bits do not depend on which
// block came last, and runs the epilogue.
//
// Block. 8 warps: warp w takes the 64 tile rows 64·(w / 4) … (four m16
// tiles) and the 16 columns 16·(w % 4) … of each chunk, so that each
// element of x is split into its terms once a row group and each weight
// element is read from shared memory once. A chunk's weight tile (128 × 64
// bf16, 16 KiB) and x (8·NT × 64 float32) stream into a ring of STAGES
// shared-memory stages with cp.async, STAGES − 1 chunks in flight while
// one is multiplied (96–176 KiB of weight a multiprocessor). The weight
// rows' eight 16-byte groups are stored swizzled (group g of row r at
// g ^ r % 8) so that ldmatrix reads the A fragments without bank
// conflicts; x's sixteen 16-byte groups a row at g ^ 2·(r % 4), so that the
// B fragments' 8-byte loads do not conflict either. At a segment's end the
// four warps of a row group add their sums into a (8·NT, 128) float32
// tile in warp order, in the stage just multiplied (free until the next
// unit's copies: 512·NT·8 bytes fit in a stage), and the whole block runs
// the split hand-over and the epilogue from it, with coalesced stores.
//
// Epilogue: y = sum (+ bias[r]) (+ y when acc), or with SWIGLU (the weight
// is [gate; up], (2·R, K), R = inter) y[j, r] = swiglu(gate row r, up row r).
//
// PDL: the first STAGES − 1 weight tiles are asked for before the wait
// (skinny_prefetch), x only after it.
//
// Launch: 256 threads, grid G ≤ U (skinny.go's skinnyBlocks); skinny.go's
// skinnySmem bytes of dynamic shared memory; K a multiple of 8, x 16-byte
// aligned; part holds 2·G·128·8·NT float32 when a row block is split.
#include <stdint.h>

namespace {

constexpr int kSkWarps = 8;           // warps a block
constexpr int kSkChunk = 64;          // k a unit
constexpr int kSkRows = 128;          // weight rows a row block
constexpr int kSkWBytes = kSkRows * 128;  // bytes of a stage's weight tile

// sk_at is the byte offset of 16-byte group g of weight row r (rows of 128
// bytes, groups swizzled by r % 8).
__device__ inline uint32_t sk_at(int r, int g) { return uint32_t(r * 128 + ((g ^ (r & 7)) << 4)); }

// sk_xat is the byte offset of 16-byte group g (of 16) of x row r (rows of
// 256 bytes, groups swizzled by 2·(r % 4)).
__device__ inline uint32_t sk_xat(int r, int g) { return uint32_t(r * 256 + ((g ^ ((r & 3) << 1)) << 4)); }

// sk_tat is the index of (x row j, tile row i) in the sums tile (8·NT rows
// of 128 float32, the tile rows swizzled by 8·(j / 2 % 4) so that the MMA
// fragments' stores do not conflict).
__device__ inline int sk_tat(int j, int i) { return j * kSkRows + (i ^ (((j >> 1) & 3) << 3)); }

// sk_terms splits x[k], x[k+1] into their bf16 terms: hi and lo, each
// packed with x[k] in the low half.
__device__ inline void sk_terms(float2 v, uint32_t& hi, uint32_t& lo) {
    hi = pack_bf16(v.x, v.y);
    lo = pack_bf16(__fsub_rn(v.x, __uint_as_float(hi << 16)), __fsub_rn(v.y, __uint_as_float(hi & 0xffff0000u)));
}

// sk_stages is the ring's depth for NT tiles of x rows (skinny.go's
// skinnyStages): as many as fit in the 227 KiB a block may take, one block
// a multiprocessor.
__host__ __device__ constexpr int sk_stages(int nt) { return nt >= 8 ? 7 : nt >= 4 ? 9 : nt >= 2 ? 11 : 12; }

// sk_units sets the units of this block, [u0, u1), and the chunks of K.
template <bool SWIGLU>
__device__ inline void sk_units(int rows, int K, int& chunks, int& u0, int& u1) {
    const int outs = SWIGLU ? kSkRows / 2 : kSkRows;
    chunks = (K + kSkChunk - 1) / kSkChunk;
    const int U = (rows + outs - 1) / outs * chunks, G = gridDim.x;
    u0 = int(int64_t(blockIdx.x) * U / G);
    u1 = int((int64_t(blockIdx.x) + 1) * U / G);
}

// sk_cp16 is cp16 with L2 hints by the bits of flags: 1 the weights are
// evicted first (policy pol, from sk_policy), 2 L2 fetches 256 bytes (the
// row's next chunk with this one).
__device__ inline void sk_cp16(uint32_t dst, const void* src, int bytes, int flags, uint64_t pol) {
    switch (flags & 3) {
    case 1:
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(bytes), "l"(pol)
                     : "memory");
        break;
    case 2:
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
        break;
    case 3:
        asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(bytes),
                     "l"(pol)
                     : "memory");
        break;
    default:
        cp16(dst, src, bytes);
    }
}

// sk_policy is an L2 policy that evicts what it reads first.
__device__ inline uint64_t sk_policy() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

// sk_issue_w copies the weight tile of (row block rb, chunk c) to shared
// address dst (zeros past the rows or K): thread t copies group t % 8 of
// tile rows t / 8 + 32·j.
template <bool SWIGLU>
__device__ inline void sk_issue_w(uint32_t dst, const uint16_t* w, int rows, int K, int rb, int c, int flags, uint64_t pol) {
    const int tid = threadIdx.x, k = c * kSkChunk + 8 * (tid & 7);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = (tid >> 3) + 32 * j;  // tile row
        int r = rb * kSkRows + i, stored = r;
        if (SWIGLU) {
            r = rb * (kSkRows / 2) + (i & (kSkRows / 2 - 1));  // the row within gate or up
            stored = i < kSkRows / 2 ? r : rows + r;
        }
        const bool ok = r < rows && k < K;
        sk_cp16(dst + sk_at(i, tid & 7), ok ? w + size_t(stored) * K + k : w, ok ? 16 : 0, flags, pol);
    }
}

// skinny_prefetch runs before the PDL wait (the weights do not depend on
// the kernels before): it issues the first STAGES − 1 units' weight copies
// (committed with the first x copies).
template <int NT, bool SWIGLU>
__device__ void skinny_prefetch(const uint16_t* w, int rows, int K, int flags) {
    constexpr int XR = 8 * NT, S = sk_stages(NT);
    constexpr uint32_t kStage = kSkWBytes + XR * 256;
    extern __shared__ __align__(128) uint8_t sk_smem[];
    int chunks, u0, u1;
    sk_units<SWIGLU>(rows, K, chunks, u0, u1);
    int rb = u0 / chunks, c = u0 - rb * chunks;
    const uint64_t pol = sk_policy();
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (u0 + st < u1) sk_issue_w<SWIGLU>(smem_addr(sk_smem) + st * kStage, w, rows, K, rb, c, flags, pol);
        if (++c == chunks) {
            c = 0;
            rb++;
        }
    }
}

template <int NT, bool SWIGLU>
__device__ void skinny(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w, int n,
                       int rows, int K, const float* __restrict__ bias, int acc_y, float limit, float* part,
                       int* counters, int flags) {
    constexpr int XR = 8 * NT;                    // rows of x a stage holds
    constexpr int S = sk_stages(NT);              // stages
    constexpr uint32_t kStage = kSkWBytes + XR * 256;  // bytes of a stage
    constexpr int XC = (XR * 16 + 255) / 256;     // x groups a thread copies a unit (at most)
    extern __shared__ __align__(128) uint8_t sk_smem[];
    // No static shared memory: the kernel's dynamic limit is raised to the
    // device's whole opt-in (module.go's raiseSmem). The split hand-over's
    // flag follows the stages.
    int& last = *reinterpret_cast<int*>(sk_smem + S * kStage);
    const uint32_t sm = smem_addr(sk_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int grp = warp >> 2, sl = warp & 3;  // row group, k16 slice of the chunk
    const int gid = lane >> 2, tig = lane & 3;

    const int outs = SWIGLU ? kSkRows / 2 : kSkRows;  // outputs a row block
    int chunks, u0, u1;
    sk_units<SWIGLU>(rows, K, chunks, u0, u1);
    const int U = (rows + outs - 1) / outs * chunks, G = gridDim.x;
    const uint64_t pol = sk_policy();

    // issue_x copies chunk c of x into stage st (zeros past n or K).
    auto issue_x = [&](int c, int st) {
#pragma unroll
        for (int v = 0; v < XC; v++) {
            const int e = tid + 256 * v, r = e >> 4, g = e & 15, k = c * kSkChunk + 4 * g;
            if (r < XR) {
                const bool ok = r < n && k < K;
                cp16(sm + st * kStage + kSkWBytes + sk_xat(r, g), ok ? x + size_t(r) * K + k : x, ok ? 16 : 0);
            }
        }
    };

    // The unit the ring copies next: row block irb, chunk ic, stage ist.
    int irb = u0 / chunks, ic = u0 - irb * chunks, ist = 0;
    const int rb0 = irb, c0 = ic;
    auto next = [&](int& rb, int& c) {
        if (++c == chunks) {
            c = 0;
            rb++;
        }
    };
    // skinny_prefetch issued the first stages' weight copies.
    if (u0 >= u1) return;
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (u0 + st < u1) issue_x(ic, st);
        cp_commit();
        next(irb, ic);
        ist++;
    }

    const int ntu = min(NT, (n + 7) >> 3);  // x tiles with a row below n
    float acc[4][NT][4];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[t][nt][e] = 0.f;
    // ldmatrix lane addresses of the A fragments: matrix lane / 8 (rows +8
    // for odd, the upper 8 columns of the k-step from 2).
    const int am = lane >> 3, ar = lane & 7;
    int rb = rb0, c = c0, cst = 0;  // the unit multiplied: row block, chunk, stage
    bool whole = c0 == 0;           // the segment began at the row block's first chunk
    for (int u = u0; u < u1; u++) {
        cp_wait<S - 2>();
        __syncthreads();
        if (u + S - 1 < u1) {
            sk_issue_w<SWIGLU>(sm + ist * kStage, w, rows, K, irb, ic, flags, pol);
            issue_x(ic, ist);
        }
        cp_commit();
        next(irb, ic);
        ist = ist + 1 == S ? 0 : ist + 1;
        const uint32_t ws = sm + uint32_t(cst) * kStage;
        const uint8_t* xs = sk_smem + cst * kStage + kSkWBytes;
        // The sums tile of a segment ending here: this unit's stage, free
        // until the next iteration's copies.
        float* tile = reinterpret_cast<float*>(sk_smem + cst * kStage);
        cst = cst + 1 == S ? 0 : cst + 1;
        uint32_t a[4][4];
#pragma unroll
        for (int t = 0; t < 4; t++) ldsm_x4(a[t], ws + sk_at(64 * grp + 16 * t + 8 * (am & 1) + ar, 2 * sl + (am >> 1)));
        uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (nt >= ntu) continue;
            const int r = 8 * nt + gid, g = 4 * sl + (tig >> 1), off = 8 * (tig & 1);
            sk_terms(*reinterpret_cast<const float2*>(xs + sk_xat(r, g) + off), bh[nt][0], bl[nt][0]);
            sk_terms(*reinterpret_cast<const float2*>(xs + sk_xat(r, g + 2) + off), bh[nt][1], bl[nt][1]);
        }
        // flags 8 (benchmarks only, wrong sums): no MMA, the hi/lo terms
        // folded into one bit; flags 4: no lo-term MMA.
        if (flags & 8) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (nt < ntu) acc[0][nt][0] += __uint_as_float((bh[nt][0] ^ bh[nt][1] ^ bl[nt][0] ^ bl[nt][1] ^ a[nt & 3][nt & 3]) & 1u);
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= ntu) continue;
#pragma unroll
                for (int t = 0; t < 4; t++) mma_bf16(acc[t][nt], a[t], bh[nt][0], bh[nt][1]);
            }
            if (!(flags & 4)) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (nt >= ntu) continue;
#pragma unroll
                    for (int t = 0; t < 4; t++) mma_bf16(acc[t][nt], a[t], bl[nt][0], bl[nt][1]);
                }
            }
        }

        if (c + 1 < chunks && u + 1 < u1) {  // the segment goes on
            c++;
            continue;
        }

        // The segment ends: the row group's warps add their sums into the
        // tile in slice order. acc[t][nt][e] is tile row 64·grp + 16·t +
        // gid + 8·(e / 2) times x row 8·nt + 2·tig + e % 2.
        __syncthreads();  // every warp is done with the stage
        for (int s = 0; s < 4; s++) {
            if (sl == s) {
#pragma unroll
                for (int t = 0; t < 4; t++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float* p = tile + sk_tat(8 * nt + 2 * tig + (e & 1), 64 * grp + 16 * t + gid + 8 * (e >> 1));
                            *p = s == 0 ? acc[t][nt][e] : __fadd_rn(*p, acc[t][nt][e]);
                            acc[t][nt][e] = 0.f;
                        }
            }
            __syncthreads();
        }
        const int srb = rb;  // the segment's row block
        const bool piece = !whole || c + 1 < chunks;
        whole = true;  // the next segment starts at chunk 0
        next(rb, c);
        if (piece) {
            // A piece of the row block: slot 0 of this block's part if the row
            // block is the block's first, else slot 1.
            auto slot = [&](int64_t b) {
                const int first = int(b * U / G / chunks);
                return part + (size_t(b) * 2 + (srb == first ? 0 : 1)) * (kSkRows * XR);
            };
            float* mine = slot(blockIdx.x);
            for (int e = tid; e < n * kSkRows; e += 256) mine[e] = tile[sk_tat(e / kSkRows, e % kSkRows)];
            __threadfence();
            __syncthreads();
            // The blocks whose units hold the row block's first and last chunk.
            const int64_t f = int64_t(srb) * chunks, l = f + chunks - 1;
            const int64_t bf = ((f + 1) * G + U - 1) / U - 1, bl2 = ((l + 1) * G + U - 1) / U - 1;
            if (tid == 0) last = atomicAdd(&counters[srb], 1) == int(bl2 - bf);
            __syncthreads();
            if (!last) continue;
            __threadfence();
            for (int64_t b = bf; b <= bl2; b++) {  // in block order: the bits do not depend on who came last
                const float* p = slot(b);
                for (int e = tid; e < n * kSkRows; e += 256) {
                    float& v = tile[sk_tat(e / kSkRows, e % kSkRows)];
                    v = b == bf ? __ldcg(p + e) : __fadd_rn(v, __ldcg(p + e));
                }
            }
            if (tid == 0) counters[srb] = 0;
            __syncthreads();
        }
        // The epilogue, from the tile: thread t takes outputs t % outs of x
        // rows t / outs, +256 / outs, …
        for (int e = tid; e < n * outs; e += 256) {
            const int j = e / outs, i = e % outs, r = srb * outs + i;
            if (r >= rows) continue;
            if (SWIGLU) {
                y[size_t(j) * rows + r] = swiglu_clamp1(tile[sk_tat(j, i)], tile[sk_tat(j, kSkRows / 2 + i)], limit);
                continue;
            }
            float v = tile[sk_tat(j, i)];
            if (bias) v = __fadd_rn(v, bias[r]);
            float* o = y + size_t(j) * rows + r;
            if (acc_y) v = __fadd_rn(v, *o);
            *o = v;
        }
        // The next segment's tile writes wait for the loop's __syncthreads.
    }
    cp_wait<0>();
}

}  // namespace

// ferrite_skinny_bf16_NT: y (n, rows) = x (n, cols) · wᵀ (+ bias) (+ y);
// ferrite_skinny_swiglu_bf16_NT: y (n, rows) = swiglu of the stacked [gate;
// up] (2·rows, cols) weight's products (clamped at limit > 0). n ≤ 8·NT;
// flags: sk_cp16's L2 hints for the weights (bits 1, 2); bits 4 and 8 drop
// the lo-term MMAs or all MMAs (wrong sums: BenchmarkSkinny's cost
// breakdown only).
#define FERRITE_SKINNY(NAME, NT, SWIGLU)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                     \
        NAME(float* y, const float* x, const uint16_t* w, int n, int rows, int cols, const float* bias,      \
             int acc_y, float limit, float* part, int* counters, int flags) {                                \
        skinny_prefetch<NT, SWIGLU>(w, rows, cols, flags);                                                   \
        FERRITE_PDL_WAIT();                                                                                  \
        skinny<NT, SWIGLU>(y, x, w, n, rows, cols, bias, acc_y, limit, part, counters, flags);                      \
    }

FERRITE_SKINNY(ferrite_skinny_bf16_1, 1, false)
FERRITE_SKINNY(ferrite_skinny_bf16_2, 2, false)
FERRITE_SKINNY(ferrite_skinny_bf16_4, 4, false)
FERRITE_SKINNY(ferrite_skinny_bf16_8, 8, false)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_1, 1, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_2, 2, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_4, 4, true)
FERRITE_SKINNY(ferrite_skinny_swiglu_bf16_8, 8, true)
