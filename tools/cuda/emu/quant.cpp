// The harness of tools/cuda/emu/run.sh -quant (included after
// ops_quant.cu): the quantized GEMV (both row counts a warp, 1 and 3 rows
// of x) against a double-precision product of the exact decoding, and the
// bf16 decoding's two terms bit for bit against the decoding rounded on the
// host. The blocks are random bytes with finite float16 scales, laid out
// as kernels/cuda's quantLayout lays them out; the decoding follows
// kernels/quant.go.
#include <cstdio>
#include <random>
#include <string>

enum QT { Q8_0, Q4_0, Q4K, Q5K, Q6K };
static const char* qname[] = {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"};
static int belems(QT t) { return t <= Q4_0 ? 32 : 256; }
static int bbytes(QT t) { return t == Q8_0 ? 34 : t == Q4_0 ? 18 : t == Q4K ? 144 : t == Q5K ? 176 : 210; }

static float h2f(uint16_t h) { return __half2float(h); }
static uint16_t f2h_pow(int e, int m) { return uint16_t(((e + 15) << 10) | m); }  // 2^e·(1 + m/1024)

// scale_min is kernels.ScaleMinK4.
static void scale_min(int j, const uint8_t* s, int& sc, int& m) {
    if (j < 4) sc = s[j] & 63, m = s[j + 4] & 63;
    else sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
}

// dequant decodes one block as kernels/quant.go does (float32 rounding).
static void dequant(QT t, const uint8_t* b, float* y) {
    auto f16 = [&](int o) { return h2f(uint16_t(b[o] | b[o + 1] << 8)); };
    switch (t) {
    case Q8_0: {
        const float d = f16(0);
        for (int i = 0; i < 32; i++) y[i] = float(int8_t(b[2 + i])) * d;
        break;
    }
    case Q4_0: {
        const float d = f16(0);
        for (int j = 0; j < 16; j++) y[j] = d * float(int(b[2 + j] & 15) - 8), y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
        break;
    }
    case Q4K:
    case Q5K: {
        const bool five = t == Q5K;
        const float d = f16(0), dmin = f16(2);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        for (int s = 0; s < 8; s++) {
            int c, m;
            scale_min(s, sc, c, m);
            const float d1 = d * float(c), m1 = dmin * float(m);
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
                if (five) v |= ((qh[l] >> s) & 1) << 4;
                y[32 * s + l] = float(d1 * float(v)) - m1;
            }
        }
        break;
    }
    case Q6K: {
        const uint8_t *ql = b, *qh = b + 128, *sc = b + 192;
        const float d = f16(208);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, g = e / 32 % 4, l = e % 32;
            const int lo = (ql[64 * h + 32 * (g & 1) + l] >> (4 * (g / 2))) & 15, hi = (qh[32 * h + l] >> (2 * g)) & 3;
            y[e] = (d * float(int8_t(sc[e / 16]))) * float((lo | hi << 4) - 32);
        }
        break;
    }
    }
}

// layout is quantLayout: Q8_0, Q4_0 and Q6_K blocks lose d to a section
// of their own at dsec.
static std::vector<uint8_t> layout(QT t, const std::vector<uint8_t>& blocks, size_t& dsec) {
    const int bb = bbytes(t);
    const size_t n = blocks.size() / bb;
    if (t == Q4K || t == Q5K) {
        dsec = 0;
        return blocks;
    }
    const int keep = t == Q8_0 ? 32 : t == Q4_0 ? 16 : 208, q = t == Q6K ? 0 : 2, d = t == Q6K ? 208 : 0;
    dsec = (n * keep + 15) & ~size_t(15);
    std::vector<uint8_t> out(dsec + 2 * n);
    for (size_t i = 0; i < n; i++) {
        std::memcpy(&out[i * keep], &blocks[i * bb + q], keep);
        std::memcpy(&out[dsec + 2 * i], &blocks[i * bb + d], 2);
    }
    return out;
}

// random_matrix returns rows × cols of random t blocks (finite scales: d,
// and dmin, 2^e·(1 + m/1024)) in the device layout, its scale section at
// dsec, and sets w to their decoding.
static std::vector<uint8_t> random_matrix(QT t, int rows, int cols, std::vector<float>& w, size_t& dsec) {
    const int bb = bbytes(t), be = belems(t), nb = rows * (cols / be);
    std::vector<uint8_t> blocks(size_t(nb) * bb);
    for (auto& v : blocks) v = uint8_t(rng());
    for (int i = 0; i < nb; i++) {
        uint8_t* b = &blocks[size_t(i) * bb];
        for (int o : t == Q6K ? std::vector<int>{208} : t >= Q4K ? std::vector<int>{0, 2} : std::vector<int>{0}) {
            const uint16_t h = f2h_pow(-12 + int(rng() % 3), int(rng() % 1024));
            b[o] = uint8_t(h), b[o + 1] = uint8_t(h >> 8);
        }
    }
    w.assign(size_t(rows) * cols, 0.f);
    for (int i = 0; i < nb; i++) dequant(t, &blocks[size_t(i) * bb], &w[size_t(i) * be]);
    return layout(t, blocks, dsec);
}

using Gemv = void (*)(float*, const float*, const uint8_t*, const uint8_t*, int, int, int, int, const float*, int);
using Bf16 = void (*)(uint16_t*, uint16_t*, const uint8_t*, const uint8_t*, int, int);

static void run_case(QT t, int rows, int cols) {
    const Gemv gemv[5][4] = {{ferrite_qgemv_q8_0_r2, ferrite_qgemv_q8_0_r4, ferrite_qgemv_q8_0_b8, ferrite_qgemv_q8_0_r8},
                             {ferrite_qgemv_q4_0_r2, ferrite_qgemv_q4_0_r4, ferrite_qgemv_q4_0_b8, ferrite_qgemv_q4_0_r8},
                             {ferrite_qgemv_q4_k_r2, ferrite_qgemv_q4_k_r4, ferrite_qgemv_q4_k_b8, ferrite_qgemv_q4_k_r8},
                             {ferrite_qgemv_q5_k_r2, ferrite_qgemv_q5_k_r4, ferrite_qgemv_q5_k_b8, ferrite_qgemv_q5_k_r8},
                             {ferrite_qgemv_q6_k_r2, ferrite_qgemv_q6_k_r4, ferrite_qgemv_q6_k_b8, ferrite_qgemv_q6_k_r8}};
    const Bf16 bf16[5] = {ferrite_qbf16_q8_0, ferrite_qbf16_q4_0, ferrite_qbf16_q4_k, ferrite_qbf16_q5_k, ferrite_qbf16_q6_k};
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, rows, cols, w, dsec);
    std::vector<float> one;  // the form-0 results of the last n, for the bits of the others
    for (int n : {1, 3, 11}) {
        std::vector<float> x(size_t(n) * cols);
        for (auto& v : x) v = randn();
        for (int f = 0; f < 4; f++) {  // 2, 4 (and, f = 3, 8) rows a block one row of x at a time; 2 rows and 8 of x
            const int r = f == 1 ? 4 : f == 3 ? 8 : 2;
            std::vector<float> y(size_t(n) * rows, -1.f);
            launch(dim3u{unsigned(ceil_div(rows, r)), 1, 1}, 128, [&] {
                if (f != 2) {
                    for (int j = 0; j < n; j++)  // as quantGemvL: this form takes one row of x
                        gemv[t][f](y.data() + size_t(j) * rows, x.data() + size_t(j) * cols, dev.data(), dev.data() + dsec, 1,
                                   rows, cols, rows, nullptr, 0);
                } else {
                    gemv[t][2](y.data(), x.data(), dev.data(), dev.data() + dsec, n, rows, cols, rows, nullptr, 0);
                }
            });
            if (f == 0) one = y;
            for (size_t i = 0; i < y.size(); i++)
                CHECK(std::memcmp(&y[i], &one[i], 4) == 0, "%s %dx%d n=%d form %d: y[%zu] = %g, %g in form 0", qname[t], rows,
                      cols, n, f, i, y[i], one[i]);
            for (int j = 0; j < n; j++)
                for (int o = 0; o < rows; o++) {
                    double s = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        s += double(w[size_t(o) * cols + k]) * x[size_t(j) * cols + k];
                        mag += std::fabs(double(w[size_t(o) * cols + k]) * x[size_t(j) * cols + k]);
                    }
                    const double e = std::fabs(y[size_t(j) * rows + o] - s) / mag;
                    CHECK(e < 2e-5, "%s %dx%d n=%d form %d: y[%d][%d] = %g, want %g (error %.3g)", qname[t], rows, cols, n, f, j, o,
                          y[size_t(j) * rows + o], s, e);
                }
        }
    }
    std::vector<uint16_t> hi(w.size()), lo(w.size());
    launch(dim3u{7, 1, 1}, 256, [&] { bf16[t](hi.data(), lo.data(), dev.data(), dev.data() + dsec, rows, cols); });
    for (size_t i = 0; i < w.size(); i++) {
        const uint16_t h = f32_to_bf16(w[i]), l = f32_to_bf16(w[i] - __uint_as_float(uint32_t(h) << 16));
        CHECK(hi[i] == h && lo[i] == l, "%s %dx%d: bf16 terms of element %zu: %04x %04x, want %04x %04x (%g)", qname[t], rows,
              cols, i, hi[i], lo[i], h, l, w[i]);
    }
}

// quant_x8_host is kernels/cpu/quant.go's quantizeXGo for one row: q and,
// per 16 columns, (d, Σq).
static void quant_x8_host(const float* x, int cols, int group, int8_t* q, float* d16, int* s16) {
    for (int g = 0; g < cols / group; g++) {
        float amax = 0.f;
        for (int i = 0; i < group; i++) amax = std::max(amax, std::fabs(x[g * group + i]));
        const float d = amax / 127.f, id = amax == 0.f ? 0.f : 127.f / amax;
        for (int i = 0; i < group; i++) {
            const int c = g * group + i;
            int qi = 0;
            if (amax != 0.f) {
                const float t = x[c] * id;
                qi = t >= 0.f ? std::min(int(t + 0.5f), 127) : std::max(int(t - 0.5f), -127);
            }
            q[c] = int8_t(qi);
            if (c % 16 == 0) d16[c / 16] = amax == 0.f ? 0.f : d, s16[c / 16] = 0;
            s16[c / 16] += qi;
        }
    }
}

using Gemv8 = void (*)(float*, const int8_t*, const uint2*, const uint8_t*, const uint8_t*, int, int, int, int, const float*, int);

// run_case8 checks ferrite_qx8 bit for bit against the host's quantization
// of x (a zero row among them), and the int8-activation GEMV, one row of x
// at a time (4 weight rows a block) and up to 8 (2), each row's bits
// equal in both, against a double-precision product of the exact decoding
// with x's int8 rounding d·q.
static void run_case8(QT t, int rows, int cols) {
    const Gemv8 gemv[5][2] = {{ferrite_qgemv8_q8_0_r4, ferrite_qgemv8_q8_0_b8}, {ferrite_qgemv8_q4_0_r4, ferrite_qgemv8_q4_0_b8},
                              {ferrite_qgemv8_q4_k_r4, ferrite_qgemv8_q4_k_b8}, {ferrite_qgemv8_q5_k_r4, ferrite_qgemv8_q5_k_b8},
                              {ferrite_qgemv8_q6_k_r4, ferrite_qgemv8_q6_k_b8}};
    const int group = belems(t);
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, rows, cols, w, dsec);
    for (int n : {1, 3, 11}) {
        std::vector<float> x(size_t(n) * cols);
        for (auto& v : x) v = randn() * (1 + 30 * (rng() % 8 == 0));  // some outliers, so groups differ in d
        if (n == 3) std::fill(x.begin() + cols, x.begin() + 2 * cols, 0.f);
        std::vector<int8_t> xq(x.size(), 99);
        std::vector<uint2> xe(x.size() / 16);
        launch(dim3u{unsigned(ceil_div(cols, 256)), unsigned(n), 1}, 256, [&] { ferrite_qx8(xq.data(), xe.data(), x.data(), cols, cols, group); });
        std::vector<int8_t> hq(x.size());
        std::vector<float> hd(x.size() / 16);
        std::vector<int> hs(x.size() / 16);
        for (int j = 0; j < n; j++)
            quant_x8_host(&x[size_t(j) * cols], cols, group, &hq[size_t(j) * cols], &hd[size_t(j) * cols / 16], &hs[size_t(j) * cols / 16]);
        for (size_t i = 0; i < x.size(); i++) CHECK(xq[i] == hq[i], "%s qx8 cols %d n=%d: q[%zu] = %d, want %d", qname[t], cols, n, i, xq[i], hq[i]);
        for (size_t i = 0; i < xe.size(); i++)
            CHECK(xe[i].x == __float_as_uint(hd[i]) && int(xe[i].y) == hs[i], "%s qx8 cols %d n=%d: run %zu (%g, %d), want (%g, %d)", qname[t],
                  cols, n, i, __uint_as_float(xe[i].x), int(xe[i].y), hd[i], hs[i]);
        std::vector<float> one(size_t(n) * rows, -1.f), all(size_t(n) * rows, -1.f);
        launch(dim3u{unsigned(ceil_div(rows, 4)), 1, 1}, 128, [&] {
            for (int j = 0; j < n; j++)
                gemv[t][0](one.data() + size_t(j) * rows, xq.data() + size_t(j) * cols, xe.data() + size_t(j) * cols / 16, dev.data(),
                           dev.data() + dsec, 1, rows, cols, rows, nullptr, 0);
        });
        launch(dim3u{unsigned(ceil_div(rows, 2)), 1, 1}, 128,
               [&] { gemv[t][1](all.data(), xq.data(), xe.data(), dev.data(), dev.data() + dsec, n, rows, cols, rows, nullptr, 0); });
        for (size_t i = 0; i < one.size(); i++)
            CHECK(std::memcmp(&one[i], &all[i], 4) == 0, "%s gemv8 %dx%d n=%d: y[%zu] = %g alone, %g with 8", qname[t], rows, cols, n, i,
                  one[i], all[i]);
        for (int j = 0; j < n; j++)
            for (int o = 0; o < rows; o++) {
                double s = 0, mag = 0;
                for (int k = 0; k < cols; k++) {
                    const double xv = double(hd[(size_t(j) * cols + k) / 16]) * hq[size_t(j) * cols + k];
                    s += double(w[size_t(o) * cols + k]) * xv;
                    mag += std::fabs(double(w[size_t(o) * cols + k]) * xv);
                }
                const double e = mag == 0 ? std::fabs(one[size_t(j) * rows + o]) : std::fabs(one[size_t(j) * rows + o] - s) / mag;
                CHECK(e < 2e-5, "%s gemv8 %dx%d n=%d: y[%d][%d] = %g, want %g (error %.3g)", qname[t], rows, cols, n, j, o,
                      one[size_t(j) * rows + o], s, e);
            }
    }
}

using Mmq = void (*)(float*, float*, const int8_t*, const uint2*, const uint8_t*, const uint8_t*, int, int, int, int, const float*, int);

// run_mmq checks the tensor-core product (quant_mmq, mma_s8 emulated from
// the PTX fragment layouts) against a double-precision product of the
// exact decoding with x's int8 rounding, in one split and in three
// (ferrite_qmmq_sum), 16 and 32 rows of x a block; a row's bits do not
// depend on the rows of x beside it or on the block's; bias and the
// residual add in the last case; ie: the integer-combining forms.
static void run_mmq(QT t, int rows, int cols, bool ie) {
    const Mmq forms[2][5][2] = {
        {{ferrite_qmmq_q8_0_x16, ferrite_qmmq_q8_0_x32}, {ferrite_qmmq_q4_0_x16, ferrite_qmmq_q4_0_x32},
         {ferrite_qmmq_q4_k_x16, ferrite_qmmq_q4_k_x32}, {ferrite_qmmq_q5_k_x16, ferrite_qmmq_q5_k_x32},
         {ferrite_qmmq_q6_k_x16, ferrite_qmmq_q6_k_x32}},
        {{ferrite_qmmq_q8_0_x16i, ferrite_qmmq_q8_0_x32i}, {ferrite_qmmq_q4_0_x16i, ferrite_qmmq_q4_0_x32i},
         {ferrite_qmmq_q4_k_x16i, ferrite_qmmq_q4_k_x32i}, {ferrite_qmmq_q5_k_x16i, ferrite_qmmq_q5_k_x32i},
         {ferrite_qmmq_q6_k_x16i, ferrite_qmmq_q6_k_x32i}}};
    const auto& mmq = forms[ie];
    const int group = belems(t);
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, rows, cols, w, dsec);
    const int n = 21;
    std::vector<float> x(size_t(n) * cols);
    for (auto& v : x) v = randn() * (1 + 30 * (rng() % 8 == 0));
    std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, 0.f);  // a row of zeros
    std::vector<int8_t> xq(x.size());
    std::vector<uint2> xe(x.size() / 16);
    launch(dim3u{unsigned(ceil_div(cols, 256)), unsigned(n), 1}, 256, [&] { ferrite_qx8(xq.data(), xe.data(), x.data(), cols, cols, group); });
    std::vector<float> bias(rows), y0(size_t(n) * rows);
    for (auto& v : bias) v = randn();
    for (auto& v : y0) v = randn();
    for (int splits : {1, 3}) {
        std::vector<float> first;  // the first form's results: every other form's bits
        for (int f = 0; f < 3; f++) {  // 16 rows of x a block; 32; 32 with only the first 9 rows of x
            const int nx = f == 2 ? 9 : n, kx = f == 0 ? 16 : 32;
            const bool ba = splits == 3 && f == 1;  // bias and the residual add
            std::vector<float> y(size_t(nx) * rows, -1.f), ws(size_t(splits) * nx * rows, -2.f);
            if (ba) std::copy(y0.begin(), y0.begin() + y.size(), y.begin());
            launch(dim3u{unsigned(ceil_div(rows, 128)), unsigned(ceil_div(nx, kx)), unsigned(splits)}, 128, [&] {
                mmq[t][f != 0](y.data(), ws.data(), xq.data(), xe.data(), dev.data(), dev.data() + dsec, nx, rows, cols, rows,
                               splits == 1 && ba ? bias.data() : nullptr, ba);
            });
            if (splits > 1)
                launch(dim3u{unsigned(ceil_div(nx * rows, 256)), 1, 1}, 256,
                       [&] { ferrite_qmmq_sum(y.data(), ws.data(), ba ? bias.data() : nullptr, nx, rows, rows, splits, ba); });
            if (ba)
                for (int j = 0; j < nx; j++)
                    for (int o = 0; o < rows; o++) y[size_t(j) * rows + o] -= bias[o] + y0[size_t(j) * rows + o];
            if (f == 0) first = y;
            for (size_t i = 0; i < y.size() && !ba; i++)
                CHECK(std::memcmp(&y[i], &first[i], 4) == 0, "%s mmq%s %dx%d splits %d form %d: y[%zu] = %g, %g in form 0", qname[t], ie ? "i" : "", rows, cols,
                      splits, f, i, y[i], first[i]);
            for (int j = 0; j < nx; j++)
                for (int o = 0; o < rows; o++) {
                    double s = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        const double xv = double(__uint_as_float(xe[(size_t(j) * cols + k) / 16].x)) * xq[size_t(j) * cols + k];
                        s += double(w[size_t(o) * cols + k]) * xv;
                        mag += std::fabs(double(w[size_t(o) * cols + k]) * xv);
                    }
                    const double got = y[size_t(j) * rows + o], e = mag == 0 ? std::fabs(got) : std::fabs(got - s) / mag;
                    CHECK(e < (ba ? 1e-4 : 2e-5), "%s mmq%s %dx%d splits %d form %d: y[%d][%d] = %g, want %g (error %.3g)", qname[t], ie ? "i" : "", rows,
                          cols, splits, f, j, o, got, s, e);
                }
        }
    }
}

// run_embed checks ferrite_embed_q: each gathered row bit for bit the host
// decoding, NaN for an id outside the table.
static void run_embed(QT t, int rows, int cols) {
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, rows, cols, w, dsec);
    const std::vector<int> ids = {rows - 1, 0, -1, 2, rows, 2};
    const int n = int(ids.size()), stride = cols + 3;
    std::vector<float> y(size_t(n) * stride, 7.f);
    launch(dim3u{unsigned(n), 1, 1}, 256, [&] {
        ferrite_embed_q(y.data(), stride, dev.data(), dev.data() + dsec, ids.data(), 1, n, rows, cols, kQ8_0 + int(t));
    });
    for (int i = 0; i < n; i++)
        for (int c = 0; c < stride; c++) {
            const float got = y[size_t(i) * stride + c];
            if (c >= cols) CHECK(got == 7.f, "%s embed: row %d column %d past the row written", qname[t], i, c);
            else if (ids[i] < 0 || ids[i] >= rows) CHECK(std::isnan(got), "%s embed: id %d column %d = %g, want NaN", qname[t], ids[i], c, got);
            else CHECK(std::memcmp(&got, &w[size_t(ids[i]) * cols + c], 4) == 0, "%s embed: id %d column %d = %g, want %g", qname[t], ids[i], c,
                       got, w[size_t(ids[i]) * cols + c]);
        }
}

// run_moe_mmq checks the experts' grouped tensor-core product
// (ferrite_moe_mmq_gate_up, _down) on slots sorted as ferrite_moe_sort
// sorts them: gate/up's SwiGLU against double-precision products of the
// exact decoding with x's int8 rounding, down against the same of h's
// (quantized on the host), every slot; expert 0 takes every token's first
// slot, so its slots fill two tiles, the first past 32.
static void run_moe_mmq(QT gt, QT dt, int hidden, int inter) {
    const int ne = 5, n = 70, k = 2, slots = n * k;
    std::vector<float> gu[ne], dw[ne];
    std::vector<uint8_t> gud[ne], dd[ne];
    size_t gus[ne], dss[ne];
    std::vector<MatDesc> table(3 * ne);
    for (int e = 0; e < ne; e++) {
        gud[e] = random_matrix(gt, 2 * inter, hidden, gu[e], gus[e]);
        dd[e] = random_matrix(dt, hidden, inter, dw[e], dss[e]);
        const float* gsc = reinterpret_cast<const float*>(gud[e].data() + gus[e]);
        table[3 * e] = MatDesc{gud[e].data(), gsc, kQ8_0 + int(gt), inter, hidden, 1, 1, 0};
        table[3 * e + 1] = MatDesc{gud[e].data(), gsc, kQ8_0 + int(gt), inter, hidden, 1, 1, inter};
        table[3 * e + 2] = MatDesc{dd[e].data(), reinterpret_cast<const float*>(dd[e].data() + dss[e]), kQ8_0 + int(dt), hidden, inter, 1, 1, 0};
    }
    std::vector<int> ids(slots);
    for (int i = 0; i < n; i++) ids[i * k] = 0, ids[i * k + 1] = 1 + int(rng() % (ne - 1));
    std::vector<int> off, tiles, perm;  // ferrite_moe_sort's
    host_sort(ids, ne, kTileM, off, tiles, perm);
    std::vector<float> x(size_t(n) * hidden);
    for (auto& v : x) v = randn();
    std::vector<int8_t> xq(x.size());
    std::vector<uint2> xe(x.size() / 16);
    launch(dim3u{unsigned(ceil_div(hidden, 256)), unsigned(n), 1}, 256, [&] { ferrite_qx8(xq.data(), xe.data(), x.data(), hidden, hidden, belems(gt)); });
    const unsigned gy = unsigned(ceil_div(slots, kTileM) + ne);
    std::vector<float> h(size_t(slots) * inter, -7.f);
    launch(dim3u{unsigned(ceil_div(inter, 64)), gy, 1}, 128, [&] {
        ferrite_moe_mmq_gate_up(h.data(), inter, xq.data(), xe.data(), hidden, off.data(), tiles.data(), perm.data(), table.data(), ne, k, 0.f);
    });
    for (int sl = 0; sl < slots; sl++) {
        const int tok = sl / k, e = ids[sl];
        for (int r = 0; r < inter; r++) {
            double a = 0, b = 0, ma = 0, mb = 0;
            for (int c = 0; c < hidden; c++) {
                const double xv = double(__uint_as_float(xe[(size_t(tok) * hidden + c) / 16].x)) * xq[size_t(tok) * hidden + c];
                a += double(gu[e][size_t(r) * hidden + c]) * xv, ma += std::fabs(double(gu[e][size_t(r) * hidden + c]) * xv);
                b += double(gu[e][size_t(inter + r) * hidden + c]) * xv, mb += std::fabs(double(gu[e][size_t(inter + r) * hidden + c]) * xv);
            }
            const double sg = a / (1 + std::exp(-a)), want = sg * b;
            const double bound = 2e-5 * (ma * std::fabs(b) + std::fabs(sg) * mb) + 1e-30;
            const float got = h[size_t(sl) * inter + r];
            CHECK(std::fabs(got - want) <= bound, "%s+%s moe gate/up slot %d (expert %d) row %d = %g, want %g", qname[gt], qname[dt], sl, e, r,
                  got, want);
        }
    }
    std::vector<int8_t> hq(h.size());
    std::vector<uint2> he(h.size() / 16);
    launch(dim3u{unsigned(ceil_div(inter, 256)), unsigned(slots), 1}, 256, [&] { ferrite_qx8(hq.data(), he.data(), h.data(), inter, inter, belems(dt)); });
    std::vector<float> ye(size_t(slots) * hidden, -7.f);
    launch(dim3u{unsigned(ceil_div(hidden, 128)), gy, 1}, 128, [&] {
        ferrite_moe_mmq_down(ye.data(), hidden, hq.data(), he.data(), inter, off.data(), tiles.data(), perm.data(), table.data(), ne, k);
    });
    for (int sl = 0; sl < slots; sl++) {
        const int e = ids[sl];
        for (int r = 0; r < hidden; r++) {
            double a = 0, ma = 0;
            for (int c = 0; c < inter; c++) {
                const double hv = double(__uint_as_float(he[(size_t(sl) * inter + c) / 16].x)) * hq[size_t(sl) * inter + c];
                a += double(dw[e][size_t(r) * inter + c]) * hv, ma += std::fabs(double(dw[e][size_t(r) * inter + c]) * hv);
            }
            const float got = ye[size_t(sl) * hidden + r];
            CHECK(std::fabs(got - a) <= 2e-5 * ma + 1e-30, "%s+%s moe down slot %d (expert %d) row %d = %g, want %g", qname[gt], qname[dt], sl,
                  e, r, got, a);
        }
    }
}

// run_expert checks ops_common_quant.cu's reading of one expert matrix
// through a MatDesc (ops_moe.cu's desc_dot and moe_tile): quant_run16 bit
// for bit against the host decoding for every run of the view's rows, and
// quant_desc_dot for one row and 1 x (aligned and not) against a
// double-precision product, and for two rows and 3 of 4 x in one pass with
// the bits of each alone.
static void run_expert(QT t, int rows, int cols, int row0) {
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, rows, cols, w, dsec);
    const MatDesc m{dev.data(), reinterpret_cast<const float*>(dev.data() + dsec), kQ8_0 + int(t), rows - row0, cols, 1, 1, row0};
    for (int r = 0; r < rows - row0; r++)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            float v[16];
            quant_run16(m, r, c0, v);
            for (int e = 0; e < 16; e++)
                CHECK(std::memcmp(&v[e], &w[size_t(r + row0) * cols + c0 + e], 4) == 0, "%s expert %dx%d: run at (%d, %d)[%d] = %g, want %g",
                      qname[t], rows, cols, r, c0, e, v[e], w[size_t(r + row0) * cols + c0 + e]);
        }
    std::vector<float> x(4 * cols + 1);
    for (auto& v : x) v = randn();
    const int vr = rows - row0;  // the view's rows
    for (int al = 0; al < 2; al++) {
        const float* xb = x.data() + (al ? 0 : 1);  // malloc aligns x.data() to 16 bytes; + 1 does not
        const bool xal = (uintptr_t(xb) & 15) == 0;
        std::vector<float> one(size_t(vr) * 4);  // (row, x) alone
        for (int r = 0; r < vr; r++)
            for (int j = 0; j < 4; j++) {
                const float* xs[1] = {xb + size_t(j) * cols};
                launch(dim3u{1, 1, 1}, 32, [&] {
                    float oa[1], ob[1];
                    quant_desc_dot<1>(m, r, nullptr, 0, xs, 1, xal, oa, ob);
                    if (threadIdx.x == 0) one[size_t(r) * 4 + j] = oa[0];
                });
                double s = 0, mag = 0;
                for (int k = 0; k < cols; k++) {
                    s += double(w[size_t(r + row0) * cols + k]) * xb[size_t(j) * cols + k];
                    mag += std::fabs(double(w[size_t(r + row0) * cols + k]) * xb[size_t(j) * cols + k]);
                }
                CHECK(std::fabs(one[size_t(r) * 4 + j] - s) / mag < 2e-5, "%s expert %dx%d: row %d x%d = %g, want %g", qname[t], rows,
                      cols, r, j, one[size_t(r) * 4 + j], s);
            }
        // quant_rows_dot8 (the _q8 experts): x quantized on the host, one
        // row against a double-precision product of x's rounding, two rows
        // in one pass with the bits of each alone.
        if (al) {
            const int group = belems(t);
            std::vector<int8_t> q(cols);
            std::vector<float> d16(cols / 16);
            std::vector<int> s16(cols / 16);
            quant_x8_host(xb, cols, group, q.data(), d16.data(), s16.data());
            std::vector<uint2> e16(cols / 16);
            for (int i = 0; i < cols / 16; i++) e16[i] = uint2{__float_as_uint(d16[i]), uint32_t(s16[i])};
            std::vector<float> one8(vr);
            for (int r = 0; r < vr; r++) {
                launch(dim3u{1, 1, 1}, 32, [&] {
                    float o, unused;
                    quant_rows_dot8(m, r, nullptr, 0, q.data(), e16.data(), o, unused);
                    if (threadIdx.x == 0) one8[r] = o;
                });
                double s = 0, mag = 0;
                for (int c = 0; c < cols; c++) {
                    const double xv = double(d16[c / 16]) * q[c];
                    s += double(w[size_t(r + row0) * cols + c]) * xv;
                    mag += std::fabs(double(w[size_t(r + row0) * cols + c]) * xv);
                }
                CHECK(std::fabs(one8[r] - s) <= 2e-5 * mag, "%s expert %dx%d: int8 row %d = %g, want %g", qname[t], rows, cols, r, one8[r], s);
            }
            for (int r = 0; r < vr; r++) {
                const int r2 = (r + 1 + r % 3) % vr;
                float pa = 0, pb = 0;
                launch(dim3u{1, 1, 1}, 32, [&] {
                    float oa, ob;
                    quant_rows_dot8(m, r, &m, r2, q.data(), e16.data(), oa, ob);
                    if (threadIdx.x == 0) pa = oa, pb = ob;
                });
                CHECK(std::memcmp(&pa, &one8[r], 4) == 0 && std::memcmp(&pb, &one8[r2], 4) == 0,
                      "%s expert %dx%d: int8 rows %d, %d: %g, %g in a pair, %g, %g alone", qname[t], rows, cols, r, r2, pa, pb, one8[r], one8[r2]);
            }
        }
        // Two rows (r and another) against three of four x in one pass: the bits of each alone.
        const float* xs4[4] = {xb, xb + cols, xb + 2 * size_t(cols), xb + 3 * size_t(cols)};
        for (int r = 0; r < vr; r++) {
            const int r2 = (r + 1 + r % 3) % vr;
            float fa[4], fb[4];
            launch(dim3u{1, 1, 1}, 32, [&] {
                float oa[4], ob[4];
                quant_desc_dot<4>(m, r, &m, r2, xs4, 3, xal, oa, ob);
                if (threadIdx.x == 0)
                    for (int j = 0; j < 3; j++) fa[j] = oa[j], fb[j] = ob[j];
            });
            for (int j = 0; j < 3; j++) {
                CHECK(std::memcmp(&fa[j], &one[size_t(r) * 4 + j], 4) == 0, "%s expert %dx%d: row %d x%d: %g in a pair, %g alone",
                      qname[t], rows, cols, r, j, fa[j], one[size_t(r) * 4 + j]);
                CHECK(std::memcmp(&fb[j], &one[size_t(r2) * 4 + j], 4) == 0, "%s expert %dx%d: row %d x%d: %g in a pair, %g alone",
                      qname[t], rows, cols, r2, j, fb[j], one[size_t(r2) * 4 + j]);
            }
        }
    }
}

// run_mla_proj checks mla_proj_q (ops_mla.cu's ferrite_mla_proj_q_*), AttentionMLA's
// per-head products over a GGUF's attn_k_b or attn_v_b blocks:
// y[i·y_rs + h·y_hs + r] = W[h·hrows + r]·x[i·x_rs + h·x_hs], x a head's
// first cols values of x_hs (as the absorbed query reads q_nope from a
// query head), for 1, 3 and 11 query rows (8 a block: two blocks), against a
// double-precision product of the exact decoding, each row's bits those of
// the row launched alone in the one-row form, y's gaps between heads
// untouched.
static void run_mla_proj(QT t, int heads, int hrows, int cols, int xpad) {
    std::vector<float> w;
    size_t dsec;
    const std::vector<uint8_t> dev = random_matrix(t, heads * hrows, cols, w, dsec);
    const int x_hs = cols + xpad, x_rs = heads * x_hs, y_hs = hrows + 3, y_rs = heads * y_hs;
    const unsigned gx = unsigned(ceil_div(hrows, 8));
    for (int n : {1, 3, 11}) {
        std::vector<float> x(size_t(n) * x_rs);
        for (auto& v : x) v = randn();
        std::vector<float> y(size_t(n) * y_rs, -7.f), alone(size_t(n) * y_rs, -7.f);
        launch(dim3u{gx, unsigned(heads), unsigned(ceil_div(n, 8))}, 256, [&] {
            mla_proj_q<8>(y.data(), y_rs, y_hs, x.data(), x_rs, x_hs, n, hrows, hrows, dev.data(), dev.data() + dsec, kQ8_0 + int(t), cols);
        });
        for (int i = 0; i < n; i++)
            launch(dim3u{gx, unsigned(heads), 1}, 256, [&] {  // one row a block (ferrite_mla_proj_q_1)
                mla_proj_q<1>(alone.data() + size_t(i) * y_rs, y_rs, y_hs, x.data() + size_t(i) * x_rs, x_rs, x_hs, 1, hrows, hrows,
                                   dev.data(), dev.data() + dsec, kQ8_0 + int(t), cols);
            });
        for (int i = 0; i < n; i++)
            for (int h = 0; h < heads; h++)
                for (int r = 0; r < y_hs; r++) {
                    const size_t at = size_t(i) * y_rs + size_t(h) * y_hs + r;
                    if (r >= hrows) {
                        CHECK(y[at] == -7.f, "%s mla_proj %d heads of %dx%d n=%d: y[%d][%d][%d] past the head's rows written", qname[t], heads,
                              hrows, cols, n, i, h, r);
                        continue;
                    }
                    CHECK(std::memcmp(&y[at], &alone[at], 4) == 0, "%s mla_proj %d heads of %dx%d n=%d: y[%d][%d][%d] = %g, %g alone", qname[t],
                          heads, hrows, cols, n, i, h, r, y[at], alone[at]);
                    double s = 0, mag = 0;
                    for (int k = 0; k < cols; k++) {
                        const double p = double(w[(size_t(h) * hrows + r) * cols + k]) * x[size_t(i) * x_rs + size_t(h) * x_hs + k];
                        s += p, mag += std::fabs(p);
                    }
                    CHECK(std::fabs(y[at] - s) <= 2e-5 * mag + 1e-30, "%s mla_proj %d heads of %dx%d n=%d: y[%d][%d][%d] = %g, want %g", qname[t],
                          heads, hrows, cols, n, i, h, r, y[at], s);
                }
    }
}

int main() {
    run_moe_mmq(Q4K, Q6K, 512, 256);
    run_moe_mmq(Q8_0, Q8_0, 256, 384);
    run_moe_mmq(Q5K, Q4K, 256, 512);
    run_moe_mmq(Q4_0, Q6K, 384, 256);
    for (QT t : {Q8_0, Q4_0, Q4K, Q5K, Q6K}) {
        run_case(t, 5, 256);
        run_case(t, 9, 1280);
        run_case(t, 3, 2048);
        run_case8(t, 5, 256);
        run_case8(t, 9, 1280);
        run_case8(t, 3, 2048);
        for (bool ie : {false, true}) {
            run_mmq(t, 130, 1280, ie);
            run_mmq(t, 20, 512, ie);
        }
        run_embed(t, 5, 4608);
        run_expert(t, 6, 256, 0);
        run_expert(t, 8, 1536, 3);  // the up half of a fused gate_up: row0 = 3
        run_mla_proj(t, 3, 20, 512, 0);  // attn_v_b: a head's 20 rows (a partial block of 8) over the latent
        run_mla_proj(t, 2, 8, 256, 5);   // x not 16-byte aligned
        if (belems(t) == 32) run_mla_proj(t, 3, 12, 192, 64);  // attn_k_b at GLM-4.7-Flash's nope: q_nope of 256-wide heads
    }
    std::printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
