// Paged causal attention for prefill: flash attention on tensor cores
// (mma.sync m16n8k16 bf16 → f32, sm_80 and up). ops.cu's split-KV kernel
// reads every key once per query row; here a block takes a tile of
// 16·WARPS consecutive query rows of one sequence for one query head and
// streams the sequence's keys and values through shared memory in tiles of
// kPfKeys, so each key is read once per row tile.
//
// Block (head h, row tile): rows [r0, r0 + 16·WARPS) of the batch, which
// prefill_owns (ops.cu) says are all of one sequence; other tiles are left
// to the split-KV kernel (launched after this one with the same predicate).
// Warp w takes rows r0 + 16w .. r0 + 16w + 15. For each key tile:
//   S = Q·Kᵀ (16×64 per warp, f32), masked causally by each row's position;
//   online softmax in f32 (running max m, per-thread partial sums l);
//   O += P·V with P rounded to bf16.
// Q, and the keys and values of an F32 cache, are rounded to bf16 for the
// products (round to nearest even); every sum is f32. Against the float64
// reference that is the AttentionBF16Tol of kernels/kerneltest (Backend's
// AttentionRoundsToBF16 says when).
//
// Shared memory holds one key tile and one value tile, bf16, rows padded to
// HD + 8 elements so ldmatrix's eight 16-byte row reads hit distinct banks.
// A BF16 cache is copied with cp.async: the next key tile streams in while
// P·V runs and the next value tile while the next Q·Kᵀ runs; an F32 cache
// is loaded, rounded and stored by the threads.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"; g = lane/4, t = lane%4):
//   A (16×16 row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16×8 col):  b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C (16×8 f32):  c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
// the lower-indexed element of each pair in the low 16 bits.
//
// Launch: grid (heads, ceil(n / (16·WARPS))), 32·WARPS threads; HD 64 or
// 128; WARPS 4 or 8 (tiles of 64 or 128 rows).

namespace {

constexpr int kPfKeys = 64;  // keys per shared-memory tile

// pack_bf16 rounds lo and hi to bf16 (nearest even) into one register, lo
// in the low half.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// ldsm_x4 loads four 8×8 b16 matrices; lanes 8i..8i+7 give the row
// addresses of matrix i, and r[i] gets (row g, columns 2t, 2t+1) of it.
__device__ inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ldsm_x4_t is ldsm_x4 transposed: r[i] gets (rows 2t, 2t+1, column g).
__device__ inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// cp16 copies 16 bytes from global src to shared dst asynchronously; with
// bytes 0 it writes zeros and reads nothing.
__device__ inline void cp16(uint32_t dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ inline void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// cp_wait waits until at most N of this thread's committed groups are
// still in flight.
template <int N>
__device__ inline void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// A thread's share of a key tile: 16-byte chunks c = threadIdx.x +
// 32·WARPS·i, i < pf_chunks(HD, WARPS), each part c % (HD/8) of the row of
// key c / (HD/8).
__host__ __device__ constexpr int pf_chunks(int hd, int warps) { return kPfKeys * (hd / 8) / (warps * 32); }

// tile_blocks reads the block-table entries (bt, bs slots a block, 2^bsh
// when bsh ≥ 0: a shift, not a division) of the thread's keys of the tile
// at k0, 0 from kend on. The prefill kernel issues them a tile ahead of
// load_tile, so that the cp.async addresses do not wait on these loads.
template <int HD, int WARPS>
__device__ inline void tile_blocks(int (&blk)[pf_chunks(HD, WARPS)], const int* bt, int bs, int bsh, int k0, int kend) {
#pragma unroll
    for (int i = 0; i < pf_chunks(HD, WARPS); i++) {
        const int p = k0 + (int(threadIdx.x) + WARPS * 32 * i) / (HD / 8);
        blk[i] = p < kend ? bt[bsh >= 0 ? p >> bsh : p / bs] : 0;
    }
}

// load_tile fills dst (kPfKeys rows of HD bf16, stride HD + 8) with the
// cache rows of keys [k0, k0 + kPfKeys) whose block-table entries
// tile_blocks read into blk; keys from kend on are zeros. BF16: cp.async
// (the caller commits); F32: rounded by the threads.
template <int HD, bool BF, int WARPS>
__device__ inline void load_tile(uint16_t* dst, const void* cache, const int (&blk)[pf_chunks(HD, WARPS)], int bs,
                                 int bsh, size_t kw, size_t off, int k0, int kend) {
    constexpr int kChunks = HD / 8;  // 16-byte bf16 chunks per row
#pragma unroll
    for (int i = 0; i < pf_chunks(HD, WARPS); i++) {
        const int c = int(threadIdx.x) + WARPS * 32 * i;
        const int key = c / kChunks, part = c % kChunks;
        const int p = k0 + key;
        uint16_t* d = dst + key * (HD + 8) + part * 8;
        size_t e = 0;  // element index of the chunk in the cache
        if (p < kend) e = (size_t(blk[i]) * bs + (bsh >= 0 ? p & (bs - 1) : p % bs)) * kw + off + part * 8;
        if (BF) {
            cp16(smem_addr(d), static_cast<const uint16_t*>(cache) + e, p < kend ? 16 : 0);
        } else {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (p < kend) {
                const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + e);
                const float4 a = s[0], b = s[1];
                v = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
            }
            *reinterpret_cast<uint4*>(d) = v;
        }
    }
}

// softmax_tile turns a key tile's scores s (C fragments of NK n-tiles,
// rows g and g + 8) into probabilities and updates the running state: the
// scores scaled to log2 units (sl2), keys past a row's position masked
// when mask is set (keys k0 + 8·nt + 2t + (e & 1)), the running maxima m0,
// m1 of the quad's rows, this thread's partial sums l0, l1, and the output
// accumulators o (ND n-tiles) rescaled to the new maxima.
template <int NK, int ND>
__device__ inline void softmax_tile(float (&s)[NK][4], float (&o)[ND][4], float& m0, float& m1, float& l0, float& l1,
                                    int k0, bool mask, int pos0, int pos1, int t, float sl2) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NK; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + nt * 8 + 2 * t + (e & 1);
            float x = s[nt][e] * sl2;
            if (mask && key > (e < 2 ? pos0 : pos1)) x = -INFINITY;
            s[nt][e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // While a row has seen no key its max is −∞: subtract 0 instead, so
    // exp2 gives 0 for the masked scores and the (zero) old state.
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float c0 = exp2f(m0 - mu0), c1 = exp2f(m1 - mu1);
    m0 = mn0;
    m1 = mn1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NK; nt++) {
        s[nt][0] = exp2f(s[nt][0] - mu0);
        s[nt][1] = exp2f(s[nt][1] - mu0);
        s[nt][2] = exp2f(s[nt][2] - mu1);
        s[nt][3] = exp2f(s[nt][3] - mu1);
        ps0 += s[nt][0] + s[nt][1];
        ps1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + ps0;
    l1 = l1 * c1 + ps1;
#pragma unroll
    for (int d = 0; d < ND; d++) {
        o[d][0] *= c0;
        o[d][1] *= c0;
        o[d][2] *= c1;
        o[d][3] *= c1;
    }
}

template <int HD, bool BF, int WARPS>
__device__ void prefill_block(const AttnArgs& a) {  // ops.cu's arguments; hd = HD, no part or splits
    constexpr int ROWS = 16 * WARPS;
    constexpr int S = HD + 8;        // shared row stride, elements
    constexpr int KS = HD / 16;      // k-steps of Q·Kᵀ
    constexpr int ND = HD / 8;       // n-tiles of O
    constexpr int NK = kPfKeys / 8;  // n-tiles of S
    __shared__ uint4 ks4[kPfKeys * S / 8], vs4[kPfKeys * S / 8];  // uint4: 16-byte aligned rows
    uint16_t* ks = reinterpret_cast<uint16_t*>(ks4);
    uint16_t* vs = reinterpret_cast<uint16_t*>(vs4);

    const int h = blockIdx.x;
    const int r0 = (gridDim.y - 1 - blockIdx.y) * ROWS;  // the longest tiles first
    if (!prefill_owns(a.seq, a.n, r0, ROWS)) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int kvh = h / (a.heads / a.kvh);
    const size_t kw = size_t(a.kvh) * HD, off = size_t(kvh) * HD;
    const int* bt = a.blocks + size_t(a.seq[r0]) * a.max_blocks;
    const int bsh = (a.bs & (a.bs - 1)) == 0 ? __ffs(a.bs) - 1 : -1;  // log2 of a power-of-two block size

    // The tile's key range: [0, largest position + 1); keys up to its
    // smallest position need no mask. Rows past n have position −1.
    int pmax = -1, pmin = 0x7fffffff;
    for (int r = r0 + lane; r < min(a.n, r0 + ROWS); r += 32) {
        const int p = a.pos[r];
        pmax = max(pmax, p);
        pmin = min(pmin, p);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        pmax = max(pmax, __shfl_xor_sync(0xffffffffu, pmax, o));
        pmin = min(pmin, __shfl_xor_sync(0xffffffffu, pmin, o));
    }
    const int kend = pmax + 1;
    const int ntiles = (kend + kPfKeys - 1) / kPfKeys;

    // This thread's two rows (g and g + 8 of the warp's 16).
    const int row0 = r0 + warp * 16 + g, row1 = row0 + 8;
    const int pos0 = row0 < a.n ? a.pos[row0] : -1, pos1 = row1 < a.n ? a.pos[row1] : -1;
    // The warp's largest position: key tiles past it are masked for all of
    // its rows and change nothing, so the warp skips their products.
    int wmax = max(pos0, pos1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));

    // Prologue: the first key and value tiles start streaming in.
    {
        int blk[pf_chunks(HD, WARPS)];
        tile_blocks<HD, WARPS>(blk, bt, a.bs, bsh, 0, kend);
        load_tile<HD, BF, WARPS>(ks, a.kc, blk, a.bs, bsh, kw, off, 0, kend);
        cp_commit();
        load_tile<HD, BF, WARPS>(vs, a.vc, blk, a.bs, bsh, kw, off, 0, kend);
        cp_commit();
    }

    // Q as A fragments, rounded to bf16.
    uint32_t qa[KS][4];
    {
        const float* q0 = a.q + (size_t(row0) * a.heads + h) * HD;
        const float* q1 = a.q + (size_t(row1) * a.heads + h) * HD;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            float2 x0 = make_float2(0.f, 0.f), x1 = x0, x2 = x0, x3 = x0;
            if (row0 < a.n) {
                x0 = *reinterpret_cast<const float2*>(q0 + 16 * k + 2 * t);
                x2 = *reinterpret_cast<const float2*>(q0 + 16 * k + 8 + 2 * t);
            }
            if (row1 < a.n) {
                x1 = *reinterpret_cast<const float2*>(q1 + 16 * k + 2 * t);
                x3 = *reinterpret_cast<const float2*>(q1 + 16 * k + 8 + 2 * t);
            }
            qa[k][0] = pack_bf16(x0.x, x0.y);
            qa[k][1] = pack_bf16(x1.x, x1.y);
            qa[k][2] = pack_bf16(x2.x, x2.y);
            qa[k][3] = pack_bf16(x3.x, x3.y);
        }
    }

    float o[ND][4];
#pragma unroll
    for (int j = 0; j < ND; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // running max (log2 units), partial sums
    const float sl2 = a.scale * 1.4426950408889634f;             // scores to log2 units

    // ldmatrix lane addresses. K (not transposed): lane gives key
    // (lane & 7) of an n-tile, dims 8·(lane >> 3) of a 32-dim step, so
    // r[0], r[1] are the B fragment of one k-step and r[2], r[3] the next.
    // V (transposed): lane gives key 8·((lane >> 3) & 1) + (lane & 7) of a
    // 16-key step, dims 8·(lane >> 4) of a 16-dim pair of n-tiles, so r[0],
    // r[1] are the B fragment of the first n-tile and r[2], r[3] the second.
    const uint32_t kbase = smem_addr(ks + (lane & 7) * S + (lane >> 3) * 8);
    const uint32_t vbase = smem_addr(vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * S + (lane >> 4) * 8);

    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * kPfKeys;
        const bool live = k0 <= wmax;  // warp-uniform
        const bool more = j + 1 < ntiles;
        int nblk[pf_chunks(HD, WARPS)];  // the next tile's block-table entries, loaded while this one runs
        if (more) tile_blocks<HD, WARPS>(nblk, bt, a.bs, bsh, k0 + kPfKeys, kend);
        cp_wait<1>();  // this tile's keys (its values may still be in flight)
        __syncthreads();

        float s[NK][4];
        if (live) {
#pragma unroll
            for (int nt = 0; nt < NK; nt++) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
                for (int kk = 0; kk < KS / 2; kk++) {
                    uint32_t b[4];
                    ldsm_x4(b, kbase + uint32_t((nt * 8 * S + kk * 32) * 2));
                    mma_bf16(s[nt], qa[2 * kk], b[0], b[1]);
                    mma_bf16(s[nt], qa[2 * kk + 1], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with ks
        if (more) {
            load_tile<HD, BF, WARPS>(ks, a.kc, nblk, a.bs, bsh, kw, off, k0 + kPfKeys, kend);
            cp_commit();
        }
        if (live) softmax_tile<NK, ND>(s, o, m0, m1, l0, l1, k0, k0 + kPfKeys - 1 > pmin, pos0, pos1, t, sl2);
        if (more) cp_wait<1>();  // this tile's values (the next keys may be in flight)
        else cp_wait<0>();
        __syncthreads();  // the values are in
        if (live) {
#pragma unroll
            for (int kk = 0; kk < kPfKeys / 16; kk++) {
                // P's C fragments of n-tiles 2kk and 2kk+1 are the A
                // fragment of k-step kk.
                const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int dp = 0; dp < ND / 2; dp++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, vbase + uint32_t((kk * 16 * S + dp * 16) * 2));
                    mma_bf16(o[2 * dp], pa, b[0], b[1]);
                    mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with vs
        if (more) {
            load_tile<HD, BF, WARPS>(vs, a.vc, nblk, a.bs, bsh, kw, off, k0 + kPfKeys, kend);
            cp_commit();
        }
    }

    // The row sums over the quad, and out = O / l.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    float* out0 = a.out + (size_t(row0) * a.heads + h) * HD + 2 * t;
    float* out1 = a.out + (size_t(row1) * a.heads + h) * HD + 2 * t;
#pragma unroll
    for (int d = 0; d < ND; d++) {
        if (row0 < a.n) *reinterpret_cast<float2*>(out0 + 8 * d) = make_float2(o[d][0] * i0, o[d][1] * i0);
        if (row1 < a.n) *reinterpret_cast<float2*>(out1 + 8 * d) = make_float2(o[d][2] * i1, o[d][3] * i1);
    }
}

}  // namespace

#define FERRITE_PREFILL(name, HD, BF, WARPS)                                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) name(                                         \
        float* out, const float* q, const void* kc, const void* vc, const int* pos, const int* seq,        \
        const int* blocks, int max_blocks, int bs, int n, int heads, int kvh, float scale) {               \
        AttnArgs a{out, q, kc, vc, pos, seq, blocks, nullptr, max_blocks, bs, n, heads, kvh, HD, 1, 1, scale, 0}; \
        prefill_block<HD, BF, WARPS>(a);                                                                   \
    }

// ferrite_prefill_attn_<cache>_<head dim>_<rows per tile>
FERRITE_PREFILL(ferrite_prefill_attn_f32_64_64, 64, false, 4)
FERRITE_PREFILL(ferrite_prefill_attn_f32_128_64, 128, false, 4)
FERRITE_PREFILL(ferrite_prefill_attn_bf16_64_64, 64, true, 4)
FERRITE_PREFILL(ferrite_prefill_attn_bf16_128_64, 128, true, 4)
FERRITE_PREFILL(ferrite_prefill_attn_f32_64_128, 64, false, 8)
FERRITE_PREFILL(ferrite_prefill_attn_f32_128_128, 128, false, 8)
FERRITE_PREFILL(ferrite_prefill_attn_bf16_64_128, 64, true, 8)
FERRITE_PREFILL(ferrite_prefill_attn_bf16_128_128, 128, true, 8)
