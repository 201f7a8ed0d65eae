// Stand-in for CUDA's cuda_fp16.h for tools/cuda/check_cuda.sh: the half
// type and the conversions kernels/cuda/src uses, declared only.
#pragma once
struct __half { unsigned short x; };
__device__ float __half2float(__half);
__device__ __half __ushort_as_half(unsigned short);
