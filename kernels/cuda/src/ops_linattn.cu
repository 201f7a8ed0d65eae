// The linear-attention ops (kernels.LinearAttentionOps) of the hybrid
// models, qwen3_next's Gated DeltaNet and glm5_next's KDA: the short
// convolution, the gated delta rule, the gated RMSNorm and the sigmoid
// gate, with the semantics of kernels/ref/linattn.go. Recurrent states are
// float32 rows of a state tensor, one slot per sequence; a sequence is the
// rows [start[s], start[s+1]) of the step, continuing from row slot[s] of
// the state.
//
// The file sorts after ops.cu and ops_common.cu in the one translation unit
// (tools/cuda/build_fatbin.sh), so it uses ops.cu's warp_sum_f64 and
// ops_common.cu's block_sum_f64.
#include <math.h>
#include <stdint.h>

namespace {

// sigmoid64 is 1/(1+e^-x) in float64 without overflow (kernels/ref).
__device__ inline double sigmoid64(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

// softplus64 is torch's softplus (beta 1, threshold 20).
__device__ inline double softplus64(double x) { return x > 20.0 ? x : log1p(exp(x)); }

constexpr int kConvMaxK = 8;   // the longest convolution ShortConv runs
constexpr int kConvAhead = 8;  // rows whose inputs ShortConv loads at once

}  // namespace

// ShortConv: y (n, C) = silu(Σ_j w[ch, j]·x_{t−K+1+j}[ch]) per sequence,
// the K−1 inputs before its first row taken from its state slot ((K−1)·C:
// raw inputs, oldest first), which is left holding the last K−1 raw
// inputs. Sums in float64 in the reference's order; y may be x (a thread
// reads x[t][ch] before it writes y[t][ch], and no other thread touches
// them). rec (n) at rec_stride, or null: a row whose entry is ≥ 0 also
// leaves the K−1 inputs up to it in that slot (kernels.Recurrent.Record).
// Launch: grid (seqs, ceil(C/128)), 128 threads; 1 ≤ K ≤ 8.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_short_conv(float* y, const float* x, const float* w, float* state, int state_stride, const int* start,
                       int start_stride, const int* slot, int slot_stride, int C, int K, const int* rec,
                       int rec_stride) {
    const int s = blockIdx.x;
    const int ch = blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    const int r0 = start[size_t(s) * start_stride], r1 = start[size_t(s + 1) * start_stride];
    float* st = state + size_t(slot[size_t(s) * slot_stride]) * state_stride;
    // win[j], j < K−1: the raw input K−1−j rows before the next one.
    float win[kConvMaxK];
    double wc[kConvMaxK];
#pragma unroll
    for (int j = 0; j < kConvMaxK; j++) {
        win[j] = j < K - 1 ? st[size_t(j) * C + ch] : 0.f;
        wc[j] = j < K - 1 ? double(w[size_t(ch) * K + j]) : 0.0;
    }
    const double wlast = double(w[size_t(ch) * K + K - 1]);  // the current row's tap
    // kConvAhead rows' inputs are loaded before their outputs are stored
    // (loads in flight together; row r + u is never the element y[r]
    // overwrites, so this holds when y is x too).
    for (int r = r0; r < r1; r += kConvAhead) {
        float xs[kConvAhead];
#pragma unroll
        for (int u = 0; u < kConvAhead; u++) xs[u] = r + u < r1 ? x[size_t(r + u) * C + ch] : 0.f;
#pragma unroll
        for (int u = 0; u < kConvAhead; u++) {
            if (r + u >= r1) break;
            const float xt = xs[u];
            double acc = 0;
#pragma unroll
            for (int j = 0; j < kConvMaxK - 1; j++)
                if (j < K - 1) acc += wc[j] * double(win[j]);
            acc += wlast * double(xt);
            y[size_t(r + u) * C + ch] = float(acc * sigmoid64(acc));
#pragma unroll
            for (int j = 0; j < kConvMaxK - 1; j++) win[j] = j < K - 2 ? win[j + 1] : (j == K - 2 ? xt : win[j]);
            const int to = rec != nullptr ? rec[size_t(r + u) * rec_stride] : -1;
            if (to >= 0) {
                float* rs = state + size_t(to) * state_stride;
#pragma unroll
                for (int j = 0; j < kConvMaxK - 1; j++)
                    if (j < K - 1) rs[size_t(j) * C + ch] = win[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; j++)
        if (j < K - 1) st[size_t(j) * C + ch] = win[j];
}

// ShortConv of long sequences, every row at once: ferrite_short_conv_rows
// writes y (n, C), never in place, from x and the states, which it only
// reads; ferrite_short_conv_state then leaves each sequence's last K−1 raw
// inputs in its slot. Each output is ferrite_short_conv's sum, in its
// order, so the bits are the same. No recording (kernels.Recurrent.Record:
// ferrite_short_conv's). Launch: grid (ceil(n / kConvRun), ceil(C/128)),
// 128 threads; then grid (seqs, ceil(C/128)), 128 threads.
namespace {
constexpr int kConvRun = 16;  // rows a thread of ferrite_short_conv_rows
}  // namespace

extern "C" __global__ void __launch_bounds__(128)
    ferrite_short_conv_rows(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ state, int state_stride, const int* __restrict__ start,
                            int start_stride, const int* __restrict__ slot, int slot_stride, int seqs, int n, int C,
                            int K) {
    const int ch = blockIdx.y * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.x * kConvRun, t1 = min(n, t0 + kConvRun);
    if (ch >= C || t0 >= n) return;
    double wc[kConvMaxK];
#pragma unroll
    for (int j = 0; j < kConvMaxK; j++) wc[j] = j < K ? double(w[size_t(ch) * K + j]) : 0.0;
    // The sequence holding row t0: the last s with start[s] ≤ t0.
    int lo = 0, hi = seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (start[size_t(mid) * start_stride] <= t0) lo = mid; else hi = mid - 1;
    }
    int s = lo, r0 = start[size_t(s) * start_stride], r1 = start[size_t(s + 1) * start_stride];
    // win[j], j < K−1: the raw input K−1−j rows before row t; filled at
    // the run's first row and at each sequence start (the state's rows
    // K−1 + (idx − r0) before the sequence's first row r0).
    float win[kConvMaxK];
#define FERRITE_CONV_FILL(t)                                                                                  \
    do {                                                                                                      \
        const float* st = state + size_t(slot[size_t(s) * slot_stride]) * state_stride;                      \
        _Pragma("unroll") for (int j = 0; j < kConvMaxK - 1; j++) {                                           \
            const int idx = (t) - (K - 1) + j;                                                                \
            win[j] = j >= K - 1 ? 0.f : idx >= r0 ? x[size_t(idx) * C + ch] : st[size_t(K - 1 + idx - r0) * C + ch]; \
        }                                                                                                     \
    } while (0)
    FERRITE_CONV_FILL(t0);
    for (int t = t0; t < t1; t++) {
        if (t == r1) {  // the next sequence starts here
            while (t == r1) {
                s++;
                r0 = r1;
                r1 = start[size_t(s + 1) * start_stride];
            }
            FERRITE_CONV_FILL(t);
        }
        const float xt = x[size_t(t) * C + ch];
        double acc = 0;
#pragma unroll
        for (int j = 0; j < kConvMaxK - 1; j++)
            if (j < K - 1) acc += wc[j] * double(win[j]);
        acc += wc[K - 1] * double(xt);
        y[size_t(t) * C + ch] = float(acc * sigmoid64(acc));
#pragma unroll
        for (int j = 0; j < kConvMaxK - 1; j++) win[j] = j < K - 2 ? win[j + 1] : (j == K - 2 ? xt : win[j]);
    }
#undef FERRITE_CONV_FILL
}

extern "C" __global__ void __launch_bounds__(128)
    ferrite_short_conv_state(const float* __restrict__ x, float* state, int state_stride, const int* start,
                             int start_stride, const int* slot, int slot_stride, int C, int K) {
    const int s = blockIdx.x;
    const int ch = blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    const int r0 = start[size_t(s) * start_stride], T = start[size_t(s + 1) * start_stride] - r0;
    float* st = state + size_t(slot[size_t(s) * slot_stride]) * state_stride;
    float nw[kConvMaxK];  // the new state: history (K−1 old ++ T new) rows T … T + K − 2
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; j++) {
        const int idx = T + j - (K - 1);  // ≥ 0: a new row; < 0: an old state row
        nw[j] = j >= K - 1 ? 0.f : idx >= 0 ? x[size_t(r0 + idx) * C + ch] : st[size_t(K - 1 + idx) * C + ch];
    }
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; j++)
        if (j < K - 1) st[size_t(j) * C + ch] = nw[j];
}

// The delta rule's per-row inputs (kernels/ref.prepare): qk (n, 2·hk·dk)
// = [q | k] with every head L2-normalised (x/sqrt(Σx² + 1e-6), q then
// times float32(dk^-½)), the decays dec (n, gw) = e^g in float64 of the
// log-decays g rounded to float32 (gw = hv, or hv·dk per channel) and β
// (n, hv), from the rows of qkv (n, qkv_w), a (n, gw) and b (n, hv), in
// float64 rounded once as kernels/ref.DeltaGates. Launch: grid n, 128
// threads.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_delta_prep(float* qk, double* dec, float* beta, const float* qkv, const float* a, const float* b,
                       const float* alog, const float* dtb, int qkv_w, int hv, int hk, int dk, int per_channel,
                       float lower) {
    const int i = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float* src = qkv + size_t(i) * qkv_w;
    float* dst = qk + size_t(i) * 2 * hk * dk;
    const double qs = double(float(1.0 / sqrt(double(dk))));
    for (int hh = warp; hh < 2 * hk; hh += nw) {  // one warp per q or k head
        const float* v = src + size_t(hh) * dk;
        double ss = 0;
        for (int c = lane; c < dk; c += 32) ss += double(v[c]) * double(v[c]);
        ss = warp_sum_f64(ss);
        const double f = (hh < hk ? qs : 1.0) / sqrt(ss + 1e-6);
        for (int c = lane; c < dk; c += 32) dst[size_t(hh) * dk + c] = float(double(v[c]) * f);
    }
    const int per = per_channel ? dk : 1, gw = hv * per;
    for (int c = threadIdx.x; c < gw; c += blockDim.x) {
        const double e = exp(double(alog[c / per]));
        const double xv = double(__fadd_rn(a[size_t(i) * gw + c], dtb[c]));  // float32 sum, as HF
        const float g = lower < 0 ? float(double(lower) * sigmoid64(e * xv)) : float(-e * softplus64(xv));
        dec[size_t(i) * gw + c] = exp(double(g));
    }
    for (int h = threadIdx.x; h < hv; h += blockDim.x)
        beta[size_t(i) * hv + h] = float(sigmoid64(double(b[size_t(i) * hv + h])));
}

// ---------------------------------------------------------------------------
// The gated delta rule. Block (sequence s, value head h, column tile z)
// steps through the sequence's rows keeping the columns [8z, 8z + 8) of
// the head's state S (dk, dv) in registers as float64: warp w owns columns
// 8z + 2w and 8z + 2w + 1, lane l the key rows l, l + 32, …; the sums over the key
// index are warp reductions. Per row, for each owned column j:
//
//	u = Σ_c k_c·e^{g_c}·S[c][j];  δ = β(v_j − u)
//	S[c][j] ← e^{g_c}·S[c][j] + k_c·δ;  o_j = Σ_c q_c·S[c][j]
//
// (o from the unrounded new state). A sequence of at most
// kDeltaRecurrentMax rows rounds S to float32 after every row, exactly the
// token-by-token form of kernels/ref.DeltaRule, so a row gives the same
// bits whether it comes alone or with up to 7 others (speculative
// verification reproduces plain decoding). A longer one keeps S in
// float64 across the call and rounds it once at the end, like the chunked
// WY form (kernels/ref.DeltaRuleChunked): the same arithmetic as the
// chunked form up to the order of float64 sums.
//
// Launch: grid (seqs, hv, ceil(dv/8)), 128 threads; dk ≤ 32·KPL.

namespace {

constexpr int kDeltaCols = 2;   // state columns per warp
constexpr int kDeltaWarps = 4;  // warps per block
constexpr int kDeltaRecurrentMax = 8;

struct DeltaArgs {
    float* out;          // (n, hv·dv)
    const float* qk;     // (n, 2·hk·dk) ferrite_delta_prep's
    const float* qkv;    // (n, qkv_w): v at column 2·hk·dk + h·dv
    const double* dec;   // (n, gw) e^g
    const float* beta;   // (n, hv)
    float* state;        // (slots, state_stride): head h at h·dk·dv
    const int* start;    // (seqs+1) at start_stride
    const int* slot;     // (seqs) at slot_stride
    const int* rec;      // (n) at rec_stride: the slot receiving the state after each row, or −1; null: none
    int state_stride, start_stride, slot_stride, rec_stride;
    int hv, hk, dk, dv, per_channel;
    int skip_long;  // leave sequences of more than kDeltaRecurrentMax rows to ferrite_delta_chunk_*
};

// warp_sum_n sums each of v[0..N) over the warp, in every lane: the
// shuffle butterfly of warp_sum_f64 (the same bits), the N chains
// interleaved.
template <int N>
__device__ __forceinline__ void warp_sum_n(double* v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
    }
}

// delta_out writes row r's outputs o (the warp's kDeltaCols columns from
// j0, reduced) from lane 0.
__device__ __forceinline__ void delta_out(const DeltaArgs& a, int r, int h, int j0, int lane, const double* o) {
    if (lane != 0) return;
    float* orow = a.out + size_t(r) * a.hv * a.dv + size_t(h) * a.dv;
#pragma unroll
    for (int col = 0; col < kDeltaCols; col++)
        if (j0 + col < a.dv) orow[j0 + col] = float(o[col]);
}

// delta_store writes the warp's part of a head's state S (its lane's
// rows c = lane + 32·i, columns j0 …) into D (dk, dv) as float32.
template <int KPL>
__device__ __forceinline__ void delta_store(float* D, const double (&S)[KPL][kDeltaCols], int lane, int j0, int dk,
                                            int dv) {
#pragma unroll
    for (int i = 0; i < KPL; i++) {
        const int c = lane + 32 * i;
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) {
            const int j = j0 + col;
            if (c < dk && j < dv) D[size_t(c) * dv + j] = float(S[i][col]);
        }
    }
}

template <int KPL>
__device__ void delta_rule(const DeltaArgs& a) {
    const int s = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.z * kDeltaWarps + warp) * kDeltaCols;
    if (j0 >= a.dv) return;  // the whole warp; the block never synchronises
    const int dk = a.dk, dv = a.dv;
    const int r0 = a.start[size_t(s) * a.start_stride], r1 = a.start[size_t(s + 1) * a.start_stride];
    const bool round = r1 - r0 <= kDeltaRecurrentMax;
    if (a.skip_long && !round) return;  // the chunked form's (ops_linattn_chunk.cu)
    const int kh = h / (a.hv / a.hk);
    const int qkw = 2 * a.hk * dk, qkv_w = qkw + a.hv * dv, gw = a.per_channel ? a.hv * dk : a.hv;
    float* S0 = a.state + size_t(a.slot[size_t(s) * a.slot_stride]) * a.state_stride + size_t(h) * dk * dv;

    double S[KPL][kDeltaCols];
#pragma unroll
    for (int i = 0; i < KPL; i++) {
        const int c = lane + 32 * i;
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) {
            const int j = j0 + col;
            S[i][col] = c < dk && j < dv ? double(S0[size_t(c) * dv + j]) : 0.0;
        }
    }
    // The next row's inputs, loaded while the current row is computed.
    float nk[KPL], nq[KPL], nv[kDeltaCols], nb = 0.f;
    double nd[KPL];
    auto load = [&](int r) {
        const float* qr = a.qk + size_t(r) * qkw + size_t(kh) * dk;  // (dk) normalised q
        const float* kr = qr + size_t(a.hk) * dk;                    // (dk) normalised k
        const double* dr = a.dec + size_t(r) * gw;
#pragma unroll
        for (int i = 0; i < KPL; i++) {
            const int c = lane + 32 * i;
            const bool in = c < dk;
            nk[i] = in ? kr[c] : 0.f;
            nq[i] = in ? qr[c] : 0.f;
            nd[i] = in ? dr[a.per_channel ? h * dk + c : h] : 0.0;
        }
        const float* vr = a.qkv + size_t(r) * qkv_w + qkw + size_t(h) * dv;  // (dv)
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) nv[col] = j0 + col < dv ? vr[j0 + col] : 0.f;
        nb = a.beta[size_t(r) * a.hv + h];
    };
    // red[0..C) are row r's u, red[C..2C) row r−1's o (unreduced until the
    // u of the next row is reduced with them: independent shuffle chains,
    // so the recurrence waits for one reduction per row, not two).
    double red[2 * kDeltaCols];
#pragma unroll
    for (int col = 0; col < kDeltaCols; col++) red[kDeltaCols + col] = 0.0;
    if (r0 < r1) load(r0);
    for (int r = r0; r < r1; r++) {
        double kc[KPL], qc[KPL], dec[KPL], v[kDeltaCols];
#pragma unroll
        for (int i = 0; i < KPL; i++) {
            kc[i] = double(nk[i]);
            qc[i] = double(nq[i]);
            dec[i] = nd[i];
        }
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) v[col] = double(nv[col]);
        const double bt = double(nb);
        if (r + 1 < r1) load(r + 1);
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) {
            red[col] = 0;
#pragma unroll
            for (int i = 0; i < KPL; i++) red[col] += kc[i] * dec[i] * S[i][col];
        }
        warp_sum_n<2 * kDeltaCols>(red);
        if (r > r0) delta_out(a, r - 1, h, j0, lane, red + kDeltaCols);
#pragma unroll
        for (int col = 0; col < kDeltaCols; col++) {
            const double del = j0 + col < dv ? bt * (v[col] - red[col]) : 0.0;
            double o = 0;
#pragma unroll
            for (int i = 0; i < KPL; i++) {
                const double xs = dec[i] * S[i][col] + kc[i] * del;
                S[i][col] = round ? double(float(xs)) : xs;
                o += qc[i] * xs;
            }
            red[kDeltaCols + col] = o;
        }
        // kernels.Recurrent.Record: the state after row r (rounded: a
        // recording sequence has at most kDeltaRecurrentMax rows).
        const int to = a.rec != nullptr ? a.rec[size_t(r) * a.rec_stride] : -1;
        if (to >= 0) delta_store<KPL>(a.state + size_t(to) * a.state_stride + size_t(h) * dk * dv, S, lane, j0, dk, dv);
    }
    if (r1 > r0) {
        warp_sum_n<kDeltaCols>(red + kDeltaCols);
        delta_out(a, r1 - 1, h, j0, lane, red + kDeltaCols);
    }
    delta_store<KPL>(S0, S, lane, j0, dk, dv);
}

}  // namespace

#define FERRITE_DELTA(name, KPL)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) name(                                                  \
        float* out, const float* qk, const float* qkv, const double* dec, const float* beta, float* state,    \
        int state_stride, const int* start, int start_stride, const int* slot, int slot_stride, int hv, int hk, \
        int dk, int dv, int per_channel, const int* rec, int rec_stride, int skip_long) {                     \
        DeltaArgs a{out, qk, qkv, dec, beta, state, start, slot, rec, state_stride, start_stride, slot_stride, \
                    rec_stride, hv, hk, dk, dv, per_channel, skip_long};                                      \
        delta_rule<KPL>(a);                                                                                   \
    }

FERRITE_DELTA(ferrite_delta_rule_1, 1)
FERRITE_DELTA(ferrite_delta_rule_2, 2)
FERRITE_DELTA(ferrite_delta_rule_4, 4)
FERRITE_DELTA(ferrite_delta_rule_8, 8)

// Gated RMSNorm over rows of d values: y = w ⊙ x/sqrt(mean(x²) + eps) ⊙
// gate(z), gate(z) = z·sigmoid(z) (silu) or sigmoid(z), all in float64,
// rounded once (kernels/ref.GatedRMSNorm). y may be x or z. Launch: grid
// rows, 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_gated_rmsnorm(float* y, const float* x, const float* z, const float* w, int d, float eps, int silu) {
    __shared__ double part[32];
    const size_t off = size_t(blockIdx.x) * d;
    double ss = 0;
    for (int c = threadIdx.x; c < d; c += blockDim.x) ss += double(x[off + c]) * double(x[off + c]);
    ss = block_sum_f64(ss, part);
    const double inv = 1.0 / sqrt(ss / double(d) + double(eps));
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        const double zi = double(z[off + c]);
        double gz = sigmoid64(zi);
        if (silu) gz *= zi;
        y[off + c] = float(double(w[c]) * (double(x[off + c]) * inv) * gz);
    }
}

// Sigmoid gate: y[i] = x[i]·sigmoid(gate) (+ y[i] when acc) for n values in
// rows of cols, one gate per element or, per_row, per row; the sigmoid in
// float64 rounded, the product and sum in float32 (kernels/ref.SigmoidGate).
// y may be x. Launch: any 1-D grid of 256 threads.
extern "C" __global__ void ferrite_sigmoid_gate(float* y, const float* x, const float* gate, uint64_t n, int cols,
                                                int per_row, int acc) {
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const float gv = gate[per_row ? i / cols : i];
        const float sg = float(1.0 / (1.0 + exp(-double(gv))));
        float p = __fmul_rn(x[i], sg);
        if (acc) p = __fadd_rn(p, y[i]);
        y[i] = p;
    }
}
