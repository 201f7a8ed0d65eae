// GGML block-quantized weights on the device: the GEMV of decode steps,
// reading the blocks as they are, and their exact decoding into bfloat16
// for the products of many rows (kernels/cuda/quant.go). The blocks'
// device layout and their decoding are ops_common_quant.cu's, which the
// MoE kernels share.

namespace {

// quant_gemv_store ends a pass of the quantized GEMVs (4 warps): each
// warp's sums acc (R weight rows from r0, NB rows of x, nb of them real)
// meet in part and are added in warp order into y[j·ldy + r0 + r]
// (+ bias) (+ the old y).
template <int R, int NB>
__device__ __forceinline__ void quant_gemv_store(float (*part)[R * NB], const float (&acc)[R][NB], float* __restrict__ y, int r0, int rows,
                                                 int nb, int ldy, const float* __restrict__ bias, int acc_y) {
    constexpr int kWarps = 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
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
            store(y + size_t(j) * ldy + r0 + r, s, bias, r0 + r, acc_y);
        }
    }
    __syncthreads();
}

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
        quant_gemv_store<R, NB>(part, acc, y + size_t(j0) * ldy, r0, rows, nb, ldy, bias, acc_y);
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
        quant_gemv_store<R, NB>(part, acc, y + size_t(j0) * ldy, r0, rows, nb, ldy, bias, acc_y);
    }
}

// i2f is v as a float32, exactly for |v| < 2^22, in two full-rate
// instructions (an integer add into the mantissa of 1.5·2^23, then a float
// subtraction) where I2F runs at an eighth of the FMA rate.
__device__ inline float i2f(int v) { return __fsub_rn(__int_as_float(v + 0x4B400000), 12582912.f); }

// The tensor-core product's tiles: a block of 4 warps takes kMmqRows weight
// rows (a warp 32: two tiles of 16), x's columns kMmqChunk at a time (4
// parts of every dtype).
constexpr int kMmqRows = 128, kMmqChunk = 128;

// MmqX is a block's chunk of NT·8 rows of int8 x in shared memory: their
// values (a row 16 bytes longer than the chunk, so that the fragments'
// loads meet no bank conflicts) and each run's (d, Σq) pair.
template <int NT>
struct MmqX {
    int8_t q[NT * 8][kMmqChunk + 16];
    uint2 e[NT * 8][kMmqChunk / 16];
};

// mmq_stage copies chunk c of x's rows src(j) (j < NT·8; −1: zeros) from
// the int8 values xq and pairs xe (cols wide rows) into s. The caller
// synchronises the block before and after.
template <int NT, class F>
__device__ __forceinline__ void mmq_stage(MmqX<NT>& s, const int8_t* __restrict__ xq, const uint2* __restrict__ xe, int cols, int c,
                                          F src) {
    for (int i = threadIdx.x; i < NT * 8 * 8; i += blockDim.x) {
        const int j = i >> 3, q = i & 7, r = src(j);
        uint4 v{};
        if (r >= 0) v = __ldg(reinterpret_cast<const uint4*>(xq + size_t(r) * cols + c * kMmqChunk) + q);
        reinterpret_cast<uint4*>(s.q[j])[q] = v;
    }
    for (int i = threadIdx.x; i < NT * 8 * 4; i += blockDim.x) {
        const int j = i >> 2, q = i & 3, r = src(j);
        uint4 v{};
        if (r >= 0) v = __ldg(reinterpret_cast<const uint4*>(xe + size_t(r) * (cols / 16) + c * (kMmqChunk / 16)) + q);
        reinterpret_cast<uint4*>(s.e[j])[q] = v;
    }
}

// MmqW is where a warp's two tiles of 16 weight rows are: tile m's matrix
// (w[m], its scale section ds[m]; quantLayout's) and rows r[m][0] (the
// lane's g) and r[m][1] (g + 8), of cols columns.
struct MmqW {
    const uint8_t* w[2];
    const uint8_t* ds[2];
    int r[2][2];
    int cols;
};

// mmq_chunk adds to acc ([tile][x tile][the mma's element]) the dot
// products of the warp's two tiles with the first nq·8 rows of s, chunk c,
// on the tensor cores (mma.sync m16n8k16 s8 → s32). A part's run (16
// weights, one scale) is one mma a tile of 16 weight rows and 8 rows of x:
// lane 4g + t holds word t of rows g and g + 8's run (Q::q8) and of x row
// g's, and gets the dot products of rows g, g + 8 with x rows 2t, 2t + 1,
// combined in float32 as d·Σ_k (sc_k·(s_k − kOff·Σxq_k) − mn_k·Σxq_k). IE:
// the K quants' runs are combined in integers over the chunk
// (Σ sc_k·(s_k − kOff·Σxq_k) and Σ m_k·Σxq_k, then d·S − dmin·M in float32
// once; a chunk lies in one super-block and one scale group of x), a
// block-of-32 type's two runs in one integer a part: fewer instructions a
// run, more registers. A row's sums depend only on its own row of x.
template <class Q, int NT, bool IE>
__device__ __forceinline__ void mmq_chunk(float (&acc)[2][NT][4], const MmqW& wt, const MmqX<NT>& s, int c, int nq) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    constexpr bool kSuper = IE && Q::kBlock == 256;  // integer sums over the chunk
    int S[2][NT][4], M[2][NT][4];                    // kSuper: Σ sc·s, Σ m·Σxq, as acc
    float dk[2][2], dmk[2][2], dxk[NT][2];           // kSuper: the chunk's d, dmin [tile][g, g + 8] and x's d [x tile][2t, 2t + 1]
    if (kSuper) {
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int q = 0; q < NT; q++)
#pragma unroll
                for (int i = 0; i < 4; i++) S[m][q][i] = 0, M[m][q][i] = 0;
    }
#pragma unroll 1
    for (int pp = 0; pp < kMmqChunk / 32; pp++) {
        const int p = c * (kMmqChunk / 32) + pp;
        int o0, o1;
        Q::offs(p, o0, o1);
        o0 -= c * kMmqChunk, o1 -= c * kMmqChunk;
        typename Q::Raw raw[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) raw[m][h] = Q::load(wt.w[m], wt.ds[m], wt.r[m][h], wt.cols, p);
        uint32_t a[2][2][2];             // [tile][run][g, g + 8] the A fragments
        float sc[2][2][2], mn[2][2][2];  // [tile][g, g + 8][run]; !IE: the runs' scales and mins, else sc[·][·][0] d
        int isc[2][2][2], imn[2][2][2];  // kSuper: [tile][g, g + 8][run] the integer scales and mins
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                Q::q8(raw[m][h], t, a[m][0][h], a[m][1][h]);
                if constexpr (kSuper) {
                    Q::iscales(raw[m][h], isc[m][h], imn[m][h]);
                    Q::dd(raw[m][h], dk[m][h], dmk[m][h]);
                    continue;
                }
                const QRun cr = Q::run(raw[m][h], 0);
#pragma unroll
                for (int k = 0; k < 2; k++) sc[m][h][k] = cr.sc[k], mn[m][h][k] = cr.mn[k];
            }
#pragma unroll
        for (int q = 0; q < NT; q++) {
            if (q >= nq) break;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&s.q[8 * q + g][o0 + 4 * t]);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&s.q[8 * q + g][o1 + 4 * t]);
            float dx[2];
            int xs0[2], xs1[2];  // [x row 2t, 2t + 1] each run's Σxq
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const uint2 u0 = s.e[8 * q + 2 * t + e][o0 >> 4], u1 = s.e[8 * q + 2 * t + e][o1 >> 4];
                dx[e] = __uint_as_float(u0.x), xs0[e] = int(u0.y), xs1[e] = int(u1.y);
                if (kSuper) dxk[q][e] = dx[e];
            }
#pragma unroll
            for (int m = 0; m < 2; m++) {
                int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                mma_s8(s0, a[m][0][0], a[m][0][1], b0);
                mma_s8(s1, a[m][1][0], a[m][1][1], b1);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i >> 1, e = i & 1;
                    const int z0 = s0[i] - Q::kOff * xs0[e], z1 = s1[i] - Q::kOff * xs1[e];
                    if (kSuper) {
                        S[m][q][i] += isc[m][h][0] * z0 + isc[m][h][1] * z1;
                        if (Q::kMin) M[m][q][i] += imn[m][h][0] * xs0[e] + imn[m][h][1] * xs1[e];
                    } else if (IE) {  // one scale d a part (sc[·][·][0] = sc[·][·][1], no mins)
                        acc[m][q][i] = fmaf(__fmul_rn(dx[e], sc[m][h][0]), i2f(z0 + z1), acc[m][q][i]);
                    } else {
                        float v = fmaf(sc[m][h][0], i2f(z0), __fmul_rn(sc[m][h][1], i2f(z1)));
                        if (Q::kMin) v = fmaf(-mn[m][h][0], i2f(xs0[e]), fmaf(-mn[m][h][1], i2f(xs1[e]), v));
                        acc[m][q][i] = fmaf(dx[e], v, acc[m][q][i]);
                    }
                }
            }
        }
    }
    if (kSuper) {  // the chunk's integer sums, in float32 once
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int q = 0; q < NT; q++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (q >= nq) break;
                    const int h = i >> 1, e = i & 1;
                    float v = __fmul_rn(dk[m][h], float(S[m][q][i]));
                    if (Q::kMin) v = fmaf(-dmk[m][h], float(M[m][q][i]), v);
                    acc[m][q][i] = fmaf(dxk[q][e], v, acc[m][q][i]);
                }
    }
}

// quant_mmq: y[j·ldy + r] = row r of w · x_j (+ bias[r]) (+ the old y) for
// j < n, x quantized to int8 (quant_x8_rows' xq, xe), on the tensor cores
// (mmq_chunk): decode batches wider than the GEMV's. A block takes
// kMmqRows weight rows and NT·8 rows of x (blockIdx.y), over split
// blockIdx.z of gridDim.z of the column chunks, each chunk of x staged in
// shared memory. With one split, y gets the sums; with more, ws[z] (n,
// ldy) gets split z's and ferrite_qmmq_sum adds them in split order. A
// row's sums do not depend on n, NT or the other rows of x (only on the
// splits, which the caller chooses from w's shape).
template <class Q, int NT, bool IE>
__device__ void quant_mmq(float* __restrict__ y, float* __restrict__ ws, const int8_t* __restrict__ xq, const uint2* __restrict__ xe,
                          const uint8_t* __restrict__ w, const uint8_t* __restrict__ ds, int n, int rows, int cols, int ldy,
                          const float* __restrict__ bias, int acc_y) {
    __shared__ __align__(16) MmqX<NT> s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * kMmqRows + warp * 32, j0 = blockIdx.y * NT * 8;
    const int chunks = cols / kMmqChunk, c0 = blockIdx.z * chunks / gridDim.z, c1 = (blockIdx.z + 1) * chunks / gridDim.z;
    MmqW wt{{w, w}, {ds, ds}, {}, cols};
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) wt.r[m][h] = min(r0 + 16 * m + 8 * h + g, rows - 1);  // the last row past the end
    float acc[2][NT][4] = {};
    for (int c = c0; c < c1; c++) {
        __syncthreads();  // the last chunk's fragments are read
        mmq_stage<NT>(s, xq, xe, cols, c, [&](int j) { return j0 + j < n ? j0 + j : -1; });
        __syncthreads();
        mmq_chunk<Q, NT, IE>(acc, wt, s, c, NT);
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = r0 + 16 * m + 8 * (i >> 1) + g, j = j0 + 8 * q + 2 * t + (i & 1);
                if (r >= rows || j >= n) continue;
                if (gridDim.z == 1) store(y + size_t(j) * ldy + r, acc[m][q][i], bias, r, acc_y);
                else ws[(size_t(blockIdx.z) * n + j) * ldy + r] = acc[m][q][i];
            }
}

// moe_mmq_q is the experts' grouped product on the tensor cores for
// block-quantized experts of the dtype Q: block (x, g) takes tile g of the
// sorted slots (ferrite_moe_sort's: expert e with tiles[e] ≤ g <
// tiles[e + 1], up to kTileM of its slots, tile_slots), 32 slots of x at a
// time, x's int8 rows (xq, xe, kdim wide) those of the slots' tokens (GU)
// or the slots (down). GU: warp v takes output rows r0 = 64x + 16v, its
// tile 0 the gate's rows and tile 1 the up's, h[s] (slots, nrows = inter)
// = the SwiGLU; else warp v takes the down's rows 128x + 32v …, ye[s]
// (slots, nrows = hidden) each slot's expert output (ferrite_moe_combine
// adds them). A slot's sums depend only on its own row of x.
template <class Q, bool GU>
__device__ void moe_mmq_q(float* __restrict__ out, int nrows, const int8_t* __restrict__ xq, const uint2* __restrict__ xe, int kdim,
                          const MatDesc& ma, const MatDesc& mb, const int* slot, const int* row_in, int cnt, MmqX<4>& s, float limit) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = GU ? blockIdx.x * 64 + warp * 16 : blockIdx.x * kMmqRows + warp * 32;
    MmqW wt{{ma.data, (GU ? mb : ma).data},
            {reinterpret_cast<const uint8_t*>(ma.scale), reinterpret_cast<const uint8_t*>((GU ? mb : ma).scale)},
            {},
            kdim};
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wt.r[m][h] = min((GU ? r0 : r0 + 16 * m) + 8 * h + g, nrows - 1) + (GU && m ? mb.row0 : ma.row0);
    for (int s0 = 0; s0 < cnt; s0 += 32) {
        const int nq = min(4, (cnt - s0 + 7) / 8);
        float acc[2][4][4] = {};
        for (int c = 0; c < kdim / kMmqChunk; c++) {
            __syncthreads();  // the last chunk's fragments are read
            mmq_stage<4>(s, xq, xe, kdim, c, [&](int j) { return s0 + j < cnt ? row_in[s0 + j] : -1; });
            __syncthreads();
            mmq_chunk<Q, 4, false>(acc, wt, s, c, nq);
        }
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = s0 + 8 * q + 2 * t + (i & 1);
                if (j >= cnt) continue;
                const int sl = slot[j];
                if (GU) {
                    const int r = r0 + 8 * (i >> 1) + g;
                    if (r < nrows) out[size_t(sl) * nrows + r] = swiglu_clamp1(acc[0][q][i], acc[1][q][i], limit);
                } else {
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        const int r = r0 + 16 * m + 8 * (i >> 1) + g;
                        if (r < nrows) out[size_t(sl) * nrows + r] = acc[m][q][i];
                    }
                }
            }
    }
}

// moe_mmq is moe_mmq_q by the dtype of tile g's expert (its gate and up,
// or its down, all of one dtype: the caller checks).
template <bool GU>
__device__ void moe_mmq(float* out, int nrows, const int8_t* xq, const uint2* xe, int kdim, const int* off, const int* tiles,
                        const int* perm, const MatDesc* table, int experts, int k, float limit) {
    __shared__ __align__(16) MmqX<4> s;
    __shared__ int row_in[kTileM], slot[kTileM];
    const int g = blockIdx.y;
    if (g >= tiles[experts]) return;
    const int e = tile_slots<GU>(slot, row_in, g, off, tiles, perm, experts, k);
    const int cnt = min(kTileM, off[e + 1] - off[e] - (g - tiles[e]) * kTileM);
    const MatDesc ma = table[3 * e + (GU ? 0 : 2)], mb = table[3 * e + 1];
    switch (ma.dtype) {
    case kQ8_0: moe_mmq_q<Q8_0Q, GU>(out, nrows, xq, xe, kdim, ma, mb, slot, row_in, cnt, s, limit); break;
    case kQ4_0: moe_mmq_q<Q4_0Q, GU>(out, nrows, xq, xe, kdim, ma, mb, slot, row_in, cnt, s, limit); break;
    case kQ4K: moe_mmq_q<QKQ<false>, GU>(out, nrows, xq, xe, kdim, ma, mb, slot, row_in, cnt, s, limit); break;
    case kQ5K: moe_mmq_q<QKQ<true>, GU>(out, nrows, xq, xe, kdim, ma, mb, slot, row_in, cnt, s, limit); break;
    default: moe_mmq_q<Q6KQ, GU>(out, nrows, xq, xe, kdim, ma, mb, slot, row_in, cnt, s, limit); break;
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
// ferrite_embed_q: y[i] (cols) = row ids[i] of the block-quantized table w
// (rows, cols; quantLayout's device layout, ds its scale section, dtype
// its device code), decoded exactly as kernels.Mat.RowF32 (quant_run16);
// an id outside the table writes NaN. Launch: a block of 256 threads a
// row of y, a thread a run of 16 columns at a time.
extern "C" __global__ void __launch_bounds__(256) ferrite_embed_q(float* y, int y_stride, const uint8_t* w, const uint8_t* ds,
                                                                   const int* ids, int ids_stride, int n, int rows, int cols,
                                                                   int dtype) {
    FERRITE_PDL_WAIT();
    if (int(blockIdx.x) >= n) return;
    float* yr;
    const int id = embed_id(yr, y, y_stride, ids, ids_stride, rows, cols);
    if (id < 0) return;
    const MatDesc m{w, reinterpret_cast<const float*>(ds), dtype, rows, cols, 1, 1, 0};
    for (int c0 = 16 * threadIdx.x; c0 < cols; c0 += 16 * blockDim.x) {
        float v[16];
        quant_run16(m, id, c0, v);
#pragma unroll
        for (int e = 0; e < 16; e++) yr[c0 + e] = v[e];
    }
}

#define FERRITE_QMMQ(name, Q, NT, IE)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128) name(float* y, float* ws, const int8_t* xq, const uint2* xe,         \
                                                           const uint8_t* w, const uint8_t* ds, int n, int rows, int cols, \
                                                           int ldy, const float* bias, int acc_y) {                        \
        FERRITE_PDL_WAIT();                                                                                                \
        quant_mmq<Q, NT, IE>(y, ws, xq, xe, w, ds, n, rows, cols, ldy, bias, acc_y);                                       \
    }

// The experts' grouped product over their blocks on int8 x (moe_mmq):
// gate/up with the SwiGLU into h (slots, inter) from x's int8 rows (n,
// hidden); down into ye (slots, hidden) from h's (slots, inter), then
// ferrite_moe_combine. Launch: grid (ceil(inter / 64), ceil(slots / 64) +
// experts) and (ceil(hidden / 128), the same), 128 threads, after
// ferrite_moe_sort.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_moe_mmq_gate_up(float* h, int inter, const int8_t* xq, const uint2* xe, int hidden, const int* off, const int* tiles,
                            const int* perm, const MatDesc* table, int experts, int k, float limit) {
    FERRITE_PDL_WAIT();
    moe_mmq<true>(h, inter, xq, xe, hidden, off, tiles, perm, table, experts, k, limit);
}
extern "C" __global__ void __launch_bounds__(128)
    ferrite_moe_mmq_down(float* ye, int hidden, const int8_t* hq, const uint2* he, int inter, const int* off, const int* tiles,
                         const int* perm, const MatDesc* table, int experts, int k) {
    FERRITE_PDL_WAIT();
    moe_mmq<false>(ye, hidden, hq, he, inter, off, tiles, perm, table, experts, k, 0.f);
}

// ferrite_qmmq_sum: y[j·ldy + r] = Σ_z ws[(z·n + j)·ldy + r] in split
// order (+ bias[r]) (+ the old y), for j < n, r < rows: quant_mmq's splits.
extern "C" __global__ void __launch_bounds__(256) ferrite_qmmq_sum(float* y, const float* ws, const float* bias, int n, int rows,
                                                                    int ldy, int splits, int acc_y) {
    FERRITE_PDL_WAIT();
    const size_t i = size_t(blockIdx.x) * 256 + threadIdx.x;
    if (i >= size_t(n) * rows) return;
    const int j = int(i / rows), r = int(i % rows);
    float s = ws[size_t(j) * ldy + r];
    for (int z = 1; z < splits; z++) s += ws[(size_t(z) * n + j) * ldy + r];
    store(y + size_t(j) * ldy + r, s, bias, r, acc_y);
}

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
FERRITE_QMMQ(ferrite_qmmq_q8_0_x16, Q8_0Q, 2, false)
FERRITE_QMMQ(ferrite_qmmq_q8_0_x16i, Q8_0Q, 2, true)
FERRITE_QMMQ(ferrite_qmmq_q8_0_x32, Q8_0Q, 4, false)
FERRITE_QMMQ(ferrite_qmmq_q8_0_x32i, Q8_0Q, 4, true)
FERRITE_QMMQ(ferrite_qmmq_q4_0_x16, Q4_0Q, 2, false)
FERRITE_QMMQ(ferrite_qmmq_q4_0_x16i, Q4_0Q, 2, true)
FERRITE_QMMQ(ferrite_qmmq_q4_0_x32, Q4_0Q, 4, false)
FERRITE_QMMQ(ferrite_qmmq_q4_0_x32i, Q4_0Q, 4, true)
FERRITE_QMMQ(ferrite_qmmq_q4_k_x16, QKQ<false>, 2, false)
FERRITE_QMMQ(ferrite_qmmq_q4_k_x16i, QKQ<false>, 2, true)
FERRITE_QMMQ(ferrite_qmmq_q4_k_x32, QKQ<false>, 4, false)
FERRITE_QMMQ(ferrite_qmmq_q4_k_x32i, QKQ<false>, 4, true)
FERRITE_QMMQ(ferrite_qmmq_q5_k_x16, QKQ<true>, 2, false)
FERRITE_QMMQ(ferrite_qmmq_q5_k_x16i, QKQ<true>, 2, true)
FERRITE_QMMQ(ferrite_qmmq_q5_k_x32, QKQ<true>, 4, false)
FERRITE_QMMQ(ferrite_qmmq_q5_k_x32i, QKQ<true>, 4, true)
FERRITE_QMMQ(ferrite_qmmq_q6_k_x16, Q6KQ, 2, false)
FERRITE_QMMQ(ferrite_qmmq_q6_k_x16i, Q6KQ, 2, true)
FERRITE_QMMQ(ferrite_qmmq_q6_k_x32, Q6KQ, 4, false)
FERRITE_QMMQ(ferrite_qmmq_q6_k_x32i, Q6KQ, 4, true)
