// Element-wise conversions and fills: float32 → bfloat16 for GEMM inputs,
// and seeded pseudo-random bf16 fills for benchmarks at real sizes (values
// are a hash of (seed, index), so any launch shape gives the same data).
//
// Launch: any 1-D grid; each kernel strides over all n elements.
#include <stdint.h>

// Round to nearest even, NaN kept quiet: the same bits as kernels.F32ToBF16.
__device__ inline uint16_t f32_to_bf16(float f) {
    uint32_t b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t(b >> 16) | 0x40;
    return uint16_t((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
}

extern "C" __global__ void ferrite_f32_to_bf16(uint16_t* dst, const float* src, uint64_t n) {
    FERRITE_PDL_WAIT();
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
        dst[i] = f32_to_bf16(src[i]);
}

// splitmix64 finaliser.
__device__ inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// dst[i] = bf16 of a uniform value in [-scale, scale).
extern "C" __global__ void ferrite_fill_bf16(uint16_t* dst, uint64_t n, uint64_t seed, float scale) {
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
        const float u = float(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
        dst[i] = f32_to_bf16((2.0f * u - 1.0f) * scale);
    }
}
