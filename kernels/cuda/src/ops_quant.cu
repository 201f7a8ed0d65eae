// GGML block-quantized weights on the device: the GEMV of decode steps,
// reading the blocks as they are, and their exact decoding into bfloat16
// for the products of many rows (kernels/cuda/quant.go).
//
// Device layout (quant.go's quantLayout; every load below is 16-byte
// aligned). Rows follow one another; for Q8_0, Q4_0 and Q6_K the
// blocks' float16 scales d move to a second section at byte dsec, row r's
// at dsec + 2·r·(cols / block elements):
//   Q4_K, Q5_K  GGML's own blocks, 144 and 176 bytes (multiples of 16).
//   Q8_0        the row's int8 values, cols bytes.
//   Q4_0        the row's nibbles, 16 bytes a block (GGML's qs).
//   Q6_K        208 bytes a super-block: ql 128, qh 64, int8 scales 16.
//
// A part is the 32 elements of a row one lane takes: a Q8_0 or Q4_0 block,
// or an eighth of a K super-block. It is two runs of 16 elements, run 0 at
// columns o0…o0+15 and run 1 at o1…o1+15, each with one scale and min, so
// that element i of run k is w = exact(q_i, sc_k, mn_k) (the Go reference's
// rounding, kernels.quant.go). The GEMV writes w = A·f − B with
// f = 1 + q / 2^bits, a float32 made from q's bits in one or two integer
// operations (no int → float conversion, which runs at a sixteenth of the
// FMA rate), so a run's dot product is A·Σ f·x − B·Σ x: the sums differ
// from the exact weights' only in rounding (tolerances in quant_test.go).

namespace {

// qbyte is byte i (compile-time after unrolling) of v.
__device__ inline uint32_t qbyte(const uint4& v, int i) {
    const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (w >> (8 * (i & 3))) & 0xffu;
}

// qword is the 32-bit word of v that holds byte i (compile-time after
// unrolling).
__device__ inline uint32_t qword(const uint4& v, int i) { return i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w; }

// qbits moves bits lo…lo+B−1 of w (lo compile-time after unrolling) to
// bits 23−B…22, the top of a float32's mantissa, the rest cleared: a mask,
// then a shift that the compiler joins to qf's add (IMAD or LEA.HI).
template <int B>
__device__ inline uint32_t qbits(uint32_t w, int lo) {
    const int sh = 23 - B - lo;
    const uint32_t m = w & (((1u << B) - 1) << lo);
    return sh >= 0 ? m << sh : m >> -sh;
}

// qf is the float32 1 + field / 2^B for the bits qbits (or a sum of such
// fields of B bits in all) made.
__device__ inline float qf(uint32_t bits) { return __uint_as_float(bits + 0x3f800000u); }

__device__ inline float qhalf(const uint8_t* p) { return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p))); }

// QRun are a part's two runs' scales and mins (exact's sc and mn).
struct QRun {
    float sc[2], mn[2];
};

// Q8_0: w = d·q, q int8; the GEMV's q is the byte + 128.
struct Q8_0Q {
    static constexpr int kBits = 8, kBlock = 32;
    struct Raw {
        uint4 a, b;
        float d;
    };
    __device__ static void offs(int p, int& o0, int& o1) { o0 = 32 * p, o1 = o0 + 16; }
    __device__ static Raw load(const uint8_t* w, const uint8_t* ds, int r, int cols, int p) {
        const uint4* q = reinterpret_cast<const uint4*>(w + size_t(r) * cols + 32 * size_t(p));
        return Raw{__ldg(q), __ldg(q + 1), qhalf(ds + 2 * (size_t(r) * (cols / 32) + p))};
    }
    __device__ static uint32_t q(const Raw& v, int i) { return (i < 16 ? qbyte(v.a, i) : qbyte(v.b, i - 16)) ^ 0x80u; }
    __device__ static float f(const Raw& v, int i) {
        return qf(qbits<8>(qword(i < 16 ? v.a : v.b, i & 15) ^ 0x80808080u, 8 * (i & 3)));
    }
    __device__ static QRun run(const Raw& v, int) { return QRun{{v.d, v.d}, {0.f, 0.f}}; }
    __device__ static float exact(uint32_t q, float sc, float) { return __fmul_rn(float(int(q) - 128), sc); }
    __device__ static void ab(float sc, float, float& A, float& B) { A = 256.f * sc, B = 384.f * sc; }
};

// Q4_0: w = d·(q − 8); byte j holds element j (low nibble) and j + 16.
struct Q4_0Q {
    static constexpr int kBits = 4, kBlock = 32;
    struct Raw {
        uint4 a;
        float d;
    };
    __device__ static void offs(int p, int& o0, int& o1) { o0 = 32 * p, o1 = o0 + 16; }
    __device__ static Raw load(const uint8_t* w, const uint8_t* ds, int r, int cols, int p) {
        const uint4* q = reinterpret_cast<const uint4*>(w + size_t(r) * (cols / 2) + 16 * size_t(p));
        return Raw{__ldg(q), qhalf(ds + 2 * (size_t(r) * (cols / 32) + p))};
    }
    __device__ static uint32_t q(const Raw& v, int i) { return i < 16 ? qbyte(v.a, i) & 15u : qbyte(v.a, i - 16) >> 4; }
    __device__ static float f(const Raw& v, int i) { return qf(qbits<4>(qword(v.a, i & 15), 8 * (i & 3) + 4 * (i >> 4))); }
    __device__ static QRun run(const Raw& v, int) { return QRun{{v.d, v.d}, {0.f, 0.f}}; }
    __device__ static float exact(uint32_t q, float sc, float) { return __fmul_rn(sc, float(int(q) - 8)); }
    __device__ static void ab(float sc, float, float& A, float& B) { A = 16.f * sc, B = 24.f * sc; }
};

// The K quants' 6-bit scale and min of sub-block j (kernels.ScaleMinK4)
// from a block's first 16 bytes h (d, dmin, scales[12]).
__device__ inline void scale_min_k4(const uint4& h, int j, float& sc, float& m) {
    const int sh = 8 * (j & 3);
    const uint32_t b0 = (h.y >> sh) & 0xffu, b1 = (h.z >> sh) & 0xffu, b2 = (h.w >> sh) & 0xffu;
    const bool hi = j >= 4;
    sc = float(hi ? (b2 & 15u) | ((b0 >> 6) << 4) : b0 & 63u);
    m = float(hi ? (b2 >> 4) | ((b1 >> 6) << 4) : b1 & 63u);
}

// Q4_K and Q5_K (F = 5): w = d·sc·q − dmin·m per sub-block of 32. Part t
// of a super-block takes bytes 16·t… of qs: their low nibbles are elements
// 16·(t&1)… of sub-block 2·(t/2) (run 0), their high ones the same of
// sub-block 2·(t/2) + 1 (run 1); Q5_K's fifth bits are bits 2·(t/2) and
// 2·(t/2) + 1 of qh's bytes 16·(t&1)….
template <bool F>
struct QKQ {
    static constexpr int kBits = F ? 5 : 4, kBlock = 256, kBytes = F ? 176 : 144;
    struct Raw {
        uint4 h, qh, qs;
        int t;
    };
    __device__ static void offs(int p, int& o0, int& o1) {
        const int t = p & 7;
        o0 = 256 * (p >> 3) + 64 * (t >> 1) + 16 * (t & 1), o1 = o0 + 32;
    }
    __device__ static Raw load(const uint8_t* w, const uint8_t*, int r, int cols, int p) {
        const uint8_t* b = w + (size_t(r) * (cols / 256) + (p >> 3)) * kBytes;
        const int t = p & 7;
        Raw v;
        v.t = t;
        v.h = __ldg(reinterpret_cast<const uint4*>(b));
        v.qh = F ? __ldg(reinterpret_cast<const uint4*>(b + 16 + 16 * (t & 1))) : uint4{};
        v.qs = __ldg(reinterpret_cast<const uint4*>(b + (F ? 48 : 16) + 16 * t));
        return v;
    }
    __device__ static uint32_t q(const Raw& v, int i) {
        const int k = i >> 4, l = i & 15, s = 2 * (v.t >> 1) + k;
        uint32_t q = (qbyte(v.qs, l) >> (4 * k)) & 15u;
        if (F) q |= ((qbyte(v.qh, l) >> s) & 1u) << 4;
        return q;
    }
    __device__ static float f(const Raw& v, int i) {
        const int k = i >> 4, l = i & 15;
        if (!F) return qf(qbits<4>(qword(v.qs, l), 8 * (l & 3) + 4 * k));
        // the nibble below the fifth bit, bit s of qh's byte l (s per run)
        const uint32_t h = qword(v.qh, l) >> (2 * (v.t >> 1) + k);
        return qf((qbits<4>(qword(v.qs, l), 8 * (l & 3) + 4 * k) >> 1) + qbits<1>(h, 8 * (l & 3)));
    }
    __device__ static QRun run(const Raw& v, int) {
        const float d = __half2float(__ushort_as_half(uint16_t(v.h.x))), dmin = __half2float(__ushort_as_half(uint16_t(v.h.x >> 16)));
        QRun o;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float sc, m;
            scale_min_k4(v.h, 2 * (v.t >> 1) + k, sc, m);
            o.sc[k] = __fmul_rn(d, sc), o.mn[k] = __fmul_rn(dmin, m);
        }
        return o;
    }
    __device__ static float exact(uint32_t q, float sc, float mn) { return __fsub_rn(__fmul_rn(sc, float(q)), mn); }
    __device__ static void ab(float sc, float mn, float& A, float& B) {
        A = float(1 << kBits) * sc, B = __fadd_rn(A, mn);
    }
};

// Q6_K: w = d·sc·(q − 32), q six bits, a scale per 16 elements. Part t of
// a super-block (h = t/4, g = (t/2)&1, u = t&1) takes ql bytes
// 64h + 32g + 16u… (low nibbles: elements 128h + 32g + 16u…, run 0; high
// ones: the same + 64, run 1) and qh bytes 32h + 16u… (bits 2g and 2g + 4).
struct Q6KQ {
    static constexpr int kBits = 6, kBlock = 256, kBytes = 208;
    struct Raw {
        uint4 ql, qh;
        float sc0, sc1;
        int t;
    };
    __device__ static void offs(int p, int& o0, int& o1) {
        const int t = p & 7;
        o0 = 256 * (p >> 3) + 128 * (t >> 2) + 32 * ((t >> 1) & 1) + 16 * (t & 1), o1 = o0 + 64;
    }
    __device__ static Raw load(const uint8_t* w, const uint8_t* ds, int r, int cols, int p) {
        const size_t sb = size_t(r) * (cols / 256) + (p >> 3);
        const uint8_t* b = w + sb * kBytes;
        const int t = p & 7, h = t >> 2, g = (t >> 1) & 1, u = t & 1;
        Raw v;
        v.t = t;
        v.ql = __ldg(reinterpret_cast<const uint4*>(b + 64 * h + 32 * g + 16 * u));
        v.qh = __ldg(reinterpret_cast<const uint4*>(b + 128 + 32 * h + 16 * u));
        const float d = qhalf(ds + 2 * sb);
        const int s = 8 * h + 2 * g + u;  // the scale of run 0; run 1's is s + 4
        v.sc0 = __fmul_rn(d, float(int8_t(__ldg(b + 192 + s)))), v.sc1 = __fmul_rn(d, float(int8_t(__ldg(b + 196 + s))));
        return v;
    }
    __device__ static uint32_t q(const Raw& v, int i) {
        const int k = i >> 4, l = i & 15, g = ((v.t >> 1) & 1) + 2 * k;
        return ((qbyte(v.ql, l) >> (4 * k)) & 15u) | (((qbyte(v.qh, l) >> (2 * g)) & 3u) << 4);
    }
    __device__ static float f(const Raw& v, int i) {
        const int k = i >> 4, l = i & 15, g = ((v.t >> 1) & 1) + 2 * k;
        const uint32_t h = qword(v.qh, l) >> (2 * g);  // qh's bits 2g, 2g + 1 of byte l at 8·(l & 3)
        return qf((qbits<4>(qword(v.ql, l), 8 * (l & 3) + 4 * k) >> 2) + qbits<2>(h, 8 * (l & 3)));
    }
    __device__ static QRun run(const Raw& v, int) { return QRun{{v.sc0, v.sc1}, {0.f, 0.f}}; }
    __device__ static float exact(uint32_t q, float sc, float) { return __fmul_rn(sc, float(int(q) - 32)); }
    __device__ static void ab(float sc, float, float& A, float& B) { A = 64.f * sc, B = 96.f * sc; }
};

// load16 reads 16 floats from x (16-byte aligned) into v.
__device__ inline void load16(const float* __restrict__ x, float (&v)[16]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(x) + q);
        v[4 * q] = t.x, v[4 * q + 1] = t.y, v[4 * q + 2] = t.z, v[4 * q + 3] = t.w;
    }
}

// QDec is one part of a row ready for its dot products: f = 1 + q / 2^bits
// of its 32 elements (run 0, then run 1) and the runs' w = A·f − B.
struct QDec {
    float f[32];
    float A0, B0, A1, B1;
};

template <class Q>
__device__ inline QDec quant_dec(const typename Q::Raw& raw) {
    QDec d;
#pragma unroll
    for (int i = 0; i < 32; i++) d.f[i] = Q::f(raw, i);
    const QRun c = Q::run(raw, 0);
    Q::ab(c.sc[0], c.mn[0], d.A0, d.B0);
    Q::ab(c.sc[1], c.mn[1], d.A1, d.B1);
    return d;
}

// quant_part_dot is a decoded part's contribution to its row's dot
// product with x's 32 values xa (run 0) and xb (run 1), whose sums are sa
// and sb: A0·Σf·xa − B0·sa + A1·Σf·xb − B1·sb, rounded the same way
// wherever it is called (every form of the kernel gives a row the same
// bits).
__device__ inline float quant_part_dot(const QDec& d, const float (&xa)[16], const float (&xb)[16], float sa, float sb) {
    float fa = 0.f, fb = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        fa = fmaf(d.f[i], xa[i], fa);
        fb = fmaf(d.f[16 + i], xb[i], fb);
    }
    return __fadd_rn(__fsub_rn(__fmul_rn(d.A0, fa), __fmul_rn(d.B0, sa)), __fsub_rn(__fmul_rn(d.A1, fb), __fmul_rn(d.B1, sb)));
}

// quant_x loads a part's 32 values of the row x (runs at o0 and o1) and
// their sums.
__device__ inline void quant_x(const float* __restrict__ x, int o0, int o1, float (&xa)[16], float (&xb)[16], float& sa,
                               float& sb) {
    load16(x + o0, xa);
    load16(x + o1, xb);
    sa = 0.f, sb = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) sa += xa[i], sb += xb[i];
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
