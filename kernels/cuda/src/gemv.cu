// Matrix-vector products for decode: y (n, rows) = x (n, cols) · wᵀ (+ bias)
// (+ y when acc_y) with the weight w (rows, cols) in its stored dtype, x, y
// and bias float32 (bias may be null), and every sum accumulated in
// float32. One warp computes one output row for up to NB rows of x at a
// time, so each weight byte is read once per NB rows of x; the warp's lanes
// stride the row in 16-byte loads when the row is 16-byte aligned, one
// element at a time otherwise.
//
// Launch: 256 threads a block; n ≥ 1. The _8 kernels take any n in chunks
// of 8, one warp per row: ceil(rows / 8) blocks. The _1 kernels are the
// decode path (n = 1): four warps share a row, each summing every fourth
// 512-byte stretch, so a 4096-wide bf16 row is one round of loads per warp
// and small matrices still fill the GPU: ceil(rows / 2) blocks. The _r4
// and _r8 kernels are the other decode layout (gemv_rows): 4 or 8 rows a
// block, ceil(rows / R) blocks. The _x kernels run the _1 kernels' sums
// for any n, row after row (kernels.RowExact). src/ops.cu builds
// SwiGLULinear's GEMVs on split_dot and rows_partial.
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kWarpsPerBlock = 8;

// Weight decoders: one(row, k) widens element k of a row; vec(v, o) widens a
// 16-byte load into E floats. kVec says whether vec exists for the dtype.

struct F32W {
    static constexpr int kSize = 4, kE = 4;
    static constexpr bool kVec = true;
    __device__ static float one(const uint8_t* row, int k) { return reinterpret_cast<const float*>(row)[k]; }
    __device__ static void vec(uint4 v, float* o) {
        o[0] = __uint_as_float(v.x); o[1] = __uint_as_float(v.y);
        o[2] = __uint_as_float(v.z); o[3] = __uint_as_float(v.w);
    }
};

struct BF16W {
    static constexpr int kSize = 2, kE = 8;
    static constexpr bool kVec = true;
    __device__ static float one(const uint8_t* row, int k) {
        return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[k]) << 16);
    }
    __device__ static void pair(uint32_t w, float* o) {
        o[0] = __uint_as_float(w << 16);
        o[1] = __uint_as_float(w & 0xffff0000u);
    }
    __device__ static void vec(uint4 v, float* o) { pair(v.x, o); pair(v.y, o + 2); pair(v.z, o + 4); pair(v.w, o + 6); }
};

struct F16W {
    static constexpr int kSize = 2, kE = 8;
    static constexpr bool kVec = true;
    __device__ static float one(const uint8_t* row, int k) {
        return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(row)[k]));
    }
    __device__ static void pair(uint32_t w, float* o) {
        o[0] = __half2float(__ushort_as_half(uint16_t(w)));
        o[1] = __half2float(__ushort_as_half(uint16_t(w >> 16)));
    }
    __device__ static void vec(uint4 v, float* o) { pair(v.x, o); pair(v.y, o + 2); pair(v.z, o + 4); pair(v.w, o + 6); }
};

// float8 e4m3fn (bias 7, 0x7f/0xff NaN), exact in float32; the block scale
// is applied per element by the caller.
__device__ inline float f8e4m3(uint8_t b) {
    uint32_t sign = uint32_t(b >> 7) << 31, exp = (b >> 3) & 0xf, man = b & 7;
    if (exp == 0xf && man == 7) return __uint_as_float(0x7fc00000u);
    if (exp == 0) {
        float f = float(man) * (1.0f / 512.0f);
        return sign ? -f : f;
    }
    return __uint_as_float(sign | (exp + 120) << 23 | man << 20);
}

__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// dot_x adds wv[e]·x[e] for the W::kE weights of one 16-byte load to acc,
// in element order; x is 16-byte aligned, in global memory read through
// the non-coherent cache (NC) or anywhere (shared memory) with plain loads.
template <class W, bool NC = true>
__device__ inline float dot_x(const float* wv, const float* __restrict__ x, float acc) {
    const float4* xp = reinterpret_cast<const float4*>(x);
#pragma unroll
    for (int q = 0; q < W::kE / 4; q++) {
        const float4 xv = NC ? __ldg(xp + q) : xp[q];
        acc = fmaf(wv[4 * q], xv.x, acc);
        acc = fmaf(wv[4 * q + 1], xv.y, acc);
        acc = fmaf(wv[4 * q + 2], xv.z, acc);
        acc = fmaf(wv[4 * q + 3], xv.w, acc);
    }
    return acc;
}

// store writes one output element through the linear epilogue: + bias[r]
// when bias is set, + the old value when acc_y (a residual add).
__device__ inline void store(float* y, float s, const float* bias, int r, int acc_y) {
    if (bias) s += bias[r];
    if (acc_y) s += *y;
    *y = s;
}

// weight_prefetch, in the first pf blocks of the grid (the ones resident
// while the kernel before may still run; 0: none), asks L2 for the bytes
// bytes from p on, the block's threads striding the 128-byte lines. The
// split GEMVs call it for their weight rows before FERRITE_PDL_WAIT (the
// weights are never written by a step's kernels), so under PDL the weight
// stream starts while the kernel before drains (kernels/cuda/pdl.go).
__device__ inline void weight_prefetch(int pf, const uint8_t* p, size_t bytes) {
    if (int(blockIdx.x) >= pf) return;
    for (size_t o = size_t(threadIdx.x) * 128; o < bytes; o += size_t(blockDim.x) * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

template <class W, int NB>
__device__ void gemv(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                     int n, int rows, int cols, const float* __restrict__ bias, int acc_y) {
    const int r = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const uint8_t* row = w + size_t(r) * cols * W::kSize;
    const bool vec = W::kVec && (size_t(cols) * W::kSize) % 16 == 0;
    for (int j0 = 0; j0 < n; j0 += NB) {
        const int nb = min(NB, n - j0);
        const float* xb = x + size_t(j0) * cols;
        float acc[NB];
#pragma unroll
        for (int j = 0; j < NB; j++) acc[j] = 0.f;
        if (vec) {
#pragma unroll 4
            for (int k = lane * W::kE; k < cols; k += 32 * W::kE) {
                float wv[W::kE];
                W::vec(__ldg(reinterpret_cast<const uint4*>(row + size_t(k) * W::kSize)), wv);
#pragma unroll
                for (int j = 0; j < NB; j++)
                    if (j < nb) acc[j] = dot_x<W>(wv, xb + size_t(j) * cols + k, acc[j]);
            }
        } else {
            for (int k = lane; k < cols; k += 32) {
                float wv = W::one(row, k);
#pragma unroll
                for (int j = 0; j < NB; j++)
                    if (j < nb) acc[j] = fmaf(wv, xb[size_t(j) * cols + k], acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < NB; j++) {
            float s = warp_sum(acc[j]);
            if (lane == 0 && j < nb) store(y + size_t(j0 + j) * rows + r, s, bias, r, acc_y);
        }
    }
}

// One row per four warps (kSplit), n = 1: warp part p of a row sums the
// stretches p, p + 4, p + 8, … of 32·E elements; the four partial sums meet
// in shared memory.
constexpr int kSplit = 4;

// split_prefetch is weight_prefetch of the kernel's block's rows in the
// gemv_split layout (kWarpsPerBlock / kSplit rows a block).
template <class W>
__device__ inline void split_prefetch(int pf, const uint8_t* w, int rows, int cols) {
    const int r0 = blockIdx.x * (kWarpsPerBlock / kSplit);
    const size_t rb = size_t(cols) * W::kSize;
    if (r0 < rows) weight_prefetch(pf, w + size_t(r0) * rb, size_t(min(kWarpsPerBlock / kSplit, rows - r0)) * rb);
}

// split_dot is warp part p's share of row · x (cols values), summed over
// the warp (the same in every lane).
template <class W>
__device__ float split_dot(const uint8_t* __restrict__ row, const float* __restrict__ x, int cols, int p) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    if (W::kVec && (size_t(cols) * W::kSize) % 16 == 0) {
#pragma unroll 4
        for (int k = (p * 32 + lane) * W::kE; k < cols; k += kSplit * 32 * W::kE) {
            float wv[W::kE];
            W::vec(__ldg(reinterpret_cast<const uint4*>(row + size_t(k) * W::kSize)), wv);
            acc = dot_x<W>(wv, x + k, acc);
        }
    } else {
        for (int k = p * 32 + lane; k < cols; k += kSplit * 32) acc = fmaf(W::one(row, k), x[k], acc);
    }
    return warp_sum(acc);
}

// kSplitRows is how many rows of x split_dot_rows takes at once.
constexpr int kSplitRows = 4;

// split_dot_rows is split_dot for nr ≤ kSplitRows rows of x (row j at x +
// j·cols) at once, into acc[j]: each weight element is read once for all
// of them, and row j's sum is made of exactly split_dot's products and
// additions in split_dot's order, so its bits are split_dot's.
template <class W>
__device__ void split_dot_rows(const uint8_t* __restrict__ row, const float* __restrict__ x, int cols, int p, int nr,
                               float* acc) {
    const int lane = threadIdx.x & 31;
    float a[kSplitRows];
#pragma unroll
    for (int j = 0; j < kSplitRows; j++) a[j] = 0.f;
    if (W::kVec && (size_t(cols) * W::kSize) % 16 == 0) {
#pragma unroll 2
        for (int k = (p * 32 + lane) * W::kE; k < cols; k += kSplit * 32 * W::kE) {
            float wv[W::kE];
            W::vec(__ldg(reinterpret_cast<const uint4*>(row + size_t(k) * W::kSize)), wv);
#pragma unroll
            for (int j = 0; j < kSplitRows; j++)
                if (j < nr) a[j] = dot_x<W>(wv, x + size_t(j) * cols + k, a[j]);
        }
    } else {
        for (int k = p * 32 + lane; k < cols; k += kSplit * 32) {
            const float wk = W::one(row, k);
#pragma unroll
            for (int j = 0; j < kSplitRows; j++) {
                if (j < nr) a[j] = fmaf(wk, x[size_t(j) * cols + k], a[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kSplitRows; j++) acc[j] = warp_sum(a[j]);
}

// split_total adds the kSplit partial sums of the row whose first warp is
// w0, in a fixed order.
__device__ inline float split_total(const float* part, int w0) {
    float s = part[w0];
#pragma unroll
    for (int i = 1; i < kSplit; i++) s += part[w0 + i];
    return s;
}

template <class W>
__device__ void gemv_split(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                           int rows, int cols, const float* __restrict__ bias, int acc_y) {
    __shared__ float part[kWarpsPerBlock];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (kWarpsPerBlock / kSplit) + warp / kSplit;
    const int p = warp % kSplit;
    float acc = 0.f;
    if (r < rows) acc = split_dot<W>(w + size_t(r) * cols * W::kSize, x, cols, p);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (p == 0 && lane == 0 && r < rows) store(y + r, split_total(part, warp), bias, r, acc_y);
}

// gemv_split over n rows of x, kSplitRows at a time (split_dot_rows): row
// j's sum is split_dot and split_total exactly as gemv_split computes it
// for that row alone, so a row's bits do not depend on the other rows of
// the call (kernels.RowExact: a speculative verification's rows reproduce
// plain decoding's). Each weight element is read once for kSplitRows rows,
// so a call of up to four rows takes about a one-row call's time. Launch
// as gemv_split: ceil(rows / 2) blocks.
template <class W>
__device__ void gemv_split_rows(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                                int n, int rows, int cols, const float* __restrict__ bias, int acc_y) {
    __shared__ float part[kSplitRows][kWarpsPerBlock];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (kWarpsPerBlock / kSplit) + warp / kSplit;
    const int p = warp % kSplit;
    for (int j0 = 0; j0 < n; j0 += kSplitRows) {
        const int nr = min(kSplitRows, n - j0);
        float acc[kSplitRows];
#pragma unroll
        for (int j = 0; j < kSplitRows; j++) acc[j] = 0.f;
        if (r < rows) split_dot_rows<W>(w + size_t(r) * cols * W::kSize, x + size_t(j0) * cols, cols, p, nr, acc);
        __syncthreads();  // the previous rows' partial sums have been read
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < kSplitRows; j++) part[j][warp] = acc[j];
        }
        __syncthreads();
        if (p == 0 && lane == 0 && r < rows) {
            for (int j = 0; j < nr; j++) store(y + size_t(j0 + j) * rows + r, split_total(part[j], warp), bias, r, acc_y);
        }
    }
}

// The GEMVs with a fused RMSNorm (kernels.LinearOps.NormLinearCat):
// y = inv·(s ⊙ x)·wᵀ for the un-normed x, s the norm weight (1 + w with
// off) and inv = 1/sqrt(mean(x²) + eps), the mean rounded to float32 and
// eps added in float32 as kernels/ref.RMSNorm does. The four warps of a
// block's first row read all of x, so they also sum x² on the way (each
// lane in float32, the lanes and the four warps in float64: the same bits
// for every block), and the block's rows scale their sums by inv once.
//
// split_norm_dot is split_dot of row with s ⊙ x (each product rounded to
// float32) and, with want_sq, in *sq warp part p's share of Σx²; both are
// summed over the warp. With ADD, x is x + dl (AddNormLinearCat's pending
// residual add, one float32 add an element).
template <class W, bool ADD>
__device__ float split_norm_dot(const uint8_t* __restrict__ row, const float* __restrict__ x,
                                const float* __restrict__ dl, const float* __restrict__ nw, int off, int cols, int p,
                                bool want_sq, double* sq) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f, ss = 0.f;
    if (W::kVec && (size_t(cols) * W::kSize) % 16 == 0) {
#pragma unroll 4
        for (int k = (p * 32 + lane) * W::kE; k < cols; k += kSplit * 32 * W::kE) {
            float wv[W::kE];
            W::vec(__ldg(reinterpret_cast<const uint4*>(row + size_t(k) * W::kSize)), wv);
            const float4* xp = reinterpret_cast<const float4*>(x + k);
            const float4* sp = reinterpret_cast<const float4*>(nw + k);
#pragma unroll
            for (int q = 0; q < W::kE / 4; q++) {
                const float4 xv = __ldg(xp + q), sv = __ldg(sp + q);
                float xe[4] = {xv.x, xv.y, xv.z, xv.w};
                const float se[4] = {sv.x, sv.y, sv.z, sv.w};
                if (ADD) {
                    const float4 dv = __ldg(reinterpret_cast<const float4*>(dl + k) + q);
                    xe[0] = __fadd_rn(xe[0], dv.x);
                    xe[1] = __fadd_rn(xe[1], dv.y);
                    xe[2] = __fadd_rn(xe[2], dv.z);
                    xe[3] = __fadd_rn(xe[3], dv.w);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (want_sq) ss = fmaf(xe[e], xe[e], ss);
                    const float sc = off ? __fadd_rn(1.f, se[e]) : se[e];
                    acc = fmaf(wv[4 * q + e], __fmul_rn(sc, xe[e]), acc);
                }
            }
        }
    } else {
        for (int k = p * 32 + lane; k < cols; k += kSplit * 32) {
            const float xk = ADD ? __fadd_rn(x[k], dl[k]) : x[k];
            if (want_sq) ss = fmaf(xk, xk, ss);
            const float sc = off ? __fadd_rn(1.f, nw[k]) : nw[k];
            acc = fmaf(W::one(row, k), __fmul_rn(sc, xk), acc);
        }
    }
    if (want_sq) *sq = warp_sum_f64(double(ss));
    return warp_sum(acc);
}

// norm_inv is the RMSNorm scale of a row of cols values from the kSplit
// partial sums of squares from sq[0] on, added in a fixed order.
__device__ inline float norm_inv(const double* sq, int cols, float eps) {
    double s = sq[0];
#pragma unroll
    for (int i = 1; i < kSplit; i++) s += sq[i];
    const float ms = float(s / double(cols));
    return float(1.0 / sqrt(double(__fadd_rn(ms, eps))));
}

// gemv_norm_split is gemv_split_rows with the fused norm: n rows of x one
// after another, each summed as for that row alone (so the n = 1 decode
// and a row-exact verification give the same bits). With ADD the input is
// x + dl, which the blocks also write to sum, each a share of the
// elements (AddNormLinearCat). Launch as gemv_split: ceil(rows / 2)
// blocks of 256 threads.
template <class W, bool ADD>
__device__ void gemv_norm_split(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ dl,
                                float* __restrict__ sum, const uint8_t* __restrict__ w, int n, int rows, int cols,
                                const float* __restrict__ nw, float eps, int off, const float* __restrict__ bias,
                                int acc_y) {
    __shared__ float part[kWarpsPerBlock];
    __shared__ double sqp[kSplit];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (kWarpsPerBlock / kSplit) + warp / kSplit;
    const int p = warp % kSplit;
    const bool first = warp < kSplit;  // the block's first row: it sums x²
    if (ADD) {
        const size_t total = size_t(n) * cols;
        for (size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += size_t(gridDim.x) * blockDim.x)
            sum[k] = __fadd_rn(x[k], dl[k]);
    }
    for (int j = 0; j < n; j++) {
        float acc = 0.f;
        double sq = 0;
        if (r < rows)
            acc = split_norm_dot<W, ADD>(w + size_t(r) * cols * W::kSize, x + size_t(j) * cols, dl + (ADD ? size_t(j) * cols : 0),
                                         nw, off, cols, p, first, &sq);
        __syncthreads();  // the previous row's partial sums have been read
        if (lane == 0) {
            part[warp] = acc;
            if (first) sqp[warp] = sq;
        }
        __syncthreads();
        if (p == 0 && lane == 0 && r < rows) {
            const float inv = norm_inv(sqp, cols, eps);
            store(y + size_t(j) * rows + r, __fmul_rn(split_total(part, warp), inv), bias, r, acc_y);
        }
    }
}

// R rows a block, n = 1, the 8 warps splitting the columns: warp v sums
// the 16-byte stretches v, v + 8, v + 16, … of every one of the block's
// rows, so each x stretch is loaded once for R rows (x's L2 traffic is 1/R
// of a row's instead of as much as the weight's) and a lane has R weight
// loads in flight per stretch; the warps' partial sums meet in shared
// memory. An alternative to gemv_split (Device.gemvRows picks it).
//
// rows_partial leaves in part[v][j] warp v's share of row j · x, where row
// j < half is a + j·(row bytes) (if j < na) and row j ≥ half is b + (j −
// half)·(row bytes) (if j − half < nb); missing rows sum to 0. It ends
// with __syncthreads.
template <class W, int R>
__device__ void rows_partial(float (&part)[kWarpsPerBlock][R], const uint8_t* __restrict__ a,
                             const uint8_t* __restrict__ b, int half, int na, int nb,
                             const float* __restrict__ x, int cols) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t rb = size_t(cols) * W::kSize;  // bytes a row
    const uint8_t* row[R];
    bool ok[R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        ok[j] = j < half ? j < na : j - half < nb;
        row[j] = j < half ? a + j * rb : b + (j - half) * rb;
    }
    float acc[R];
#pragma unroll
    for (int j = 0; j < R; j++) acc[j] = 0.f;
    if (W::kVec && rb % 16 == 0) {
#pragma unroll 2
        for (int k = (warp * 32 + lane) * W::kE; k < cols; k += kWarpsPerBlock * 32 * W::kE) {
            uint4 wv[R];
#pragma unroll
            for (int j = 0; j < R; j++)
                wv[j] = ok[j] ? __ldg(reinterpret_cast<const uint4*>(row[j] + size_t(k) * W::kSize)) : uint4{};
            float xv[W::kE];
            const float4* xp = reinterpret_cast<const float4*>(x + k);
#pragma unroll
            for (int q = 0; q < W::kE / 4; q++) {
                const float4 v = __ldg(xp + q);
                xv[4 * q] = v.x;
                xv[4 * q + 1] = v.y;
                xv[4 * q + 2] = v.z;
                xv[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < R; j++) {
                float f[W::kE];
                W::vec(wv[j], f);
#pragma unroll
                for (int e = 0; e < W::kE; e++) acc[j] = fmaf(f[e], xv[e], acc[j]);
            }
        }
    } else {
        for (int k = warp * 32 + lane; k < cols; k += kWarpsPerBlock * 32) {
            const float xk = x[k];
#pragma unroll
            for (int j = 0; j < R; j++)
                if (ok[j]) acc[j] = fmaf(W::one(row[j], k), xk, acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float s = warp_sum(acc[j]);
        if (lane == 0) part[warp][j] = s;
    }
    __syncthreads();
}

// rows_total adds the warps' partial sums of row j in a fixed order.
template <int R>
__device__ inline float rows_total(const float (&part)[kWarpsPerBlock][R], int j) {
    float s = part[0][j];
#pragma unroll
    for (int i = 1; i < kWarpsPerBlock; i++) s += part[i][j];
    return s;
}

template <class W, int R>
__device__ void gemv_rows(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                          int rows, int cols, const float* __restrict__ bias, int acc_y) {
    __shared__ float part[kWarpsPerBlock][R];
    const int r0 = blockIdx.x * R;
    const int nr = min(R, rows - r0);
    rows_partial<W, R>(part, w + size_t(r0) * cols * W::kSize, nullptr, R, nr, 0, x, cols);
    if (int(threadIdx.x) < nr) store(y + r0 + threadIdx.x, rows_total<R>(part, threadIdx.x), bias, r0 + threadIdx.x, acc_y);
}

// F8E4M3 with (ceil(rows/br), ceil(cols/bc)) float32 block scales: each
// weight is rounded to float32 after its scale, as kernels.MatMulRef does.
template <int NB>
__device__ void gemv_f8(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                        const float* __restrict__ scale, int n, int rows, int cols, int br, int bc,
                        const float* __restrict__ bias, int acc_y) {
    const int r = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const uint8_t* row = w + size_t(r) * cols;
    const float* srow = scale + size_t(r / br) * ((cols + bc - 1) / bc);
    for (int j0 = 0; j0 < n; j0 += NB) {
        const int nb = min(NB, n - j0);
        const float* xb = x + size_t(j0) * cols;
        float acc[NB];
#pragma unroll
        for (int j = 0; j < NB; j++) acc[j] = 0.f;
        for (int k = lane; k < cols; k += 32) {
            float wv = __fmul_rn(f8e4m3(row[k]), srow[k / bc]);
#pragma unroll
            for (int j = 0; j < NB; j++)
                if (j < nb) acc[j] = fmaf(wv, xb[size_t(j) * cols + k], acc[j]);
        }
#pragma unroll
        for (int j = 0; j < NB; j++) {
            float s = warp_sum(acc[j]);
            if (lane == 0 && j < nb) store(y + size_t(j0 + j) * rows + r, s, bias, r, acc_y);
        }
    }
}

}  // namespace

#define FERRITE_GEMV(name, W, NB)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y) {                                  \
        gemv<W, NB>(y, x, w, n, rows, cols, bias, acc_y);                                           \
    }

#define FERRITE_GEMV_SPLIT(name, W)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y, int pf) {                          \
        split_prefetch<W>(pf, w, rows, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_split<W>(y, x, w, rows, cols, bias, acc_y);                                            \
    }

#define FERRITE_GEMV_EXACT(name, W)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y, int pf) {                          \
        split_prefetch<W>(pf, w, rows, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_split_rows<W>(y, x, w, n, rows, cols, bias, acc_y);                                    \
    }

#define FERRITE_GEMV_ROWS(name, W, R)                                                               \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y) {                                  \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_rows<W, R>(y, x, w, rows, cols, bias, acc_y);                                          \
    }

#define FERRITE_GEMV_NORM(name, W)                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                               \
        name(float* y, const float* x, const uint8_t* w, int n, int rows, int cols, const float* nw, float eps, \
             int off, const float* bias, int acc_y, int pf) {                                       \
        split_prefetch<W>(pf, w, rows, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_norm_split<W, false>(y, x, nullptr, nullptr, w, n, rows, cols, nw, eps, off, bias, acc_y); \
    }

FERRITE_GEMV_NORM(ferrite_gemv_norm_f32, F32W)
FERRITE_GEMV_NORM(ferrite_gemv_norm_bf16, BF16W)
FERRITE_GEMV_NORM(ferrite_gemv_norm_f16, F16W)

// AddNormLinearCat's form: the input is x + dl, also written to sum.
#define FERRITE_GEMV_ADDNORM(name, W)                                                               \
    extern "C" __global__ void __launch_bounds__(256)                                               \
        name(float* y, const float* x, const uint8_t* w, int n, int rows, int cols, const float* nw, float eps, \
             int off, const float* bias, int acc_y, int pf, const float* dl, float* sum) {          \
        split_prefetch<W>(pf, w, rows, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                         \
        gemv_norm_split<W, true>(y, x, dl, sum, w, n, rows, cols, nw, eps, off, bias, acc_y);       \
    }

FERRITE_GEMV_ADDNORM(ferrite_gemv_addnorm_f32, F32W)
FERRITE_GEMV_ADDNORM(ferrite_gemv_addnorm_bf16, BF16W)
FERRITE_GEMV_ADDNORM(ferrite_gemv_addnorm_f16, F16W)

FERRITE_GEMV_ROWS(ferrite_gemv_f32_r4, F32W, 4)
FERRITE_GEMV_ROWS(ferrite_gemv_f32_r8, F32W, 8)
FERRITE_GEMV_ROWS(ferrite_gemv_bf16_r4, BF16W, 4)
FERRITE_GEMV_ROWS(ferrite_gemv_bf16_r8, BF16W, 8)
FERRITE_GEMV_ROWS(ferrite_gemv_f16_r4, F16W, 4)
FERRITE_GEMV_ROWS(ferrite_gemv_f16_r8, F16W, 8)

FERRITE_GEMV_EXACT(ferrite_gemv_f32_x, F32W)
FERRITE_GEMV_EXACT(ferrite_gemv_bf16_x, BF16W)
FERRITE_GEMV_EXACT(ferrite_gemv_f16_x, F16W)

FERRITE_GEMV_SPLIT(ferrite_gemv_f32_1, F32W)
FERRITE_GEMV(ferrite_gemv_f32_8, F32W, 8)
FERRITE_GEMV_SPLIT(ferrite_gemv_bf16_1, BF16W)
FERRITE_GEMV(ferrite_gemv_bf16_8, BF16W, 8)
FERRITE_GEMV_SPLIT(ferrite_gemv_f16_1, F16W)
FERRITE_GEMV(ferrite_gemv_f16_8, F16W, 8)

extern "C" __global__ void __launch_bounds__(256)
    ferrite_gemv_f8e4m3_1(float* y, const float* x, const uint8_t* w, const float* scale, int n, int rows,
                          int cols, int br, int bc, const float* bias, int acc_y) {
    gemv_f8<1>(y, x, w, scale, n, rows, cols, br, bc, bias, acc_y);
}

extern "C" __global__ void __launch_bounds__(256)
    ferrite_gemv_f8e4m3_8(float* y, const float* x, const uint8_t* w, const float* scale, int n, int rows,
                          int cols, int br, int bc, const float* bias, int acc_y) {
    gemv_f8<8>(y, x, w, scale, n, rows, cols, br, bc, bias, acc_y);
}
