// Grouped experts for one to three tokens (batch-1 decode and short
// speculative verifications) as one persistent kernel, ferrite_moe_b1_*
// (kernels/cuda's moe.go: FERRITE_MOE_B1). It follows ops_moe.cu in the
// one translation unit and uses its helpers (mat_row, warp_sum,
// swiglu_clamp1, BF16W).
//
// One block of 512 threads per multiprocessor (the grid is the GPU's SMs,
// all resident at once: 128 registers a thread at most). Every block first
// plans the call in shared memory: the slots (token i's j-th expert, s =
// i·k + j) sorted by expert, cut into units of one expert and at most C
// slots (C = 1 for one token, 3 for up to three), each unit's gate, up and
// down rows. Then
//
//  1. gate/up: the (unit, row) tasks, spread over every warp of the grid;
//     a warp loads its gate and up row whole (16 loads of 16 bytes a lane
//     in flight for hidden 2048) and writes h[s][r] = silu(g)·u for the
//     unit's slots (float32, global scratch);
//  2. every warp asks for its first down row's weights (up to kB1DB loads
//     a lane), then the grid waits for every block's h (a grid barrier:
//     one atomic counter and a generation word that the last block to
//     arrive resets and bumps), so the down weights stream while the last
//     gate/up rows finish;
//  3. down: each block copies h (n·k, inter) into shared memory, and each
//     warp takes hidden rows: the row of every unit's down matrix against
//     the unit's slots of h, then each token's k products added in
//     increasing expert id (float32 products and sums).
//
// mode picks all three in one launch (kB1Both) or the gate/up and down
// halves as two launches (kB1GateUp, kB1Down); the down half then plans
// and asks for its first weights before its PDL wait, since its ids come
// from the kernel two launches back, complete once this grid is launched.
//
// Every dot product is summed as rows_dot_vec<BF16W, 1, …> sums it (lane L:
// elements 8L + 256m for m = 0, 1, …, in order, then warp_sum) and every
// combination as moe_few_down and ferrite_moe_combine do, so the bits are
// those of the slot-a-pass and register-tile kernels: a token's result
// does not depend on the tokens it shares the call with (kernels.RowExact).
// Weights bf16, rows 16-byte aligned, x 16-byte aligned rows; an id outside
// [0, experts) makes its token's row NaN.
#include <stdint.h>

namespace {

// B1<NT> is the shape of a block of NT threads (512): its warps, gate/up
// strides and down loads a lane a batch (so that a thread's 128 registers
// hold them), and the shared memory before h (the plan and a row of part a
// warp; kernels/cuda moeB1Fixed). Blocks of 1,024 threads of 64 registers
// (half the loads a lane in flight) measured slower (session 14, GPU run 3)
// and were removed.
template <int NT>
struct B1 {
    static_assert(NT == 512, "ferrite_moe_b1 runs blocks of 512 threads");
    static constexpr int kWarps = NT / 32;
    static constexpr int kGB = 8;
    static constexpr int kDB = 16;
    static constexpr int kFixed = 24 << 10;
};
constexpr int kB1MaxSlots = 192;  // n·k (kernels/cuda moeB1Slots)
constexpr int kB1GateUp = 1, kB1Down = 2, kB1Both = 3;

// B1Plan is a block's plan of the call (b1_plan).
struct B1Plan {
    int id[kB1MaxSlots];     // ids
    float w[kB1MaxSlots];    // routing weights
    int ord[kB1MaxSlots];    // (token, q): the token's q-th slot j by (expert id, j)
    int srt[kB1MaxSlots];    // the valid slots sorted by (expert, slot)
    int u0[kB1MaxSlots];     // unit u's first place in srt
    int un[kB1MaxSlots];     // unit u's slots (≤ C)
    const uint8_t* pg[kB1MaxSlots];  // unit u's gate, up and down row 0
    const uint8_t* pu[kB1MaxSlots];
    const uint8_t* pd[kB1MaxSlots];
    unsigned bal[32];        // unit starts, a ballot a warp
    int nu;                  // units
};

constexpr int kB1PlanBytes = (sizeof(B1Plan) + 15) / 16 * 16;
static_assert(kB1PlanBytes + B1<512>::kWarps * kB1MaxSlots * 4 <= B1<512>::kFixed, "ferrite_moe_b1's plan outgrows kFixed");

// b1_plan fills P for n tokens of k slots each (n·k ≤ kB1MaxSlots). ids
// and w are read through L2 (another grid wrote them).
template <int C>
__device__ void b1_plan(B1Plan& P, const int* ids, const float* w, const MatDesc* table, int experts, int n, int k) {
    const int S = n * k, t = threadIdx.x;
    int e = 0;
    bool valid = false;
    if (t < S) {
        e = int(__ldcg(reinterpret_cast<const unsigned*>(ids) + t));
        valid = e >= 0 && e < experts;
        P.id[t] = e;
        P.w[t] = __ldcg(w + t);
    }
    const int nv = __syncthreads_count(valid);
    if (t < S) {
        const int i = t / k, j = t % k;
        int rank = 0;
        for (int q = 0; q < k; q++) {
            const int eq = P.id[i * k + q];
            rank += eq < e || (eq == e && q < j);
        }
        P.ord[i * k + rank] = j;
        if (valid) {
            int r = 0;
            for (int u = 0; u < S; u++) {
                const int eu = P.id[u];
                r += eu >= 0 && eu < experts && (eu < e || (eu == e && u < t));
            }
            P.srt[r] = t;
        }
    }
    __syncthreads();
    bool start = false;
    int ep = 0;
    if (t < nv) {
        ep = P.id[P.srt[t]];
        int rs = t;
        while (rs > 0 && P.id[P.srt[rs - 1]] == ep) rs--;
        start = (t - rs) % C == 0;
    }
    const unsigned b = __ballot_sync(0xffffffffu, start);
    const int lane = t & 31, warp = t >> 5;
    if (lane == 0) P.bal[warp] = b;
    __syncthreads();
    if (start) {
        int u = __popc(b & ((1u << lane) - 1));
        for (int q = 0; q < warp; q++) u += __popc(P.bal[q]);
        int c = 1;
        while (c < C && t + c < nv && P.id[P.srt[t + c]] == ep) c++;
        P.u0[u] = t;
        P.un[u] = c;
        const float* unused;
        P.pg[u] = mat_row(table[3 * ep], 0, &unused);
        P.pu[u] = mat_row(table[3 * ep + 1], 0, &unused);
        P.pd[u] = mat_row(table[3 * ep + 2], 0, &unused);
    }
    if (t == 0) {
        int nu = 0;
        for (int q = 0; q < int(blockDim.x >> 5); q++) nu += __popc(P.bal[q]);
        P.nu = nu;
    }
    __syncthreads();
}

// b1_gate_up runs the grid's gate/up tasks (unit u, row r) of warp gw of
// GW: h[s][r] = swiglu(gate_r·x[s / k], up_r·x[s / k]) for the unit's slots.
template <int C, int NT>
__device__ void b1_gate_up(const B1Plan& P, float* h, const float* x, int x_stride, int k, int inter, int hidden,
                           float limit, int gw, int GW) {
    const int lane = threadIdx.x & 31;
    const int total = P.nu * inter;
    const size_t pitch = size_t(hidden) * 2;
    for (int task = gw; task < total; task += GW) {
        const int u = task / inter, r = task - u * inter;
        const int nc = P.un[u], p0 = P.u0[u];
        int sl[C];
        const float* xs[C];
#pragma unroll
        for (int c = 0; c < C; c++) {
            sl[c] = P.srt[p0 + min(c, nc - 1)];
            xs[c] = x + size_t(sl[c] / k) * x_stride;
        }
        const uint8_t* ga = P.pg[u] + r * pitch;
        const uint8_t* ua = P.pu[u] + r * pitch;
        float g[C], v[C];
#pragma unroll
        for (int c = 0; c < C; c++) g[c] = v[c] = 0.f;
        constexpr int GB = B1<NT>::kGB;
        for (int k0 = 0; k0 < hidden; k0 += 256 * GB) {
            uint4 wg[GB], wu[GB];
#pragma unroll
            for (int j = 0; j < GB; j++) {
                const int kk = k0 + 256 * j + lane * 8;
                if (kk < hidden) {
                    wg[j] = __ldg(reinterpret_cast<const uint4*>(ga + size_t(kk) * 2));
                    wu[j] = __ldg(reinterpret_cast<const uint4*>(ua + size_t(kk) * 2));
                }
            }
#pragma unroll
            for (int j = 0; j < GB; j++) {
                const int kk = k0 + 256 * j + lane * 8;
                if (kk < hidden) {
                    float a[8], bv[8];
                    BF16W::vec(wg[j], a);
                    BF16W::vec(wu[j], bv);
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        if (c < nc) {
                            const float4 x0 = __ldg(reinterpret_cast<const float4*>(xs[c] + kk));
                            const float4 x1 = __ldg(reinterpret_cast<const float4*>(xs[c] + kk) + 1);
                            const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                            for (int q = 0; q < 8; q++) g[c] = fmaf(a[q], xv[q], g[c]);
#pragma unroll
                            for (int q = 0; q < 8; q++) v[c] = fmaf(bv[q], xv[q], v[c]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            if (c < nc) {
                const float gs = warp_sum(g[c]), vs = warp_sum(v[c]);
                if (lane == 0) h[size_t(sl[c]) * inter + r] = swiglu_clamp1(gs, vs, limit);
            }
        }
    }
}

// b1_down_load asks for the down weights of hidden row r from (unit u,
// stride m) on: kB1DB (unit, stride) pairs, s2 strides of 256 columns a
// unit.
template <int DB>
__device__ __forceinline__ void b1_down_load(const B1Plan& P, uint4 (&wv)[DB], int r, int u, int m, int s2,
                                             int inter) {
    const int lane = threadIdx.x & 31, nu = P.nu;
    const size_t pitch = size_t(inter) * 2;
#pragma unroll
    for (int j = 0; j < DB; j++) {
        if (u < nu) {
            const int kk = 256 * m + lane * 8;
            if (kk < inter) wv[j] = __ldg(reinterpret_cast<const uint4*>(P.pd[u] + r * pitch + size_t(kk) * 2));
        }
        if (++m == s2) {
            m = 0;
            u++;
        }
    }
}

// b1_first_load asks for the first batch of warp gw's first down row, r
// = gw, and reports whether there is one.
template <int DB>
__device__ __forceinline__ bool b1_first_load(const B1Plan& P, uint4 (&wv)[DB], int gw, int hidden, int s2,
                                              int inter) {
    if (gw >= hidden) return false;
    b1_down_load(P, wv, gw, 0, 0, s2, inter);
    return true;
}

// b1_down_row computes hidden row r of y for the n tokens: part[s] (this
// warp's) = down_row·h[s] for every valid slot, then each token's sum.
// With pre, wv already holds the first batch (b1_down_load from (0, 0)).
template <int C, int DB>
__device__ __forceinline__ void b1_down_row(const B1Plan& P, float* part, const float* hs, float* y, int y_stride, int n, int k,
                            int inter, int r, uint4 (&wv)[DB], bool pre) {
    const int lane = threadIdx.x & 31, nu = P.nu;
    const int s2 = (inter + 255) / 256;
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; c++) acc[c] = 0.f;
    int fu = 0, fm = 0;
    while (fu < nu) {
        if (!pre) b1_down_load(P, wv, r, fu, fm, s2, inter);
        pre = false;
        int u = fu, m = fm;
#pragma unroll
        for (int j = 0; j < DB; j++) {
            if (u < nu) {
                const int nc = P.un[u], p0 = P.u0[u];
                const int kk = 256 * m + lane * 8;
                if (kk < inter) {
                    float a[8];
                    BF16W::vec(wv[j], a);
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        if (c < nc) {
                            const float4* hp = reinterpret_cast<const float4*>(hs + size_t(P.srt[p0 + c]) * inter + kk);
                            const float4 h0 = hp[0], h1 = hp[1];
                            const float hv[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                            for (int q = 0; q < 8; q++) acc[c] = fmaf(a[q], hv[q], acc[c]);
                        }
                    }
                }
                if (m == s2 - 1) {
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        if (c < nc) {
                            const float s = warp_sum(acc[c]);
                            if (lane == 0) part[P.srt[p0 + c]] = s;
                        }
                        acc[c] = 0.f;
                    }
                }
            }
            if (++m == s2) {
                m = 0;
                u++;
            }
        }
        fu = u;
        fm = m;
    }
    __syncwarp();
    if (lane < n) {
        float t = 0.f;
        for (int q = 0; q < k; q++) {
            const int s = lane * k + P.ord[lane * k + q];
            t = __fadd_rn(t, __fmul_rn(P.w[s], part[s]));
        }
        y[size_t(lane) * y_stride + r] = t;
    }
    __syncwarp();
}

// b1_grid_sync waits until every block of the grid has arrived (all
// resident: one a multiprocessor). bar[0] counts the arrivals, bar[1] is
// the generation the last to arrive bumps after resetting bar[0]; each
// block's writes before are visible to every block after. A wait of
// seconds (a grid that is not all resident) traps instead of hanging.
__device__ void b1_grid_sync(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* vb = bar;
        const unsigned gen = vb[1];
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            vb[0] = 0;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            unsigned spins = 0;
            while (vb[1] == gen) {
                if (++spins == (1u << 23)) asm volatile("trap;");
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// b1_table returns the expert table to plan from: with tcopy a copy in
// shared memory at room (made before the PDL wait: a step never writes
// the table), so that the plan's reads of it after the wait are not L2 or
// DRAM round trips; else the table itself.
__device__ __forceinline__ const MatDesc* b1_table(const MatDesc* table, int experts, int tcopy, float4* room) {
    if (!tcopy) return table;
    const unsigned* src = reinterpret_cast<const unsigned*>(table);
    unsigned* dst = reinterpret_cast<unsigned*>(room);
    for (int i = threadIdx.x; i < 3 * experts * int(sizeof(MatDesc) / 4); i += blockDim.x) dst[i] = __ldg(src + i);
    return reinterpret_cast<const MatDesc*>(dst);
}

template <int C, int NT>
__device__ void moe_b1(int mode, float* y, int y_stride, float* h, const float* x, int x_stride, const int* ids,
                       const float* w, const MatDesc* table, int experts, int n, int k, int inter, int hidden,
                       float limit, unsigned* bar, int tcopy) {
    // Dynamic shared memory only (the whole of it opted in: no static
    // shared memory may add to it): the plan, each warp's row of part,
    // then h (n·k, inter) for down.
    extern __shared__ float4 b1_sm[];
    B1Plan& P = *reinterpret_cast<B1Plan*>(b1_sm);
    float (*part)[kB1MaxSlots] = reinterpret_cast<float (*)[kB1MaxSlots]>(reinterpret_cast<char*>(b1_sm) + kB1PlanBytes);
    constexpr int kB1Warps = B1<NT>::kWarps, kB1Fixed = B1<NT>::kFixed, kB1DB = B1<NT>::kDB;
    float4* b1_hs = b1_sm + kB1Fixed / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gw = blockIdx.x * kB1Warps + warp, GW = gridDim.x * kB1Warps;
    const int s2 = (inter + 255) / 256;
    uint4 wv[kB1DB];
    bool pre = false;
    if (mode == kB1Down) {
        // The ids and weights are Route's, two launches back: it completed
        // before the gate/up grid passed its wait and let this one launch.
        b1_plan<C>(P, ids, w, table, experts, n, k);
        pre = b1_first_load(P, wv, gw, hidden, s2, inter);
        FERRITE_PDL_WAIT();
    } else {
        const MatDesc* tb = b1_table(table, experts, tcopy, b1_sm + kB1Fixed / 16);
        FERRITE_PDL_WAIT();
        b1_plan<C>(P, ids, w, tb, experts, n, k);
        b1_gate_up<C, NT>(P, h, x, x_stride, k, inter, hidden, limit, gw, GW);
        if (mode == kB1GateUp) return;
        pre = b1_first_load(P, wv, gw, hidden, s2, inter);
        b1_grid_sync(bar);
    }
    const int S = n * k;
    float* hs = reinterpret_cast<float*>(b1_hs);
    for (int i = threadIdx.x; i < S * inter / 4; i += NT) b1_hs[i] = __ldcg(reinterpret_cast<const float4*>(h) + i);
    for (int s = lane; s < S; s += 32) part[warp][s] = __int_as_float(0x7fc00000);  // a slot of a bad id
    __syncthreads();
    for (int r = gw; r < hidden; r += GW) {
        b1_down_row<C, kB1DB>(P, part[warp], hs, y, y_stride, n, k, inter, r, wv, pre);
        pre = false;
    }
}

}  // namespace

// Launch: grid the multiprocessors (every block resident), 512 threads,
// dynamic shared memory kFixed (24 KiB) + n·k·inter·4 bytes (kFixed for kB1GateUp); y (n, hidden), h (n·k, inter) scratch, ids and w (n, k)
// contiguous, n·k ≤ 192, bar two zeroed words (kB1Both; each launch leaves
// them for the next); tcopy: the dynamic shared memory also holds the
// expert table (3·experts·40 bytes after the first kFixed), copied before
// the PDL wait (not for kB1Down). _1 for one token, _3 for up to three.
#define FERRITE_MOE_B1(name, C, NT)                                                                            \
    extern "C" __global__ void __launch_bounds__(NT, 1)                                                        \
        name(int mode, float* y, int y_stride, float* h, const float* x, int x_stride, const int* ids,          \
             const float* w, const MatDesc* table, int experts, int n, int k, int inter, int hidden, float limit, \
             unsigned* bar, int tcopy) {                                                                       \
        moe_b1<C, NT>(mode, y, y_stride, h, x, x_stride, ids, w, table, experts, n, k, inter, hidden, limit, bar,   \
                  tcopy);                                                                                      \
    }
FERRITE_MOE_B1(ferrite_moe_b1_1, 1, 512)
FERRITE_MOE_B1(ferrite_moe_b1_3, 3, 512)
