// GGML block-quantized weights on the device: the GEMV of decode steps,
// reading the blocks as they are, and their exact decoding into bfloat16
// for the products of many rows (kernels/cuda/quant.go). The blocks'
// device layout and their decoding are ops_common_quant.cu's, which the
// MoE kernels share.

namespace {

// quant_gemv: y[j·ldy + r] = row r of w · x_j (+ bias[r]) (+ the old y),
// for j < n. A block of 4 warps takes R rows; its 128 lanes deal a row's
// parts among them (lane L of warp v: parts 32v + L, + 128, …), each
// lane's 32 x values of a part held for all R rows and the R rows' part
// decoded once for up to NB rows of x; the warps' sums meet in shared
// memory and are added in warp order. A row's sum does not depend on n,
// NB, R or the other rows (kernels.RowExact holds).
template <class Q, int R, int NB>
__device__ void quant_gemv(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,
                           const uint8_t* __restrict__ ds, int n, int rows, int cols, int ldy,
                           const float* __restrict__ bias, int acc_y) {
    constexpr int kWarps = 4;
    __shared__ float part[kWarps][R * NB];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R;
    const int parts = cols / 32;
    for (int j0 = 0; j0 < n; j0 += NB) {
        const int nb = min(NB, n - j0);
        float acc[R][NB];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NB; j++) acc[r][j] = 0.f;
        for (int p = warp * 32 + lane; p < parts; p += kWarps * 32) {
            int o0, o1;
            Q::offs(p, o0, o1);
            if (NB == 1) {  // the rows' loads first, then each row decoded as its products need it
                typename Q::Raw raw[R];
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r0 + r < rows) raw[r] = Q::load(w, ds, r0 + r, cols, p);
                float xa[16], xb[16], sa, sb;
                quant_x(x + size_t(j0) * cols, o0, o1, xa, xb, sa, sb);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r0 + r < rows) acc[r][0] = __fadd_rn(acc[r][0], quant_part_dot(quant_dec<Q>(raw[r]), xa, xb, sa, sb));
                continue;
            }
            QDec dec[R];  // the R rows' part, decoded once for every row of x
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r0 + r < rows) dec[r] = quant_dec<Q>(Q::load(w, ds, r0 + r, cols, p));
#pragma unroll
            for (int j = 0; j < NB; j++) {
                if (j >= nb) break;
                float xa[16], xb[16], sa, sb;
                quant_x(x + size_t(j0 + j) * cols, o0, o1, xa, xb, sa, sb);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r0 + r < rows) acc[r][j] = __fadd_rn(acc[r][j], quant_part_dot(dec[r], xa, xb, sa, sb));
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const float s = warp_sum(acc[r][j]);
                if (lane == 0) part[warp][r * NB + j] = s;
            }
        __syncthreads();
        if (int(threadIdx.x) < R * NB) {
            const int r = threadIdx.x / NB, j = threadIdx.x % NB;
            if (r0 + r < rows && j < nb) {
                float s = part[0][threadIdx.x];
#pragma unroll
                for (int v = 1; v < kWarps; v++) s += part[v][threadIdx.x];
                store(y + size_t(j0 + j) * ldy + r0 + r, s, bias, r0 + r, acc_y);
            }
        }
        __syncthreads();
    }
}

// quant_x8_rows quantizes rows of x (n, cols; row i at x + i·x_stride) to int8 as the CPU backend
// does (kernels/cpu/quant.go, quantizeXGo; the same bits): one scale
// d = amax/127 per group of 32 or 256 columns (a K quant's super-block),
// q = round(x·(127/amax)) half away from zero, into xq (n, cols) and, per
// 16 columns, (d as float bits, Σq) into xe (n, cols/16). A block of 256
// threads takes 256 columns of a row (blockIdx.y), a thread one value.
__device__ void quant_x8_rows(int8_t* __restrict__ xq, uint2* __restrict__ xe, const float* __restrict__ x, int x_stride, int cols,
                              int group) {
    __shared__ float wmax[8];
    const int c = blockIdx.x * 256 + threadIdx.x, lane = threadIdx.x & 31;
    if (blockIdx.x * 256 + (threadIdx.x & ~31) >= cols) return;  // a whole warp past the row (cols is a multiple of 32)
    const size_t at = size_t(blockIdx.y) * cols + c;
    const float v = x[size_t(blockIdx.y) * x_stride + c];
    float amax = __uint_as_float(__float_as_uint(v) & 0x7fffffffu);  // |v|, as kernels/cpu clears the sign bit
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (group == 256) {  // cols is a multiple of 256: every warp of the block is here
        if (lane == 0) wmax[threadIdx.x >> 5] = amax;
        __syncthreads();
#pragma unroll
        for (int w = 0; w < 8; w++) amax = fmaxf(amax, wmax[w]);
    }
    int q = 0;
    float d = 0.f;
    if (amax != 0.f) {
        d = __fdiv_rn(amax, 127.f);
        const float t = __fmul_rn(v, __fdiv_rn(127.f, amax));
        q = t >= 0.f ? min(__float2int_rz(__fadd_rn(t, 0.5f)), 127) : max(__float2int_rz(__fsub_rn(t, 0.5f)), -127);
    }
    xq[at] = int8_t(q);
    int sum = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((lane & 15) == 0) xe[at >> 4] = uint2{__float_as_uint(d), uint32_t(sum)};
}

// quant_gemv8 is quant_gemv over int8-quantized rows of x (quant_x8_rows'
// xq and xe): each part's runs dotted in integers (dp4a), one float
// combination a part (quant_part_dot8). A block of 4 warps takes R rows,
// its lanes deal the parts as quant_gemv's do, and a row's sum does not
// depend on n, NB, R or the other rows.
template <class Q, int R, int NB>
__device__ void quant_gemv8(float* __restrict__ y, const int8_t* __restrict__ xq, const uint2* __restrict__ xe,
                            const uint8_t* __restrict__ w, const uint8_t* __restrict__ ds, int n, int rows, int cols, int ldy,
                            const float* __restrict__ bias, int acc_y) {
    constexpr int kWarps = 4;
    __shared__ float part[kWarps][R * NB];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R;
    const int parts = cols / 32;
    for (int j0 = 0; j0 < n; j0 += NB) {
        const int nb = min(NB, n - j0);
        float acc[R][NB];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NB; j++) acc[r][j] = 0.f;
        for (int p = warp * 32 + lane; p < parts; p += kWarps * 32) {
            int o0, o1;
            Q::offs(p, o0, o1);
            typename Q::Raw raw[R];  // the R rows' part, loaded first
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r0 + r < rows) raw[r] = Q::load(w, ds, r0 + r, cols, p);
#pragma unroll
            for (int j = 0; j < NB; j++) {
                if (j >= nb) break;
                const QX8 xv = quant_x8(xq + size_t(j0 + j) * cols, xe + size_t(j0 + j) * (cols / 16), o0, o1);
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r0 + r < rows) acc[r][j] = __fadd_rn(acc[r][j], quant_part_dot8<Q>(raw[r], xv));
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NB; j++) {
                const float s = warp_sum(acc[r][j]);
                if (lane == 0) part[warp][r * NB + j] = s;
            }
        __syncthreads();
        if (int(threadIdx.x) < R * NB) {
            const int r = threadIdx.x / NB, j = threadIdx.x % NB;
            if (r0 + r < rows && j < nb) {
                float s = part[0][threadIdx.x];
#pragma unroll
                for (int v = 1; v < kWarps; v++) s += part[v][threadIdx.x];
                store(y + size_t(j0 + j) * ldy + r0 + r, s, bias, r0 + r, acc_y);
            }
        }
        __syncthreads();
    }
}

// quant_bf16 writes the exact decoding of w's rows (rows, cols), rounded to
// bfloat16 (f32_to_bf16), to hi and, when lo is set, the rest rounded to
// bfloat16 to lo (hi + lo: 16 bits of the value's mantissa): a thread a
// part, 16-byte stores.
template <class Q>
__device__ void quant_bf16(uint16_t* __restrict__ hi, uint16_t* __restrict__ lo, const uint8_t* __restrict__ w,
                           const uint8_t* __restrict__ ds, int rows, int cols) {
    const int parts = cols / 32;
    const size_t total = size_t(rows) * parts;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
        const int r = int(i / parts), p = int(i % parts);
        const typename Q::Raw raw = Q::load(w, ds, r, cols, p);
        const QRun c = Q::run(raw, 0);
        int o[2];
        Q::offs(p, o[0], o[1]);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t vh[8], vl[8];
#pragma unroll
            for (int e = 0; e < 16; e++) {
                const float v = Q::exact(Q::q(raw, 16 * k + e), c.sc[k], c.mn[k]);
                const uint32_t h = f32_to_bf16(v);
                const uint32_t l = f32_to_bf16(__fsub_rn(v, __uint_as_float(h << 16)));
                if (e % 2 == 0) vh[e / 2] = h, vl[e / 2] = l;
                else vh[e / 2] |= h << 16, vl[e / 2] |= l << 16;
            }
            const size_t at = size_t(r) * cols + o[k];
            uint4* dh = reinterpret_cast<uint4*>(hi + at);
            dh[0] = uint4{vh[0], vh[1], vh[2], vh[3]};
            dh[1] = uint4{vh[4], vh[5], vh[6], vh[7]};
            if (lo) {
                uint4* dl = reinterpret_cast<uint4*>(lo + at);
                dl[0] = uint4{vl[0], vl[1], vl[2], vl[3]};
                dl[1] = uint4{vl[4], vl[5], vl[6], vl[7]};
            }
        }
    }
}

}  // namespace

#define FERRITE_QGEMV(name, Q, R, NB)                                                                               \
    extern "C" __global__ void __launch_bounds__(128) name(float* y, const float* x, const uint8_t* w, const uint8_t* ds, \
                                                           int n, int rows, int cols, int ldy, const float* bias,        \
                                                           int acc_y) {                                                  \
        FERRITE_PDL_WAIT();                                                                                             \
        quant_gemv<Q, R, NB>(y, x, w, ds, n, rows, cols, ldy, bias, acc_y);                                                 \
    }

#define FERRITE_QBF16(name, Q)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) name(uint16_t* hi, uint16_t* lo, const uint8_t* w, const uint8_t* ds, \
                                                           int rows, int cols) {                                         \
        FERRITE_PDL_WAIT();                                                                                             \
        quant_bf16<Q>(hi, lo, w, ds, rows, cols);                                                                       \
    }

#define FERRITE_QGEMV8(name, Q, R, NB)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) name(float* y, const int8_t* xq, const uint2* xe, const uint8_t* w,  \
                                                           const uint8_t* ds, int n, int rows, int cols, int ldy,          \
                                                           const float* bias, int acc_y) {                                 \
        FERRITE_PDL_WAIT();                                                                                             \
        quant_gemv8<Q, R, NB>(y, xq, xe, w, ds, n, rows, cols, ldy, bias, acc_y);                                         \
    }

extern "C" __global__ void __launch_bounds__(256) ferrite_qx8(int8_t* xq, uint2* xe, const float* x, int x_stride, int cols,
                                                               int group) {
    FERRITE_PDL_WAIT();
    quant_x8_rows(xq, xe, x, x_stride, cols, group);
}

FERRITE_QGEMV(ferrite_qgemv_q8_0_r2, Q8_0Q, 2, 1)
FERRITE_QGEMV(ferrite_qgemv_q8_0_r4, Q8_0Q, 4, 1)
FERRITE_QGEMV(ferrite_qgemv_q8_0_r8, Q8_0Q, 8, 1)
FERRITE_QGEMV(ferrite_qgemv_q8_0_b8, Q8_0Q, 2, 8)
FERRITE_QGEMV(ferrite_qgemv_q4_0_r2, Q4_0Q, 2, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_0_r4, Q4_0Q, 4, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_0_r8, Q4_0Q, 8, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_0_b8, Q4_0Q, 2, 8)
FERRITE_QGEMV(ferrite_qgemv_q4_k_r2, QKQ<false>, 2, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_k_r4, QKQ<false>, 4, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_k_r8, QKQ<false>, 8, 1)
FERRITE_QGEMV(ferrite_qgemv_q4_k_b8, QKQ<false>, 2, 8)
FERRITE_QGEMV(ferrite_qgemv_q5_k_r2, QKQ<true>, 2, 1)
FERRITE_QGEMV(ferrite_qgemv_q5_k_r4, QKQ<true>, 4, 1)
FERRITE_QGEMV(ferrite_qgemv_q5_k_r8, QKQ<true>, 8, 1)
FERRITE_QGEMV(ferrite_qgemv_q5_k_b8, QKQ<true>, 2, 8)
FERRITE_QGEMV(ferrite_qgemv_q6_k_r2, Q6KQ, 2, 1)
FERRITE_QGEMV(ferrite_qgemv_q6_k_r4, Q6KQ, 4, 1)
FERRITE_QGEMV(ferrite_qgemv_q6_k_r8, Q6KQ, 8, 1)
FERRITE_QGEMV(ferrite_qgemv_q6_k_b8, Q6KQ, 2, 8)
FERRITE_QBF16(ferrite_qbf16_q8_0, Q8_0Q)
FERRITE_QBF16(ferrite_qbf16_q4_0, Q4_0Q)
FERRITE_QBF16(ferrite_qbf16_q4_k, QKQ<false>)
FERRITE_QBF16(ferrite_qbf16_q5_k, QKQ<true>)
FERRITE_QBF16(ferrite_qbf16_q6_k, Q6KQ)
FERRITE_QGEMV8(ferrite_qgemv8_q8_0_r4, Q8_0Q, 4, 1)
FERRITE_QGEMV8(ferrite_qgemv8_q8_0_b8, Q8_0Q, 2, 8)
FERRITE_QGEMV8(ferrite_qgemv8_q4_0_r4, Q4_0Q, 4, 1)
FERRITE_QGEMV8(ferrite_qgemv8_q4_0_b8, Q4_0Q, 2, 8)
FERRITE_QGEMV8(ferrite_qgemv8_q4_k_r4, QKQ<false>, 4, 1)
FERRITE_QGEMV8(ferrite_qgemv8_q4_k_b8, QKQ<false>, 2, 8)
FERRITE_QGEMV8(ferrite_qgemv8_q5_k_r4, QKQ<true>, 4, 1)
FERRITE_QGEMV8(ferrite_qgemv8_q5_k_b8, QKQ<true>, 2, 8)
FERRITE_QGEMV8(ferrite_qgemv8_q6_k_r4, Q6KQ, 4, 1)
FERRITE_QGEMV8(ferrite_qgemv8_q6_k_b8, Q6KQ, 2, 8)
