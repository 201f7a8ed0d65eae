// GGML block-quantized weights on the device, as ops_quant.cu's GEMV and
// decoding and ops_moe.cu's grouped experts read them (sorted after
// ops_common.cu, whose MatDesc a quantized expert's matrix fills: data the
// blocks, scale the byte address of the scale section).
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
// operations (no int → float conversion, which runs at an eighth of the
// FMA rate), so a run's dot product is A·Σ f·x − B·Σ x: the sums differ
// from the exact weights' only in rounding (tolerances in quant_test.go).

namespace {

// The device codes of the GGML block types (kernels.DType), after ops.cu's
// kF32, kBF16, kF16 and kF8E4M3.
constexpr int kQ8_0 = 4, kQ4_0 = 5, kQ4K = 6, kQ5K = 7, kQ6K = 8;

__device__ inline bool is_quant(int dtype) { return dtype >= kQ8_0 && dtype <= kQ6K; }

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
    __device__ static void where(int c, int& p, int& i) { p = c >> 5, i = c & 31; }
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
    // int8 activations (quant_part_dot8, quant_mmq): w = sc·(q8 − kOff) − mn
    // (kMin: whether mn can be other than 0); q8 sets q0 and q1 to word w
    // (0…3: elements 4w…4w+3) of run 0's and run 1's q8 (here the int8
    // values), a signed byte each.
    static constexpr int kOff = 0;
    static constexpr bool kMin = false;
    __device__ static void q8(const Raw& v, int w, uint32_t& q0, uint32_t& q1) { q0 = qword(v.a, 4 * w), q1 = qword(v.b, 4 * w); }
};

// Q4_0: w = d·(q − 8); byte j holds element j (low nibble) and j + 16.
struct Q4_0Q {
    static constexpr int kBits = 4, kBlock = 32;
    struct Raw {
        uint4 a;
        float d;
    };
    __device__ static void offs(int p, int& o0, int& o1) { o0 = 32 * p, o1 = o0 + 16; }
    __device__ static void where(int c, int& p, int& i) { p = c >> 5, i = c & 31; }
    __device__ static Raw load(const uint8_t* w, const uint8_t* ds, int r, int cols, int p) {
        const uint4* q = reinterpret_cast<const uint4*>(w + size_t(r) * (cols / 2) + 16 * size_t(p));
        return Raw{__ldg(q), qhalf(ds + 2 * (size_t(r) * (cols / 32) + p))};
    }
    __device__ static uint32_t q(const Raw& v, int i) { return i < 16 ? qbyte(v.a, i) & 15u : qbyte(v.a, i - 16) >> 4; }
    __device__ static float f(const Raw& v, int i) { return qf(qbits<4>(qword(v.a, i & 15), 8 * (i & 3) + 4 * (i >> 4))); }
    __device__ static QRun run(const Raw& v, int) { return QRun{{v.d, v.d}, {0.f, 0.f}}; }
    __device__ static float exact(uint32_t q, float sc, float) { return __fmul_rn(sc, float(int(q) - 8)); }
    __device__ static void ab(float sc, float, float& A, float& B) { A = 16.f * sc, B = 24.f * sc; }
    static constexpr int kOff = 8;
    static constexpr bool kMin = false;
    __device__ static void q8(const Raw& v, int w, uint32_t& q0, uint32_t& q1) {
        const uint32_t b = qword(v.a, 4 * w);
        q0 = b & 0x0f0f0f0fu, q1 = (b >> 4) & 0x0f0f0f0fu;
    }
};

// The K quants' 6-bit scale and min of sub-block j (kernels.ScaleMinK4)
// from a block's first 16 bytes h (d, dmin, scales[12]).
__device__ inline void scale_min_k4(const uint4& h, int j, int& sc, int& m) {
    const int sh = 8 * (j & 3);
    const uint32_t b0 = (h.y >> sh) & 0xffu, b1 = (h.z >> sh) & 0xffu, b2 = (h.w >> sh) & 0xffu;
    const bool hi = j >= 4;
    sc = int(hi ? (b2 & 15u) | ((b0 >> 6) << 4) : b0 & 63u);
    m = int(hi ? (b2 >> 4) | ((b1 >> 6) << 4) : b1 & 63u);
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
    // where is offs' inverse: column c is element i of part p.
    __device__ static void where(int c, int& p, int& i) {
        const int j = c & 255, l = j & 31;
        p = 8 * (c >> 8) + 2 * (j >> 6) + (l >> 4), i = 16 * ((j >> 5) & 1) + (l & 15);
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
        float d, dmin;
        dd(v, d, dmin);
        int sc[2], m[2];
        iscales(v, sc, m);
        QRun o;
#pragma unroll
        for (int k = 0; k < 2; k++) o.sc[k] = __fmul_rn(d, float(sc[k])), o.mn[k] = __fmul_rn(dmin, float(m[k]));
        return o;
    }
    // dd is the super-block's d and dmin, iscales the part's runs' 6-bit
    // scales and mins (quant_mmq's integer sums: w = d·sc·q − dmin·m).
    __device__ static void dd(const Raw& v, float& d, float& dmin) {
        d = __half2float(__ushort_as_half(uint16_t(v.h.x))), dmin = __half2float(__ushort_as_half(uint16_t(v.h.x >> 16)));
    }
    __device__ static void iscales(const Raw& v, int (&sc)[2], int (&m)[2]) {
#pragma unroll
        for (int k = 0; k < 2; k++) scale_min_k4(v.h, 2 * (v.t >> 1) + k, sc[k], m[k]);
    }
    __device__ static float exact(uint32_t q, float sc, float mn) { return __fsub_rn(__fmul_rn(sc, float(q)), mn); }
    __device__ static void ab(float sc, float mn, float& A, float& B) {
        A = float(1 << kBits) * sc, B = __fadd_rn(A, mn);
    }
    static constexpr int kOff = 0;
    static constexpr bool kMin = true;
    __device__ static void q8(const Raw& v, int w, uint32_t& q0, uint32_t& q1) {
        const uint32_t b = qword(v.qs, 4 * w);
        q0 = b & 0x0f0f0f0fu, q1 = (b >> 4) & 0x0f0f0f0fu;
        if (F) {  // the fifth bits: bit s of qh's bytes for run 0, s + 1 for run 1
            const uint32_t h = qword(v.qh, 4 * w);
            const int s = 2 * (v.t >> 1);
            q0 |= ((h >> s) & 0x01010101u) << 4, q1 |= ((h >> (s + 1)) & 0x01010101u) << 4;
        }
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
        float d;
        int s0, s1;  // the runs' int8 scales
        int t;
    };
    __device__ static void offs(int p, int& o0, int& o1) {
        const int t = p & 7;
        o0 = 256 * (p >> 3) + 128 * (t >> 2) + 32 * ((t >> 1) & 1) + 16 * (t & 1), o1 = o0 + 64;
    }
    // where is offs' inverse: column c is element i of part p.
    __device__ static void where(int c, int& p, int& i) {
        const int j = c & 255, qq = (j >> 5) & 3, l = j & 31;
        p = 8 * (c >> 8) + 4 * (j >> 7) + 2 * (qq & 1) + (l >> 4), i = 16 * (qq >> 1) + (l & 15);
    }
    __device__ static Raw load(const uint8_t* w, const uint8_t* ds, int r, int cols, int p) {
        const size_t sb = size_t(r) * (cols / 256) + (p >> 3);
        const uint8_t* b = w + sb * kBytes;
        const int t = p & 7, h = t >> 2, g = (t >> 1) & 1, u = t & 1;
        Raw v;
        v.t = t;
        v.ql = __ldg(reinterpret_cast<const uint4*>(b + 64 * h + 32 * g + 16 * u));
        v.qh = __ldg(reinterpret_cast<const uint4*>(b + 128 + 32 * h + 16 * u));
        v.d = qhalf(ds + 2 * sb);
        const int s = 8 * h + 2 * g + u;  // the scale of run 0; run 1's is s + 4
        v.s0 = int8_t(__ldg(b + 192 + s)), v.s1 = int8_t(__ldg(b + 196 + s));
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
    __device__ static QRun run(const Raw& v, int) { return QRun{{__fmul_rn(v.d, float(v.s0)), __fmul_rn(v.d, float(v.s1))}, {0.f, 0.f}}; }
    __device__ static void dd(const Raw& v, float& d, float& dmin) { d = v.d, dmin = 0.f; }
    __device__ static void iscales(const Raw& v, int (&sc)[2], int (&m)[2]) { sc[0] = v.s0, sc[1] = v.s1, m[0] = m[1] = 0; }
    __device__ static float exact(uint32_t q, float sc, float) { return __fmul_rn(sc, float(int(q) - 32)); }
    __device__ static void ab(float sc, float, float& A, float& B) { A = 64.f * sc, B = 96.f * sc; }
    static constexpr int kOff = 32;
    static constexpr bool kMin = false;
    __device__ static void q8(const Raw& v, int w, uint32_t& q0, uint32_t& q1) {
        const uint32_t l = qword(v.ql, 4 * w), h = qword(v.qh, 4 * w);
        const int g = 2 * ((v.t >> 1) & 1);  // run 0's two bits of qh's bytes; run 1's are g + 4
        q0 = (l & 0x0f0f0f0fu) | ((h >> g) & 0x03030303u) << 4, q1 = ((l >> 4) & 0x0f0f0f0fu) | ((h >> (g + 4)) & 0x03030303u) << 4;
    }
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
__device__ __forceinline__ QDec quant_dec(const typename Q::Raw& raw) {
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
__device__ __forceinline__ float quant_part_dot(const QDec& d, const float (&xa)[16], const float (&xb)[16], float sa, float sb) {
    float fa = 0.f, fb = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        fa = fmaf(d.f[i], xa[i], fa);
        fb = fmaf(d.f[16 + i], xb[i], fb);
    }
    return __fadd_rn(__fsub_rn(__fmul_rn(d.A0, fa), __fmul_rn(d.B0, sa)), __fsub_rn(__fmul_rn(d.A1, fb), __fmul_rn(d.B1, sb)));
}

// quant_x loads a part's 32 values of the row x (runs at o0 and o1) and
// their sums; al: x is 16-byte aligned (float4 loads).
__device__ __forceinline__ void quant_x(const float* __restrict__ x, int o0, int o1, float (&xa)[16], float (&xb)[16], float& sa,
                               float& sb, bool al = true) {
    if (al) {
        load16(x + o0, xa);
        load16(x + o1, xb);
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) xa[i] = x[o0 + i], xb[i] = x[o1 + i];
    }
    sa = 0.f, sb = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) sa += xa[i], sb += xb[i];
}

// QX8 is a part's 32 values of a row of x quantized to int8 (ferrite_qx8):
// the runs at o0 (a) and o1 (b), and each run's (scale d as float bits,
// Σq) pair; both runs lie in one group of x, so they share d.
struct QX8 {
    uint4 a, b;
    uint2 ea, eb;
};

// quant_x8 loads a part's runs at o0 and o1 of a row of x quantized to int8:
// xq its values, xe its (d, Σq) pair per 16 columns.
__device__ __forceinline__ QX8 quant_x8(const int8_t* __restrict__ xq, const uint2* __restrict__ xe, int o0, int o1) {
    return QX8{__ldg(reinterpret_cast<const uint4*>(xq + o0)), __ldg(reinterpret_cast<const uint4*>(xq + o1)), __ldg(xe + (o0 >> 4)),
               __ldg(xe + (o1 >> 4))};
}

// quant_part_dot8 is a part's contribution to its row's dot product with
// int8-quantized x: d·Σ_k (sc_k·(Σ q8·xq − kOff·Σxq) − mn_k·Σxq), each
// run's integer sums exact (dp4a), rounded the same way wherever it is
// called. The weights are exact; x is d·xq (|x − d·xq| ≤ d/2), as the CPU
// backend's kernels/cpu/quant.go multiplies them.
template <class Q>
__device__ __forceinline__ float quant_part_dot8(const typename Q::Raw& raw, const QX8& x) {
    int s0 = 0, s1 = 0;  // each run's Σ q8·xq (dp4a: four products and their sum an instruction)
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint32_t q0, q1;
        Q::q8(raw, w, q0, q1);
        s0 = __dp4a(int(q0), int(qword(x.a, 4 * w)), s0), s1 = __dp4a(int(q1), int(qword(x.b, 4 * w)), s1);
    }
    const QRun c = Q::run(raw, 0);
    const int b0 = int(x.ea.y), b1 = int(x.eb.y);
    const float r0 = __fsub_rn(__fmul_rn(c.sc[0], float(s0 - Q::kOff * b0)), __fmul_rn(c.mn[0], float(b0)));
    const float r1 = __fsub_rn(__fmul_rn(c.sc[1], float(s1 - Q::kOff * b1)), __fmul_rn(c.mn[1], float(b1)));
    return __fmul_rn(__uint_as_float(x.ea.x), __fadd_rn(r0, r1));
}

// quant_rows_dot8_q sets oa = row ra of a · x and, when TWO, ob = row rb
// of b (of a's dtype and width) · x, x a row quantized to int8 (xq, xe:
// quant_x8_rows'), the same in every lane: lane L takes parts L, L + 32,
// …, each part's sum added in part order (quant_part_dot8), then the
// warp's; one pass over both rows, two parts in flight a lane.
template <class Q, bool TWO>
__device__ __forceinline__ void quant_rows_dot8_q(const MatDesc& a, int ra, const MatDesc& b, int rb, const int8_t* __restrict__ xq,
                                                  const uint2* __restrict__ xe, float& oa, float& ob) {
    const int lane = threadIdx.x & 31, cols = a.cols, parts = cols / 32;
    const uint8_t *da = reinterpret_cast<const uint8_t*>(a.scale), *db = reinterpret_cast<const uint8_t*>(b.scale);
    float sa = 0.f, sb = 0.f;
#pragma unroll 2
    for (int p = lane; p < parts; p += 32) {
        int o0, o1;
        Q::offs(p, o0, o1);
        const typename Q::Raw wa = Q::load(a.data, da, ra + a.row0, cols, p);
        typename Q::Raw wb;
        if (TWO) wb = Q::load(b.data, db, rb + b.row0, cols, p);
        const QX8 xv = quant_x8(xq, xe, o0, o1);
        sa = __fadd_rn(sa, quant_part_dot8<Q>(wa, xv));
        if (TWO) sb = __fadd_rn(sb, quant_part_dot8<Q>(wb, xv));
    }
    oa = warp_sum(sa);
    if (TWO) ob = warp_sum(sb);
}

// quant_rows_dot8 is quant_rows_dot8_q by a's dtype: oa = row ra of the
// view a · x (int8, xq and xe) and, when b is set (a view of a's dtype and
// width), ob = row rb of b · x.
__device__ __forceinline__ void quant_rows_dot8(const MatDesc& a, int ra, const MatDesc* b, int rb, const int8_t* xq, const uint2* xe,
                                                float& oa, float& ob) {
#define FERRITE_QROWS8(Q)                                                \
    if (b) quant_rows_dot8_q<Q, true>(a, ra, *b, rb, xq, xe, oa, ob);    \
    else quant_rows_dot8_q<Q, false>(a, ra, a, ra, xq, xe, oa, ob);
    switch (a.dtype) {
    case kQ8_0: FERRITE_QROWS8(Q8_0Q) break;
    case kQ4_0: FERRITE_QROWS8(Q4_0Q) break;
    case kQ4K: FERRITE_QROWS8(QKQ<false>) break;
    case kQ5K: FERRITE_QROWS8(QKQ<true>) break;
    default: FERRITE_QROWS8(Q6KQ) break;
    }
#undef FERRITE_QROWS8
}

// quant_run16_q sets v to columns c0…c0+15 (c0 a multiple of 16: one run)
// of row r of a Q matrix, decoded exactly.
template <class Q>
__device__ __forceinline__ void quant_run16_q(const uint8_t* w, const uint8_t* ds, int r, int cols, int c0, float (&v)[16]) {
    int p, i;
    Q::where(c0, p, i);
    const typename Q::Raw raw = Q::load(w, ds, r, cols, p);
    const QRun run = Q::run(raw, 0);
    const int k = i >> 4;
#pragma unroll
    for (int e = 0; e < 16; e++) v[e] = Q::exact(Q::q(raw, 16 * k + e), run.sc[k], run.mn[k]);
}

// quant_run16 is quant_run16_q for row r of the view m.
__device__ __forceinline__ void quant_run16(const MatDesc& m, int r, int c0, float (&v)[16]) {
    const uint8_t* ds = reinterpret_cast<const uint8_t*>(m.scale);
    const int rr = r + m.row0;
    switch (m.dtype) {
    case kQ8_0: quant_run16_q<Q8_0Q>(m.data, ds, rr, m.cols, c0, v); break;
    case kQ4_0: quant_run16_q<Q4_0Q>(m.data, ds, rr, m.cols, c0, v); break;
    case kQ4K: quant_run16_q<QKQ<false>>(m.data, ds, rr, m.cols, c0, v); break;
    case kQ5K: quant_run16_q<QKQ<true>>(m.data, ds, rr, m.cols, c0, v); break;
    default: quant_run16_q<Q6KQ>(m.data, ds, rr, m.cols, c0, v); break;
    }
}

// quant_row_dot sets o[j] = row r of the Q matrix (w, ds) · xs[j] for
// j < nx, in every lane (cols wide): lane L takes the row's parts L,
// L + 32, …, each decoded once for every x, its sums added in part order,
// then the warp's (quant_gemv's rounding per part: a row's bits do not
// depend on NB or nx). al: every xs[j] is 16-byte aligned. (Loading two
// parts of gate and up before decoding any measured 1.4–2.7× slower: the
// four parts' registers went to local memory.)
template <class Q, int NB>
__device__ __forceinline__ void quant_row_dot(const uint8_t* __restrict__ w, const uint8_t* __restrict__ ds, int r, int cols,
                                              const float* (&xs)[NB], int nx, bool al, float (&o)[NB]) {
    const int lane = threadIdx.x & 31, parts = cols / 32;
#pragma unroll
    for (int j = 0; j < NB; j++) o[j] = 0.f;
    for (int p = lane; p < parts; p += 32) {
        int o0, o1;
        Q::offs(p, o0, o1);
        const QDec d = quant_dec<Q>(Q::load(w, ds, r, cols, p));
#pragma unroll
        for (int j = 0; j < NB; j++) {
            if (j < nx) {
                float xa[16], xb[16], sa, sb;
                quant_x(xs[j], o0, o1, xa, xb, sa, sb, al);
                o[j] = __fadd_rn(o[j], quant_part_dot(d, xa, xb, sa, sb));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NB; j++) o[j] = warp_sum(o[j]);
}

// quant_desc_dot_q is quant_row_dot for row ra of the view a and, when b
// is set, row rb of the view b (of a's dtype and width).
template <class Q, int NB>
__device__ __forceinline__ void quant_desc_dot_q(const MatDesc& a, int ra, const MatDesc* b, int rb, const float* (&xs)[NB],
                                                 int nx, bool xal, float (&oa)[NB], float (&ob)[NB]) {
    quant_row_dot<Q, NB>(a.data, reinterpret_cast<const uint8_t*>(a.scale), ra + a.row0, a.cols, xs, nx, xal, oa);
    if (b) quant_row_dot<Q, NB>(b->data, reinterpret_cast<const uint8_t*>(b->scale), rb + b->row0, a.cols, xs, nx, xal, ob);
}

// quant_desc_dot sets oa[j] = row ra of the view a of a block-quantized
// matrix · xs[j] for j < nx (a.cols values each; xal: all 16-byte
// aligned), the same in every lane, and, when b is set (a view of a's
// dtype and width), ob[j] = its row rb · xs[j].
template <int NB>
__device__ __forceinline__ void quant_desc_dot(const MatDesc& a, int ra, const MatDesc* b, int rb, const float* (&xs)[NB], int nx, bool xal,
                               float (&oa)[NB], float (&ob)[NB]) {
    switch (a.dtype) {
    case kQ8_0: quant_desc_dot_q<Q8_0Q, NB>(a, ra, b, rb, xs, nx, xal, oa, ob); break;
    case kQ4_0: quant_desc_dot_q<Q4_0Q, NB>(a, ra, b, rb, xs, nx, xal, oa, ob); break;
    case kQ4K: quant_desc_dot_q<QKQ<false>, NB>(a, ra, b, rb, xs, nx, xal, oa, ob); break;
    case kQ5K: quant_desc_dot_q<QKQ<true>, NB>(a, ra, b, rb, xs, nx, xal, oa, ob); break;
    default: quant_desc_dot_q<Q6KQ, NB>(a, ra, b, rb, xs, nx, xal, oa, ob); break;
    }
}

}  // namespace
