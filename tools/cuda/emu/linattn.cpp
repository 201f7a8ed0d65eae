// The harness of tools/cuda/emu/run.sh -linattn (included after
// ops_linattn.cu and ops_linattn_chunk.cu): the gated delta rule's chunked
// kernels (ferrite_delta_chunk_*, beside ferrite_delta_rule_* with
// skip_long for the short sequences) against ferrite_delta_rule_* alone,
// which steps every row and keeps a long sequence's state in float64 across
// the call: the same arithmetic up to the order of float64 sums; and
// ShortConv's every-row kernels against ferrite_short_conv, bit for bit.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>


// chunk_smem is linattn.go's deltaChunkSmem.
static size_t chunk_smem(int dk, bool pc) {
    const size_t L = kChunkL, LP = kChunkLP, C = kChunkCols;
    const size_t doubles = size_t(dk) * C + 2 * L * LP + 2 * L * C + L * C + L;
    if (pc) return (doubles + L * dk + 2 * L * (dk + 1) + dk + (dk & 1)) * 8 + 2 * L * dk * 4;
    return (doubles + 2 * L * (dk + 1) + 3 * L) * 8;
}

using Delta = void (*)(float*, const float*, const float*, const double*, const float*, float*, int, const int*, int,
                       const int*, int, int, int, int, int, int, const int*, int, int);
using Chunk = void (*)(float*, const float*, const float*, const double*, const float*, float*, int, const int*, int,
                       const int*, int, int, int, int, int, int);

struct Case {
    int hv, hk, dk, dv;
    bool per_channel;
    float lower;    // KDA's lower bound (< 0), or 0: GDN's softplus gate
    float alog_hi;  // A_log drawn from log(U(1, alog_hi)): larger, faster decays
    std::vector<int> lens;
};

static void run_case(const Case& c) {
    const int kpl = c.dk <= 32 ? 0 : c.dk <= 64 ? 1 : 2;
    const Delta rule[3] = {ferrite_delta_rule_1, ferrite_delta_rule_2, ferrite_delta_rule_4};
    const Chunk chunk[3] = {ferrite_delta_chunk_1, ferrite_delta_chunk_2, ferrite_delta_chunk_4};
    const int seqs = int(c.lens.size());
    std::vector<int> start(seqs + 1, 0), slot(seqs);
    for (int s = 0; s < seqs; s++) start[s + 1] = start[s] + c.lens[s], slot[s] = seqs - 1 - s;
    const int n = start[seqs];
    const int qkv_w = 2 * c.hk * c.dk + c.hv * c.dv, gw = c.per_channel ? c.hv * c.dk : c.hv;
    const int st_w = c.hv * c.dk * c.dv;
    std::vector<float> qkv(size_t(n) * qkv_w), av(size_t(n) * gw), bv(size_t(n) * c.hv), alog(c.hv), dtb(gw);
    for (auto& v : qkv) v = randn();
    for (auto& v : av) v = randn();
    for (auto& v : bv) v = randn();
    for (auto& v : alog) v = std::log(1 + (c.alog_hi - 1) * std::uniform_real_distribution<float>(0, 1)(rng));
    for (auto& v : dtb) v = 0.1f * randn();
    std::vector<float> state0(size_t(seqs) * st_w);
    for (auto& v : state0) v = 0.1f * randn();

    std::vector<float> qk(size_t(n) * 2 * c.hk * c.dk), beta(size_t(n) * c.hv);
    std::vector<double> dec(size_t(n) * gw);
    launch(dim3u{unsigned(n), 1, 1}, 128, [&] {
        ferrite_delta_prep(qk.data(), dec.data(), beta.data(), qkv.data(), av.data(), bv.data(), alog.data(), dtb.data(),
                           qkv_w, c.hv, c.hk, c.dk, c.per_channel, c.lower);
    });
    const dim3u rgrid{unsigned(seqs), unsigned(c.hv), unsigned(ceil_div(c.dv, 8))};
    // The reference: every sequence through the row-by-row kernel.
    std::vector<float> want(size_t(n) * c.hv * c.dv, NAN), wantSt = state0;
    launch(rgrid, 128, [&] {
        rule[kpl](want.data(), qk.data(), qkv.data(), dec.data(), beta.data(), wantSt.data(), st_w, start.data(), 1,
                  slot.data(), 1, c.hv, c.hk, c.dk, c.dv, c.per_channel, nullptr, 0, 0);
    });
    // The chunked form for the long sequences, the row-by-row kernel for the rest.
    std::vector<float> got(want.size(), NAN), gotSt = state0;
    launch(rgrid, 128, [&] {
        rule[kpl](got.data(), qk.data(), qkv.data(), dec.data(), beta.data(), gotSt.data(), st_w, start.data(), 1,
                  slot.data(), 1, c.hv, c.hk, c.dk, c.dv, c.per_channel, nullptr, 0, 1);
    });
    emu_dyn_smem(chunk_smem(c.dk, c.per_channel));
    launch(dim3u{unsigned(seqs), unsigned(c.hv), unsigned(ceil_div(c.dv, kChunkCols))}, kChunkThreads, [&] {
        chunk[kpl](got.data(), qk.data(), qkv.data(), dec.data(), beta.data(), gotSt.data(), st_w, start.data(), 1,
                   slot.data(), 1, c.hv, c.hk, c.dk, c.dv, c.per_channel);
    });
    auto rel = [](const std::vector<float>& g, const std::vector<float>& w, int* at) {
        double m = 0;
        for (size_t i = 0; i < w.size(); i++) {
            const double e = std::fabs(double(g[i]) - double(w[i])) / std::max(1.0, std::fabs(double(w[i])));
            if (std::isnan(e)) {
                *at = int(i);
                return e;
            }
            if (e > m) m = e, *at = int(i);
        }
        return m;
    };
    int ao = -1, as = -1;
    const double eo = rel(got, want, &ao), es = rel(gotSt, wantSt, &as);
    std::string lens;
    for (int l : c.lens) lens += std::to_string(l) + " ";
    CHECK(eo <= 1e-6 && es <= 1e-6,
          "hv %d hk %d dk %d dv %d per_channel %d lower %g alog_hi %g lens %s: out error %g (at %d: %g, want %g), "
          "state error %g",
          c.hv, c.hk, c.dk, c.dv, c.per_channel, c.lower, c.alog_hi, lens.c_str(), eo, ao, ao >= 0 ? got[ao] : 0.f,
          ao >= 0 ? want[ao] : 0.f, es);
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); i++) diff += got[i] != want[i];
    std::printf("hv %d hk %d dk %d dv %d per_channel %d lens %s: out %.3g (%zu of %zu differ), state %.3g\n", c.hv,
                c.hk, c.dk, c.dv, c.per_channel, lens.c_str(), eo, diff, want.size(), es);
}

// conv_case runs ShortConv's every-row kernels against ferrite_short_conv
// (row by row), which they must equal bit for bit, outputs and states.
static void conv_case(int C, int K, std::vector<int> lens) {
    const int seqs = int(lens.size());
    std::vector<int> start(seqs + 1, 0), slot(seqs);
    for (int s = 0; s < seqs; s++) start[s + 1] = start[s] + lens[s], slot[s] = seqs - 1 - s;
    const int n = start[seqs];
    std::vector<float> x(size_t(n) * C), w(size_t(C) * K), st0(size_t(seqs) * (K - 1) * C);
    for (auto& v : x) v = randn();
    for (auto& v : w) v = randn();
    for (auto& v : st0) v = randn();
    std::vector<float> want = x, wantSt = st0, got(x.size(), NAN), gotSt = st0;
    const int sw = (K - 1) * C;
    launch(dim3u{unsigned(seqs), unsigned(ceil_div(C, 128)), 1}, 128, [&] {
        ferrite_short_conv(want.data(), want.data(), w.data(), wantSt.data(), sw, start.data(), 1, slot.data(), 1, C, K,
                           nullptr, 0);
    });
    launch(dim3u{unsigned(ceil_div(n, kConvRun)), unsigned(ceil_div(C, 128)), 1}, 128, [&] {
        ferrite_short_conv_rows(got.data(), x.data(), w.data(), gotSt.data(), sw, start.data(), 1, slot.data(), 1, seqs,
                                n, C, K);
    });
    launch(dim3u{unsigned(seqs), unsigned(ceil_div(C, 128)), 1}, 128, [&] {
        ferrite_short_conv_state(x.data(), gotSt.data(), sw, start.data(), 1, slot.data(), 1, C, K);
    });
    size_t dy = 0, ds = 0;
    for (size_t i = 0; i < want.size(); i++) dy += std::memcmp(&got[i], &want[i], 4) != 0;
    for (size_t i = 0; i < wantSt.size(); i++) ds += std::memcmp(&gotSt[i], &wantSt[i], 4) != 0;
    CHECK(dy == 0 && ds == 0, "short_conv_rows C %d K %d: %zu outputs, %zu state values differ", C, K, dy, ds);
    std::printf("short_conv_rows C %d K %d seqs %d: %zu outputs, %zu state values differ\n", C, K, seqs, dy, ds);
}

int main(int argc, char** argv) {
    conv_case(300, 4, {1, 100, 2, 33, 16});
    conv_case(64, 2, {17, 1, 40});
    conv_case(130, 8, {3, 60, 0, 5});
    const bool quick = argc > 1 && std::string(argv[1]) == "-quick";
    std::vector<Case> cases = {
        {2, 1, 32, 32, false, 0, 16, {40, 3, 33}},
        {4, 2, 64, 48, true, -5, 16, {70, 9, 1}},
        {2, 2, 32, 40, false, 0, 400, {64, 65}},  // decays that vanish within a chunk
        {2, 1, 128, 64, false, 0, 16, {100}},
        {2, 2, 128, 32, true, -5, 16, {45, 8}},
        {3, 1, 96, 40, true, -5, 16, {41}},  // a key head short of its kernel's 128
    };
    for (size_t i = 0; i < cases.size(); i++) {
        if (quick && i >= 3) break;
        run_case(cases[i]);
    }
    std::printf("emu: %d checks, %d failed\n", checks, failures);
    return failures != 0;
}
