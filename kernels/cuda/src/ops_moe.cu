// Mixture of experts on the GPU (kernels.MoEOps): the router and the routed
// experts' SwiGLU FFNs that kernels/cuda's Backend launches. It follows
// ops.cu in the one translation unit (tools/cuda/build_fatbin.sh compiles
// the sources in name order) and uses its helpers (elem, swiglu1,
// warp_max, warp_sum_f64) and gemv.cu's weight decoders.
//
// Experts has three paths. Up to 3 tokens (batch-1 decode and short
// speculative verifications; kernels/cuda's moeGTFrom) run the grouped
// GEMV ferrite_moe_few_*: one launch for gate/up with the SwiGLU fused, one
// for down with the routing weights and the sum over a token's experts
// fused, each chosen expert read once. From 4 up to 32 tokens (moeGTTokens)
// run its register-tile form ferrite_moe_gt_*: every block sorts the slots by
// expert in shared memory, a warp runs several weight rows of an expert
// against up to 4 of its slots (each weight load serving every slot, each
// activation load every row), then ferrite_moe_combine. Both sum every
// output as the one-token kernels do, so a token's bits do not depend on
// the batch (kernels.RowExact). More tokens (prefill) are sorted by expert
// on the device (ferrite_moe_sort) and run as tiled grouped GEMMs, 64
// slots by 64 weight rows a block (ferrite_moe_tile_*, or on tensor cores
// ferrite_moe_mma_*), each expert's weights read once per 64 of its slots,
// then ferrite_moe_combine adds each token's experts.
#include <stdint.h>

// route_key maps a selection value to an unsigned key in the same order
// (−0 as +0), and NaN (taken) to 0, below every number.
__device__ inline unsigned route_key(float v) {
    if (v != v) return 0u;
    const unsigned u = __float_as_uint(v == 0.f ? 0.f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Router, one warp per token: scores (softmax over the experts, or sigmoid
// plus a selection bias with grouped noaux_tc selection), the top k by
// repeated arg-max with ties to the lower expert id, and their weights,
// exactly as kernels/ref.Route, then the shared experts' ids experts + q
// with weight 1 after the k routed ones. Launch: grid n, 32 threads,
// dynamic shared memory (2·experts + 128) · 4 bytes; experts ≥ 1, k ≤ 64,
// groups ≤ 64.
extern "C" __global__ void ferrite_route(int* ids, int ids_stride, float* w, int w_stride, const float* logits,
                                         int l_stride, const float* bias, int n, int experts, int k, int sigmoid,
                                         int norm, float rscale, int groups, int keep, int shared) {
    FERRITE_PDL_WAIT();
    extern __shared__ float sm[];
    float* sc = sm;               // (experts) scores
    float* ch = sm + experts;     // (experts) selection values; NaN once taken
    float* gs = ch + experts;     // (64) group scores
    int* sel = reinterpret_cast<int*>(gs + 64);  // (64) chosen ids
    const int lane = threadIdx.x;
    const int row = blockIdx.x;
    if (row >= n) return;
    const float* lg = logits + size_t(row) * l_stride;
    if (!sigmoid) {
        float mx = -INFINITY;
        for (int j = lane; j < experts; j += 32) mx = fmaxf(mx, lg[j]);
        mx = warp_max(mx);
        double part = 0;
        for (int j = lane; j < experts; j += 32) {
            const double e = exp(double(__fsub_rn(lg[j], mx)));
            sc[j] = float(e);
            part += e;
        }
        const double inv = 1.0 / warp_sum_f64(part);
        for (int j = lane; j < experts; j += 32) {
            sc[j] = float(double(sc[j]) * inv);
            ch[j] = sc[j];
        }
    } else {
        for (int j = lane; j < experts; j += 32) {
            sc[j] = float(1.0 / (1.0 + exp(-double(lg[j]))));
            ch[j] = bias ? __fadd_rn(sc[j], bias[j]) : sc[j];
        }
    }
    __syncwarp();
    if (sigmoid && groups > 1) {
        const int per = experts / groups;
        for (int g = lane; g < groups; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int j = g * per; j < (g + 1) * per; j++) {
                const float v = ch[j];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            if (per == 1) b2 = 0.f;
            gs[g] = __fadd_rn(b1, b2);
        }
        __syncwarp();
        uint64_t kept = 0;
        if (lane == 0) {
            for (int r = 0; r < keep; r++) {
                int best = -1;
                for (int g = 0; g < groups; g++) {
                    if ((kept >> g) & 1) continue;
                    if (best < 0 || gs[g] > gs[best]) best = g;  // ties: the lower g, met first
                }
                if (best >= 0) kept |= uint64_t(1) << best;
            }
        }
        kept = __shfl_sync(0xffffffffu, kept, 0);
        for (int j = lane; j < experts; j += 32)
            if (!((kept >> (j / per)) & 1)) ch[j] = -INFINITY;
        __syncwarp();
    }
    // k rounds of arg-max over the selection values, each a warp max of
    // order-preserving keys (redux.sync) and the lowest expert id that has
    // it. Lane l owns the experts l, l + 32, …: only it reads or marks them,
    // so the rounds need no shared-memory fences. A taken or NaN value
    // keys 0, below every number (−inf included); with nothing left the
    // id is −1.
    for (int r = 0; r < k; r++) {
        unsigned bk = 0, bi = 0xffffffffu;
        for (int j = lane; j < experts; j += 32) {
            const unsigned key = route_key(ch[j]);
            if (key > bk) {
                bk = key;
                bi = j;
            }
        }
        const unsigned mk = __reduce_max_sync(0xffffffffu, bk);
        const unsigned mi = __reduce_min_sync(0xffffffffu, bk == mk ? bi : 0xffffffffu);
        const int pick = mk == 0 ? -1 : int(mi);
        if (lane == 0) sel[r] = pick;
        if (pick >= 0 && (pick & 31) == lane) ch[pick] = __int_as_float(0x7fc00000);
    }
    __syncwarp();
    if (lane == 0) {
        double sum = 0;
        for (int r = 0; r < k; r++) sum += double(sc[max(sel[r], 0)]);
        float den = float(sum);
        if (sigmoid) den = __fadd_rn(den, 1e-20f);
        for (int r = 0; r < k; r++) {
            float v = sc[max(sel[r], 0)];
            if (norm) v = __fdiv_rn(v, den);
            if (rscale != 1.0f && rscale != 0.0f) v = __fmul_rn(v, rscale);
            ids[size_t(row) * ids_stride + r] = sel[r];
            w[size_t(row) * w_stride + r] = v;
        }
    }
    for (int q = lane; q < shared; q += 32) {
        ids[size_t(row) * ids_stride + k + q] = experts + q;
        w[size_t(row) * w_stride + k + q] = 1.f;
    }
}

// Combine: y[i] = Σ_j w[i, j]·ye[i·k + j], the token's experts added in
// increasing expert id (float32 products and sums, kernels/ref.Experts).
// Launch: grid (n, parts), 256 threads, block (i, p) the columns p·256 +
// parts·256·m of token i; k ≤ 64.
extern "C" __global__ void ferrite_moe_combine(float* y, int y_stride, const float* ye, const int* ids,
                                               const float* w, int k, int hidden) {
    FERRITE_PDL_WAIT();
    __shared__ int order[64];
    const int i = blockIdx.x;
    if (threadIdx.x == 0) {
        // Insertion sort by id, stable.
        for (int j = 0; j < k; j++) {
            int t = j;
            while (t > 0 && ids[size_t(i) * k + order[t - 1]] > ids[size_t(i) * k + j]) {
                order[t] = order[t - 1];
                t--;
            }
            order[t] = j;
        }
    }
    __syncthreads();
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < hidden; d += gridDim.y * blockDim.x) {
        float acc = 0.f;
        for (int t = 0; t < k; t++) {
            const int j = order[t];
            acc = __fadd_rn(acc, __fmul_rn(w[size_t(i) * k + j], ye[(size_t(i) * k + j) * hidden + d]));
        }
        y[size_t(i) * y_stride + d] = acc;
    }
}

// ---------------------------------------------------------------------------
// Grouped experts for a few tokens (decode). Slot s = i·k + j is token i's
// j-th routed expert, ids[s]; the slots are at most kMoeMaxSlots. In both
// kernels the work for one expert covers every slot that chose it, up to NB
// slots per pass over its weight rows (so a decode step reads each chosen
// expert once), and the result does not depend on which other tokens share
// the call.

namespace {

constexpr int kMoeMaxSlots = 512;  // kernels/cuda moeFewTokens (8) · k (≤ 64)
constexpr int kMoeDownRows = 4;    // hidden rows per ferrite_moe_few_down block

// mat_row is row r of the view m and, for F8E4M3, its row of block scales.
__device__ inline const uint8_t* mat_row(const MatDesc& m, int r, const float** srow) {
    const int rr = r + m.row0;
    *srow = nullptr;
    if (m.dtype == kF8E4M3) {
        *srow = m.scale + size_t(rr / m.br) * ((m.cols + m.bc - 1) / m.bc);
        return m.data + size_t(rr) * m.cols;
    }
    return m.data + size_t(rr) * m.cols * (m.dtype == kF32 ? 4 : 2);
}

// rows_dot_vec sets oa[j] = a·xs[j] (and ob[j] = b·xs[j] when TWO) for
// j < nx: a and b weight rows of cols values of dtype W in 16-byte loads
// (rows and xs 16-byte aligned, cols·size a multiple of 16), float32 sums,
// the same in every lane. With TWO both rows' loads are in flight together;
// one vector unrolls four strides of loads, more one (the eight vectors'
// values would spill).
template <class W, int NB, bool TWO>
__device__ void rows_dot_vec(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b, int cols,
                             const float* (&xs)[NB], int nx, float (&oa)[NB], float (&ob)[NB]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NB; j++) oa[j] = ob[j] = 0.f;
    auto stride = [&](int k) {
        float wa[W::kE], wb[W::kE];
        W::vec(__ldg(reinterpret_cast<const uint4*>(a + size_t(k) * W::kSize)), wa);
        if (TWO) W::vec(__ldg(reinterpret_cast<const uint4*>(b + size_t(k) * W::kSize)), wb);
#pragma unroll
        for (int j = 0; j < NB; j++) {
            if (j < nx) {
                const float4* xp = reinterpret_cast<const float4*>(xs[j] + k);
#pragma unroll
                for (int q = 0; q < W::kE / 4; q++) {
                    const float4 xv = __ldg(xp + q);
                    oa[j] = fmaf(wa[4 * q], xv.x, oa[j]);
                    oa[j] = fmaf(wa[4 * q + 1], xv.y, oa[j]);
                    oa[j] = fmaf(wa[4 * q + 2], xv.z, oa[j]);
                    oa[j] = fmaf(wa[4 * q + 3], xv.w, oa[j]);
                    if (TWO) {
                        ob[j] = fmaf(wb[4 * q], xv.x, ob[j]);
                        ob[j] = fmaf(wb[4 * q + 1], xv.y, ob[j]);
                        ob[j] = fmaf(wb[4 * q + 2], xv.z, ob[j]);
                        ob[j] = fmaf(wb[4 * q + 3], xv.w, ob[j]);
                    }
                }
            }
        }
    };
    if constexpr (NB == 1) {
#pragma unroll 4
        for (int k = lane * W::kE; k < cols; k += 32 * W::kE) stride(k);
    } else {
#pragma unroll 1
        for (int k = lane * W::kE; k < cols; k += 32 * W::kE) stride(k);
    }
#pragma unroll
    for (int j = 0; j < NB; j++) {
        oa[j] = warp_sum(oa[j]);
        if (TWO) ob[j] = warp_sum(ob[j]);
    }
}

// row_dot_any is rows_dot_vec for one row of any dtype and alignment, one
// element a lane at a time (F8E4M3 with its block scales).
template <int NB>
__device__ void row_dot_any(const MatDesc& m, const uint8_t* row, const float* srow, const float* (&xs)[NB],
                            int nx, float (&o)[NB]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NB; j++) o[j] = 0.f;
    for (int k = lane; k < m.cols; k += 32) {
        const float wv = elem(row, k, m.dtype, srow, m.bc);
#pragma unroll
        for (int j = 0; j < NB; j++)
            if (j < nx) o[j] = fmaf(wv, xs[j][k], o[j]);
    }
#pragma unroll
    for (int j = 0; j < NB; j++) o[j] = warp_sum(o[j]);
}

// vec_ok reports whether row (of m) takes 16-byte loads; xal says the
// vectors do.
__device__ inline bool vec_ok(const MatDesc& m, const uint8_t* row, bool xal) {
    return xal && m.dtype != kF8E4M3 && (uintptr_t(row) & 15) == 0 &&
           (size_t(m.cols) * (m.dtype == kF32 ? 4 : 2)) % 16 == 0;
}

template <int NB>
__device__ void row_dot(const MatDesc& m, const uint8_t* row, const float* srow, bool vec,
                        const float* (&xs)[NB], int nx, float (&o)[NB]) {
    float unused[NB];
    if (!vec) row_dot_any<NB>(m, row, srow, xs, nx, o);
    else if (m.dtype == kBF16) rows_dot_vec<BF16W, NB, false>(row, row, m.cols, xs, nx, o, unused);
    else if (m.dtype == kF16) rows_dot_vec<F16W, NB, false>(row, row, m.cols, xs, nx, o, unused);
    else rows_dot_vec<F32W, NB, false>(row, row, m.cols, xs, nx, o, unused);
}

// desc_dot sets oa[j] = a_r·xs[j] and, when b is set, ob[j] = b_r·xs[j],
// for row r of the views a and b (one pass over both when they share a
// dtype and width; a block-quantized one is read in its blocks,
// ops_common_quant.cu, only where Q: the _q kernels, which keep the
// others' registers off the bf16 ones); xal says every xs[j] is 16-byte
// aligned.
template <int NB, bool Q = false>
__device__ void desc_dot(const MatDesc& a, const MatDesc* b, int r, const float* (&xs)[NB], int nx, bool xal,
                         float (&oa)[NB], float (&ob)[NB]) {
    if (Q) {
        // A pass over a block-quantized row (and b's, of a's dtype and
        // width); anything else through the plain form into arrays of its
        // own, so that a call there does not move oa and ob to local memory.
        if (is_quant(a.dtype) && (!b || (b->dtype == a.dtype && b->cols == a.cols))) {
            quant_desc_dot<NB>(a, r, b, r, xs, nx, xal, oa, ob);
            return;
        }
        float ta[NB], tb[NB], unused[NB];
        if (is_quant(a.dtype)) quant_desc_dot<NB>(a, r, nullptr, 0, xs, nx, xal, ta, unused);
        else desc_dot<NB, false>(a, b && !is_quant(b->dtype) ? b : nullptr, r, xs, nx, xal, ta, tb);
        if (b && is_quant(b->dtype)) quant_desc_dot<NB>(*b, r, nullptr, 0, xs, nx, xal, tb, unused);
        else if (b && is_quant(a.dtype)) desc_dot<NB, false>(*b, nullptr, r, xs, nx, xal, tb, unused);
#pragma unroll
        for (int j = 0; j < NB; j++) oa[j] = ta[j], ob[j] = b ? tb[j] : 0.f;
        return;
    }
    const float *sa, *sb = nullptr;
    const uint8_t* ra = mat_row(a, r, &sa);
    const bool va = vec_ok(a, ra, xal);
    if (!b) {
        row_dot<NB>(a, ra, sa, va, xs, nx, oa);
        return;
    }
    const uint8_t* rb = mat_row(*b, r, &sb);
    const bool vb = vec_ok(*b, rb, xal);
    if (va && vb && a.dtype == b->dtype && a.cols == b->cols) {
        if (a.dtype == kBF16) rows_dot_vec<BF16W, NB, true>(ra, rb, a.cols, xs, nx, oa, ob);
        else if (a.dtype == kF16) rows_dot_vec<F16W, NB, true>(ra, rb, a.cols, xs, nx, oa, ob);
        else rows_dot_vec<F32W, NB, true>(ra, rb, a.cols, xs, nx, oa, ob);
        return;
    }
    row_dot<NB>(a, ra, sa, va, xs, nx, oa);
    row_dot<NB>(*b, rb, sb, vb, xs, nx, ob);
}

// moe_few_first is the slot-a-pass gate/up kernels' start for block
// (x, s)'s warp at row r: it sets e = ids[s] and reports whether s is that
// expert's first slot (the block that computes its rows for every slot;
// the other blocks of the expert return at once). An id outside [0,
// experts) writes NaN into its own slot's row r and reports false.
__device__ __forceinline__ bool moe_few_first(float* h, const int* ids, int s, int r, int inter, int experts, int& e) {
    const int lane = threadIdx.x & 31;
    e = ids[s];
    if (e < 0 || e >= experts) {
        if (lane == 0) h[size_t(s) * inter + r] = __int_as_float(0x7fc00000);
        return false;
    }
    for (int t0 = 0; t0 < s; t0 += 32)
        if (__any_sync(0xffffffffu, t0 + lane < s && ids[t0 + lane] == e)) return false;
    return true;
}

// moe_few_gate_up: block (x, s) computes rows [8x, 8x + 8) of
// h[t] (inter) = silu(gate_e·x[t / k])·(up_e·x[t / k]) for every slot t
// with ids[t] = e = ids[s], when s is the first such slot (the other
// blocks of that expert return at once). An id outside [0, experts)
// writes NaN into its own slot's row.
template <int NB, bool Q>
__device__ void moe_few_gate_up(float* h, const float* x, int x_stride, const int* ids, const MatDesc* table,
                                int experts, int k, int slots, int inter, float limit) {
    const int s = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    int e;
    if (r >= inter || !moe_few_first(h, ids, s, r, inter, experts, e)) return;
    const MatDesc g = table[3 * e], u = table[3 * e + 1];
    const bool xal = (uintptr_t(x) & 15) == 0 && (x_stride & 3) == 0;
    int sl[NB];
    const float* xs[NB];
    int nx = 0;
    auto flush = [&]() {
        float gv[NB], uv[NB];
        desc_dot<NB, Q>(g, &u, r, xs, nx, xal, gv, uv);
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < NB; q++)
                if (q < nx) h[size_t(sl[q]) * inter + r] = swiglu_clamp1(gv[q], uv[q], limit);
        }
        nx = 0;
    };
    for (int t0 = s; t0 < slots; t0 += 32) {
        unsigned m = __ballot_sync(0xffffffffu, t0 + lane < slots && ids[t0 + lane] == e);
        while (m) {
            const int t = t0 + __ffs(int(m)) - 1;
            m &= m - 1;
#pragma unroll
            for (int q = 0; q < NB; q++) {
                if (q == nx) {
                    sl[q] = t;
                    xs[q] = x + size_t(t / k) * x_stride;
                }
            }
            if (++nx == NB) flush();
        }
    }
    if (nx > 0) flush();
}

// moe_few_gate_up8 is moe_few_gate_up<1, true> on x quantized to int8
// (xq, xe: quant_x8_rows' rows, one a token, hidden columns) for experts
// whose gates and ups are all block-quantized with one scale group
// (kernels/cuda expertKinds.x8): a warp's gate and up rows in one pass when
// they share a dtype.
__device__ void moe_few_gate_up8(float* h, const int8_t* xq, const uint2* xe, int hidden, const int* ids, const MatDesc* table,
                                 int experts, int k, int slots, int inter, float limit) {
    const int s = blockIdx.y, lane = threadIdx.x & 31;
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    int e;
    if (r >= inter || !moe_few_first(h, ids, s, r, inter, experts, e)) return;
    const MatDesc g = table[3 * e], u = table[3 * e + 1];
    const bool joint = g.dtype == u.dtype;
    for (int t0 = s; t0 < slots; t0 += 32) {
        unsigned m = __ballot_sync(0xffffffffu, t0 + lane < slots && ids[t0 + lane] == e);
        while (m) {
            const int t = t0 + __ffs(int(m)) - 1;
            m &= m - 1;
            const int8_t* xr = xq + size_t(t / k) * hidden;
            const uint2* er = xe + size_t(t / k) * (hidden / 16);
            float gv, uv, unused;
            if (joint) {
                quant_rows_dot8(g, r, &u, r, xr, er, gv, uv);
            } else {
                quant_rows_dot8(g, r, nullptr, 0, xr, er, gv, unused);
                quant_rows_dot8(u, r, nullptr, 0, xr, er, uv, unused);
            }
            if (lane == 0) h[size_t(t) * inter + r] = swiglu_clamp1(gv, uv, limit);
        }
    }
}

// moe_few_down: block x computes rows [x·DR, x·DR + DR) (kMoeDownRows, or
// 1 in the _q1 form: a warp takes one task rather than four) of
// y[i] (hidden) = Σ_j w[i, j]·down_{ids[i, j]}·h[i·k + j] for the n
// tokens: each warp takes (row, expert) tasks, the products of one expert's
// row with the h of every slot that chose it land in shared memory, then
// each (row, token) adds its k products in increasing expert id (float32
// products and sums, kernels/ref.Experts). An id outside [0, experts)
// makes its token's row NaN.
// X8: h quantized to int8 (hq, he: quant_x8_rows' rows, one a slot), every
// down block-quantized (NB 1).
template <int NB, bool Q, int DR, bool X8 = false>
__device__ void moe_few_down(float* y, int y_stride, const float* h, const int* ids, const float* w,
                             const MatDesc* table, int experts, int n, int k, int inter, int hidden,
                             const int8_t* hq = nullptr, const uint2* he = nullptr) {
    __shared__ float part[DR][kMoeMaxSlots];            // (row, slot) expert products
    __shared__ int next[kMoeMaxSlots];                  // the next slot of the same expert, or −1
    __shared__ int first[kMoeMaxSlots];                 // the first slot of each expert (and each bad id)
    __shared__ int order[kMoeMaxSlots];                 // (token, k) its slots' j by expert id, stable
    __shared__ int nfirst;
    const int slots = n * k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * DR;
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const int e = ids[s];
        int nx = -1;
        if (e >= 0 && e < experts) {
            for (int t = s + 1; t < slots; t++) {
                if (ids[t] == e) {
                    nx = t;
                    break;
                }
            }
        }
        next[s] = nx;
        const int i = s / k, j = s % k;
        int rank = 0;
        for (int q = 0; q < k; q++) {
            const int eq = ids[i * k + q];
            rank += eq < e || (eq == e && q < j);
        }
        order[i * k + rank] = j;
    }
    if (warp == 0) {
        int cnt = 0;
        for (int t0 = 0; t0 < slots; t0 += 32) {
            const int s = t0 + lane;
            bool f = s < slots;
            if (f) {
                const int e = ids[s];
                if (e >= 0 && e < experts) {
                    for (int t = 0; t < s && f; t++) f = ids[t] != e;
                }
            }
            const unsigned m = __ballot_sync(0xffffffffu, f);
            if (f) first[cnt + __popc(m & ((1u << lane) - 1))] = s;
            cnt += __popc(m);
        }
        if (lane == 0) nfirst = cnt;
    }
    __syncthreads();
    const bool xal = (uintptr_t(h) & 15) == 0 && (inter & 3) == 0;
    for (int task = warp; task < DR * nfirst; task += blockDim.x >> 5) {
        const int rr = task % DR, r = r0 + rr;
        const int s0 = first[task / DR];
        if (r >= hidden) continue;
        const int e = ids[s0];
        if (e < 0 || e >= experts) {
            if (lane == 0) part[rr][s0] = __int_as_float(0x7fc00000);
            continue;
        }
        const MatDesc d = table[3 * e + 2];
        if constexpr (X8) {
            for (int s = s0; s >= 0; s = next[s]) {
                float o, unused;
                quant_rows_dot8(d, r, nullptr, 0, hq + size_t(s) * inter, he + size_t(s) * (inter / 16), o, unused);
                if (lane == 0) part[rr][s] = o;
            }
            continue;
        }
        for (int s = s0; s >= 0;) {
            int sl[NB];
            const float* xs[NB];
            int nx = 0;
#pragma unroll
            for (int q = 0; q < NB; q++) {
                if (s >= 0) {
                    sl[q] = s;
                    xs[q] = h + size_t(s) * inter;
                    nx++;
                    s = next[s];
                }
            }
            float o[NB], unused[NB];
            desc_dot<NB, Q>(d, nullptr, r, xs, nx, xal, o, unused);
            if (lane == 0) {
#pragma unroll
                for (int q = 0; q < NB; q++)
                    if (q < nx) part[rr][sl[q]] = o[q];
            }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < DR * n; t += blockDim.x) {
        const int rr = t % DR, i = t / DR, r = r0 + rr;
        if (r >= hidden) continue;
        float acc = 0.f;
        for (int q = 0; q < k; q++) {
            const int j = order[i * k + q];
            acc = __fadd_rn(acc, __fmul_rn(w[size_t(i) * k + j], part[rr][i * k + j]));
        }
        y[size_t(i) * y_stride + r] = acc;
    }
}

}  // namespace

// Launch: grid (ceil(inter / 8), n·k), 256 threads; h (n·k, inter); n·k ≤
// 512. The _1 kernel is for one token, _8 for up to 8 tokens an expert;
// the _q kernels (every kernel of this file so named; _1 only here) also
// read experts kept in GGML blocks.
#define FERRITE_MOE_FEW_GATE_UP(name, NB, Q)                                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
        name(float* h, const float* x, int x_stride, const int* ids, const MatDesc* table, int experts, int k, \
             int slots, int inter, float limit) {                                                           \
        FERRITE_PDL_WAIT();                                                                                 \
        moe_few_gate_up<NB, Q>(h, x, x_stride, ids, table, experts, k, slots, inter, limit);                 \
    }
FERRITE_MOE_FEW_GATE_UP(ferrite_moe_few_gate_up_1, 1, false)
FERRITE_MOE_FEW_GATE_UP(ferrite_moe_few_gate_up_8, 8, false)
FERRITE_MOE_FEW_GATE_UP(ferrite_moe_few_gate_up_1_q, 1, true)

// Launch: grid ceil(hidden / DR), 256 threads; y (n, hidden), w (n, k)
// contiguous; n·k ≤ 512. DR (moe_few_down's rows a block) is 4 but in
// the _q1 form, 1.
#define FERRITE_MOE_FEW_DOWN(name, NB, Q, DR)                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                       \
        name(float* y, int y_stride, const float* h, const int* ids, const float* w, const MatDesc* table,    \
             int experts, int n, int k, int inter, int hidden) {                                            \
        FERRITE_PDL_WAIT();                                                                                 \
        moe_few_down<NB, Q, DR>(y, y_stride, h, ids, w, table, experts, n, k, inter, hidden);                \
    }
FERRITE_MOE_FEW_DOWN(ferrite_moe_few_down_1, 1, false, kMoeDownRows)
FERRITE_MOE_FEW_DOWN(ferrite_moe_few_down_8, 8, false, kMoeDownRows)
FERRITE_MOE_FEW_DOWN(ferrite_moe_few_down_1_q, 1, true, kMoeDownRows)
FERRITE_MOE_FEW_DOWN(ferrite_moe_few_down_1_q1, 1, true, 1)

// The _q8 forms: x (gate/up) and h (down) quantized to int8 by ferrite_qx8
// first (kernels/cuda expertKinds.x8). Launch as the _q kernels, with xq
// and xe in place of x and x_stride (gate/up: hidden columns a row) and
// hq, he after the down kernel's arguments.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_moe_few_gate_up_1_q8(float* h, const int8_t* xq, const uint2* xe, int hidden, const int* ids, const MatDesc* table,
                                 int experts, int k, int slots, int inter, float limit) {
    FERRITE_PDL_WAIT();
    moe_few_gate_up8(h, xq, xe, hidden, ids, table, experts, k, slots, inter, limit);
}
extern "C" __global__ void __launch_bounds__(256)
    ferrite_moe_few_down_1_q8(float* y, int y_stride, const int8_t* hq, const uint2* he, const int* ids, const float* w,
                              const MatDesc* table, int experts, int n, int k, int inter, int hidden) {
    FERRITE_PDL_WAIT();
    moe_few_down<1, true, kMoeDownRows, true>(y, y_stride, nullptr, ids, w, table, experts, n, k, inter, hidden, hq, he);
}

// ---------------------------------------------------------------------------
// Grouped experts as register tiles (4 to 32 tokens). Every block sorts
// the call's slots by (expert, slot) in shared memory, so the slots of one
// expert are neighbours. Each output keeps its own float32 sum in the
// order rows_dot_vec<W, 1> adds it (lane L: elements E·L + 32·E·m, m = 0,
// 1, …, then warp_sum), so a token's result has the same bits whatever the
// other tokens of the call (kernels.RowExact), and the same as the
// one-token kernels above.

namespace {

constexpr int kMoeGtSlots = 256;  // the most slots a call (kernels/cuda moeGEMVSlots); = block size
constexpr int kMoeGtWarps = 8;    // warps a block

// gt_sort is every block's prologue: sid[s] = ids[s] and srt the slots
// sorted by (expert id, slot) for the slots (≤ blockDim.x = kMoeGtSlots);
// an id below 0 sorts first and one at or past experts last, so the valid
// slots are srt[*v0, *v0 + *nv).
__device__ inline void gt_sort(int* sid, int* srt, const int* ids, int slots, int experts, int* v0, int* nv) {
    const int s = threadIdx.x;
    const int e = s < slots ? ids[s] : 0;
    if (s < slots) sid[s] = e;
    *v0 = __syncthreads_count(s < slots && e < 0);
    *nv = __syncthreads_count(s < slots && e >= 0 && e < experts);
    if (s < slots) {
        int rank = 0;
        for (int t = 0; t < slots; t++) {
            const int et = sid[t];
            rank += et < e || (et == e && t < s);
        }
        srt[rank] = s;
    }
    __syncthreads();
}

// tile_x loads a lane's W::kE input values at x (16-byte aligned).
template <class W>
__device__ __forceinline__ void tile_x(const float* x, float (&xv)[W::kE]) {
    const float4* xp = reinterpret_cast<const float4*>(x);
#pragma unroll
    for (int f = 0; f < W::kE / 4; f++) {
        const float4 t = __ldg(xp + f);
        xv[4 * f] = t.x;
        xv[4 * f + 1] = t.y;
        xv[4 * f + 2] = t.z;
        xv[4 * f + 3] = t.w;
    }
}

// tile_dot sets oa[r][q] = row_r·xs[q] (and ob[r][q] = brow_r·xs[q] when
// TWO) for r < nr rows a + r·pitch (b + r·pitch) and q < nc vectors: rows
// of cols values of dtype W in 16-byte loads (rows and xs 16-byte
// aligned, cols·size a multiple of 16), the same in every lane. Each
// weight load serves nc vectors and each vector load nr rows (a register
// tile), every output summed in rows_dot_vec<W, 1>'s order. The weights
// stay packed in registers and are widened where they are used (GPU run
// 2: widening the tile up front took 230 registers a thread), once a
// vector.
template <class W, int R, int C, bool TWO>
__device__ __forceinline__ void tile_dot(const uint8_t* a, const uint8_t* b, size_t pitch, int nr,
                                         const float* const (&xs)[C], int nc, int cols, float (&oa)[R][C],
                                         float (&ob)[R][C]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int q = 0; q < C; q++) oa[r][q] = ob[r][q] = 0.f;
#pragma unroll 1
    for (int k = lane * W::kE; k < cols; k += 32 * W::kE) {
        uint4 va[R], vb[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                va[r] = __ldg(reinterpret_cast<const uint4*>(a + r * pitch + size_t(k) * W::kSize));
                if (TWO) vb[r] = __ldg(reinterpret_cast<const uint4*>(b + r * pitch + size_t(k) * W::kSize));
            }
        }
#pragma unroll
        for (int q = 0; q < C; q++) {
            if (q < nc) {
                float xv[W::kE];
                tile_x<W>(xs[q] + k, xv);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < nr) {
                        float wv[W::kE];
                        W::vec(va[r], wv);
#pragma unroll
                        for (int c = 0; c < W::kE; c++) oa[r][q] = fmaf(wv[c], xv[c], oa[r][q]);
                        if (TWO) {
                            W::vec(vb[r], wv);
#pragma unroll
                            for (int c = 0; c < W::kE; c++) ob[r][q] = fmaf(wv[c], xv[c], ob[r][q]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int q = 0; q < C; q++) {
            oa[r][q] = warp_sum(oa[r][q]);
            if (TWO) ob[r][q] = warp_sum(ob[r][q]);
        }
    }
}

// moe_gt: the grouped GEMV as register tiles, for many slots. Block
// (x, y) takes weight rows [x·8R, x·8R + 8R), R a warp, and the slots at
// sorted places [y·sb, y·sb + sb); a warp runs its rows of an expert
// against up to C of that expert's slots at once. GU: the gate and up rows
// (weights 3e, 3e + 1) against x[t / k], out = h (slots, nrows = inter)
// the SwiGLU; else the down rows (3e + 2) against in[t], out = ye (slots,
// nrows = hidden) each slot's expert output, which ferrite_moe_combine
// adds up. An id outside [0, experts) writes NaN into its slot's row.
template <int R, int C, bool GU, bool Q>
__device__ void moe_gt(float* out, int nrows, const float* in, int in_stride, const int* ids, const MatDesc* table,
                       int experts, int k, int slots, int sb, float limit) {
    __shared__ int sid[kMoeGtSlots], srt[kMoeGtSlots];
    int v0, nv;
    gt_sort(sid, srt, ids, slots, experts, &v0, &nv);
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * (kMoeGtWarps * R) + (threadIdx.x >> 5) * R;
    if (r0 >= nrows) return;
    const int nr = min(R, nrows - r0);
    const int s0 = blockIdx.y * sb, s1 = min(s0 + sb, slots);
    for (int p = s0 + lane; p < s1; p += 32) {
        if (p < v0 || p >= v0 + nv) {
            for (int r = 0; r < nr; r++) out[size_t(srt[p]) * nrows + r0 + r] = __int_as_float(0x7fc00000);
        }
    }
    const bool xal = (uintptr_t(in) & 15) == 0 && (in_stride & 3) == 0;
    const int p1 = min(s1, v0 + nv);
    for (int p = max(s0, v0); p < p1;) {
        const int e = sid[srt[p]];
        int nc = 1;
        while (nc < C && p + nc < p1 && sid[srt[p + nc]] == e) nc++;
        int sl[C];
        const float* xs[C];
#pragma unroll
        for (int q = 0; q < C; q++) {
            sl[q] = srt[p + min(q, nc - 1)];
            xs[q] = in + size_t(GU ? sl[q] / k : sl[q]) * in_stride;
        }
        const MatDesc ma = table[3 * e + (GU ? 0 : 2)];
        const MatDesc mb = table[3 * e + 1];
        if (Q && (is_quant(ma.dtype) || (GU && is_quant(mb.dtype)))) {
            // Block-quantized: each row's blocks decoded once for the nc
            // slots (ops_common_quant.cu), the bits of the slot-a-pass
            // kernels.
            // Gate and up a row in one pass.
#pragma unroll 1
            for (int r = 0; r < nr; r++) {
                float a[C], b[C];
                desc_dot<C, true>(ma, GU ? &mb : nullptr, r0 + r, xs, nc, xal, a, b);
                if (lane == 0) {
#pragma unroll
                    for (int q = 0; q < C; q++)
                        if (q < nc) out[size_t(sl[q]) * nrows + r0 + r] = GU ? swiglu_clamp1(a[q], b[q], limit) : a[q];
                }
            }
            p += nc;
            continue;
        }
        const float* unused;
        const uint8_t* ra = mat_row(ma, r0, &unused);
        const uint8_t* rb = GU ? mat_row(mb, r0, &unused) : ra;
        const size_t pitch = size_t(ma.cols) * (ma.dtype == kF32 ? 4 : 2);
        // The rows of a view are pitch apart unless the weight is F8E4M3
        // (never vec_ok); the last row is checked for alignment as the first.
        bool fast = vec_ok(ma, ra, xal) && (!GU || (vec_ok(mb, rb, xal) && mb.dtype == ma.dtype && mb.cols == ma.cols));
        if (!fast || (ma.dtype != kBF16 && ma.dtype != kF16 && ma.dtype != kF32)) {
            // One output at a time, written at once (no register tile).
#pragma unroll 1
            for (int t = 0; t < nr * nc; t++) {
                const int r = t / nc, sq = srt[p + t % nc];
                const float* x1[1] = {in + size_t(GU ? sq / k : sq) * in_stride};
                float a1[1], b1[1];
                desc_dot<1>(ma, GU ? &mb : nullptr, r0 + r, x1, 1, xal, a1, b1);
                if (lane == 0) out[size_t(sq) * nrows + r0 + r] = GU ? swiglu_clamp1(a1[0], b1[0], limit) : a1[0];
            }
            p += nc;
            continue;
        }
        float oa[R][C], ob[R][C];
        if (ma.dtype == kBF16) tile_dot<BF16W, R, C, GU>(ra, rb, pitch, nr, xs, nc, ma.cols, oa, ob);
        else if (ma.dtype == kF16) tile_dot<F16W, R, C, GU>(ra, rb, pitch, nr, xs, nc, ma.cols, oa, ob);
        else tile_dot<F32W, R, C, GU>(ra, rb, pitch, nr, xs, nc, ma.cols, oa, ob);
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < C; q++) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (q < nc && r < nr)
                        out[size_t(sl[q]) * nrows + r0 + r] = GU ? swiglu_clamp1(oa[r][q], ob[r][q], limit) : oa[r][q];
                }
            }
        }
        p += nc;
    }
}

}  // namespace

// The register-tile form (moe_gt) for many slots, R weight rows a warp
// against up to 4 slots of an expert: gate/up into h (n·k, inter) from x
// (n, hidden); down into ye (n·k, hidden) from h, then
// ferrite_moe_combine. Launch: grid (ceil(rows / (8·R)), ceil(n·k / sb)),
// 256 threads; n·k ≤ 256. kernels/cuda runs gate/up with R = 4 and down
// with R = 8 unless FERRITE_MOE_GT picks others.
#define FERRITE_MOE_GT_GATE_UP(name, R, Q)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                                  \
        name(float* h, int inter, const float* x, int x_stride, const int* ids, const MatDesc* table,    \
             int experts, int k, int slots, int sb, float limit) {                                       \
        FERRITE_PDL_WAIT();                                                                              \
        moe_gt<R, 4, true, Q>(h, inter, x, x_stride, ids, table, experts, k, slots, sb, limit);          \
    }
FERRITE_MOE_GT_GATE_UP(ferrite_moe_gt_gate_up_r1, 1, false)
FERRITE_MOE_GT_GATE_UP(ferrite_moe_gt_gate_up_r2, 2, false)
FERRITE_MOE_GT_GATE_UP(ferrite_moe_gt_gate_up_r4, 4, false)
FERRITE_MOE_GT_GATE_UP(ferrite_moe_gt_gate_up_r4_q, 4, true)

#define FERRITE_MOE_GT_DOWN(name, R, Q)                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                                  \
        name(float* ye, int hidden, const float* h, int inter, const int* ids, const MatDesc* table,     \
             int experts, int k, int slots, int sb) {                                                    \
        FERRITE_PDL_WAIT();                                                                              \
        moe_gt<R, 4, false, Q>(ye, hidden, h, inter, ids, table, experts, k, slots, sb, 0.f);            \
    }
FERRITE_MOE_GT_DOWN(ferrite_moe_gt_down_r2, 2, false)
FERRITE_MOE_GT_DOWN(ferrite_moe_gt_down_r4, 4, false)
FERRITE_MOE_GT_DOWN(ferrite_moe_gt_down_r8, 8, false)
FERRITE_MOE_GT_DOWN(ferrite_moe_gt_down_r8_q, 8, true)

// ---------------------------------------------------------------------------
// Grouped experts for many tokens (prefill): the slots sorted by expert,
// then tiled GEMMs over each expert's slots. Every output element is one
// float32 sum over k in increasing order, whatever tile its slot lands in,
// so the result is deterministic although the order of an expert's slots
// (atomics) is not.

namespace {

constexpr int kTileM = 64;  // slots a block (kernels/cuda moeTileM)
constexpr int kTileN = 64;  // weight rows a block
constexpr int kTileK = 32;  // k per shared-memory stage

// desc_elem is element (r, c) of the view m (not block-quantized:
// moe_tile decodes those a run at a time).
__device__ inline float desc_elem(const MatDesc& m, int r, int c) {
    const float* srow;
    const uint8_t* row = mat_row(m, r, &srow);
    return elem(row, c, m.dtype, srow, m.bc);
}

// tile_slots returns the expert of tile g (< tiles[experts]), the e with
// tiles[e] ≤ g < tiles[e + 1], and threads [0, kTileM) set slot[m] to the
// tile's m-th slot, perm[off[e] + kTileM·(g − tiles[e]) + m], or −1 past
// the expert's last, and row_in[m] to the row of the input it reads: the
// token (GU) or the slot. The caller synchronises before using them.
template <bool GU>
__device__ int tile_slots(int* slot, int* row_in, int g, const int* off, const int* tiles, const int* perm,
                          int experts, int k) {
    int lo = 0, hi = experts;  // tiles[lo] ≤ g < tiles[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tiles[mid] <= g) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int m0 = (g - tiles[e]) * kTileM, cnt = off[e + 1] - off[e] - m0;
    if (threadIdx.x < kTileM) {
        const int m = threadIdx.x;
        const int s = m < cnt ? perm[off[e] + m0 + m] : -1;
        slot[m] = s;
        row_in[m] = s < 0 ? -1 : GU ? s / k : s;
    }
    return e;
}

// moe_tile: block (x, g) takes tile g of the sorted slots — expert e with
// tiles[e] ≤ g < tiles[e + 1], its slots perm[off[e] + 64·(g − tiles[e]) …]
// — and weight rows [64x, 64x + 64) of its gate and up (GU: h[s] =
// silu(gate·x[s / k])·(up·x[s / k]), inter = ncols) or down (ye[s] =
// down·h[s], hidden = ncols), kdim the inner width. 256 threads, each 4
// slots × 4 rows.
template <bool GU, bool Q>
__device__ void moe_tile(float* out, int ncols, const float* in, int in_stride, const int* off, const int* tiles,
                         const int* perm, const MatDesc* table, int experts, int k, int kdim, float limit) {
    __shared__ __align__(16) float xs[kTileK][kTileM + 4];
    __shared__ __align__(16) float ws[GU ? 2 : 1][kTileK][kTileN + 4];
    __shared__ int row_in[kTileM], slot[kTileM];
    const int g = blockIdx.y;
    if (g >= tiles[experts]) return;
    const int e = tile_slots<GU>(slot, row_in, g, off, tiles, perm, experts, k);
    const int n0 = blockIdx.x * kTileN;
    const MatDesc wa = table[3 * e + (GU ? 0 : 2)];
    const MatDesc wb = table[3 * e + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[GU ? 2 : 1][4][4];
#pragma unroll
    for (int q = 0; q < (GU ? 2 : 1); q++)
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[q][i][j] = 0.f;
    __syncthreads();
    for (int k0 = 0; k0 < kdim; k0 += kTileK) {
        for (int t = threadIdx.x; t < kTileM * kTileK; t += blockDim.x) {
            const int kk = t % kTileK, m = t / kTileK, c = k0 + kk, r = row_in[m];
            xs[kk][m] = (r >= 0 && c < kdim) ? in[size_t(r) * in_stride + c] : 0.f;
        }
#pragma unroll
        for (int q = 0; q < (GU ? 2 : 1); q++) {
            const MatDesc& wq = q == 0 ? wa : wb;
            if (Q && is_quant(wq.dtype)) {
                // A thread a run of 16 columns (kdim is a multiple of 32).
                for (int t = threadIdx.x; t < 2 * kTileN; t += blockDim.x) {
                    const int nn = t >> 1, c0 = 16 * (t & 1), r = n0 + nn;
                    float v[16];
                    if (r < ncols && k0 + c0 < kdim) quant_run16(wq, r, k0 + c0, v);
                    else {
#pragma unroll
                        for (int i = 0; i < 16; i++) v[i] = 0.f;
                    }
#pragma unroll
                    for (int i = 0; i < 16; i++) ws[q][c0 + i][nn] = v[i];
                }
                continue;
            }
            for (int t = threadIdx.x; t < kTileN * kTileK; t += blockDim.x) {
                const int kk = t % kTileK, nn = t / kTileK, c = k0 + kk, r = n0 + nn;
                ws[q][kk][nn] = r < ncols && c < kdim ? desc_elem(wq, r, c) : 0.f;
            }
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < kTileK; kk++) {
            const float4 a4 = *reinterpret_cast<const float4*>(&xs[kk][ty * 4]);
            const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
            for (int q = 0; q < (GU ? 2 : 1); q++) {
                const float4 b4 = *reinterpret_cast<const float4*>(&ws[q][kk][tx * 4]);
                const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[q][i][j] = fmaf(a[i], b[j], acc[q][i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int s = slot[ty * 4 + i];
        if (s < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = n0 + tx * 4 + j;
            if (r < ncols) out[size_t(s) * ncols + r] = GU ? swiglu_clamp1(acc[0][i][j], acc[GU ? 1 : 0][i][j], limit) : acc[0][i][j];
        }
    }
}

constexpr int kMmaPad = 40;   // bf16 per shared row of 32: 80 bytes, conflict-free fragment loads
constexpr int kMmaTerms = 3;  // bf16 terms of x

// moe_mma is moe_tile on tensor cores for bf16 weights, kdim a multiple
// of 32 and in 16-byte aligned rows: x is split into kMmaTerms bf16 terms,
// hi = bf16(x), mid = bf16(x − hi), lo = bf16(x − hi − mid) (each
// difference exact in float32; together they hold x's 24-bit mantissa, so
// every product is exact as on the CUDA cores), each multiplied by the
// weights with float32 accumulation (mma.sync m16n8k16). Two terms (2⁻¹⁸|x|
// per element) measured 4e-6 of max |y| on random experts, and a clamped
// SwiGLU, whose output is small next to its inputs, went past
// kerneltest.ExpertsTol. 128 threads: warp w computes slots [32·(w/2), +32) by rows
// [32·(w%2), +32) of the block's 64 × 64.
template <bool GU>
__device__ void moe_mma(float* out, int ncols, const float* in, int in_stride, const int* off, const int* tiles,
                        const int* perm, const MatDesc* table, int experts, int k, int kdim, float limit) {
    constexpr int NW = GU ? 2 : 1;
    __shared__ __align__(16) uint16_t xt[kMmaTerms][kTileM][kMmaPad];  // x's bf16 terms
    __shared__ __align__(16) uint16_t ws[NW][kTileN][kMmaPad];
    __shared__ int row_in[kTileM], slot[kTileM];
    const int g = blockIdx.y;
    if (g >= tiles[experts]) return;
    const int e = tile_slots<GU>(slot, row_in, g, off, tiles, perm, experts, k);
    const int n0 = blockIdx.x * kTileN;
    const uint8_t* wrow[NW];  // the weights' rows of 32 bf16 this thread stages
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    float acc[NW][2][4][4];
#pragma unroll
    for (int q = 0; q < NW; q++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[q][i][j][c] = 0.f;
    // Staging: thread t copies weight row t/2's 16 bf16 at (t%2)·16 of
    // each 32, and x row t/2's 16 values at (t%2)·16.
    const int sr = threadIdx.x >> 1, sc = (threadIdx.x & 1) * 16;
#pragma unroll
    for (int q = 0; q < NW; q++) {
        const MatDesc w = table[3 * e + (GU ? q : 2)];
        const float* unused;
        wrow[q] = n0 + sr < ncols ? mat_row(w, n0 + sr, &unused) : nullptr;
    }
    __syncthreads();
    const int xr = row_in[sr];
    for (int k0 = 0; k0 < kdim; k0 += 32) {
#pragma unroll
        for (int q = 0; q < NW; q++) {
            uint4 a = make_uint4(0, 0, 0, 0), b = a;
            if (wrow[q]) {
                const uint4* p = reinterpret_cast<const uint4*>(wrow[q] + size_t(k0 + sc) * 2);
                a = __ldg(p);
                b = __ldg(p + 1);
            }
            *reinterpret_cast<uint4*>(&ws[q][sr][sc]) = a;
            *reinterpret_cast<uint4*>(&ws[q][sr][sc + 8]) = b;
        }
#pragma unroll
        for (int v = 0; v < 4; v++) {
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (xr >= 0) f = __ldg(reinterpret_cast<const float4*>(in + size_t(xr) * in_stride + k0 + sc) + v);
            float fv[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int term = 0; term < kMmaTerms; term++) {
                uint32_t t[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    t[u] = f32_to_bf16(fv[u]);
                    fv[u] = __fsub_rn(fv[u], __uint_as_float(t[u] << 16));  // the rest, exact
                }
                *reinterpret_cast<uint2*>(&xt[term][sr][sc + 4 * v]) = make_uint2(t[0] | t[1] << 16, t[2] | t[3] << 16);
            }
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < 32; ks += 16) {
            uint32_t a[kMmaTerms][2][4];
#pragma unroll
            for (int term = 0; term < kMmaTerms; term++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = wm + 16 * i + gid, c = ks + 2 * tig;
                    a[term][i][0] = *reinterpret_cast<const uint32_t*>(&xt[term][r][c]);
                    a[term][i][1] = *reinterpret_cast<const uint32_t*>(&xt[term][r + 8][c]);
                    a[term][i][2] = *reinterpret_cast<const uint32_t*>(&xt[term][r][c + 8]);
                    a[term][i][3] = *reinterpret_cast<const uint32_t*>(&xt[term][r + 8][c + 8]);
                }
            }
#pragma unroll
            for (int q = 0; q < NW; q++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = wn + 8 * j + gid, c = ks + 2 * tig;
                    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ws[q][n][c]);
                    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ws[q][n][c + 8]);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
#pragma unroll
                        for (int term = 0; term < kMmaTerms; term++) mma_bf16(acc[q][i][j], a[term][i], b0, b1);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int s = slot[wm + 16 * i + gid + 8 * half];
            if (s < 0) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int n = n0 + wn + 8 * j + 2 * tig + c;
                    if (n >= ncols) continue;
                    const float v = acc[0][i][j][2 * half + c];
                    out[size_t(s) * ncols + n] = GU ? swiglu_clamp1(v, acc[NW - 1][i][j][2 * half + c], limit) : v;
                }
            }
        }
    }
}

}  // namespace

// Sorts the slots by expert: off[e] (experts + 1) is where expert e's
// slots start in perm (slots), tiles[e] (experts + 1) how many 64-slot
// tiles the experts before e take. A slot with an id outside [0, experts)
// is left out and its row of ye (slots, hidden) set to NaN. Launch: one
// block of 1024 threads; experts ≤ 1024.
extern "C" __global__ void __launch_bounds__(1024)
    ferrite_moe_sort(int* off, int* tiles, int* perm, float* ye, const int* ids, int slots, int experts, int hidden) {
    __shared__ int cnt[1024];
    for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < experts) {
            atomicAdd(&cnt[e], 1);
        } else {
            for (int d = 0; d < hidden; d++) ye[size_t(s) * hidden + d] = __int_as_float(0x7fc00000);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, tl = 0;
        for (int e = 0; e < experts; e++) {
            const int c = cnt[e];
            off[e] = o;
            tiles[e] = tl;
            cnt[e] = o;  // the next free place
            o += c;
            tl += (c + kTileM - 1) / kTileM;
        }
        off[experts] = o;
        tiles[experts] = tl;
    }
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < experts) perm[atomicAdd(&cnt[e], 1)] = s;
    }
}

// Gate/up tiles: h (slots, inter) from x (n, hidden). Launch: grid
// (ceil(inter / 64), ceil(slots / 64) + experts), 256 threads.
#define FERRITE_MOE_TILE_GATE_UP(name, Q)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        name(float* h, int inter, const float* x, int x_stride, const int* off, const int* tiles, const int* perm, \
             const MatDesc* table, int experts, int k, int hidden, float limit) {                               \
        moe_tile<true, Q>(h, inter, x, x_stride, off, tiles, perm, table, experts, k, hidden, limit);           \
    }
FERRITE_MOE_TILE_GATE_UP(ferrite_moe_tile_gate_up, false)
FERRITE_MOE_TILE_GATE_UP(ferrite_moe_tile_gate_up_q, true)

// Down tiles: ye (slots, hidden) from h (slots, inter). Launch: grid
// (ceil(hidden / 64), ceil(slots / 64) + experts), 256 threads.
#define FERRITE_MOE_TILE_DOWN(name, Q)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        name(float* ye, int hidden, const float* h, const int* off, const int* tiles, const int* perm,           \
             const MatDesc* table, int experts, int k, int inter) {                                             \
        moe_tile<false, Q>(ye, hidden, h, inter, off, tiles, perm, table, experts, k, inter, 0.f);              \
    }
FERRITE_MOE_TILE_DOWN(ferrite_moe_tile_down, false)
FERRITE_MOE_TILE_DOWN(ferrite_moe_tile_down_q, true)

// The experts in GGML blocks that some slot chose (off[e + 1] > off[e],
// ferrite_moe_sort's), decoded exactly and rounded to bf16 (f32_to_bf16)
// into wbf, so that the tensor-core kernels below take a prefill's
// block-quantized experts: view i = 3e + m of table (gate, up, down; each
// per = inter·hidden elements) at wbf + i·per, row by row; out (3·experts)
// the views' descriptors, bf16 ones for those, the others' (bf16 already)
// as table has them. Launch: any 1-D grid of 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_moe_qdecode(uint16_t* wbf, MatDesc* out, const MatDesc* table, const int* off, int experts, int inter, int hidden) {
    const size_t per = size_t(inter) * hidden, runs = per / 16;  // a thread decodes a run of 16
    const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x, nth = size_t(gridDim.x) * blockDim.x;
    for (size_t i = tid; i < size_t(3) * experts; i += nth) {
        MatDesc d = table[i];
        if (is_quant(d.dtype)) d = MatDesc{reinterpret_cast<const uint8_t*>(wbf + i * per), nullptr, kBF16, d.rows, d.cols, 1, 1, 0};
        out[i] = d;
    }
    for (size_t u = tid; u < 3 * experts * runs; u += nth) {
        const size_t i = u / runs, q = u % runs;
        const int e = int(i / 3);
        if (off[e + 1] == off[e]) continue;  // no slot chose e
        const MatDesc m = table[i];
        if (!is_quant(m.dtype)) continue;
        const int r = int(q / (m.cols / 16)), c0 = int(q % (m.cols / 16)) * 16;
        float v[16];
        quant_run16(m, r, c0, v);
        uint32_t p[8];
#pragma unroll
        for (int j = 0; j < 8; j++) p[j] = uint32_t(f32_to_bf16(v[2 * j])) | uint32_t(f32_to_bf16(v[2 * j + 1])) << 16;
        uint4* dst = reinterpret_cast<uint4*>(wbf + i * per + size_t(r) * m.cols + c0);
        dst[0] = uint4{p[0], p[1], p[2], p[3]};
        dst[1] = uint4{p[4], p[5], p[6], p[7]};
    }
}

// The same on tensor cores (moe_mma): every gate, up and down weight bf16,
// hidden and inter multiples of 32, x's stride a multiple of 4. Launch:
// the grids of ferrite_moe_tile_*, 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_moe_mma_gate_up(float* h, int inter, const float* x, int x_stride, const int* off, const int* tiles,
                            const int* perm, const MatDesc* table, int experts, int k, int hidden, float limit) {
    moe_mma<true>(h, inter, x, x_stride, off, tiles, perm, table, experts, k, hidden, limit);
}

extern "C" __global__ void __launch_bounds__(128)
    ferrite_moe_mma_down(float* ye, int hidden, const float* h, const int* off, const int* tiles, const int* perm,
                         const MatDesc* table, int experts, int k, int inter) {
    moe_mma<false>(ye, hidden, h, inter, off, tiles, perm, table, experts, k, inter, 0.f);
}
