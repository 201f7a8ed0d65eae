// Helpers several op files share (sorted after ops.cu, before the files that
// use them, in the one translation unit tools/cuda/build_fatbin.sh builds):
// the weight descriptor of the MoE and MLA kernels, a warp's dot product over
// one described row, block sums and LayerNorm statistics, cache stores, the
// order keys and flag scans of the radix selections, and one bf16
// tensor-core product.

namespace {

// MatDesc is one weight matrix of an expert as kernels/cuda's Go side lays
// it out (expertDesc): data and F8E4M3 block scales, dtype, shape, block
// shape and the first row the view starts at (the up half of a fused
// gate_up).
struct MatDesc {
    const uint8_t* data;
    const float* scale;
    int dtype, rows, cols, br, bc, row0;
};

// warp_dot is row r (of the view) of m times x (m.cols values), float32 sums,
// the same in every lane.
__device__ float warp_dot(const MatDesc& m, int r, const float* __restrict__ x) {
    const int lane = threadIdx.x & 31;
    const int rr = r + m.row0, cols = m.cols;
    float acc = 0.f;
    if (m.dtype == kF8E4M3) {
        const uint8_t* row = m.data + size_t(rr) * cols;
        const float* srow = m.scale + size_t(rr / m.br) * ((cols + m.bc - 1) / m.bc);
        for (int k = lane; k < cols; k += 32) acc = fmaf(elem(row, k, kF8E4M3, srow, m.bc), x[k], acc);
        return warp_sum(acc);
    }
    const int size = m.dtype == kF32 ? 4 : 2;
    const uint8_t* row = m.data + size_t(rr) * cols * size;
    const int per = 16 / size;  // elements in a 16-byte load
    if ((size_t(cols) * size) % 16 == 0 && (uintptr_t(row) & 15) == 0 && (uintptr_t(x) & 15) == 0) {
        for (int k = lane * per; k < cols; k += 32 * per) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + size_t(k) * size));
            float wv[8];
            if (m.dtype == kF32) F32W::vec(v, wv);
            else if (m.dtype == kBF16) BF16W::vec(v, wv);
            else F16W::vec(v, wv);
            for (int q = 0; q < per; q++) acc = fmaf(wv[q], x[k + q], acc);
        }
    } else {
        for (int k = lane; k < cols; k += 32) acc = fmaf(elem(row, k, m.dtype, nullptr, 1), x[k], acc);
    }
    return warp_sum(acc);
}

// block_sum_f64 is the sum of v over the block (a multiple of 32 threads),
// in every thread, added in a fixed order; partial holds one double of
// shared memory per warp.
__device__ inline double block_sum_f64(double v, double* partial) {
    v = warp_sum_f64(v);
    __syncthreads();  // partial may still be read by an earlier call
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < int(blockDim.x >> 5); i++) t += partial[i];
    return t;
}

// layer_norm_stats sets *mean and *rinv = 1/sqrt(var + eps) of x (dim)
// over the block as kernels/ref.LayerNorm: float64 sums, the mean and the
// biased variance rounded to float32, eps added in float32.
__device__ inline void layer_norm_stats(const float* x, int dim, float eps, double* partial, float* mean, float* rinv) {
    double sum = 0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) sum += double(x[c]);
    sum = block_sum_f64(sum, partial);
    const float m = float(sum / double(dim));
    double ss = 0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const double d = double(__fsub_rn(x[c], m));
        ss += d * d;
    }
    ss = block_sum_f64(ss, partial);
    *mean = m;
    *rinv = float(1.0 / sqrt(double(__fadd_rn(float(ss / double(dim)), eps))));
}

// put stores v at element e of a cache, float32 or bf16 (nearest even).
__device__ inline void put(void* cache, int bf16, size_t e, float v) {
    if (bf16) static_cast<uint16_t*>(cache)[e] = f32_to_bf16(v);
    else static_cast<float*>(cache)[e] = v;
}

// rank_key maps a score to a 32-bit key whose unsigned order is
// cmp.Compare's: NaN lowest, −0 = +0.
__device__ inline uint32_t rank_key(float v) {
    if (v != v) return 0u;
    if (v == 0.f) return 0x80000000u;
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// flag_scan returns the number of threads of the block whose f is set and,
// in *before, how many of them come before this thread. cnt holds one int
// of shared memory per warp.
__device__ inline int flag_scan(bool f, int* before, int* cnt) {
    const unsigned bal = __ballot_sync(0xffffffffu, f);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) cnt[warp] = __popc(bal);
    __syncthreads();
    int b = 0, total = 0;
    for (int v = 0; v < int(blockDim.x >> 5); v++) {
        const int c = cnt[v];
        if (v < warp) b += c;
        total += c;
    }
    *before = b + __popc(bal & ((1u << lane) - 1u));
    __syncthreads();  // cnt is rewritten by the next scan
    return total;
}

}  // namespace

// mma_s8 is d += a·b for a 16×16 int8 tile a (row-major fragment: lane
// 4g + t holds row g's columns 4t…4t+3 in a0, row g + 8's in a1), a 16×8
// int8 tile b (column-major: b0 is rows 4t…4t+3 of column g) and int32 d
// (m16n8k16; d0, d1 row g, columns 2t, 2t + 1; d2, d3 row g + 8). The host
// emulation (tools/cuda/emu/emu.h) has its own.
__device__ inline void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// mma_bf16 is d += a·b for a 16×16 bf16 tile a (row-major fragment), a
// 16×8 bf16 tile b (column-major fragment) and float32 d (m16n8k16).
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

