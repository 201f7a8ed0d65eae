// RMSNorm over rows: y (rows, dim) = w ⊙ x·rsqrt(mean(x²) + eps), or
// (1 + w) ⊙ … when offset is set (zero-centred weights), in float32 as
// engine/nn.RMSNorm computes it. y may be x.
//
// Launch: one block of 256 threads per row.
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(256)
    ferrite_rmsnorm_f32(float* y, const float* x, const float* w, int rows, int dim, float eps, int offset) {
    __shared__ float partial[8];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + size_t(r) * dim;
    float* yr = y + size_t(r) * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) partial[0] = ss;
    }
    __syncthreads();
    // Correctly rounded division and square root, as the Go reference.
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(partial[0], float(dim)) + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float s = offset ? 1.0f + w[i] : w[i];
        yr[i] = s * (xr[i] * inv);
    }
}
