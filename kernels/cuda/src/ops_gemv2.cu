// The one-row GEMV, version 2 (kernels/cuda/gemv2.go, FERRITE_CUDA_GEMV=v2,
// v2s1, v2s4): y (n, rows) = x (n, cols) · wᵀ (+ bias) (+ y when acc_y),
// and SwiGLULinear's form over the stacked [gate; up], for weights whose
// rows are whole 16-byte loads (F32, BF16, F16).
//
// S warps share a weight row and a block holds 8 / S rows. A row is cut into
// chunks of 32·U 16-byte loads (U a lane, 4 KiB for U = 8); warp part p of a
// row sums chunks p, p + S, p + 2S, … with all U of a chunk's loads in flight
// at once. The first chunk's loads are issued BEFORE FERRITE_PDL_WAIT: the
// weights are never written by a step's kernels, so under PDL a block's
// weight stream starts while the kernel before it drains, and for the
// 4,096-wide rows of Qwen3-8B (one chunk a warp) the whole of a resident
// block's weights is in flight before it waits. The weights are read with
// ld.global.nc.L1::no_allocate (streamed, L1 left to x).
//
// A row's sum depends only on cols, S and U: lane sums in chunk order, the
// warp's shuffle sum, the S parts added in order. n rows of x are taken
// kGemv2Rows at a time with one read of the weights each, every row summed
// as alone (kernels.RowExact: the same bits as n = 1), and the SwiGLU form
// sums its gate and up rows exactly as the plain form sums those rows.
//
// Launch: 256 threads; plain ceil(rows / (8/S)) blocks, SwiGLU ceil(inter /
// (4/S)) blocks.

namespace {

constexpr int kGemv2Rows = 4;  // rows of x a pass over the weights takes

// ld_stream is a 16-byte weight load that skips L1; volatile, so that the
// loads issued before FERRITE_PDL_WAIT stay before it.
__device__ inline uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// gemv2_load loads chunk c of a row of n16 16-byte words into v (zeros
// past the row's end).
template <int U>
__device__ inline void gemv2_load(uint4 (&v)[U], const uint4* row, int n16, int c) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int i = (c * U + u) * 32 + lane;
        v[u] = i < n16 ? ld_stream(row + i) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// gemv2_dot adds chunk c (in v) times the nr ≤ kGemv2Rows rows of x (row j
// at x + j·cols) into acc[j], a lane's share, in the same order for every
// nr.
template <class W, int U>
__device__ inline void gemv2_dot(const uint4 (&v)[U], const float* __restrict__ x, int cols, int n16, int c, int nr,
                                 float (&acc)[kGemv2Rows]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int i = (c * U + u) * 32 + lane;
        if (i >= n16) break;
        float wv[W::kE];
        W::vec(v[u], wv);
        const int k = i * W::kE;
#pragma unroll
        for (int j = 0; j < kGemv2Rows; j++)
            if (j < nr) acc[j] = dot_x<W>(wv, x + size_t(j) * cols + k, acc[j]);
    }
}

// gemv2_part is the body both forms share: the warp's weight row is row
// (null: none), the warp is part p of S; for each kGemv2Rows rows of x from
// j0 on, part[j][warp] gets the warp's share of row j0 + j, and done(j0,
// nr) runs after a barrier (part readable) for the epilogue. The first
// chunk is loaded before FERRITE_PDL_WAIT.
template <class W, int S, int U, class Done>
__device__ inline void gemv2_part(float (&part)[kGemv2Rows][kWarpsPerBlock], const uint8_t* __restrict__ row,
                                  const float* __restrict__ x, int n, int cols, Done done) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, p = warp % S;
    const int n16 = cols * W::kSize / 16;
    const int chunks = (n16 + 32 * U - 1) / (32 * U);
    const uint4* r16 = reinterpret_cast<const uint4*>(row);
    uint4 v[U];
    if (row && p < chunks) gemv2_load<U>(v, r16, n16, p);
    FERRITE_PDL_WAIT();
    for (int j0 = 0; j0 < n; j0 += kGemv2Rows) {
        const int nr = min(kGemv2Rows, n - j0);
        float acc[kGemv2Rows];
#pragma unroll
        for (int j = 0; j < kGemv2Rows; j++) acc[j] = 0.f;
        if (row) {
            for (int c = p; c < chunks; c += S) {
                if (j0 > 0 || c != p) gemv2_load<U>(v, r16, n16, c);
                gemv2_dot<W, U>(v, x + size_t(j0) * cols, cols, n16, c, nr, acc);
            }
        }
#pragma unroll
        for (int j = 0; j < kGemv2Rows; j++) acc[j] = warp_sum(acc[j]);
        __syncthreads();  // the previous rows' parts have been read
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < kGemv2Rows; j++) part[j][warp] = acc[j];
        }
        __syncthreads();
        done(j0, nr);
    }
}

// gemv2_total adds the S parts of the row whose first warp is w0, in order.
template <int S>
__device__ inline float gemv2_total(const float* part, int w0) {
    float s = part[w0];
#pragma unroll
    for (int i = 1; i < S; i++) s += part[w0 + i];
    return s;
}

template <class W, int S, int U>
__device__ void gemv2(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w, int n,
                      int rows, int cols, const float* __restrict__ bias, int acc_y) {
    __shared__ float part[kGemv2Rows][kWarpsPerBlock];
    const int warp = threadIdx.x >> 5;
    const int r = blockIdx.x * (kWarpsPerBlock / S) + warp / S;
    const uint8_t* row = r < rows ? w + size_t(r) * cols * W::kSize : nullptr;
    gemv2_part<W, S, U>(part, row, x, n, cols, [&](int j0, int nr) {
        if (warp % S == 0 && (threadIdx.x & 31) == 0 && r < rows) {
            for (int j = 0; j < nr; j++) store(y + size_t(j0 + j) * rows + r, gemv2_total<S>(part[j], warp), bias, r, acc_y);
        }
    });
}

// gemv2_swiglu: block b holds H = 4/S outputs (S = 4: one, its 8 warps a
// gate and an up row); its first H row slots are gate rows b·H + i, the
// next H the up rows inter + b·H + i, and output i is y[b·H + i] =
// swiglu(gate, up) (clamped with limit ≠ 0).
template <class W, int S, int U>
__device__ void gemv2_swiglu(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w, int n,
                             int inter, int cols, float limit) {
    constexpr int H = kWarpsPerBlock / S / 2;
    __shared__ float part[kGemv2Rows][kWarpsPerBlock];
    const int slot = (threadIdx.x >> 5) / S;
    const int o = blockIdx.x * H + slot % H;
    const uint8_t* row = o < inter ? w + (size_t(slot / H) * inter + o) * cols * W::kSize : nullptr;
    gemv2_part<W, S, U>(part, row, x, n, cols, [&](int j0, int nr) {
        const int t = threadIdx.x, ot = blockIdx.x * H + t;
        if (t < H && ot < inter) {
            for (int j = 0; j < nr; j++)
                y[size_t(j0 + j) * inter + ot] =
                    swiglu_clamp1(gemv2_total<S>(part[j], t * S), gemv2_total<S>(part[j], (H + t) * S), limit);
        }
    });
}

}  // namespace

#define FERRITE_GEMV2(name, W, S, U)                                                                \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int rows, int cols, const float* bias, \
                                                           int acc_y) {                                  \
        gemv2<W, S, U>(y, x, w, n, rows, cols, bias, acc_y);                                        \
    }

#define FERRITE_GEMV2_SWIGLU(name, W, S, U)                                                         \
    extern "C" __global__ void __launch_bounds__(256) name(float* y, const float* x, const uint8_t* w, \
                                                           int n, int inter, int cols, float limit) {   \
        gemv2_swiglu<W, S, U>(y, x, w, n, inter, cols, limit);                                      \
    }

FERRITE_GEMV2(ferrite_gemv2_f32_s2, F32W, 2, 8)
FERRITE_GEMV2(ferrite_gemv2_bf16_s2, BF16W, 2, 8)
FERRITE_GEMV2(ferrite_gemv2_f16_s2, F16W, 2, 8)
FERRITE_GEMV2(ferrite_gemv2_bf16_s1, BF16W, 1, 16)
FERRITE_GEMV2(ferrite_gemv2_bf16_s4, BF16W, 4, 4)

FERRITE_GEMV2_SWIGLU(ferrite_gemv2_swiglu_f32_s2, F32W, 2, 8)
FERRITE_GEMV2_SWIGLU(ferrite_gemv2_swiglu_bf16_s2, BF16W, 2, 8)
FERRITE_GEMV2_SWIGLU(ferrite_gemv2_swiglu_f16_s2, F16W, 2, 8)
FERRITE_GEMV2_SWIGLU(ferrite_gemv2_swiglu_bf16_s1, BF16W, 1, 16)
FERRITE_GEMV2_SWIGLU(ferrite_gemv2_swiglu_bf16_s4, BF16W, 4, 4)
