// The one-row GEMV, version 3 (kernels/cuda/gemv3.go, FERRITE_CUDA_GEMV=v3,
// v3n): persistent blocks that stream their weights through a ring of
// shared-memory stages with cp.async, so the bytes in flight are bounded by
// shared memory, not registers, and no block is launched or retired per
// row. y (n, rows) = x (n, cols) · wᵀ (+ bias) (+ y when acc_y) for n ≤
// kGemv3Rows rows of x; SwiGLULinear's form over the stacked [gate; up];
// and (NORM) NormLinearCat / NormSwiGLULinear's, x normed into shared
// memory once a block.
//
// Block b takes the outputs [b·rpb, min((b+1)·rpb, outs)). Its weight
// stream is those rows (SwiGLU: their gate rows, then their up rows), cut
// into 2 KiB slices (a row is a whole number of slices) and tiles of 8
// slices (16 KiB), one slice a warp: lane l copies and later reads bytes
// (k·32 + l)·16, k < 4, of its warp's slice, so a thread reads only what
// it copied itself and the ring needs no barrier. Before FERRITE_PDL_WAIT
// a block issues its first kGemv3Stages − 1 tiles (weights are never
// written by a step's kernels). After each tile the warps' slice sums meet
// in shared memory (one barrier) and thread j adds them to row j's sum in
// slice order: a row's sum depends only on cols, not on the rows of x, the
// block or the form (kernels.RowExact; SwiGLU = the plain sums of its
// rows).
//
// Launch: 256 threads, (NORM: cols·4 +) kGemv3Stages·16 KiB of dynamic
// shared memory, ceil(outs / rpb) blocks; row bytes a multiple of 2 KiB;
// SwiGLU rpb ≤ kGemv3MaxRows.

namespace {

constexpr int kGemv3Stages = 4;     // ring stages of 16 KiB
constexpr int kGemv3Rows = 4;       // rows of x a launch takes at most
constexpr int kGemv3MaxRows = 256;  // SwiGLU outputs a block at most (gate sums kept)
constexpr int kGemv3Slice = 2048;   // bytes a slice

template <int N>
__device__ inline void gemv3_wait() {
#ifndef FERRITE_HOST_EMU
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Gemv3Stream is a block's weight stream: na slices from a, then nb from b.
struct Gemv3Stream {
    const uint8_t* a;
    const uint8_t* b;
    int na, nb;
    __device__ const uint8_t* slice(int s) const {
        return s < na ? a + size_t(s) * kGemv3Slice : b + size_t(s - na) * kGemv3Slice;
    }
};

// gemv3_issue copies tile t's slice of this warp into ring stage t % stages
// (nothing past the stream's end) and commits the group (empty or not).
__device__ inline void gemv3_issue(uint8_t* ring, const Gemv3Stream& st, int t) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = t * kWarpsPerBlock + warp;
    if (s < st.na + st.nb) {
        const uint8_t* src = st.slice(s);
        uint8_t* dst = ring + size_t(t % kGemv3Stages) * (kWarpsPerBlock * kGemv3Slice) + warp * kGemv3Slice;
#pragma unroll
        for (int k = 0; k < 4; k++) dec_cp16(dst + (k * 32 + lane) * 16, src + (k * 32 + lane) * 16);
    }
    dec_cp_commit();
}

// gemv3 runs a block's stream. x (nr rows; NC: global, else shared
// memory) is read after the wait through xs(), which may fill shared
// memory and ends with a barrier when it does; row(j, seg, i, sum) gets
// row j of x's sum of the stream's row i of segment seg (0: a, 1: b), in
// thread j < nr.
template <class W, bool NC, class Xs, class Row>
__device__ inline void gemv3(uint8_t* ring, const Gemv3Stream& st, int nr, int cols, Xs xs, Row row) {
    __shared__ float part[2][kGemv3Rows][kWarpsPerBlock];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int total = st.na + st.nb;
    const int tiles = (total + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const int spr = cols * W::kSize / kGemv3Slice;  // slices a row
#pragma unroll
    for (int t = 0; t < kGemv3Stages - 1; t++) gemv3_issue(ring, st, t);
    FERRITE_PDL_WAIT();
    const float* x = xs();
    float rs = 0.f;  // thread j < nr: the current row's sum so far
    for (int t = 0; t < tiles; t++) {
        gemv3_issue(ring, st, t + kGemv3Stages - 1);  // into the stage this thread read in tile t − 1
        gemv3_wait<kGemv3Stages - 1>();               // tile t's copies (this thread's) have landed
        const int s = t * kWarpsPerBlock + warp;
        float acc[kGemv3Rows];
#pragma unroll
        for (int j = 0; j < kGemv3Rows; j++) acc[j] = 0.f;
        if (s < total) {
            const uint8_t* src = ring + size_t(t % kGemv3Stages) * (kWarpsPerBlock * kGemv3Slice) + warp * kGemv3Slice;
            const int si = s < st.na ? s : s - st.na;
            const int c0 = (si % spr) * (kGemv3Slice / W::kSize);  // the slice's first column
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float wv[W::kE];
                W::vec(*reinterpret_cast<const uint4*>(src + (k * 32 + lane) * 16), wv);
                const int c = c0 + (k * 32 + lane) * W::kE;
#pragma unroll
                for (int j = 0; j < kGemv3Rows; j++)
                    if (j < nr) acc[j] = dot_x<W, NC>(wv, x + size_t(j) * cols + c, acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < kGemv3Rows; j++)
            if (j < nr) acc[j] = warp_sum(acc[j]);
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < kGemv3Rows; j++) part[t & 1][j][warp] = acc[j];
        }
        __syncthreads();  // part[t & 1] is complete; part[(t + 1) & 1] was read in tile t − 1
        if (int(threadIdx.x) < nr) {
            const int j = threadIdx.x;
            for (int v = 0; v < kWarpsPerBlock; v++) {
                const int sv = t * kWarpsPerBlock + v;
                if (sv >= total) break;
                const int seg = sv < st.na ? 0 : 1, si = seg ? sv - st.na : sv;
                const int k = si % spr;
                rs = k == 0 ? part[t & 1][j][v] : rs + part[t & 1][j][v];
                if (k == spr - 1) row(j, seg, si / spr, rs);
            }
        }
    }
    gemv3_wait<0>();
}

// The norm-fused forms' x: each row of x is first normed into shared
// memory, h = s ⊙ (x·inv) with s the norm weight (1 + s with off) and inv =
// 1/sqrt(mean(x²) + eps), every value rounded as kernels/ref.RMSNorm rounds
// it (Σx² in float64 over the block in a fixed order, the mean rounded to
// float32, eps added in float32), and the product reads h there: one
// kernel instead of the norm and the GEMV, the norm done once a
// (persistent) block while its first weight tiles fly.
//
// gemv3_norm_row fills h with row x (cols values) normed and returns h
// after a barrier. With dl (AddNormLinearCat's pending add) the row is x +
// dl (one float32 add an element), which block 0 also writes to sum.
__device__ inline const float* gemv3_norm_row(float* h, const float* __restrict__ x, const float* __restrict__ dl,
                                              float* __restrict__ sum, const float* __restrict__ nw, int cols,
                                              float eps, int off) {
    __shared__ double partial[kWarpsPerBlock];
    double ss = 0;
    for (int k = threadIdx.x * 4; k < cols; k += blockDim.x * 4) {
        float4 v = *reinterpret_cast<const float4*>(x + k);
        if (dl) {
            const float4 d = *reinterpret_cast<const float4*>(dl + k);
            v = make_float4(__fadd_rn(v.x, d.x), __fadd_rn(v.y, d.y), __fadd_rn(v.z, d.z), __fadd_rn(v.w, d.w));
            if (blockIdx.x == 0) *reinterpret_cast<float4*>(sum + k) = v;
        }
        ss += double(v.x) * double(v.x) + double(v.y) * double(v.y) + double(v.z) * double(v.z) +
              double(v.w) * double(v.w);
        *reinterpret_cast<float4*>(h + k) = v;
    }
    ss = block_sum_f64(ss, partial);
    const float inv = float(1.0 / sqrt(double(__fadd_rn(float(ss / double(cols)), eps))));
    for (int k = threadIdx.x * 4; k < cols; k += blockDim.x * 4) {
        float4 v = *reinterpret_cast<const float4*>(h + k);
        const float4 s = __ldg(reinterpret_cast<const float4*>(nw + k));
        v.x = __fmul_rn(off ? __fadd_rn(1.f, s.x) : s.x, __fmul_rn(v.x, inv));
        v.y = __fmul_rn(off ? __fadd_rn(1.f, s.y) : s.y, __fmul_rn(v.y, inv));
        v.z = __fmul_rn(off ? __fadd_rn(1.f, s.z) : s.z, __fmul_rn(v.z, inv));
        v.w = __fmul_rn(off ? __fadd_rn(1.f, s.w) : s.w, __fmul_rn(v.w, inv));
        *reinterpret_cast<float4*>(h + k) = v;
    }
    __syncthreads();
    return h;
}

// gemv3_linear is the plain form and (NORM) NormLinearCat's and
// AddNormLinearCat's: one row of x, normed into h after the ring
// (gemv3_norm_row; with dl, x + dl, which block 0 writes to sum).
template <class W, bool NORM>
__device__ void gemv3_linear(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w, int n,
                             int rows, int cols, int rpb, const float* __restrict__ bias, int acc_y,
                             const float* __restrict__ nw, float eps, int off, const float* __restrict__ dl,
                             float* __restrict__ sum) {
    extern __shared__ uint4 gemv3_smem[];
    uint8_t* ring = reinterpret_cast<uint8_t*>(gemv3_smem);
    float* h = reinterpret_cast<float*>(ring + kGemv3Stages * kWarpsPerBlock * kGemv3Slice);
    const int r0 = blockIdx.x * rpb, nrow = min(rpb, rows - r0);
    const size_t rb = size_t(cols) * W::kSize;
    const Gemv3Stream st{w + size_t(r0) * rb, nullptr, int(size_t(nrow) * rb / kGemv3Slice), 0};
    const int nr = NORM ? 1 : n;
    auto xs = [&]() -> const float* {
        if (NORM) return gemv3_norm_row(h, x, dl, sum, nw, cols, eps, off);
        return x;
    };
    gemv3<W, !NORM>(ring, st, nr, cols, xs, [&](int j, int, int i, float s) {
        store(y + size_t(j) * rows + r0 + i, s, bias, r0 + i, acc_y);
    });
}

// gemv3_swiglu is SwiGLULinear's form and (NORM) NormSwiGLULinear's.
template <class W, bool NORM>
__device__ void gemv3_swiglu(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w, int n,
                             int inter, int cols, int rpb, float limit, const float* __restrict__ nw, float eps,
                             int off) {
    extern __shared__ uint4 gemv3_smem[];
    __shared__ float gate[kGemv3Rows][kGemv3MaxRows];
    uint8_t* ring = reinterpret_cast<uint8_t*>(gemv3_smem);
    float* h = reinterpret_cast<float*>(ring + kGemv3Stages * kWarpsPerBlock * kGemv3Slice);
    const int o0 = blockIdx.x * rpb, no = min(rpb, inter - o0);
    const size_t rb = size_t(cols) * W::kSize;
    const int ns = int(size_t(no) * rb / kGemv3Slice);
    const Gemv3Stream st{w + size_t(o0) * rb, w + (size_t(inter) + o0) * rb, ns, ns};
    const int nr = NORM ? 1 : n;
    auto xs = [&]() -> const float* {
        if (NORM) return gemv3_norm_row(h, x, nullptr, nullptr, nw, cols, eps, off);
        return x;
    };
    gemv3<W, !NORM>(ring, st, nr, cols, xs, [&](int j, int seg, int i, float s) {
        if (seg == 0) gate[j][i] = s;  // the same thread reads it back
        else y[size_t(j) * inter + o0 + i] = swiglu_clamp1(gate[j][i], s, limit);
    });
}

}  // namespace

#define FERRITE_GEMV3(name, W, NORM)                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                               \
        name(float* y, const float* x, const uint8_t* w, int n, int rows, int cols, int rpb, const float* bias, \
             int acc_y, const float* nw, float eps, int off, const float* dl, float* sum) {         \
        gemv3_linear<W, NORM>(y, x, w, n, rows, cols, rpb, bias, acc_y, nw, eps, off, dl, sum);     \
    }

#define FERRITE_GEMV3_SWIGLU(name, W, NORM)                                                         \
    extern "C" __global__ void __launch_bounds__(256)                                               \
        name(float* y, const float* x, const uint8_t* w, int n, int inter, int cols, int rpb, float limit, \
             const float* nw, float eps, int off) {                                                 \
        gemv3_swiglu<W, NORM>(y, x, w, n, inter, cols, rpb, limit, nw, eps, off);                   \
    }

FERRITE_GEMV3(ferrite_gemv3_f32, F32W, false)
FERRITE_GEMV3(ferrite_gemv3_bf16, BF16W, false)
FERRITE_GEMV3(ferrite_gemv3_f16, F16W, false)
FERRITE_GEMV3(ferrite_gemv3n_f32, F32W, true)
FERRITE_GEMV3(ferrite_gemv3n_bf16, BF16W, true)
FERRITE_GEMV3(ferrite_gemv3n_f16, F16W, true)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3_swiglu_f32, F32W, false)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3_swiglu_bf16, BF16W, false)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3_swiglu_f16, F16W, false)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3n_swiglu_f32, F32W, true)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3n_swiglu_bf16, BF16W, true)
FERRITE_GEMV3_SWIGLU(ferrite_gemv3n_swiglu_f16, F16W, true)
