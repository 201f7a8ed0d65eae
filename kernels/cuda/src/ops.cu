// The op set (kernels/ops.go) on the GPU: the element-wise, per-row and
// attention kernels that kernels/cuda's Backend launches for
// kernels.Device (the mixture-of-experts ones are in ops_moe.cu).
// Activations are float32 and every sum is accumulated in float32 (float64
// where kernels/ref uses it and the cost is nothing next to the memory
// traffic: norms, SiLU, sigmoid, RoPE angles).
//
// The sources compile as one translation unit in name order
// (tools/cuda/build_fatbin.sh), so this file uses f32_to_bf16 from
// convert.cu and the weight decoders and warp_sum of gemv.cu.
#include <math.h>
#include <stdint.h>

namespace {

// DType codes, as kernels.DType numbers them.
constexpr int kF32 = 0, kBF16 = 1, kF16 = 2, kF8E4M3 = 3;

__device__ inline float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// silu(g)·u as kernels/ref computes it: silu in float64, rounded, then a
// float32 product.
__device__ inline float swiglu1(float g, float u) {
    const float s = float(double(g) / (1.0 + exp(-double(g))));
    return __fmul_rn(s, u);
}

// swiglu1 with GLM-5's activation clamp at limit > 0 (kernels/ref
// .SwiGLUClamp): silu(min(g, L))·clamp(u, −L, L); limit 0 is no clamp.
__device__ inline float swiglu_clamp1(float g, float u, float limit) {
    if (limit > 0.f) return swiglu1(fminf(g, limit), fmaxf(fminf(u, limit), -limit));
    return swiglu1(g, u);
}

// elem decodes element k of a weight row of the given dtype; srow is the
// row's F8E4M3 block scales (bc columns each).
__device__ inline float elem(const uint8_t* row, int k, int dtype, const float* srow, int bc) {
    switch (dtype) {
    case kF32: return F32W::one(row, k);
    case kBF16: return BF16W::one(row, k);
    case kF16: return F16W::one(row, k);
    default: return __fmul_rn(f8e4m3(row[k]), srow[k / bc]);
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// Element-wise and row ops. Launch: any 1-D grid of 256 threads for the
// grid-stride kernels; one block per row where the comment says so.

// y[i] = silu(g[i])·u[i] for n values; y may be g.
extern "C" __global__ void ferrite_swiglu(float* y, const float* g, const float* u, uint64_t n) {
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
        y[i] = swiglu1(g[i], u[i]);
}

// y[i·inter + j] = swiglu(t[i·2·inter + j], t[i·2·inter + inter + j]) for
// n = rows·inter values of t (rows, 2·inter), the stacked [gate | up]
// product of SwiGLULinear (clamped with limit ≠ 0).
extern "C" __global__ void ferrite_swiglu_cat(float* y, const float* t, uint64_t n, int inter, float limit) {
    FERRITE_PDL_WAIT();
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const uint64_t r = i / inter, j = i % inter;
        y[i] = swiglu_clamp1(t[r * 2 * inter + j], t[r * 2 * inter + inter + j], limit);
    }
}

// ferrite_swiglu_cat over the split GEMM's products (linearSplit): y[i·inter
// + j] = swiglu(g, u) for n = rows·inter values, g and u the hi + lo sums
// of t (2·rows, 2·inter) (rows of hi products, then of lo products), as
// ferrite_add_halves and ferrite_swiglu_cat would give them in two passes.
// With y2 set it also writes y split for the next product's cuBLASLt input,
// as ferrite_f32_to_bf16x2 of y would: y2 (2·rows, inter) bf16.
extern "C" __global__ void ferrite_add_halves_swiglu(float* y, const float* t, uint64_t n, int inter, float limit,
                                                     uint16_t* y2) {
    FERRITE_PDL_WAIT();
    const uint64_t lo = 2 * n;  // the lo products' offset in t
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const uint64_t r = i / inter, j = i % inter, g = r * 2 * inter + j, u = g + inter;
        const float v = swiglu_clamp1(__fadd_rn(t[g], t[lo + g]), __fadd_rn(t[u], t[lo + u]), limit);
        y[i] = v;
        if (y2) {
            const uint16_t hi = f32_to_bf16(v);
            y2[i] = hi;
            y2[n + i] = f32_to_bf16(__fsub_rn(v, __uint_as_float(uint32_t(hi) << 16)));
        }
    }
}

// SwiGLULinear's one-row GEMVs (gemv.cu's split_dot and rows_partial with
// a SwiGLU epilogue).
namespace {

// The SwiGLU MLP's first half at n = 1, w the stacked [gate; up] (2·inter,
// cols): block r runs gate row r on warps 0–3 and up row r on warps 4–7
// (split_dot) and writes y[r] = swiglu(gate, up) (clamped with limit ≠ 0).
// Launch: inter blocks of 256 threads.
template <class W>
__device__ void gemv_swiglu(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                            int inter, int cols, float limit) {
    __shared__ float part[kWarpsPerBlock];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    const int half = warp / kSplit;  // 0: gate, 1: up
    const float acc = split_dot<W>(w + (size_t(half) * inter + r) * cols * W::kSize, x, cols, warp % kSplit);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) y[r] = swiglu_clamp1(split_total(part, 0), split_total(part, kSplit), limit);
}

// gemv_swiglu with gemv.cu's fused RMSNorm (NormSwiGLULinear), over n
// rows of x one after another, each as for that row alone: block r's
// warps 0–3 sum gate row r and warps 4–7 up row r (split_norm_dot), the
// gate warps also the squares for the norm scale, and y[j, r] =
// swiglu(inv·gate, inv·up). Launch: inter blocks
// of 256 threads.
template <class W>
__device__ void gemv_norm_swiglu(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                                 int n, int inter, int cols, const float* __restrict__ nw, float eps, int off,
                                 float limit) {
    __shared__ float part[kWarpsPerBlock];
    __shared__ double sqp[kSplit];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x;
    const int half = warp / kSplit;  // 0: gate, 1: up
    const uint8_t* row = w + (size_t(half) * inter + r) * cols * W::kSize;
    for (int j = 0; j < n; j++) {
        double sq = 0;
        const float acc =
            split_norm_dot<W, false>(row, x + size_t(j) * cols, nullptr, nw, off, cols, warp % kSplit, half == 0, &sq);
        __syncthreads();  // the previous row's partial sums have been read
        if (lane == 0) {
            part[warp] = acc;
            if (half == 0) sqp[warp] = sq;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const float inv = norm_inv(sqp, cols, eps);
            y[size_t(j) * inter + r] = swiglu_clamp1(__fmul_rn(split_total(part, 0), inv),
                                                     __fmul_rn(split_total(part, kSplit), inv), limit);
        }
    }
}

// gemv_swiglu with gemv_rows' layout: block b computes the R/2 outputs
// from row b·R/2 on, reading those gate rows and the matching up rows (R
// weight rows a block). Launch: ceil(inter / (R/2)) blocks of 256 threads.
template <class W, int R>
__device__ void gemv_swiglu_rows(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                                 int inter, int cols, float limit) {
    constexpr int H = R / 2;
    __shared__ float part[kWarpsPerBlock][R];
    const int r0 = blockIdx.x * H;
    const int nh = min(H, inter - r0);
    const size_t rb = size_t(cols) * W::kSize;
    rows_partial<W, R>(part, w + size_t(r0) * rb, w + (size_t(inter) + r0) * rb, H, nh, nh, x, cols);
    if (int(threadIdx.x) < nh)
        y[r0 + threadIdx.x] = swiglu_clamp1(rows_total<R>(part, threadIdx.x), rows_total<R>(part, H + threadIdx.x), limit);
}

}  // namespace

#define FERRITE_GEMV_SWIGLU_ROWS(name, W, R)                                                          \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int inter, int cols, float limit) {          \
        FERRITE_PDL_WAIT();                                                                           \
        gemv_swiglu_rows<W, R>(y, x, w, inter, cols, limit);                                          \
    }

FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_f32_r4, F32W, 4)
FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_f32_r8, F32W, 8)
FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_bf16_r4, BF16W, 4)
FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_bf16_r8, BF16W, 8)
FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_f16_r4, F16W, 4)
FERRITE_GEMV_SWIGLU_ROWS(ferrite_gemv_swiglu_f16_r8, F16W, 8)

// swiglu_prefetch is weight_prefetch of block r's gate row r and up row r
// of the stacked [gate; up] (inter, cols) each.
template <class W>
__device__ inline void swiglu_prefetch(int pf, const uint8_t* w, int inter, int cols) {
    const size_t rb = size_t(cols) * W::kSize;
    weight_prefetch(pf, w + size_t(blockIdx.x) * rb, rb);
    weight_prefetch(pf, w + (size_t(inter) + blockIdx.x) * rb, rb);
}

#define FERRITE_GEMV_SWIGLU(name, W)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int inter, int cols, float limit, int pf) {  \
        swiglu_prefetch<W>(pf, w, inter, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                           \
        gemv_swiglu<W>(y, x, w, inter, cols, limit);                                                  \
    }

#define FERRITE_GEMV_NORM_SWIGLU(name, W)                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                 \
        name(float* y, const float* x, const uint8_t* w, int n, int inter, int cols, const float* nw, float eps, \
             int off, float limit, int pf) {                                                          \
        swiglu_prefetch<W>(pf, w, inter, cols);                                                       \
        FERRITE_PDL_WAIT();                                                                           \
        gemv_norm_swiglu<W>(y, x, w, n, inter, cols, nw, eps, off, limit);                            \
    }

FERRITE_GEMV_NORM_SWIGLU(ferrite_gemv_norm_swiglu_f32, F32W)
FERRITE_GEMV_NORM_SWIGLU(ferrite_gemv_norm_swiglu_bf16, BF16W)
FERRITE_GEMV_NORM_SWIGLU(ferrite_gemv_norm_swiglu_f16, F16W)

FERRITE_GEMV_SWIGLU(ferrite_gemv_swiglu_f32, F32W)
FERRITE_GEMV_SWIGLU(ferrite_gemv_swiglu_bf16, BF16W)
FERRITE_GEMV_SWIGLU(ferrite_gemv_swiglu_f16, F16W)

// y[i] += bias[i % cols] for n·cols values (the cuBLASLt path's bias).
extern "C" __global__ void ferrite_add_bias(float* y, const float* bias, uint64_t n, int cols) {
    FERRITE_PDL_WAIT();
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
        y[i] += bias[i % cols];
}

// Splits n float32 values into two bfloat16 terms, dst[i] = hi = bf16(x)
// and dst[n + i] = bf16(x − hi), so that hi + lo carries 16 bits of x's
// mantissa: a GEMM over the stacked (2·rows, cols) input is accurate to
// about 2⁻¹⁷·Σ|x·w| while it still reads the weight once.
extern "C" __global__ void ferrite_f32_to_bf16x2(uint16_t* dst, const float* src, uint64_t n) {
    FERRITE_PDL_WAIT();
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const float x = src[i];
        const uint16_t hi = f32_to_bf16(x);
        dst[i] = hi;
        dst[n + i] = f32_to_bf16(__fsub_rn(x, __uint_as_float(uint32_t(hi) << 16)));
    }
}

// The epilogue of the split GEMM: y[i] = t[i] + t[n + i] (+ bias[i % cols])
// (+ y[i] when acc) for n = rows·cols values of t (2·rows, cols).
extern "C" __global__ void ferrite_add_halves(float* y, const float* t, const float* bias, uint64_t n, int cols,
                                              int acc) {
    FERRITE_PDL_WAIT();
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        float v = __fadd_rn(t[i], t[n + i]);
        if (bias) v = __fadd_rn(v, bias[i % cols]);
        if (acc) v = __fadd_rn(v, y[i]);
        y[i] = v;
    }
}

// Row copy: rows of row_bytes bytes, dst_stride and src_stride bytes apart,
// every 16-byte (else 4-byte, else single-byte) piece of every row a
// grid-stride step, so one long row (a recurrent state) spreads over the
// GPU like many short ones. Launch: any 1-D grid of 256 threads.
namespace {
template <class T>
__device__ inline void copy_rows_as(uint8_t* dst, int64_t dst_stride, const uint8_t* src, int64_t src_stride, int rows,
                                    int row_bytes) {
    const int64_t per = row_bytes / int64_t(sizeof(T)), total = per * rows;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = i / per, c = i - r * per;
        reinterpret_cast<T*>(dst + r * dst_stride)[c] = reinterpret_cast<const T*>(src + r * src_stride)[c];
    }
}
}  // namespace

extern "C" __global__ void ferrite_copy_rows(uint8_t* dst, int64_t dst_stride, const uint8_t* src, int64_t src_stride,
                                             int rows, int row_bytes) {
    const int64_t a = int64_t(row_bytes) | dst_stride | src_stride | int64_t(uintptr_t(dst)) | int64_t(uintptr_t(src));
    if (a % 16 == 0)
        copy_rows_as<uint4>(dst, dst_stride, src, src_stride, rows, row_bytes);
    else if (a % 4 == 0)
        copy_rows_as<uint32_t>(dst, dst_stride, src, src_stride, rows, row_bytes);
    else
        copy_rows_as<uint8_t>(dst, dst_stride, src, src_stride, rows, row_bytes);
}

namespace {

// embed_id is the embedding gathers' start, a block a row of y: it sets yr
// to block i's row of y (cols wide) and returns its id in the table (rows
// long), or −1 where the id is outside it, after writing NaN into the row.
__device__ inline int embed_id(float*& yr, float* y, int y_stride, const int* ids, int ids_stride, int rows, int cols) {
    const int i = blockIdx.x;
    const int id = ids[size_t(i) * ids_stride];
    yr = y + size_t(i) * y_stride;
    if (id < 0 || id >= rows) {
        for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __int_as_float(0x7fc00000);
        return -1;
    }
    return id;
}

}  // namespace

// Embedding gather: y[i] (cols) = row ids[i] of the weight w (rows, cols),
// decoded exactly as kernels.Mat.RowF32 (an F8E4M3 weight with its block
// scales). An id outside the table writes NaN. Launch: one block per row.
extern "C" __global__ void ferrite_embed(float* y, int y_stride, const uint8_t* w, const float* scale, const int* ids,
                                         int ids_stride, int n, int rows, int cols, int dtype, int br, int bc) {
    FERRITE_PDL_WAIT();
    if (int(blockIdx.x) >= n) return;
    float* yr;
    const int id = embed_id(yr, y, y_stride, ids, ids_stride, rows, cols);
    if (id < 0) return;
    const int size = dtype == kF32 ? 4 : dtype == kF8E4M3 ? 1 : 2;
    const uint8_t* row = w + size_t(id) * cols * size;
    const float* srow = dtype == kF8E4M3 ? scale + size_t(id / br) * ((cols + bc - 1) / bc) : nullptr;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = elem(row, c, dtype, srow, bc);
}

// Row gather: y[i] (cols) = x[rows[i]]; a row outside x writes NaN.
// Launch: one block per output row.
extern "C" __global__ void ferrite_gather_rows(float* y, int y_stride, const float* x, int x_stride, const int* rows,
                                               int rows_stride, int m, int cols, int nsrc) {
    FERRITE_PDL_WAIT();
    const int i = blockIdx.x;
    if (i >= m) return;
    const int r = rows[size_t(i) * rows_stride];
    float* yr = y + size_t(i) * y_stride;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        yr[c] = (r >= 0 && r < nsrc) ? x[size_t(r) * x_stride + c] : __int_as_float(0x7fc00000);
}

// rms_delta is add_rmsnorm's delta at (row r, column i): delta's value, or
// with HALVES the sum of the split product's halves in delta (+ bias), as
// ferrite_add_halves adds them.
template <bool HALVES>
__device__ inline float rms_delta(const float* delta, const float* bias, int rows, int dim, int r, int i) {
    if (!HALVES) return delta[size_t(r) * dim + i];
    float v = __fadd_rn(delta[size_t(r) * dim + i], delta[(size_t(rows) + r) * dim + i]);
    if (bias) v = __fadd_rn(v, bias[i]);
    return v;
}

// Fused residual add and RMSNorm: with delta set, res += delta first; then
// y = w ⊙ res·rsqrt(mean(res²) + eps) ((1 + w) with offset), the mean of
// squares summed in float64 and rounded to float32 before eps, as
// kernels/ref.RMSNorm. Rows are dim values apart; y may be res (plain
// RMSNorm in place). With sum set, res + delta goes to sum and res
// stays (AddNormLinearCat). Launch: one block per row, a multiple of 32 threads
// up to 1024 (256 for many rows, 1024 for a few: a decode step's single
// row is latency, not throughput). With sum set, res + delta goes to sum
// and res stays (AddNormLinearCat). add_rmsnorm is its body; with SPLIT it
// writes each normed value as cuBLASLt's split input instead
// (ferrite_f32_to_bf16x2 of y): y2 (2·rows, dim) bf16, hi = bf16(v) in row
// r, lo = bf16(v − hi) in row rows + r.
//
// With HALVES, delta is a split product's two halves t (2·rows, dim) (the
// hi rows, then the lo rows) and the value added is ferrite_add_halves':
// t[r] + t[rows + r] (+ hbias): ferrite_add_halves with acc into res and
// then this norm, in one pass and with the same bits.
template <bool SPLIT, bool HALVES = false>
__device__ void add_rmsnorm(float* y, uint16_t* y2, float* res, const float* delta, const float* w, int rows, int dim,
                            float eps, int offset, float* sum, const float* hbias = nullptr) {
    __shared__ double partial[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* in = res + size_t(r) * dim;
    float* xr = (sum && delta ? sum : res) + size_t(r) * dim;  // where res + delta goes
    float* yr = SPLIT ? nullptr : y + size_t(r) * dim;
    // The first kPre values of each thread and their weights stay in
    // registers for the second pass (the weights load with the values,
    // off the reduction's path).
    constexpr int kPre = 4;
    float xk[kPre], wk[kPre];
    double ss = 0;
#pragma unroll
    for (int j = 0; j < kPre; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        xk[j] = wk[j] = 0.f;
        if (i < dim) {
            float v = in[i];
            wk[j] = w[i];
            if (delta) {
                v = __fadd_rn(v, rms_delta<HALVES>(delta, hbias, rows, dim, r, i));
                xr[i] = v;
            }
            xk[j] = v;
            ss += double(v) * double(v);
        }
    }
    for (int i = threadIdx.x + kPre * blockDim.x; i < dim; i += blockDim.x) {
        float v = in[i];
        if (delta) {
            v = __fadd_rn(v, rms_delta<HALVES>(delta, hbias, rows, dim, r, i));
            xr[i] = v;
        }
        ss += double(v) * double(v);
    }
    ss = warp_sum_f64(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < int(blockDim.x >> 5); i++) t += partial[i];
        partial[0] = t;
    }
    __syncthreads();
    const float ms = float(partial[0] / double(dim));
    const float inv = float(1.0 / sqrt(double(__fadd_rn(ms, eps))));
    for (int i = threadIdx.x, j = 0; i < dim; i += blockDim.x, j++) {
        float wi, xi;
        if (j < kPre) {  // unrolled below kPre: registers, not a local array
#pragma unroll
            for (int q = 0; q < kPre; q++) {
                if (q == j) wi = wk[q], xi = xk[q];
            }
        } else {
            wi = w[i], xi = xr[i];
        }
        const float s = offset ? __fadd_rn(1.0f, wi) : wi;
        const float v = __fmul_rn(s, __fmul_rn(xi, inv));
        if (SPLIT) {
            const uint16_t hi = f32_to_bf16(v);
            y2[size_t(r) * dim + i] = hi;
            y2[(size_t(rows) + r) * dim + i] = f32_to_bf16(__fsub_rn(v, __uint_as_float(uint32_t(hi) << 16)));
        } else {
            yr[i] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    ferrite_add_rmsnorm(float* y, float* res, const float* delta, const float* w, int rows, int dim, float eps,
                        int offset, float* sum) {
    FERRITE_PDL_WAIT();
    add_rmsnorm<false>(y, nullptr, res, delta, w, rows, dim, eps, offset, sum);
}

// ferrite_rmsnorm_bf16x2 is ferrite_add_rmsnorm without delta writing y2,
// the normed rows split for cuBLASLt (NormLinearCat, NormSwiGLULinear).
extern "C" __global__ void __launch_bounds__(1024)
    ferrite_rmsnorm_bf16x2(uint16_t* y2, const float* x, const float* w, int rows, int dim, float eps, int offset) {
    FERRITE_PDL_WAIT();
    add_rmsnorm<true>(nullptr, y2, const_cast<float*>(x), nullptr, w, rows, dim, eps, offset, nullptr);
}

// ferrite_halves_rmsnorm_bf16x2 is ferrite_add_halves of a split product
// t (2·rows, dim) with its bias (or none) into res (acc), then
// ferrite_rmsnorm_bf16x2 of res into y2: one launch for two, the same bits
// (a decode batch's o or down projection and the next sublayer's norm;
// opset.go's halvesFix).
extern "C" __global__ void __launch_bounds__(1024)
    ferrite_halves_rmsnorm_bf16x2(uint16_t* y2, float* res, const float* t, const float* bias, const float* w, int rows,
                                  int dim, float eps, int offset) {
    FERRITE_PDL_WAIT();
    add_rmsnorm<true, true>(nullptr, y2, res, t, w, rows, dim, eps, offset, nullptr, bias);
}

// Rotary embedding in place over x (n, heads·hd): the first 2·half dims of
// every head, at its row's position, angle = float32(pos)·inv[i] in float32
// and cos/sin in float64, rounded and scaled (kernels/ref.RopeAngles);
// pairs (2i, 2i+1) when interleaved, else (i, i + half).
extern "C" __global__ void ferrite_rope(float* x, const int* pos, int pos_stride, const float* inv, int n, int heads,
                                        int hd, int half, int interleaved, float scale) {
    FERRITE_PDL_WAIT();
    const uint64_t total = uint64_t(n) * heads * half;
    for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total; t += uint64_t(gridDim.x) * blockDim.x) {
        const int i = int(t % half);
        const int h = int((t / half) % heads);
        const int r = int(t / (uint64_t(half) * heads));
        const int p = pos[size_t(r) * pos_stride];
        const double a = double(__fmul_rn(float(p), inv[i]));
        const float c = __fmul_rn(float(cos(a)), scale), s = __fmul_rn(float(sin(a)), scale);
        float* v = x + (size_t(r) * heads + h) * hd;
        float* pa = interleaved ? v + 2 * i : v + i;
        float* pb = interleaved ? v + 2 * i + 1 : v + i + half;
        const float a0 = *pa, b0 = *pb;
        *pa = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, s));
        *pb = __fadd_rn(__fmul_rn(b0, c), __fmul_rn(a0, s));
    }
}

// KV store: kc[slot[i]] = k[i], vc[slot[i]] = v[i] over width values, the
// cache float32 or bf16 (round to nearest even); a slot outside [0, slots)
// is skipped.
extern "C" __global__ void ferrite_store_kv(void* kc, void* vc, const float* k, int k_stride, const float* v,
                                            int v_stride, const int* slot, int slot_stride, int n, int width,
                                            int slots, int bf16) {
    const uint64_t total = uint64_t(n) * width;
    for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total; t += uint64_t(gridDim.x) * blockDim.x) {
        const int i = int(t / width), j = int(t % width);
        const int s = slot[size_t(i) * slot_stride];
        if (s < 0 || s >= slots) continue;
        const float kv = k[size_t(i) * k_stride + j], vv = v[size_t(i) * v_stride + j];
        const size_t e = size_t(s) * width + j;
        if (bf16) {
            static_cast<uint16_t*>(kc)[e] = f32_to_bf16(kv);
            static_cast<uint16_t*>(vc)[e] = f32_to_bf16(vv);
        } else {
            static_cast<float*>(kc)[e] = kv;
            static_cast<float*>(vc)[e] = vv;
        }
    }
}

// The attention input step (kernels.AttentionOps.PrepareQKV), one warp a
// head, shared by ferrite_prepare_qkv and the attention kernels' QKV form
// (QKVAttention), so both give the same bits.
namespace {

constexpr int kPrepWarps = 4;  // heads a ferrite_prepare_qkv block takes

// PrepArgs are PrepareQKV's parameters besides the rows: the q and k norm
// weights (null: none) with their eps, the flags (bit 0: q norm offset,
// bit 1: k norm offset, bit 2: interleaved rotation) and the rotation
// (inv null: none; half pairs, cos/sin scaled by scale).
struct PrepArgs {
    const float* qn;
    const float* kn;
    const float* inv;
    float qeps, keps, scale;
    int half, flags;
};

// prep_norm copies the head of hd values at src into vw (shared memory) for
// one warp and, for a q (kind 0) or k (kind 1) head with a norm weight,
// norms it (the float64 sum of squares, lane by lane over elements lane,
// lane + 32, … and then across the warp, the mean rounded to float32 as
// kernels/ref.RMSNorm). It reports whether the head is rotated next (not
// a v head, kind 2, which is only copied). Every lane of the warp calls it.
// With lo set, src and lo are the head in a split product's two halves and
// the head is their sum (+ bias, the head's bias values), as
// ferrite_add_halves sums them, also written to sum.
__device__ bool prep_norm(float* vw, const float* src, int hd, int kind, const PrepArgs& a, const float* lo = nullptr,
                          const float* bias = nullptr, float* sum = nullptr) {
    const int lane = threadIdx.x & 31;
    if (lo) {
        for (int d = lane; d < hd; d += 32) {
            float v = __fadd_rn(src[d], lo[d]);
            if (bias) v = __fadd_rn(v, bias[d]);
            vw[d] = v;
            sum[d] = v;
        }
    } else {
        for (int d = lane; d < hd; d += 32) vw[d] = src[d];
    }
    __syncwarp();
    if (kind == 2) return false;
    const float* w = kind == 0 ? a.qn : a.kn;
    if (w) {
        const float eps = kind == 0 ? a.qeps : a.keps;
        const bool off = (a.flags >> kind) & 1;
        double ss = 0;
        for (int d = lane; d < hd; d += 32) ss += double(vw[d]) * double(vw[d]);
        ss = warp_sum_f64(ss);
        const float ms = float(ss / double(hd));
        const float rs = float(1.0 / sqrt(double(__fadd_rn(ms, eps))));
        for (int d = lane; d < hd; d += 32) {
            const float sc = off ? __fadd_rn(1.0f, w[d]) : w[d];
            vw[d] = __fmul_rn(sc, __fmul_rn(vw[d], rs));
        }
        __syncwarp();
    }
    return a.inv != nullptr;
}

// prep_rotate rotates pair k of the head in vw by the angle of cosine c and
// sine sn (ferrite_rope's products; interleaved pairs with flags bit 2).
__device__ inline void prep_rotate(float* vw, int k, float c, float sn, const PrepArgs& a) {
    const bool il = (a.flags >> 2) & 1;
    const int ia = il ? 2 * k : k, ib = il ? 2 * k + 1 : k + a.half;
    const float a0 = vw[ia], b0 = vw[ib];
    vw[ia] = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(b0, sn));
    vw[ib] = __fadd_rn(__fmul_rn(b0, c), __fmul_rn(a0, sn));
}

// prep_head is one warp's PrepareQKV of the head of hd values at src into
// vw (shared memory): a q or k head is normed (prep_norm; lo, bias and sum
// as there) and rotated at position pos (ferrite_rope's angles), a v head
// copied. Every lane of the warp calls it.
__device__ void prep_head(float* vw, const float* src, int hd, int kind, const PrepArgs& a, int pos,
                          const float* lo = nullptr, const float* bias = nullptr, float* sum = nullptr) {
    if (!prep_norm(vw, src, hd, kind, a, lo, bias, sum)) return;
    for (int k = threadIdx.x & 31; k < a.half; k += 32) {
        const double ang = double(__fmul_rn(float(pos), a.inv[k]));
        prep_rotate(vw, k, __fmul_rn(float(cos(ang)), a.scale), __fmul_rn(float(sin(ang)), a.scale), a);
    }
    __syncwarp();
}

// head_put is a warp's store of the hd values of vw at element e of a
// cache, float32 or bf16 (round to nearest even).
__device__ inline void head_put(void* c, bool bf16, size_t e, const float* vw, int hd) {
    for (int d = threadIdx.x & 31; d < hd; d += 32) {
        if (bf16) static_cast<uint16_t*>(c)[e + d] = f32_to_bf16(vw[d]);
        else static_cast<float*>(c)[e + d] = vw[d];
    }
}

}  // namespace

namespace {

// prepare_qkv is ferrite_prepare_qkv's body; with lo set (an element
// offset into qkv), qkv holds a split product's halves (prep_head), bias
// (or null) its bias, and their sums go to sum (n, (heads + 2·kvh)·hd).
__device__ void prepare_qkv(float* q, void* kc, void* vc, const float* qkv, const int* pos, int pos_stride, const int* slot,
                            int slot_stride, int slots, int bf16, int heads, int kvh, int hd, const PrepArgs& a, size_t lo,
                            const float* bias, float* sum) {
    __shared__ float v[kPrepWarps][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x, h = blockIdx.y * kPrepWarps + warp;
    if (h >= heads + 2 * kvh) return;
    const int kind = h < heads ? 0 : h < heads + kvh ? 1 : 2;  // q, k, v
    const size_t at = (size_t(i) * (heads + 2 * kvh) + h) * hd;
    prep_head(v[warp], qkv + at, hd, kind, a, pos[size_t(i) * pos_stride], lo ? qkv + at + lo : nullptr,
              bias ? bias + size_t(h) * hd : nullptr, lo ? sum + at : nullptr);
    if (kind == 0) {
        float* dst = q + (size_t(i) * heads + h) * hd;
        for (int d = lane; d < hd; d += 32) dst[d] = v[warp][d];
        return;
    }
    const int s = slot[size_t(i) * slot_stride];
    if (s < 0 || s >= slots) return;
    const int kh = kind == 1 ? h - heads : h - heads - kvh;
    head_put(kind == 1 ? kc : vc, bf16, size_t(s) * kvh * hd + size_t(kh) * hd, v[warp], hd);
}

}  // namespace

// ferrite_prepare_qkv: warp w of block (row i, y) takes head h = 4y + w of
// qkv (n, (heads + 2·kvh)·hd) [q | k | v] (prep_head) and writes a q head
// to q, a k or v head to the cache (float32 or bf16) at the row's slot; a
// slot outside [0, slots) is skipped. flags as PrepArgs. Launch: grid (n,
// ceil((heads + 2·kvh) / 4)), 128 threads; hd ≤ 256.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_prepare_qkv(float* q, void* kc, void* vc, const float* qkv, const int* pos, int pos_stride, const int* slot,
                        int slot_stride, int slots, int bf16, int heads, int kvh, int hd, const float* qn, float qeps,
                        const float* kn, float keps, const float* inv, int half, float scale, int flags) {
    FERRITE_PDL_WAIT();
    const PrepArgs a{qn, kn, inv, qeps, keps, scale, half, flags};
    prepare_qkv(q, kc, vc, qkv, pos, pos_stride, slot, slot_stride, slots, bf16, heads, kvh, hd, a, 0, nullptr, nullptr);
}

// ferrite_prepare_qkv_halves is ferrite_prepare_qkv of the sum of a split
// product's two halves t (2·n, (heads + 2·kvh)·hd) (+ bias), which it also
// writes to qkv (n, (heads + 2·kvh)·hd) as ferrite_add_halves would: the
// q/k/v product's epilogue and PrepareQKV in one launch, the same bits
// (halves.go). Launch as ferrite_prepare_qkv.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_prepare_qkv_halves(float* q, void* kc, void* vc, const float* t, const int* pos, int pos_stride, const int* slot,
                               int slot_stride, int slots, int bf16, int heads, int kvh, int hd, const float* qn, float qeps,
                               const float* kn, float keps, const float* inv, int half, float scale, int flags,
                               const float* bias, float* qkv) {
    FERRITE_PDL_WAIT();
    const PrepArgs a{qn, kn, inv, qeps, keps, scale, half, flags};
    const size_t lo = size_t(gridDim.x) * (heads + 2 * kvh) * hd;  // n rows of hi products first
    prepare_qkv(q, kc, vc, t, pos, pos_stride, slot, slot_stride, slots, bf16, heads, kvh, hd, a, lo, bias, qkv);
}

// ---------------------------------------------------------------------------
// Paged causal attention, split-KV. Block (row i, KV head, head chunk,
// split z) computes, for up to G (kAttnGroup or 4) query heads of the KV head's
// group, the softmax-weighted sum of the values over the keys of positions
// [z·split, min((z+1)·split, pos[i]+1)) of the row's sequence, with an
// online (running max) softmax in float32. Each warp takes tiles of 32 keys,
// one key per lane for the scores and then the lanes split the head dims to
// add the tile's values. With one split the block writes out directly;
// otherwise it writes (max, sum, acc[hd]) per head to part, and either
// ferrite_attn_combine merges the splits (cnt null) or the last block of
// each (row, KV head, chunk) to finish does, in the same kernel: cnt holds
// one zeroed counter per (row, blockIdx.y), which that block sets back to
// 0. Both merge with split_merge, so they give the same bits.
//
// Launch: grid (n, kvHeads·chunks, splits), 128 threads; hd ≤ 32·DPL.

namespace {

constexpr int kAttnWarps = 4;

// prefill_owns reports whether prefill.cu's kernel, at row tiles of rows,
// computes the tile of row i (rows [r0, min(n, r0 + rows)), r0 = i − i %
// rows): all of its rows are of one sequence. The split-KV kernel,
// launched after it with ptile = rows, skips those rows. Every lane of the
// calling warp must take part.
__device__ inline bool prefill_owns(const int* seq, int n, int i, int rows) {
    const int r0 = i - i % rows, s = seq[r0];
    bool same = true;
    for (int r = r0 + int(threadIdx.x & 31); r < min(n, r0 + rows); r += 32) same = same && seq[r] == s;
    return __all_sync(0xffffffffu, same);
}
constexpr int kAttnGroup = 8;  // query heads a block handles
constexpr int kAttnMaxHD = 256;

struct AttnArgs {
    float* out;
    const float* q;
    const void* kc;
    const void* vc;
    const int* pos;
    const int* seq;
    const int* blocks;
    float* part;
    int max_blocks, bs, n, heads, kvh, hd, chunks, split;
    float scale;
    int ptile;  // prefill.cu's row tile when it ran first (prefill_owns), else 0
    int* cnt;   // the split counters when the last block merges the splits, else null
    int pf;     // attn_prefetch before the PDL wait
    // The QKV form only (one row): the q/k/v product's row, the row's cache
    // slot, the cache's slots and PrepareQKV's parameters.
    const float* qkv;
    const int* slot;
    int slots;
    PrepArgs prep;
    // With out2 set, out is also written split into bf16 hi and lo rows
    // (2·n, heads·hd), the o projection's cuBLASLt input (halves.go).
    uint16_t* out2;
};

// attn_out stores element e of the attention's output v: to out, and with
// out2 split into its bf16 terms, lo elements after hi
// (ferrite_f32_to_bf16x2's bits).
__device__ inline void attn_out(float* out, uint16_t* out2, size_t lo, size_t e, float v) {
    out[e] = v;
    if (out2) {
        const uint16_t hi = f32_to_bf16(v);
        out2[e] = hi;
        out2[lo + e] = f32_to_bf16(__fsub_rn(v, __uint_as_float(uint32_t(hi) << 16)));
    }
}

// attn_put is attn_out of the kernel's arguments.
__device__ inline void attn_put(const AttnArgs& a, size_t e, float v) {
    attn_out(a.out, a.out2, size_t(a.n) * a.heads * a.hd, e, v);
}

// attn_prefetch, with a.pf set, asks L2 for the keys and values of the
// block's split before the kernel waits for the one before it: a thread a
// position. The step's positions, sequences and block table are its
// inputs, written before its kernels, and past positions' keys and values
// were stored by earlier steps; the row's own key, which the kernel before
// may still be storing, is only prefetched (L2 is coherent), never read
// here.
template <bool BF>
__device__ inline void attn_prefetch(const AttnArgs& a) {
    if (!a.pf || a.ptile) return;
    const int i = blockIdx.x, kvh = blockIdx.y / a.chunks;
    const int len = a.pos[i] + 1;
    const int k0 = blockIdx.z * a.split, k1 = min(len, k0 + a.split);
    const int* bt = a.blocks + size_t(a.seq[i]) * a.max_blocks;
    const size_t kw = size_t(a.kvh) * a.hd, off = size_t(kvh) * a.hd;
    constexpr int esz = BF ? 2 : 4;
    const int rowb = a.hd * esz;
    for (int p = k0 + int(threadIdx.x); p < k1; p += blockDim.x) {
        const size_t e = ((size_t(bt[p / a.bs]) * a.bs + p % a.bs) * kw + off) * esz;
        const char* kp = static_cast<const char*>(a.kc) + e;
        const char* vp = static_cast<const char*>(a.vc) + e;
        for (int o = 0; o < rowb; o += 128) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(kp + o));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(vp + o));
        }
    }
}

// split_merge is element d of a head's output from its splits' partials
// pp (splits × (hd + 2): max, sum, acc[hd]), read from L2 (other blocks
// wrote them), merged in split order.
__device__ inline float split_merge(const float* pp, int splits, int hd, int d) {
    float mx = -INFINITY;
    for (int z = 0; z < splits; z++) mx = fmaxf(mx, __ldcg(pp + z * (hd + 2)));
    float L = 0.f, A = 0.f;
    for (int z = 0; z < splits; z++) {
        const float mz = __ldcg(pp + z * (hd + 2));
        if (mz == -INFINITY) continue;
        const float c = expf(mz - mx);
        L += __ldcg(pp + z * (hd + 2) + 1) * c;
        A += __ldcg(pp + z * (hd + 2) + 2 + d) * c;
    }
    return A / L;
}

// kv_at reads cache element e; with CG from L2 (ld.global.cg: the QKV
// attention form reads the key and value its own block stored).
template <bool BF, bool CG = false>
__device__ inline float kv_at(const void* c, size_t e) {
    if (BF) {
        const uint16_t* p = static_cast<const uint16_t*>(c) + e;
        return __uint_as_float(uint32_t(CG ? __ldcg(p) : *p) << 16);
    }
    const float* p = static_cast<const float*>(c) + e;
    return CG ? __ldcg(p) : *p;
}

// kv8 widens 8 consecutive cache values at element e (a multiple of 8) into o.
template <bool BF, bool CG = false>
__device__ inline void kv8(const void* c, size_t e, float* o) {
    if (BF) {
        const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(c) + e);
        BF16W::vec(CG ? __ldcg(p) : __ldg(p), o);
    } else {
        const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(c) + e);
        F32W::vec(CG ? __ldcg(p) : *p, o);
        F32W::vec(CG ? __ldcg(p + 1) : *(p + 1), o + 4);
    }
}

// kv_run widens the N consecutive cache values at element e (N a power of
// two ≤ 8, e a multiple of N) into o with one load (two for 8 float32);
// with CG from L2 as kv_at.
template <bool BF, bool CG, int N>
__device__ inline void kv_run(const void* c, size_t e, float* o) {
    if constexpr (BF) {
        const uint16_t* p = static_cast<const uint16_t*>(c) + e;
        if constexpr (N == 8) {
            const uint4* q = reinterpret_cast<const uint4*>(p);
            BF16W::vec(CG ? __ldcg(q) : *q, o);
        } else if constexpr (N == 4) {
            const uint2* q = reinterpret_cast<const uint2*>(p);
            const uint2 v = CG ? __ldcg(q) : *q;
            BF16W::pair(v.x, o);
            BF16W::pair(v.y, o + 2);
        } else if constexpr (N == 2) {
            const unsigned* q = reinterpret_cast<const unsigned*>(p);
            BF16W::pair(CG ? __ldcg(q) : *q, o);
        } else {
            o[0] = kv_at<BF, CG>(c, e);
        }
    } else {
        const float* p = static_cast<const float*>(c) + e;
        if constexpr (N >= 4) {
#pragma unroll
            for (int k = 0; k < N / 4; k++) {
                const float4* q = reinterpret_cast<const float4*>(p) + k;
                const float4 v = CG ? __ldcg(q) : *q;
                o[4 * k] = v.x, o[4 * k + 1] = v.y, o[4 * k + 2] = v.z, o[4 * k + 3] = v.w;
            }
        } else if constexpr (N == 2) {
            const float2* q = reinterpret_cast<const float2*>(p);
            const float2 v = CG ? __ldcg(q) : *q;
            o[0] = v.x, o[1] = v.y;
        } else {
            o[0] = kv_at<BF, CG>(c, e);
        }
    }
}

// attn_block is the attention kernels' whole body (their macro only packs
// the arguments), so it starts with their programmatic-launch wait (after
// attn_prefetch, which reads only the step's inputs and past keys). G is
// the query heads a block handles (G, or 4 for groups of up to 4
// heads: no work on empty heads); every head's sums are the same whatever
// G, so the two give the same bits. The queries and each tile's
// probabilities are read from shared memory four at a time.
template <int DPL, bool BF, int G, bool QKV>
__device__ void attn_block(const AttnArgs& a) {
    attn_prefetch<BF>(a);
    FERRITE_PDL_WAIT();
    __shared__ __align__(16) float sq[G][kAttnMaxHD];
    __shared__ __align__(16) float pw[kAttnWarps][G][32];  // each warp's tile probabilities
    __shared__ float wm[kAttnWarps][G], wl[kAttnWarps][G];
    __shared__ float wacc[kAttnWarps][G][kAttnMaxHD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x;
    if (a.ptile && prefill_owns(a.seq, a.n, i, a.ptile)) return;
    const int kvh = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks;
    const int grp = a.heads / a.kvh;
    const int h0 = kvh * grp + chunk * G;
    const int ng = min(G, grp - chunk * G);
    const int hd = a.hd;
    // A lane's DPL value dims are consecutive (one load a key) when the
    // head fills the lanes exactly, else lane, lane + 32, … (the sums per
    // dim are the same either way).
    const bool cont = hd == 32 * DPL;
    const int len = a.pos[i] + 1;
    const int k0 = blockIdx.z * a.split, k1 = min(len, k0 + a.split);
    const int* bt = a.blocks + size_t(a.seq[i]) * a.max_blocks;
    const size_t kw = size_t(a.kvh) * hd;
    const size_t off = size_t(kvh) * hd;

    if (QKV) {
        // PrepareQKV in the block (one row): the warps prepare the block's
        // query heads into sq, and the split holding the row's own position
        // (every head chunk of it: the same bits) stores its key and value
        // before reading them back, from L2 (CG loads).
        const float* row = a.qkv + size_t(i) * (a.heads + 2 * a.kvh) * hd;
        const int self = len - 1;
        for (int g = warp; g < G; g += kAttnWarps) {
            if (g < ng) {
                prep_head(sq[g], row + size_t(h0 + g) * hd, hd, 0, a.prep, self);
            } else {
                for (int d = lane; d < hd; d += 32) sq[g][d] = 0.f;
            }
        }
        if (int(blockIdx.z) == min(self / a.split, int(gridDim.z) - 1) && warp < 2) {
            float* vw = wacc[warp][0];  // free until the warps' merge
            prep_head(vw, row + size_t(a.heads + warp * a.kvh + kvh) * hd, hd, 1 + warp, a.prep, self);
            const int sl = a.slot[i];
            if (sl >= 0 && sl < a.slots) head_put(const_cast<void*>(warp == 0 ? a.kc : a.vc), BF, size_t(sl) * kw + off, vw, hd);
        }
    } else {
        for (int t = threadIdx.x; t < G * hd; t += blockDim.x) {
            const int g = t / hd, d = t % hd;
            sq[g][d] = g < ng ? a.q[(size_t(i) * a.heads + h0 + g) * hd + d] : 0.f;
        }
    }
    __syncthreads();

    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[g][j] = 0.f;
    }

    for (int t0 = k0 + warp * 32; t0 < k1; t0 += kAttnWarps * 32) {
        const int p = t0 + lane;
        const bool valid = p < k1;
        size_t base = 0;  // element index of this lane's key row
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = 0.f;
        if (valid) {
            base = (size_t(bt[p / a.bs]) * a.bs + p % a.bs) * kw + off;
            if (hd % 8 == 0) {  // 16-byte loads (bf16) or two (float32)
#pragma unroll 8
                for (int d = 0; d < hd; d += 8) {
                    float kd[8];
                    kv8<BF, QKV>(a.kc, base + d, kd);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        const float4 q0 = *reinterpret_cast<const float4*>(&sq[g][d]);
                        const float4 q1 = *reinterpret_cast<const float4*>(&sq[g][d + 4]);
                        const float qe[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                        for (int e = 0; e < 8; e++) s[g] = fmaf(qe[e], kd[e], s[g]);
                    }
                }
            } else {
                for (int d = 0; d < hd; d++) {
                    const float kd = kv_at<BF, QKV>(a.kc, base + d);
#pragma unroll
                    for (int g = 0; g < G; g++) s[g] = fmaf(sq[g][d], kd, s[g]);
                }
            }
        }
        float pe[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float sc = valid ? s[g] * a.scale : -INFINITY;
            const float mn = fmaxf(m[g], warp_max(sc));
            const float c = expf(m[g] - mn);  // 0 while m is −∞
            pe[g] = valid ? expf(sc - mn) : 0.f;
            l[g] = l[g] * c + warp_sum(pe[g]);
#pragma unroll
            for (int j = 0; j < DPL; j++) acc[g][j] *= c;
            m[g] = mn;
        }
        // Values, kV keys at a time: their loads are issued before the
        // first is used. Key kk's probabilities come from pw, four keys a
        // load.
#pragma unroll
        for (int g = 0; g < G; g++) pw[warp][g][lane] = pe[g];
        __syncwarp();
        // Fewer for wide heads (registers); more with 4 heads a block (the
        // decode kernel: few blocks, registers to spare).
        constexpr int kV = DPL > 4 ? 4 : G <= 4 ? 16 : 8;
        const int nk = min(32, k1 - t0);
        for (int k0v = 0; k0v < nk; k0v += kV) {
            float vv[kV][DPL];
#pragma unroll
            for (int u = 0; u < kV; u++) {
                const int kk = min(k0v + u, nk - 1);
                const size_t vb = __shfl_sync(0xffffffffu, base, kk);
                if (cont) {  // the lane's DPL dims in one load
                    kv_run<BF, QKV, DPL>(a.vc, vb + size_t(DPL) * lane, vv[u]);
                } else {
#pragma unroll
                    for (int j = 0; j < DPL; j++) {
                        const int d = lane + 32 * j;
                        vv[u][j] = d < hd ? kv_at<BF, QKV>(a.vc, vb + d) : 0.f;
                    }
                }
            }
#pragma unroll
            for (int u4 = 0; u4 < kV; u4 += 4) {
                float4 p4[G];
#pragma unroll
                for (int g = 0; g < G; g++) p4[g] = *reinterpret_cast<const float4*>(&pw[warp][g][k0v + u4]);
#pragma unroll
                for (int uu = 0; uu < 4; uu++) {
                    const int u = u4 + uu, kk = k0v + u;
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float pk = uu == 0 ? p4[g].x : uu == 1 ? p4[g].y : uu == 2 ? p4[g].z : p4[g].w;
                        if (kk >= nk) pk = 0.f;
#pragma unroll
                        for (int j = 0; j < DPL; j++) acc[g][j] = fmaf(pk, vv[u][j], acc[g][j]);
                    }
                }
            }
        }
        __syncwarp();  // pw is rewritten by the next tile
    }

    // Merge the warps' running softmaxes.
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            wm[warp][g] = m[g];
            wl[warp][g] = l[g];
        }
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            const int d = cont ? DPL * lane + j : lane + 32 * j;
            if (d < hd) wacc[warp][g][d] = acc[g][j];
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < ng * hd; t += blockDim.x) {
        const int g = t / hd, d = t % hd;
        float mx = -INFINITY;
        for (int w = 0; w < kAttnWarps; w++) mx = fmaxf(mx, wm[w][g]);
        float L = 0.f, A = 0.f;
        if (mx != -INFINITY) {
            for (int w = 0; w < kAttnWarps; w++) {
                const float c = expf(wm[w][g] - mx);
                L += wl[w][g] * c;
                A += wacc[w][g][d] * c;
            }
        }
        const int h = h0 + g;
        if (gridDim.z == 1) {
            attn_put(a, (size_t(i) * a.heads + h) * hd + d, A / L);
        } else {
            float* pp = a.part + ((size_t(i) * a.heads + h) * gridDim.z + blockIdx.z) * (hd + 2);
            if (d == 0) {
                pp[0] = mx;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
    if (gridDim.z == 1 || !a.cnt) return;
    // The last of the row's splits to finish merges them: every block makes
    // its partials visible before it counts itself (threadfence reduction).
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* c = a.cnt + size_t(i) * gridDim.y + blockIdx.y;
        last = atomicAdd(c, 1) == int(gridDim.z) - 1;
        if (last) *c = 0;  // every split has counted: ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int t = threadIdx.x; t < ng * hd; t += blockDim.x) {
        const int g = t / hd, d = t % hd;
        const size_t h = size_t(i) * a.heads + h0 + g;
        attn_put(a, h * hd + d, split_merge(a.part + h * gridDim.z * (hd + 2), gridDim.z, hd, d));
    }
}

}  // namespace

#define FERRITE_ATTN(name, DPL, BF, G)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) name(                                           \
        float* out, const float* q, const void* kc, const void* vc, const int* pos, const int* seq,     \
        const int* blocks, float* part, int max_blocks, int bs, int n, int heads, int kvh, int hd,      \
        int chunks, int split, float scale, int ptile, int* cnt, int pf, uint16_t* out2) {             \
        AttnArgs a{out, q, kc, vc, pos, seq, blocks, part, max_blocks, bs, n, heads, kvh, hd, chunks, split, scale, ptile, \
                   cnt, pf, nullptr, nullptr, 0, PrepArgs{}, out2};                                    \
        attn_block<DPL, BF, G, false>(a);                                                              \
    }

// The QKV form (QKVAttention, one row): q is unused, the row's q/k/v come
// from qkv as PrepareQKV takes them (flags as PrepArgs).
#define FERRITE_ATTN_QKV(name, DPL, BF, G)                                                              \
    extern "C" __global__ void __launch_bounds__(128) name(                                           \
        float* out, const float* q, const void* kc, const void* vc, const int* pos, const int* seq,     \
        const int* blocks, float* part, int max_blocks, int bs, int n, int heads, int kvh, int hd,      \
        int chunks, int split, float scale, int ptile, int* cnt, int pf, const float* qkv, const int* slot, \
        int slots, const float* qn, float qeps, const float* kn, float keps, const float* inv, int half, \
        float rscale, int flags) {                                                                     \
        AttnArgs a{out, q, kc, vc, pos, seq, blocks, part, max_blocks, bs, n, heads, kvh, hd, chunks, split, scale, ptile, \
                   cnt, pf, qkv, slot, slots, PrepArgs{qn, kn, inv, qeps, keps, rscale, half, flags}};  \
        attn_block<DPL, BF, G, true>(a);                                                               \
    }

FERRITE_ATTN_QKV(ferrite_attn_qkv_f32_1, 1, false, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_f32_2, 2, false, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_f32_4, 4, false, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_f32_8, 8, false, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_bf16_1, 1, true, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_bf16_2, 2, true, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_bf16_4, 4, true, 4)
FERRITE_ATTN_QKV(ferrite_attn_qkv_bf16_8, 8, true, 4)

FERRITE_ATTN(ferrite_attn_f32_1, 1, false, kAttnGroup)
FERRITE_ATTN(ferrite_attn_f32_2, 2, false, kAttnGroup)
FERRITE_ATTN(ferrite_attn_f32_4, 4, false, kAttnGroup)
FERRITE_ATTN(ferrite_attn_f32_8, 8, false, kAttnGroup)
FERRITE_ATTN(ferrite_attn_bf16_1, 1, true, kAttnGroup)
FERRITE_ATTN(ferrite_attn_bf16_2, 2, true, kAttnGroup)
FERRITE_ATTN(ferrite_attn_bf16_4, 4, true, kAttnGroup)
FERRITE_ATTN(ferrite_attn_bf16_8, 8, true, kAttnGroup)
FERRITE_ATTN(ferrite_attn_f32_1_g4, 1, false, 4)
FERRITE_ATTN(ferrite_attn_f32_2_g4, 2, false, 4)
FERRITE_ATTN(ferrite_attn_f32_4_g4, 4, false, 4)
FERRITE_ATTN(ferrite_attn_f32_8_g4, 8, false, 4)
FERRITE_ATTN(ferrite_attn_bf16_1_g4, 1, true, 4)
FERRITE_ATTN(ferrite_attn_bf16_2_g4, 2, true, 4)
FERRITE_ATTN(ferrite_attn_bf16_4_g4, 4, true, 4)
FERRITE_ATTN(ferrite_attn_bf16_8_g4, 8, true, 4)

// Merges the splits of ferrite_attn_*: out (n, heads·hd) from part (n,
// heads, splits, hd + 2), but for the rows of prefill.cu's tiles of ptile
// rows (none when 0); with out2 set, out also split as the attention
// kernel's out2. Launch: grid (n, heads), 128 threads.
extern "C" __global__ void ferrite_attn_combine(float* out, const float* part, int heads, int hd, int splits,
                                                const int* seq, int n, int ptile, uint16_t* out2) {
    const int i = blockIdx.x, h = blockIdx.y;
    if (ptile && prefill_owns(seq, n, i, ptile)) return;
    const float* pp = part + (size_t(i) * heads + h) * splits * (hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        attn_out(out, out2, size_t(n) * heads * hd, (size_t(i) * heads + h) * hd + d, split_merge(pp, splits, hd, d));
}
