// The harness of tools/cuda/emu/run.sh (included after ops_decode.cu):
// ferrite_dattn_* in both forms, ferrite_rmsnorm_row and
// ferrite_gemv_*_1n against double-precision references.
#include <algorithm>
#include <cstdio>
#include <random>

static float unbf(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// dec_splits is decode.go's decSplits.
static void dec_splits(int cols, int max_keys, int sms, int target, int min_keys, int* splits, int* split) {
    if (target <= 0) target = 2 * sms;
    if (min_keys <= 0) min_keys = 32;
    int s = std::min(ceil_div(target, cols), ceil_div(max_keys, min_keys));
    s = std::max(1, std::min(s, 64));
    *split = ceil_div(ceil_div(max_keys, s), 8) * 8;
    *splits = ceil_div(max_keys, *split);
}

using DAttn = void (*)(float*, const float*, void*, void*, const int*, const int*, const int*, float*, int*, int, int, int,
                       int, int, int, float, const float*, const int*, int, const float*, float, const float*, float,
                       const float*, int, float, int, int);

static DAttn dattn_kernel(bool qkv, bool bf, int hd, int g) {
    const DAttn k[2][2][2][2] = {
        {{{ferrite_dattn_f32_64_g4, ferrite_dattn_f32_64_g8}, {ferrite_dattn_f32_128_g4, ferrite_dattn_f32_128_g8}},
         {{ferrite_dattn_bf16_64_g4, ferrite_dattn_bf16_64_g8}, {ferrite_dattn_bf16_128_g4, ferrite_dattn_bf16_128_g8}}},
        {{{ferrite_dattn_qkv_f32_64_g4, ferrite_dattn_qkv_f32_64_g8}, {ferrite_dattn_qkv_f32_128_g4, ferrite_dattn_qkv_f32_128_g8}},
         {{ferrite_dattn_qkv_bf16_64_g4, ferrite_dattn_qkv_bf16_64_g8},
          {ferrite_dattn_qkv_bf16_128_g4, ferrite_dattn_qkv_bf16_128_g8}}}};
    return k[qkv][bf][hd == 128][g == 8];
}

// prep_ref is PrepareQKV of one head on the host (kernels/ref's order):
// norm with weight w (double sum of squares), then the rotation at pos.
static void prep_ref(float* v, int hd, const float* w, float eps, const float* inv, int half, bool il, int pos) {
    if (w) {
        double ss = 0;
        for (int d = 0; d < hd; d++) ss += double(v[d]) * double(v[d]);
        const float rs = float(1.0 / std::sqrt(double(float(ss / double(hd)) + eps)));
        for (int d = 0; d < hd; d++) v[d] = w[d] * (v[d] * rs);
    }
    if (inv) {
        for (int k = 0; k < half; k++) {
            const double ang = double(float(pos) * inv[k]);
            const float c = float(std::cos(ang)), s = float(std::sin(ang));
            const int ia = il ? 2 * k : k, ib = il ? 2 * k + 1 : k + half;
            const float a0 = v[ia], b0 = v[ib];
            v[ia] = a0 * c - b0 * s;
            v[ib] = b0 * c + a0 * s;
        }
    }
}

struct AttnCase {
    int heads, kvh, hd;
    bool bf;
    int ctx, min_keys, target;
    bool qkv;
};

static void attn_case(const AttnCase& c) {
    const int bs = 16, hd = c.hd, kw = c.kvh * hd, qw = c.heads * hd, grp = c.heads / c.kvh;
    const int g = grp > 4 ? 8 : 4, chunks = ceil_div(grp, g), cols = c.kvh * chunks;
    int width = 1;
    while (width * bs < c.ctx) width *= 2;
    width *= 2;  // wider than needed: empty splits
    const int nblk = width + 3, slots = nblk * bs, esz = c.bf ? 2 : 4;
    std::vector<int> perm(nblk);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> table(perm.begin(), perm.begin() + width);
    auto slot_of = [&](int p) { return table[p / bs] * bs + p % bs; };
    std::vector<uint8_t> kc(size_t(slots) * kw * esz), vc(kc.size());
    std::vector<float> keys(size_t(c.ctx) * kw), vals(keys.size());  // as the cache holds them
    auto put = [&](std::vector<uint8_t>& cache, int p, int e, float v) -> float {
        const size_t i = size_t(slot_of(p)) * kw + e;
        if (c.bf) {
            const uint16_t h = f32_to_bf16(v);
            std::memcpy(&cache[i * 2], &h, 2);
            return unbf(h);
        }
        std::memcpy(&cache[i * 4], &v, 4);
        return v;
    };
    const int self = c.ctx - 1;
    for (int p = 0; p < self; p++)
        for (int e = 0; e < kw; e++) {
            keys[size_t(p) * kw + e] = put(kc, p, e, randn());
            vals[size_t(p) * kw + e] = put(vc, p, e, randn());
        }
    // The row: q (plain) or the q/k/v product's row (QKV form).
    std::vector<float> qkv(size_t(qw + 2 * kw)), q(qw), qn(hd), kn(hd), inv(hd / 2);
    for (auto& v : qkv) v = randn();
    for (auto& v : qn) v = 1 + 0.2f * randn();
    for (auto& v : kn) v = 1 + 0.2f * randn();
    for (int i = 0; i < hd / 2; i++) inv[i] = float(std::pow(10000.0, -2.0 * i / hd));
    const bool il = hd == 64;  // interleaved, partial rotation at head dim 64
    const int half = hd == 64 ? 16 : hd / 2;
    std::vector<float> kself(kw), vself(kw);
    for (int h = 0; h < c.heads; h++) {
        std::copy(&qkv[size_t(h) * hd], &qkv[size_t(h + 1) * hd], &q[size_t(h) * hd]);
        if (c.qkv) prep_ref(&q[size_t(h) * hd], hd, qn.data(), 1e-6f, inv.data(), half, il, self);
    }
    for (int h = 0; h < c.kvh; h++) {
        std::copy(&qkv[size_t(qw + h * hd)], &qkv[size_t(qw + (h + 1) * hd)], &kself[size_t(h) * hd]);
        std::copy(&qkv[size_t(qw + kw + h * hd)], &qkv[size_t(qw + kw + (h + 1) * hd)], &vself[size_t(h) * hd]);
        if (c.qkv) prep_ref(&kself[size_t(h) * hd], hd, kn.data(), 1e-5f, inv.data(), half, il, self);
    }
    std::vector<float> kwant(kw), vwant(kw);
    for (int e = 0; e < kw; e++) {
        kwant[e] = c.bf ? unbf(f32_to_bf16(kself[e])) : kself[e];
        vwant[e] = c.bf ? unbf(f32_to_bf16(vself[e])) : vself[e];
        if (!c.qkv) {  // PrepareQKV stored them before
            put(kc, self, e, kself[e]);
            put(vc, self, e, vself[e]);
        }
        keys[size_t(self) * kw + e] = kwant[e];
        vals[size_t(self) * kw + e] = vwant[e];
    }
    // Reference attention in double.
    const float scale = float(1 / std::sqrt(double(hd)));
    std::vector<double> want(qw);
    for (int h = 0; h < c.heads; h++) {
        const int kh = h / grp;
        std::vector<double> s(c.ctx);
        double mx = -INFINITY;
        for (int p = 0; p < c.ctx; p++) {
            double d = 0;
            for (int e = 0; e < hd; e++) d += double(q[size_t(h) * hd + e]) * keys[size_t(p) * kw + kh * hd + e];
            s[p] = d * scale;
            mx = std::max(mx, s[p]);
        }
        double l = 0;
        for (int p = 0; p < c.ctx; p++) l += s[p] = std::exp(s[p] - mx);
        for (int e = 0; e < hd; e++) {
            double a = 0;
            for (int p = 0; p < c.ctx; p++) a += s[p] * vals[size_t(p) * kw + kh * hd + e];
            want[size_t(h) * hd + e] = a / l;
        }
    }
    int splits, split;
    dec_splits(cols, width * bs, 132, c.target, c.min_keys, &splits, &split);
    std::vector<float> out(qw, NAN), part(size_t(splits) * c.heads * (hd + 2), NAN);
    std::vector<int> cnt(1024, 0), pos{self}, seq{0}, slot{slot_of(self)};
    const DAttn k = dattn_kernel(c.qkv, c.bf, hd, g);
    launch(dim3u{unsigned(cols), unsigned(splits), 1}, 128, [&] {
        k(out.data(), c.qkv ? nullptr : q.data(), kc.data(), vc.data(), pos.data(), seq.data(), table.data(),
          splits > 1 ? part.data() : nullptr, splits > 1 ? cnt.data() : nullptr, width, bs, c.heads, c.kvh, chunks, split,
          scale, c.qkv ? qkv.data() : nullptr, slot.data(), slots, qn.data(), 1e-6f, kn.data(), 1e-5f, inv.data(), half,
          1.0f, il ? 4 : 0, 0);
    });
    char name[160];
    std::snprintf(name, sizeof name, "dattn heads %d/%d hd %d %s ctx %d keys %d target %d %s", c.heads, c.kvh, hd,
                  c.bf ? "bf16" : "f32", c.ctx, c.min_keys, c.target, c.qkv ? "qkv" : "plain");
    double err = 0;
    for (int i = 0; i < qw; i++) err = std::max(err, std::fabs(out[i] - want[i]));
    CHECK(err <= 1e-4, "%s: max error %g (splits %d of %d)", name, err, splits, split);
    CHECK(std::all_of(cnt.begin(), cnt.end(), [](int v) { return v == 0; }), "%s: counters not back at 0", name);
    if (c.qkv) {  // the row's key and value in the cache
        double kerr = 0;
        for (int e = 0; e < kw; e++) {
            const size_t i = size_t(slot_of(self)) * kw + e;
            float kg, vg;
            if (c.bf) {
                uint16_t h;
                std::memcpy(&h, &kc[i * 2], 2), kg = unbf(h);
                std::memcpy(&h, &vc[i * 2], 2), vg = unbf(h);
            } else {
                std::memcpy(&kg, &kc[i * 4], 4), std::memcpy(&vg, &vc[i * 4], 4);
            }
            kerr = std::max({kerr, std::fabs(double(kg) - kwant[e]), std::fabs(double(vg) - vwant[e])});
        }
        CHECK(kerr <= 1e-2 * (c.bf ? 1 : 1e-3), "%s: stored key/value off by %g", name, kerr);
    }
}

static void norm_case(int dim, bool delta, bool sum, bool offset) {
    std::vector<float> x(dim), dl(dim), w(dim), y(dim, NAN), sm(dim, NAN);
    for (auto& v : x) v = randn();
    for (auto& v : dl) v = randn();
    for (auto& v : w) v = randn();
    std::vector<float> x0 = x, in(dim);
    for (int i = 0; i < dim; i++) in[i] = delta ? x[i] + dl[i] : x[i];
    double ss = 0;
    for (float v : in) ss += double(v) * v;
    const float inv = float(1.0 / std::sqrt(double(float(ss / dim) + 1e-6f)));
    const int threads = std::min(1024, 32 * ceil_div(dim / 4, 32));
    launch(dim3u{1, 1, 1}, threads, [&] {
        ferrite_rmsnorm_row(y.data(), x.data(), delta ? dl.data() : nullptr, w.data(), dim, 1e-6f, offset,
                            sum ? sm.data() : nullptr);
    });
    double err = 0, serr = 0;
    for (int i = 0; i < dim; i++) {
        const float s = offset ? 1 + w[i] : w[i];
        err = std::max(err, std::fabs(y[i] - double(s) * (in[i] * inv)));
        if (delta) serr = std::max(serr, std::fabs(double(sum ? sm[i] : x[i]) - in[i]));
        if (sum) serr = std::max(serr, std::fabs(double(x[i]) - x0[i]));
    }
    CHECK(err <= 1e-5 && serr == 0, "rmsnorm_row dim %d delta %d sum %d offset %d: error %g, residual %g", dim, delta, sum,
          offset, err, serr);
}

static void gemv_norm_case(int rows, int cols, bool offset) {
    std::vector<uint16_t> w(size_t(rows) * cols);
    std::vector<float> x(cols), y(rows), nw(rows), h(rows, NAN), wf(w.size());
    for (size_t i = 0; i < w.size(); i++) w[i] = f32_to_bf16(randn() / 16), wf[i] = unbf(w[i]);
    for (auto& v : x) v = randn();
    for (auto& v : y) v = randn();
    for (auto& v : nw) v = randn();
    std::vector<double> want(rows);
    double ss = 0;
    for (int r = 0; r < rows; r++) {
        double d = 0;
        for (int k = 0; k < cols; k++) d += double(wf[size_t(r) * cols + k]) * x[k];
        want[r] = y[r] + d;
        ss += want[r] * want[r];
    }
    const double inv = 1 / std::sqrt(ss / rows + 1e-6);
    std::vector<int> cnt(1, 0);
    launch(dim3u{unsigned(ceil_div(rows, 2)), 1, 1}, 256, [&] {
        ferrite_gemv_bf16_1n(y.data(), x.data(), reinterpret_cast<const uint8_t*>(w.data()), 1, rows, cols, nullptr, 1, 0,
                             h.data(), nw.data(), 1e-6f, offset, cnt.data());
    });
    double yerr = 0, herr = 0;
    for (int r = 0; r < rows; r++) {
        yerr = std::max(yerr, std::fabs(y[r] - want[r]));
        herr = std::max(herr, std::fabs(h[r] - (offset ? 1 + nw[r] : nw[r]) * want[r] * inv));
    }
    CHECK(yerr <= 1e-4 && herr <= 1e-4 && cnt[0] == 0, "gemv_bf16_1n %dx%d offset %d: y error %g, h error %g, counter %d",
          rows, cols, offset, yerr, herr, cnt[0]);
}

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "-quick";
    for (int dim : {4096, 2048, 5120, 40})
        for (int m = 0; m < 8; m++) norm_case(dim, m & 1, m & 2, m & 4);
    for (int rows : {64, 1024})
        for (bool off : {false, true}) gemv_norm_case(rows, 256, off);
    const int shapes[][3] = {{32, 8, 128}, {32, 4, 128}, {40, 8, 128}, {64, 4, 128}, {16, 2, 64}, {8, 8, 64}};
    for (auto& sh : shapes)
        for (bool bf : {true, false})
            for (int ctx : {1, 2, 17, 64, 65, 130, 700, 2100})
                for (int t = 0; t < 4; t++)
                    for (bool qkv : {false, true}) {
                        const int mk[4] = {0, 8, 200, 8}, tg[4] = {0, 0, 1, 100000};
                        if ((quick || ctx > 700) && t != 0) continue;
                        if (quick && sh[0] != 32) continue;
                        attn_case(AttnCase{sh[0], sh[1], sh[2], bf, ctx, mk[t], tg[t], qkv});
                    }
    std::printf("emu: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
