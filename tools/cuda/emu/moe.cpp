// The harness of tools/cuda/emu/run.sh -moe (included after ops_moe.cu's
// moe_mma and ops_moe_tc.cu): the bf16 experts' grouped products on the
// tensor cores for decode batches (ferrite_moe_tc_gate_up, _down) on
// slots sorted as ferrite_moe_sort sorts them, against double-precision
// products, and ferrite_bf16_terms3's split bit for bit. The prefill's
// tensor-core tiles (moe_mma, measured right on the GPU) run on the same
// experts: they check the emulated mma's fragment layout itself.
#include <cstdio>
#include <vector>

static uint16_t bf16_bits(float f) { return f32_to_bf16(f); }
static float bf16_val(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

struct Case {
    int ne, n, k, hidden, inter;
    float limit;
};

// run_tc checks one shape: ne experts (even ones with gate and up in one
// matrix, odd ones apart), n tokens of k slots, expert 0 every token's
// first slot (so it fills more than one 32-slot pass and, past 64 tokens,
// two tiles), x in rows of stride hidden + 4.
template <bool U4>
static void run_tc(const Case& cs) {
    const int ne = cs.ne, n = cs.n, k = cs.k, hidden = cs.hidden, inter = cs.inter, slots = n * k;
    std::vector<std::vector<uint16_t>> gu(ne), gate(ne), up(ne), dw(ne);
    std::vector<MatDesc> table(3 * ne);
    auto fill = [](std::vector<uint16_t>& m, size_t count) {
        m.resize(count);
        for (auto& v : m) v = bf16_bits(0.1f * randn());
    };
    for (int e = 0; e < ne; e++) {
        if (e % 2 == 0) {
            fill(gu[e], size_t(2) * inter * hidden);
            const auto* p = reinterpret_cast<const uint8_t*>(gu[e].data());
            table[3 * e] = MatDesc{p, nullptr, kBF16, inter, hidden, 1, 1, 0};
            table[3 * e + 1] = MatDesc{p, nullptr, kBF16, inter, hidden, 1, 1, inter};
        } else {
            fill(gate[e], size_t(inter) * hidden), fill(up[e], size_t(inter) * hidden);
            table[3 * e] = MatDesc{reinterpret_cast<const uint8_t*>(gate[e].data()), nullptr, kBF16, inter, hidden, 1, 1, 0};
            table[3 * e + 1] = MatDesc{reinterpret_cast<const uint8_t*>(up[e].data()), nullptr, kBF16, inter, hidden, 1, 1, 0};
        }
        fill(dw[e], size_t(hidden) * inter);
        table[3 * e + 2] = MatDesc{reinterpret_cast<const uint8_t*>(dw[e].data()), nullptr, kBF16, hidden, inter, 1, 1, 0};
    }
    auto W = [&](int e, int q, int r, int c) -> double {  // gate (q 0), up (1), down (2) of expert e
        if (q == 2) return bf16_val(dw[e][size_t(r) * inter + c]);
        if (e % 2 == 0) return bf16_val(gu[e][size_t(r + q * inter) * hidden + c]);
        return bf16_val((q == 0 ? gate[e] : up[e])[size_t(r) * hidden + c]);
    };
    std::vector<int> ids(slots);
    for (int i = 0; i < n; i++) {
        ids[i * k] = 0;
        for (int j = 1; j < k; j++) ids[i * k + j] = 1 + int(rng() % (ne - 1));
    }
    std::vector<int> off, tiles, perm;  // ferrite_moe_sort's
    host_sort(ids, ne, kTileM, off, tiles, perm);
    const int stride = hidden + 4;
    std::vector<float> x(size_t(n) * stride, 1e30f);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < hidden; c++) x[size_t(i) * stride + c] = randn() * (c % 7 == 0 ? 1e-3f : 1.f);
    // The split: hi + mid + lo is x exactly, each term a bf16 rounding.
    const size_t xplane = size_t(n) * hidden;
    std::vector<uint16_t> xt(3 * xplane, 0xffff);
    launch(dim3u{3, 1, 1}, 256, [&] { ferrite_bf16_terms3(xt.data(), x.data(), stride, n, hidden); });
    for (int i = 0; i < n; i++)
        for (int c = 0; c < hidden; c++) {
            const size_t o = size_t(i) * hidden + c;
            const float v = x[size_t(i) * stride + c], hi = bf16_val(xt[o]), mid = bf16_val(xt[xplane + o]);
            const float lo = bf16_val(xt[2 * xplane + o]);
            CHECK(xt[o] == bf16_bits(v) && xt[xplane + o] == bf16_bits(v - hi) && xt[2 * xplane + o] == bf16_bits(v - hi - mid) &&
                      double(hi) + double(mid) + double(lo) == double(v),
                  "terms3 x[%d][%d] = %g: %g + %g + %g", i, c, v, hi, mid, lo);
        }
    const unsigned gy = unsigned(ceil_div(slots, kTileM) + ne);
    const size_t hplane = size_t(slots) * inter;
    std::vector<uint16_t> ht(3 * hplane, 0xffff);
    launch(dim3u{unsigned(ceil_div(inter, 16 * kMtcWarps)), gy, 1}, 128, [&] {
        (U4 ? ferrite_moe_tc_gate_up_u4 : ferrite_moe_tc_gate_up)(ht.data(), slots, inter, xt.data(), n, hidden, off.data(), tiles.data(), perm.data(), table.data(), ne, k,
                               cs.limit);
    });
    // The prefill's tiles on the same input (f32 h).
    std::vector<float> hm(hplane, -7.f);
    launch(dim3u{unsigned(ceil_div(inter, kTileN)), gy, 1}, 128, [&] {
        moe_mma<true>(hm.data(), inter, x.data(), stride, off.data(), tiles.data(), perm.data(), table.data(), ne, k, hidden, cs.limit);
    });
    std::vector<float> h(hplane);
    for (int sl = 0; sl < slots; sl++) {
        const int tok = sl / k, e = ids[sl];
        for (int r = 0; r < inter; r++) {
            double a = 0, b = 0, ma = 0, mb = 0;
            for (int c = 0; c < hidden; c++) {
                const double xv = x[size_t(tok) * stride + c];
                a += W(e, 0, r, c) * xv, ma += std::fabs(W(e, 0, r, c) * xv);
                b += W(e, 1, r, c) * xv, mb += std::fabs(W(e, 1, r, c) * xv);
            }
            if (cs.limit > 0) a = std::min(a, double(cs.limit)), b = std::max(std::min(b, double(cs.limit)), -double(cs.limit));
            const double sg = a / (1 + std::exp(-a)), want = sg * b;
            const double bound = 2e-6 * (ma * std::fabs(b) + std::fabs(sg) * mb) + 1e-30;
            const size_t o = size_t(sl) * inter + r;
            const uint16_t t0 = ht[o], t1 = ht[hplane + o], t2 = ht[2 * hplane + o];
            const double got = double(bf16_val(t0)) + double(bf16_val(t1)) + double(bf16_val(t2));
            h[o] = float(got);
            // The terms are the split of one float32.
            CHECK(double(h[o]) == got && t0 == bf16_bits(h[o]) && t1 == bf16_bits(h[o] - bf16_val(t0)),
                  "tc gate/up slot %d row %d: terms %04x %04x %04x are not a float's split", sl, r, t0, t1, t2);
            CHECK(std::fabs(got - want) <= bound, "tc gate/up %dx%d n=%d slot %d (expert %d) row %d = %g, want %g", hidden, inter, n, sl, e, r,
                  got, want);
            CHECK(std::fabs(hm[o] - want) <= bound, "mma gate/up slot %d (expert %d) row %d = %g, want %g", sl, e, r, hm[o], want);
        }
    }
    std::vector<float> ye(size_t(slots) * hidden, -7.f), yem(size_t(slots) * hidden, -7.f);
    launch(dim3u{unsigned(ceil_div(hidden, 32 * kMtcWarps)), gy, 1}, 128, [&] {
        (U4 ? ferrite_moe_tc_down_u4 : ferrite_moe_tc_down)(ye.data(), hidden, ht.data(), slots, inter, off.data(), tiles.data(), perm.data(), table.data(), ne, k);
    });
    launch(dim3u{unsigned(ceil_div(hidden, kTileN)), gy, 1}, 128, [&] {
        moe_mma<false>(yem.data(), hidden, h.data(), inter, off.data(), tiles.data(), perm.data(), table.data(), ne, k, inter, 0.f);
    });
    for (int sl = 0; sl < slots; sl++) {
        const int e = ids[sl];
        for (int r = 0; r < hidden; r++) {
            double a = 0, ma = 0;
            for (int c = 0; c < inter; c++) {
                const double p = W(e, 2, r, c) * double(h[size_t(sl) * inter + c]);
                a += p, ma += std::fabs(p);
            }
            const size_t o = size_t(sl) * hidden + r;
            CHECK(std::fabs(ye[o] - a) <= 2e-6 * ma + 1e-30, "tc down %dx%d n=%d slot %d (expert %d) row %d = %g, want %g", hidden, inter, n,
                  sl, e, r, ye[o], a);
            CHECK(std::fabs(yem[o] - a) <= 2e-6 * ma + 1e-30, "mma down slot %d (expert %d) row %d = %g, want %g", sl, e, r, yem[o], a);
        }
    }
}

int main() {
    for (bool u4 : {false, true}) {
        auto run = u4 ? run_tc<true> : run_tc<false>;
        run(Case{5, 70, 2, 288, 160, 0.f});  // expert 0: 70 slots, two tiles, the first in two passes; partial blocks, a last chunk alone
        run(Case{9, 12, 4, 256, 96, 0.f});   // a few slots an expert, one B tile
        run(Case{4, 37, 3, 96, 64, 0.05f});  // the clamped SwiGLU; 37 slots in expert 0: a pass of 5 B tiles' worth
    }
    std::printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
