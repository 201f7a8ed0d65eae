// On-device sampling support (kernels.SampleOps): every row of a step's
// logits reduced to its k best entries, so the host reads k candidates per
// row instead of the vocabulary. The order is a total one: the larger value
// first, ties to the lower column, NaN counted as −∞ and −0 as +0; the
// entries are compared as 32-bit keys that order exactly like those floats.
//
// Launch: one block of kSampleThreads threads per row, grid (rows).
#include <stdint.h>

namespace {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kSampleMaxK = 1024;  // the bitonic sort holds one candidate per thread
constexpr unsigned kSampleFull = 0xffffffffu;

// sample_key maps a logit to an unsigned key in the candidates' order:
// NaN as −∞, −0 as +0, then the usual flip of float bits (negative values
// inverted, positive ones above them). Every real key is ≥ 0x007fffff
// (−∞), so 0 is below all of them.
__device__ inline uint32_t sample_key(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u;  // NaN → −∞
    if ((u & 0x7fffffffu) == 0) u = 0;                      // −0 → +0
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// sample_value is the float a key stands for (canonical: no NaN, no −0).
__device__ inline float sample_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// sample_better reports whether candidate a (key, column) comes before b.
__device__ inline bool sample_better(uint32_t ka, int ca, uint32_t kb, int cb) {
    return ka > kb || (ka == kb && ca < cb);
}

}  // namespace

// out (rows, 2) = [value | column] of each row's best entry of x (rows, V):
// the greedy argmax, ties to the lower column. Row r of x starts at
// r·stride, of out at r·ostride (elements).
extern "C" __global__ void __launch_bounds__(kSampleThreads)
    ferrite_argmax_rows(float* out, uint64_t ostride, const float* x, uint64_t stride, int V) {
    const float* row = x + uint64_t(blockIdx.x) * stride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Each thread visits its columns in increasing order, so a strictly
    // larger key is the only reason to move.
    uint32_t bk = 0;
    int bc = 0x7fffffff;
    // 16-byte loads, four a thread in flight, where the row allows: a
    // thread's columns 4·t … 4·t + 3, 4·(t + blockDim.x) …, increasing,
    // then the tail past the last whole four.
    int j0 = 0;
    if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const int v4 = V >> 2;
#pragma unroll 4
        for (int j = threadIdx.x; j < v4; j += blockDim.x) {
            const float4 f = r4[j];
            const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const uint32_t k = sample_key(e[u]);
                if (k > bk) bk = k, bc = 4 * j + u;
            }
        }
        j0 = v4 << 2;
    }
    for (int j = j0 + threadIdx.x; j < V; j += blockDim.x) {
        const uint32_t k = sample_key(row[j]);
        if (k > bk) bk = k, bc = j;
    }
    __shared__ uint32_t wk[kSampleWarps];
    __shared__ int wc[kSampleWarps];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t ok = __shfl_xor_sync(kSampleFull, bk, o);
        const int oc = __shfl_xor_sync(kSampleFull, bc, o);
        if (sample_better(ok, oc, bk, bc)) bk = ok, bc = oc;
    }
    if (lane == 0) wk[warp] = bk, wc[warp] = bc;
    __syncthreads();
    if (warp != 0) return;
    const int nw = blockDim.x >> 5;
    bk = lane < nw ? wk[lane] : 0;
    bc = lane < nw ? wc[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint32_t ok = __shfl_xor_sync(kSampleFull, bk, o);
        const int oc = __shfl_xor_sync(kSampleFull, bc, o);
        if (sample_better(ok, oc, bk, bc)) bk = ok, bc = oc;
    }
    if (lane == 0) {
        float* o = out + uint64_t(blockIdx.x) * ostride;
        o[0] = sample_value(bk);
        o[1] = float(bc);
    }
}

// out (rows, 2k) = [values (k) | columns (k)] of each row's k best entries
// of x (rows, V), best first; 1 ≤ k ≤ min(V, kSampleMaxK), blockDim.x =
// kSampleThreads. A radix select finds the k-th best key T in four passes
// of 8 bits (per-warp histograms, lanes of one bin merged by
// __match_any_sync); one more pass collects the keys above T (any order)
// and the first columns with key T (in column order, so ties go to the
// lower column); a bitonic sort orders the k of them.
extern "C" __global__ void __launch_bounds__(kSampleThreads)
    ferrite_topk_rows(float* out, uint64_t ostride, const float* x, uint64_t stride, int V, int k) {
    __shared__ uint32_t hist[kSampleWarps][256];
    __shared__ uint32_t skey[kSampleMaxK];
    __shared__ int scol[kSampleMaxK];
    __shared__ int wcount[kSampleWarps];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remain, s_ngt, s_neq, s_done;
    const float* row = x + uint64_t(blockIdx.x) * stride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
    if (tid == 0) s_prefix = 0, s_mask = 0, s_remain = k, s_ngt = 0, s_neq = 0;

    // Radix select. Invariant: at least s_remain keys match s_prefix under
    // s_mask, and exactly k − s_remain keys are above every such key.
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = lane; i < 256; i += 32) hist[warp][i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int base = 0; base < V; base += nt) {  // uniform trip count: whole warps
            const int j = base + tid;
            const uint32_t key = j < V ? sample_key(row[j]) : 0;
            const bool match = j < V && (key & mask) == prefix;
            const unsigned bin = match ? (key >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(kSampleFull, bin);
            if (match && lane == __ffs(peers) - 1) atomicAdd(&hist[warp][bin], unsigned(__popc(peers)));
        }
        __syncthreads();
        if (tid < 256) {
            uint32_t s = 0;
            for (int w = 0; w < nt / 32; w++) s += hist[w][tid];
            hist[0][tid] = s;
        }
        __syncthreads();
        if (warp == 0) {
            // Lane l owns bins [8l, 8l+8); the digit is the highest bin d
            // with (keys in bins ≥ d) ≥ remain.
            const uint32_t remain = uint32_t(s_remain);
            __syncwarp();  // every lane has read s_remain before one writes it
            uint32_t s = 0;
            for (int b = 0; b < 8; b++) s += hist[0][8 * lane + b];
            uint32_t incl = s;  // keys in the bins of lanes ≥ lane
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t t = __shfl_down_sync(kSampleFull, incl, o);
                if (lane + o < 32) incl += t;
            }
            const uint32_t above = incl - s;
            if (above < remain && remain <= incl) {
                uint32_t cum = above;
                for (int b = 7; b >= 0; b--) {
                    const uint32_t h = hist[0][8 * lane + b];
                    if (cum + h >= remain) {
                        s_prefix = prefix | (uint32_t(8 * lane + b) << shift);
                        s_mask = mask | (255u << shift);
                        s_remain = int(remain - cum);
                        break;
                    }
                    cum += h;
                }
            }
        }
        __syncthreads();
    }

    // Collect: the keys above T, then the first `need` columns with key T.
    const uint32_t T = s_prefix;
    const int need = s_remain, above = k - need;
    for (int base = 0; base < V; base += nt) {
        const int j = base + tid;
        const uint32_t key = j < V ? sample_key(row[j]) : 0;
        if (key > T) {
            const int at = atomicAdd(&s_ngt, 1);
            skey[at] = key, scol[at] = j;
        }
        const bool eq = j < V && key == T;
        const unsigned ballot = __ballot_sync(kSampleFull, eq);
        if (lane == 0) wcount[warp] = __popc(ballot);
        __syncthreads();
        int r = s_neq + __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < warp; w++) r += wcount[w];
        if (eq && r < need) skey[above + r] = key, scol[above + r] = j;
        __syncthreads();  // s_neq and wcount read
        if (tid == 0) {
            int t = 0;
            for (int w = 0; w < nt / 32; w++) t += wcount[w];
            s_neq += t;
            // Decided by one thread: the next tile's atomics may already
            // move s_ngt while others look.
            s_done = s_ngt == above && s_neq >= need;
        }
        __syncthreads();
        if (s_done) break;
    }

    // Bitonic sort of the k candidates, padded to a power of two with keys
    // below every real one.
    int P = 1;
    while (P < k) P <<= 1;
    if (tid >= k && tid < P) skey[tid] = 0, scol[tid] = 0x7fffffff;
    for (int size = 2; size <= P; size <<= 1) {
        for (int half = size >> 1; half > 0; half >>= 1) {
            __syncthreads();
            const int i = tid, m = tid ^ half;
            if (i < P && m > i) {
                const uint32_t ka = skey[i], kb = skey[m];
                const int ca = scol[i], cb = scol[m];
                const bool first = (i & size) == 0;  // this run goes best first
                if (first ? sample_better(kb, cb, ka, ca) : sample_better(ka, ca, kb, cb)) {
                    skey[i] = kb, scol[i] = cb;
                    skey[m] = ka, scol[m] = ca;
                }
            }
        }
    }
    __syncthreads();
    if (tid < k) {
        float* o = out + uint64_t(blockIdx.x) * ostride;
        o[tid] = sample_value(skey[tid]);
        o[k + tid] = float(scol[tid]);
    }
}

// dst[i] = (int) src[idx[i]] for the m entries with 0 ≤ idx[i] < n; the
// others are left alone (kernels.DraftOps.FeedIDs): an MTP draft pass's
// argmax columns become a later pass's token ids inside one step.
// Launch: grid ceil(m / 256), 256 threads.
extern "C" __global__ void ferrite_feed_ids(int* dst, int dst_stride, const float* src, int64_t n, const int* idx,
                                            int idx_stride, int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    const int j = idx[int64_t(i) * idx_stride];
    if (j >= 0 && j < n) dst[int64_t(i) * dst_stride] = int(src[j]);
}
