// Grouped experts for decode batches, the weights streamed through shared
// memory (kernels/cuda moe_pipe.go, FERRITE_MOE_KERNELS=pipe): the
// register tiles of ops_moe.cu (ferrite_moe_gt_*) keep only the loads a
// warp holds in registers in flight, 2.4–2.9 TB/s on an H200. Here every
// block is resident for the whole call (one a multiprocessor, grid = the
// SMs) and walks a list of work items, copying each item's weight rows and
// its slots' inputs into a ring of kPipeStages shared-memory stages with
// cp.async (16 bytes a copy), kPipeStages − 1 chunks in flight (96 KiB of
// weights an SM) while one is multiplied, the ring running on from one
// item to the next without draining.
//
// Work. Each block sorts the call's slots by expert in shared memory
// (counting sort) and cuts each expert's slots into groups of up to
// kPipeC; an item is a group and a block of RB weight rows (gate/up: 32
// rows of each, down: 64), item i = group i / row blocks, row block i %
// row blocks, block b taking items b, b + grid, … A chunk is 256 columns
// of the item's rows (512 bytes of bf16 a row) and of its slots' inputs.
//
// Exactness. Lane L of the warp that owns a row sums the row's elements
// 8L + 256m, m = 0, 1, …, eight at a time in order with fmaf into one
// float32 a (row, slot), then warp_sum: the order of rows_dot_vec<BF16W,
// 1> and tile_dot, so every output has the bits of the one-token kernels
// whatever the other tokens of the call (kernels.RowExact), and the same
// as the register tiles. Only the loads differ.
//
// Compute. A warp widens its rows' 16-byte pieces of the chunk to float32
// once (gate/up: 4 rows of gate and of up, down: 8 rows) and multiplies
// them into every slot of the group (float32 FMAs on the CUDA cores): at
// 4–64 tokens the experts are read at far less than one multiply-add a
// byte a slot, so the FMA pipes are not the bound.
#include <stdint.h>

namespace {

constexpr int kPipeSlots = 512;    // the most slots a call (kernels/cuda moePipeSlots)
constexpr int kPipeExperts = 1024;  // the most experts (kernels/cuda moeMaxExperts)
constexpr int kPipeC = 8;           // slots a group
constexpr int kPipeStages = 4;      // shared-memory stages
constexpr int kPipeK = 256;         // columns a chunk: 16 bytes of bf16 a lane

// PipeShape: NM weight matrices an item (gate and up, or down), RB rows
// of each an item, WARPS warps a block and R rows of each a warp; a stage
// holds NM·RB rows of 512 bytes, then kPipeC inputs of 256 float32 (1 KiB
// each).
template <bool GU, int WARPS>
struct PipeShape {
    static constexpr int NM = GU ? 2 : 1;
    static constexpr int RB = GU ? 32 : 64;
    static constexpr int R = RB / WARPS;
    static constexpr int kThreads = 32 * WARPS;
    static constexpr int kW = NM * RB * kPipeK * 2;  // weight bytes a stage
    static constexpr int kStage = kW + kPipeC * kPipeK * 4;
};

// kPipeSmemSort is the shared memory of the sort (and the ring of
// dynamically taken items) after the stages.
constexpr int kPipeSmemSort = (kPipeExperts + 5 * kPipeSlots + 4 + 8) * 4;

// pipe_cp16 copies 16 bytes from global src to shared dst asynchronously,
// or at once with ordinary loads when src is not 16-byte aligned (a view
// that starts off the alignment; the dtype's own alignment holds). W16: src
// holds 16-bit values, else 32-bit ones.
template <bool W16>
__device__ inline void pipe_cp16(void* dst, const void* src) {
    if ((uintptr_t(src) & 15) == 0) {
        const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
        return;
    }
    if (W16) {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
        uint16_t* o = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = s[i];
    } else {
        const float* s = reinterpret_cast<const float*>(src);
        float* o = reinterpret_cast<float*>(dst);
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] = s[i];
    }
}

__device__ inline void pipe_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ inline void pipe_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// moe_pipe: GU gate/up rows (weights 3e, 3e + 1) against x[s / k] into h
// (slots, nrows = inter) as the SwiGLU, else down rows (3e + 2) against
// in[s] = h[s] into ye (slots, nrows = hidden); kdim the inner width (a
// multiple of 8), every weight bf16. An id outside [0, experts) makes its
// slot's row of out NaN. Dynamic shared memory: kPipeStages ·
// PipeShape::kStage + kPipeSmemSort bytes.
//
// Static (DYN false): block b takes items b, b + grid, …. Dynamic: every
// block takes its next item from the counter ctr[0] (thread 0, an item
// ahead, into a ring of 8 in shared memory), so blocks that run ahead take
// more; the last block to finish (ctr[1]) sets both back to 0 for the next
// launch. Which block takes an item does not change its bits.
template <bool GU, int WARPS, bool DYN>
__device__ void moe_pipe(float* out, int nrows, const float* in, int in_stride, const int* ids,
                         const MatDesc* table, int experts, int k, int slots, int kdim, float limit, int* ctr) {
    using S = PipeShape<GU, WARPS>;
    constexpr int NM = S::NM, R = S::R, RB = S::RB, kPipeThreads = S::kThreads;
    // All of it dynamic (a static part would lower the dynamic limit that
    // kernels/cuda raises every big-shared-memory kernel's to): the stages,
    // then the sort.
    extern __shared__ __align__(16) uint8_t pipe_smem[];
    int* cnt = reinterpret_cast<int*>(pipe_smem + kPipeStages * S::kStage);  // (kPipeExperts) slots an expert, then its next place in perm
    int* perm = cnt + kPipeExperts;      // (kPipeSlots) valid slots sorted by expert
    int* gstart = perm + kPipeSlots;     // (kPipeSlots) each group's first place in perm
    int* gcount = gstart + kPipeSlots;   // (kPipeSlots) its slots
    int* gexp = gcount + kPipeSlots;     // (kPipeSlots) its expert
    int& ngroups = gexp[kPipeSlots];     // how many groups
    int* ring = gexp + kPipeSlots + 4;   // (8) DYN: the items of the block's ordinals t, t + 1, … at t % 8
    int* sid = ring + 8;                 // (kPipeSlots) ids
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // Counting sort of the valid slots by expert, stable (each block
    // must find the same groups: an expert's slots past kPipeC go to its
    // next group), and the groups.
    for (int e = tid; e < experts; e += kPipeThreads) cnt[e] = 0;
    for (int s = tid; s < slots; s += kPipeThreads) sid[s] = ids[s];
    __syncthreads();
    for (int s = tid; s < slots; s += kPipeThreads) {
        const int e = sid[s];
        if (e >= 0 && e < experts) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (warp == 0) {
        const int per = (experts + 31) / 32, e0 = min(lane * per, experts), e1 = min(e0 + per, experts);
        int sc = 0, sg = 0;
        for (int e = e0; e < e1; e++) {
            sc += cnt[e];
            sg += (cnt[e] + kPipeC - 1) / kPipeC;
        }
        int ic = sc, ig = sg;  // inclusive scans over the lanes
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_sync(0xffffffffu, ic, lane - o), b = __shfl_sync(0xffffffffu, ig, lane - o);
            if (lane >= o) {
                ic += a;
                ig += b;
            }
        }
        int oc = ic - sc, og = ig - sg;
        for (int e = e0; e < e1; e++) {
            const int c = cnt[e];
            for (int j = 0; j * kPipeC < c; j++) {
                gstart[og] = oc + j * kPipeC;
                gcount[og] = min(kPipeC, c - j * kPipeC);
                gexp[og] = e;
                og++;
            }
            cnt[e] = oc;
            oc += c;
        }
        if (lane == 31) ngroups = og;
    }
    __syncthreads();
    for (int s = tid; s < slots; s += kPipeThreads) {
        const int e = sid[s];
        if (e >= 0 && e < experts) {
            int rank = 0;  // the expert's slots before s
            for (int t = 0; t < s; t++) rank += sid[t] == e;
            perm[cnt[e] + rank] = s;
        } else {
            for (int r = blockIdx.x; r < nrows; r += gridDim.x) out[size_t(s) * nrows + r] = __int_as_float(0x7fc00000);
        }
    }
    __syncthreads();

    const int nrb = (nrows + RB - 1) / RB, nk = (kdim + kPipeK - 1) / kPipeK;
    const int nitems = ngroups * nrb;
    // item_of is the item of the block's ordinal t (≥ nitems: none; then
    // none after it either).
    auto item_of = [&](int t) { return DYN ? ring[t & 7] : int(blockIdx.x) + t * int(gridDim.x); };
    const size_t pitch = size_t(kdim) * 2;  // bytes between weight rows of a view

    // issue queues chunk i's copies into stage i % kPipeStages; it runs
    // over i = 0, 1, … in order, so at an item's first chunk it finds the
    // sources of the thread's weight rows (nullptr past nrows) and x pieces
    // (nullptr past the group's slots), which its other chunks step along.
    constexpr int WJ = NM * RB / WARPS;                                           // weight rows a thread copies
    constexpr int XJ = (kPipeC * kPipeK / 4 + kPipeThreads - 1) / kPipeThreads;  // x pieces a thread copies
    const uint8_t* wsrc[WJ] = {};
    const float* xsrc[XJ] = {};
    auto issue = [&](int i) {
        const int t = i / nk, kc = i - t * nk;
        const int it = item_of(t);
        if (DYN && kc == 0 && tid == 0) ring[(t + 1) & 7] = it < nitems ? atomicAdd(ctr, 1) : nitems;
        if (it >= nitems) return;
        if (kc == 0) {
            const int g = it / nrb, r0 = (it - g * nrb) * RB;
            const int e = gexp[g], nc = gcount[g], p0 = gstart[g];
            const float* unused;
            const uint8_t* base[NM];
#pragma unroll
            for (int m = 0; m < NM; m++) base[m] = mat_row(table[3 * e + (GU ? m : 2)], 0, &unused) + lane * 16;
#pragma unroll
            for (int j = 0; j < WJ; j++) {
                const int row = warp + WARPS * j, r = r0 + row % RB;
                wsrc[j] = r < nrows ? base[row / RB] + r * pitch : nullptr;
            }
#pragma unroll
            for (int j = 0; j < XJ; j++) {
                const int p = tid + kPipeThreads * j, q = p / (kPipeK / 4);
                const int s = q < nc ? perm[p0 + q] : 0;
                xsrc[j] = q < nc ? in + size_t(GU ? s / k : s) * in_stride + 4 * (p % (kPipeK / 4)) : nullptr;
            }
        }
        uint8_t* st = pipe_smem + (i % kPipeStages) * S::kStage;
        if (kc * kPipeK + 8 * lane < kdim) {
#pragma unroll
            for (int j = 0; j < WJ; j++)
                if (wsrc[j]) pipe_cp16<true>(st + (warp + WARPS * j) * (kPipeK * 2) + lane * 16, wsrc[j] + kc * (kPipeK * 2));
        }
        float* xs = reinterpret_cast<float*>(st + S::kW);
#pragma unroll
        for (int j = 0; j < XJ; j++) {
            const int p = tid + kPipeThreads * j, q = p / (kPipeK / 4), f = p % (kPipeK / 4);
            // Lane L's elements 8L … 8L + 7 land at float4 L and 32 + L:
            // two conflict-free 16-byte reads.
            if (xsrc[j] && kc * kPipeK + 4 * f < kdim)
                pipe_cp16<false>(xs + q * kPipeK + 4 * ((f & 1) * 32 + (f >> 1)), xsrc[j] + kc * kPipeK);
        }
    };

    if (DYN) {
        if (tid == 0) ring[0] = atomicAdd(ctr, 1);
        __syncthreads();
    }
    for (int i = 0; i < kPipeStages - 1; i++) {
        issue(i);
        pipe_commit();
        if (DYN) __syncthreads();  // the ring entry issue(i) wrote, for issue(i + 1)
    }
    float acc[NM][R][kPipeC] = {};
    int kc = 0, t = 0;
    for (int i = 0;; i++) {
        pipe_wait<kPipeStages - 2>();
        __syncthreads();
        // Ring entries are written at the first chunk of the ordinal before
        // (at least one barrier back) and read at most 4 ordinals later.
        const int it = item_of(t);
        if (it >= nitems) break;
        issue(i + kPipeStages - 1);
        pipe_commit();

        const int g = it / nrb, r0 = (it - g * nrb) * RB + warp * R;
        const int nc = gcount[g];
        if (kc == 0) {
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int q = 0; q < kPipeC; q++) acc[m][r][q] = 0.f;
        }
        if (kc * kPipeK + 8 * lane < kdim && r0 < nrows) {
            const uint8_t* st = pipe_smem + (i % kPipeStages) * S::kStage;
            float wv[NM][R][8];
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint4 v =
                        *reinterpret_cast<const uint4*>(st + (m * RB + warp * R + r) * (kPipeK * 2) + lane * 16);
                    BF16W::vec(v, wv[m][r]);
                }
            const float4* xs = reinterpret_cast<const float4*>(st + S::kW);
#pragma unroll
            for (int q = 0; q < kPipeC; q++) {
                if (q < nc) {
                    const float4 a = xs[q * (kPipeK / 4) + lane], b = xs[q * (kPipeK / 4) + 32 + lane];
                    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int c = 0; c < 8; c++) acc[m][r][q] = fmaf(wv[m][r][c], xv[c], acc[m][r][q]);
                }
            }
        }
        if (++kc == nk) {
            // The item's last chunk: each output's warp sum, then lane 0
            // writes (rows past nrows are skipped).
            const int p0 = gstart[g];
#pragma unroll
            for (int q = 0; q < kPipeC; q++) {
                if (q < nc) {
                    const int s = perm[p0 + q];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float a = warp_sum(acc[0][r][q]);
                        const float b = GU ? warp_sum(acc[NM - 1][r][q]) : 0.f;
                        if (lane == 0 && r0 + r < nrows)
                            out[size_t(s) * nrows + r0 + r] = GU ? swiglu_clamp1(a, b, limit) : a;
                    }
                }
            }
            kc = 0;
            t++;
        }
    }
    pipe_wait<0>();
    if (DYN) {
        __syncthreads();
        if (tid == 0) {
            __threadfence();
            if (atomicAdd(ctr + 1, 1) == int(gridDim.x) - 1) {
                ctr[0] = 0;
                ctr[1] = 0;
                __threadfence();
            }
        }
    }
}

}  // namespace

// The streamed grouped experts (moe_pipe), every weight bf16, hidden and
// inter multiples of 8: gate/up into h (n·k, inter) from x (n, hidden),
// x_stride a multiple of 4; down into ye (n·k, hidden) from h, then
// ferrite_moe_combine. Launch: grid = the SMs (at most one block of each
// fits an SM), 256 threads (the _w16 kernels 512: the same rows an item,
// half as many a warp; _dyn: items taken from ctr, 2 ints, zero before
// the first launch, gate/up and down each their own), dynamic shared memory
// kPipeStages · PipeShape::kStage + kPipeSmemSort (163,840 + 14,384 bytes
// for all; kernels/cuda moePipeSmem); n·k ≤ 512, experts ≤ 1024.
#define FERRITE_MOE_PIPE_GATE_UP(name, W, DYN)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * W, 1)                                                   \
        name(float* h, int inter, const float* x, int x_stride, const int* ids, const MatDesc* table,          \
             int experts, int k, int slots, int hidden, float limit, int* ctr) {                               \
        FERRITE_PDL_WAIT();                                                                                    \
        moe_pipe<true, W, DYN>(h, inter, x, x_stride, ids, table, experts, k, slots, hidden, limit, ctr);      \
    }
FERRITE_MOE_PIPE_GATE_UP(ferrite_moe_pipe_gate_up, 8, false)
FERRITE_MOE_PIPE_GATE_UP(ferrite_moe_pipe_gate_up_w16, 16, false)
FERRITE_MOE_PIPE_GATE_UP(ferrite_moe_pipe_gate_up_dyn, 8, true)
FERRITE_MOE_PIPE_GATE_UP(ferrite_moe_pipe_gate_up_w16_dyn, 16, true)

#define FERRITE_MOE_PIPE_DOWN(name, W, DYN)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * W, 1)                                                   \
        name(float* ye, int hidden, const float* h, const int* ids, const MatDesc* table, int experts, int k,    \
             int slots, int inter, int* ctr) {                                                                 \
        FERRITE_PDL_WAIT();                                                                                    \
        moe_pipe<false, W, DYN>(ye, hidden, h, inter, ids, table, experts, k, slots, inter, 0.f, ctr);         \
    }
FERRITE_MOE_PIPE_DOWN(ferrite_moe_pipe_down, 8, false)
FERRITE_MOE_PIPE_DOWN(ferrite_moe_pipe_down_w16, 16, false)
FERRITE_MOE_PIPE_DOWN(ferrite_moe_pipe_down_dyn, 8, true)
FERRITE_MOE_PIPE_DOWN(ferrite_moe_pipe_down_w16_dyn, 16, true)
