// A host emulation of the CUDA features kernels/cuda/src/ops_decode.cu
// uses, for checking its kernels' logic on a machine without a GPU
// (tools/cuda/emu/run.sh): a block's threads are fibers (ucontext) on one
// OS thread, switched at __syncthreads and __syncwarp (a barrier releases
// once every live thread of the block, or of the warp, waits at it);
// shared memory is a function's static storage (blocks run one after
// another); warp shuffles go through an exchange array between two warp
// barriers. Arithmetic is the host's float/double (build with
// -ffp-contract=off), expf and cos/sin the C library's, so results match
// the GPU's to rounding, not bit for bit.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };
struct dim3u { unsigned x = 0, y = 0, z = 0; };

inline dim3u threadIdx, blockIdx;
inline dim3u blockDim, gridDim;

#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define FERRITE_PDL_WAIT() \
    do {                   \
    } while (0)

namespace emu {
enum State { kRun, kWarp, kBlock, kDone };
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    State st = kRun;
};
inline std::vector<Fiber> fibers;
inline ucontext_t sched;
inline int cur = -1;
inline const std::function<void()>* body;
inline uint64_t xchg[1024];

inline void wait(State s) {
    fibers[cur].st = s;
    swapcontext(&fibers[cur].ctx, &sched);
}

inline void entry() {
    (*body)();
    fibers[cur].st = kDone;
    swapcontext(&fibers[cur].ctx, &sched);
}

// run_block runs the block's n threads to the end; a barrier some live
// thread never reaches aborts the program.
inline void run_block(unsigned n, const std::function<void()>& fn) {
    body = &fn;
    fibers.assign(n, Fiber{});
    for (unsigned t = 0; t < n; t++) {
        Fiber& f = fibers[t];
        f.stack.resize(256 << 10);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
    }
    for (;;) {
        bool ran = false;
        for (unsigned t = 0; t < n; t++) {
            if (fibers[t].st != kRun) continue;
            cur = int(t);
            threadIdx = dim3u{t, 0, 0};
            swapcontext(&sched, &fibers[t].ctx);
            ran = true;
        }
        bool live = false, released = false;
        for (unsigned w = 0; w * 32 < n; w++) {
            bool all = true, any = false;
            for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); t++) {
                if (fibers[t].st == kDone) continue;
                any = true;
                all = all && fibers[t].st == kWarp;
            }
            if (any && all) {
                for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); t++)
                    if (fibers[t].st == kWarp) fibers[t].st = kRun;
                released = true;
            }
        }
        bool all = true;
        for (auto& f : fibers) {
            if (f.st == kDone) continue;
            live = true;
            all = all && f.st == kBlock;
        }
        if (!live) return;
        if (all) {
            for (auto& f : fibers) f.st = kRun;
            released = true;
        }
        if (!ran && !released) {
            std::fprintf(stderr, "emu: block (%u, %u): threads wait at barriers that cannot complete\n", blockIdx.x,
                         blockIdx.y);
            std::abort();
        }
    }
}
}  // namespace emu

inline void __syncthreads() { emu::wait(emu::kBlock); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::kWarp); }

template <class T>
T emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8);
    const int t = threadIdx.x;
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    emu::xchg[t] = u;
    __syncwarp();
    const uint64_t r = emu::xchg[(t & ~31) | (src & 31)];
    __syncwarp();
    T out;
    std::memcpy(&out, &r, sizeof(T));
    return out;
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, int(threadIdx.x & 31) ^ o); }
template <class T>
T __shfl_sync(unsigned, T v, int lane) { return emu_shfl(v, lane); }

// mma_s8 is ops_common.cu's mma.sync m16n8k16 s8 → s32, d += a·b, from
// the PTX ISA's fragment layouts: lane 4g + t holds A's row g (a0) and
// row g + 8 (a1), columns 4t…4t+3, B's rows 4t…4t+3 of column g (b0), and
// d's rows g (d0, d1) and g + 8 (d2, d3), columns 2t and 2t + 1.
inline uint32_t emu_frag[1024][3];
inline void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    const int t = threadIdx.x, base = t & ~31, lane = t & 31;
    emu_frag[t][0] = a0, emu_frag[t][1] = a1, emu_frag[t][2] = b0;
    __syncwarp();
    auto byte = [](uint32_t w, int i) { return int(int8_t(w >> (8 * i))); };
    for (int i = 0; i < 4; i++) {
        const int row = (lane >> 2) + 8 * (i >> 1), col = 2 * (lane & 3) + (i & 1);
        for (int k = 0; k < 16; k++) {
            const int a = byte(emu_frag[base + 4 * (row & 7) + k / 4][row >> 3], k & 3);
            const int b = byte(emu_frag[base + 4 * col + k / 4][2], k & 3);
            d[i] += a * b;
        }
    }
    __syncwarp();
}

// mma_bf16 is ops_common.cu's mma.sync m16n8k16 bf16 → f32, d += a·b,
// from the PTX ISA's fragment layouts: lane 4g + t holds A's (row, column
// pairs) (g, 2t…2t+1) in a[0], (g + 8, 2t…) in a[1], (g, 2t+8…2t+9) in
// a[2], (g + 8, 2t+8…) in a[3], the low half first; B's rows 2t…2t+1 of
// column g in b0, rows 2t+8…2t+9 in b1; d as mma_s8's. The products and
// their sum are taken in double precision and added to d once (the GPU
// sums in float32 in its own order: results agree to rounding).
inline uint32_t emu_frag16[1024][6];
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const int t = threadIdx.x, base = t & ~31, lane = t & 31;
    for (int i = 0; i < 4; i++) emu_frag16[t][i] = a[i];
    emu_frag16[t][4] = b0, emu_frag16[t][5] = b1;
    __syncwarp();
    auto half = [](uint32_t w, int i) {
        const uint32_t u = (w >> (16 * i)) & 0xffffu;
        float f;
        const uint32_t bits = u << 16;
        std::memcpy(&f, &bits, 4);
        return double(f);
    };
    for (int i = 0; i < 4; i++) {
        const int row = (lane >> 2) + 8 * (i >> 1), col = 2 * (lane & 3) + (i & 1);
        double sum = d[i];
        for (int k = 0; k < 16; k++) {
            // A (row, k): lane 4·(row % 8) + (k % 8) / 2, register (row ≥ 8) + 2·(k ≥ 8), half k % 2.
            const double av = half(emu_frag16[base + 4 * (row & 7) + (k & 7) / 2][(row >> 3) + 2 * (k >> 3)], k & 1);
            // B (k, col): lane 4·col + (k % 8) / 2, register 4 + (k ≥ 8), half k % 2.
            const double bv = half(emu_frag16[base + 4 * col + (k & 7) / 2][4 + (k >> 3)], k & 1);
            sum += av * bv;
        }
        d[i] = float(sum);
    }
    __syncwarp();
}

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float fabsf(float x) { return std::fabs(x); }
inline int __float2int_rz(float x) { return int(x); }
// __dp4a is c + the four products of a's and b's signed bytes.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += int(int8_t(a >> (8 * i))) * int(int8_t(b >> (8 * i)));
    return c;
}
inline float expf(float x) { return std::exp(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
template <class T>
T __ldg(const T* p) { return *p; }
// float16 as its bits (normal and subnormal values only).
inline uint16_t __ushort_as_half(uint16_t h) { return h; }
inline float __half2float(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e ? std::ldexp(float(1024 + m), e - 25) : std::ldexp(float(m), -24);
    return (h & 0x8000) ? -v : v;
}
template <class T>
T __ldcg(const T* p) { return *p; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// The asynchronous copies and counter operations of ops_decode.cu.
inline void dec_cp16(void* dst, const void* src) { std::memcpy(dst, src, 16); }
inline void dec_cp_commit() {}
inline void dec_cp_wait() {}
inline void dec_arrive(int* p) { __atomic_fetch_add(p, 1, __ATOMIC_RELEASE); }
inline int dec_acquire(const int* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

// launch runs fn for every block of grid (one after another, the last
// block last).
inline void launch(dim3u grid, unsigned threads, const std::function<void()>& fn) {
    gridDim = grid;
    blockDim = dim3u{threads, 1, 1};
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3u{x, y, z};
                emu::run_block(threads, fn);
            }
}

// gemv.cu's L2 prefetch: nothing to do here.
inline void weight_prefetch(int, const uint8_t*, size_t) {}

// A kernel's dynamic shared memory (extern __shared__ on the GPU): the
// harness sizes it before a launch; kernels read it under FERRITE_HOST_EMU.
inline std::vector<uint64_t> emu_dyn_smem_store;
inline uint8_t* emu_dyn_smem(size_t bytes) {
    if (emu_dyn_smem_store.size() * 8 < bytes) emu_dyn_smem_store.assign((bytes + 7) / 8, 0);
    return reinterpret_cast<uint8_t*>(emu_dyn_smem_store.data());
}

// What the harnesses share: CHECK counts a check and prints the first 20
// failures; randn draws N(0, 1) inputs from one seeded stream.
inline int failures = 0, checks = 0;
#define CHECK(cond, ...)                  \
    do {                                  \
        checks++;                         \
        if (!(cond) && failures++ < 20) { \
            std::printf(__VA_ARGS__);     \
            std::printf("\n");            \
        }                                 \
    } while (0)
inline std::mt19937_64 rng(1);
inline float randn() { return std::normal_distribution<float>(0, 1)(rng); }
inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// host_sort is ferrite_moe_sort on the host: off[e] (ne + 1) where expert
// e's slots start in perm, tiles[e] (ne + 1) the tiles of tile slots before
// it, perm the slots of ids by expert, each expert's in slot order.
inline void host_sort(const std::vector<int>& ids, int ne, int tile, std::vector<int>& off, std::vector<int>& tiles,
                      std::vector<int>& perm) {
    off.assign(ne + 1, 0), tiles.assign(ne + 1, 0), perm.clear();
    for (int e = 0; e < ne; e++) {
        for (int sl = 0; sl < int(ids.size()); sl++)
            if (ids[sl] == e) perm.push_back(sl);
        off[e + 1] = int(perm.size());
        tiles[e + 1] = tiles[e] + ceil_div(off[e + 1] - off[e], tile);
    }
}
