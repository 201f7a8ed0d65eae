// Declarations of the CUDA keywords, built-in variables and device
// functions kernels/cuda/src uses, so that clang can type-check the kernels
// as device code on a machine without the CUDA toolkit
// (tools/cuda/check_cuda.sh). Declarations only: nothing here is compiled
// into the fatbin, which nvcc builds with the real headers.
#pragma once
#include <__clang_cuda_builtin_vars.h>
#include <stddef.h>
#include <stdint.h>

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#ifndef INFINITY
#define INFINITY __builtin_huge_valf()
#endif

struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };

__device__ uint4 make_uint4(unsigned, unsigned, unsigned, unsigned);
__device__ uint2 make_uint2(unsigned, unsigned);
__device__ float4 make_float4(float, float, float, float);

__device__ void __syncthreads();
__device__ int __syncthreads_count(int pred);
__device__ unsigned __reduce_max_sync(unsigned mask, unsigned value);
__device__ unsigned __reduce_min_sync(unsigned mask, unsigned value);
__device__ void __threadfence();
__device__ void __syncwarp(unsigned mask = 0xffffffffu);
// Warp votes, bit counts and shared-memory atomics (src/sample.cu).
__device__ unsigned __ballot_sync(unsigned mask, int pred);
__device__ unsigned __match_any_sync(unsigned mask, unsigned value);
__device__ int __popc(unsigned);
__device__ int __ffs(int);
__device__ unsigned atomicAdd(unsigned*, unsigned);
__device__ int atomicAdd(int*, int);
__device__ unsigned __shfl_down_sync(unsigned mask, unsigned v, unsigned delta, int width = 32);
#define FERRITE_SHFL(T)                                                        \
    __device__ T __shfl_sync(unsigned mask, T v, int lane, int width = 32);    \
    __device__ T __shfl_xor_sync(unsigned mask, T v, int lane, int width = 32);
FERRITE_SHFL(int)
FERRITE_SHFL(unsigned)
FERRITE_SHFL(long)
FERRITE_SHFL(unsigned long)
FERRITE_SHFL(long long)
FERRITE_SHFL(unsigned long long)
FERRITE_SHFL(float)
FERRITE_SHFL(double)
#undef FERRITE_SHFL
// Warp votes, bit counts and shared-memory atomics (ops_mla.cu's top-k).
__device__ unsigned __ballot_sync(unsigned mask, int pred);
__device__ int __popc(unsigned);
__device__ int atomicAdd(int*, int);

__device__ int atomicAdd(int*, int);
__device__ unsigned __ballot_sync(unsigned mask, int pred);
__device__ int __any_sync(unsigned mask, int pred);
__device__ int __popc(unsigned);
__device__ int __ffs(int);
__device__ int __ffsll(long long);

__device__ uint4 __ldg(const uint4*);
__device__ float4 __ldg(const float4*);
__device__ float __ldg(const float*);
__device__ double __ldg(const double*);
__device__ unsigned char __ldg(const unsigned char*);
__device__ float __ldcg(const float*);
// Read-only 32-bit loads (src/ops_moe_b1.cu's expert descriptors).
__device__ unsigned __ldg(const unsigned*);
__device__ uint2 __ldg(const uint2*);
__device__ int __dp4a(int, int, int);
__device__ int __float2int_rz(float);
__device__ uint4 __ldcg(const uint4*);
__device__ unsigned short __ldcg(const unsigned short*);
__device__ uint2 __ldcg(const uint2*);
__device__ unsigned __ldcg(const unsigned*);
__device__ float4 __ldcg(const float4*);
__device__ float2 __ldcg(const float2*);
__device__ unsigned __float_as_uint(float);
__device__ float __uint_as_float(unsigned);
__device__ float __int_as_float(int);
__device__ int __float_as_int(float);
__device__ float __fmul_rn(float, float);
__device__ float __fadd_rn(float, float);
__device__ float __fsub_rn(float, float);
__device__ float __fdiv_rn(float, float);
__device__ float __fsqrt_rn(float);
__device__ float fmaf(float, float, float);
__device__ float fmaxf(float, float);
__device__ float fminf(float, float);
__device__ float expf(float);
__device__ float sqrtf(float);
__device__ float rsqrtf(float);
__device__ double exp(double);
__device__ double cos(double);
__device__ double sin(double);
__device__ double sqrt(double);
__device__ int min(int, int);
__device__ int max(int, int);
__device__ unsigned min(unsigned, unsigned);
__device__ unsigned max(unsigned, unsigned);
__device__ long long min(long long, long long);
__device__ long long max(long long, long long);
__device__ double log1p(double);
__device__ double fmax(double, double);
__device__ unsigned atomicAdd(unsigned*, unsigned);
__device__ unsigned __ballot_sync(unsigned mask, int pred);
__device__ int __popc(unsigned);
__device__ int __all_sync(unsigned mask, int pred);
__device__ float exp2f(float);
__device__ size_t __cvta_generic_to_shared(const void*);
__device__ uint4 make_uint4(unsigned, unsigned, unsigned, unsigned);
__device__ float2 make_float2(float, float);
// The split hand-overs (src/ops.cu, ops_decode.cu, ops_moe_b1.cu, ...).
__device__ void __threadfence();
__device__ float __ldcg(const float*);
