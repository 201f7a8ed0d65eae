// glm5_next's ops: the clamped SwiGLU (kernels.ClampOps), the mHC
// hyper-connections (kernels.HyperOps) and the k-pool indexer
// (kernels.KPoolOps), with the semantics of kernels/ref (hyper.go,
// kpool.go, mla.go's LayerNorm and SelectTopK).
//
// The file sorts after ops.cu, ops_common.cu and ops_linattn.cu in the one
// translation unit, so it uses their helpers (swiglu_clamp1, elem,
// block_sum_f64, layer_norm_stats, put, rank_key, flag_scan, sigmoid64).
#include <math.h>
#include <stdint.h>

namespace {

// cache_at reads element e of a cache layer, float32 or bf16.
__device__ inline float cache_at(const void* c, size_t e, int bf16) {
    if (bf16) return __uint_as_float(uint32_t(static_cast<const uint16_t*>(c)[e]) << 16);
    return static_cast<const float*>(c)[e];
}

constexpr int kHyperMaxStreams = 16;

}  // namespace

// y[i] = silu(min(g[i], L))·clamp(u[i], −L, L) for n values; y may be g.
// Launch: any 1-D grid of 256 threads.
extern "C" __global__ void ferrite_swiglu_clamp(float* y, const float* g, const float* u, uint64_t n, float limit) {
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
        y[i] = swiglu_clamp1(g[i], u[i], limit);
}

// ---------------------------------------------------------------------------
// Hyper-connections. A token's residual is hc streams X (hc·hidden,
// stream-major).

// The weightless RMSNorm of each token's streams before the mix product
// (kernels/ref.HyperNorm): xn = X·float32(1/sqrt(float32(mean(X²)) + eps)),
// the sum in float64. Launch: grid n, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_hyper_norm(float* xn, const float* X, int w, float eps) {
    __shared__ double part[32];
    const size_t off = size_t(blockIdx.x) * w;
    double ss = 0;
    for (int c = threadIdx.x; c < w; c += blockDim.x) ss += double(X[off + c]) * double(X[off + c]);
    ss = block_sum_f64(ss, part);
    const float inv = float(1.0 / sqrt(double(float(ss / double(w))) + double(eps)));
    for (int c = threadIdx.x; c < w; c += blockDim.x) xn[off + c] = __fmul_rn(X[off + c], inv);
}

// The mix product mix (n, m) = xn (n, cols)·wᵀ for the site's hc_fn w (m,
// cols) in its stored dtype (decoded as kernels.Mat.RowF32), float64 sums
// rounded once, as kernels.MatMulRef: the mix feeds sigmoids and Sinkhorn's
// exponentials, so it is not left to the bf16 GEMM paths of Linear. Block
// (rows 4x .. 4x+3, output j). Launch: grid (ceil(n/4), m), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_hyper_mix(float* mix, const float* xn, const uint8_t* w, const float* scale, int n, int m, int cols,
                      int dtype, int br, int bc) {
    __shared__ double part[32];
    const int r0 = blockIdx.x * 4, j = blockIdx.y;
    const int size = dtype == kF32 ? 4 : dtype == kF8E4M3 ? 1 : 2;
    const uint8_t* row = w + size_t(j) * cols * size;
    const float* srow = dtype == kF8E4M3 ? scale + size_t(j / br) * ((cols + bc - 1) / bc) : nullptr;
    double acc[4] = {0, 0, 0, 0};
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const double wv = double(elem(row, c, dtype, srow, bc));
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (r0 + q < n) acc[q] += wv * double(xn[size_t(r0 + q) * cols + c]);
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const double sum = block_sum_f64(acc[q], part);
        if (threadIdx.x == 0 && r0 + q < n) mix[size_t(r0 + q) * m + j] = float(sum);
    }
}

// The coefficients and the pre-weighted sum of one token per block
// (kernels/ref.HyperCoef, HyperPre): from the token's mix ((2+hc)·hc),
// pre_j = sigmoid(mix_j·s0 + base_j) + eps, coef = [post | comb] with
// post_j = 2·sigmoid(mix_{hc+j}·s1 + base_{hc+j}) and comb the Sinkhorn
// projection of mix_{2hc+·}·s2 + base_{2hc+·} (float64, a thread per
// element), then x (hidden) = Σ_i pre_i·X_i in float64. Launch: grid n, 128 threads;
// hc ≤ 16.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_hyper_pre(float* x, float* coef, const float* X, const float* mix, const float* base, int hidden, int hc,
                      int iters, float s0, float s1, float s2, float eps) {
    __shared__ double pre[kHyperMaxStreams];
    __shared__ double buf[2][kHyperMaxStreams * kHyperMaxStreams];
    const int r = blockIdx.x;
    const int m = (2 + hc) * hc, cw = hc + hc * hc, nc = hc * hc;
    const double e = double(eps);
    const float* mx = mix + size_t(r) * m;
    float* cr = coef + size_t(r) * cw;
    for (int j = threadIdx.x; j < hc; j += blockDim.x) {
        pre[j] = sigmoid64(double(mx[j]) * double(s0) + double(base[j])) + e;
        cr[j] = float(2.0 * sigmoid64(double(mx[hc + j]) * double(s1) + double(base[hc + j])));
    }
    // Sinkhorn (kernels/ref.Sinkhorn): a row softmax plus eps, a column
    // normalisation, then iters − 1 rounds of rows and columns, each dividing
    // by sum + eps. A thread per element (i, j) = (t / hc, t % hc); every
    // sum runs over its row or column in the reference's order, so each
    // element of a row or column sees the same sum; c is read, nw written,
    // then they swap.
    double *c = buf[0], *nw = buf[1];
    for (int t = threadIdx.x; t < nc; t += blockDim.x)
        c[t] = double(mx[2 * hc + t]) * double(s2) + double(base[2 * hc + t]);
    __syncthreads();
    for (int t = threadIdx.x; t < nc; t += blockDim.x) {
        const double* row = c + (t / hc) * hc;
        double rmax = -INFINITY;
        for (int j = 0; j < hc; j++) rmax = fmax(rmax, row[j]);
        nw[t] = exp(c[t] - rmax);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < nc; t += blockDim.x) {
        const double* row = nw + (t / hc) * hc;
        double sum = 0;
        for (int j = 0; j < hc; j++) sum += row[j];
        c[t] = nw[t] / sum + e;
    }
    __syncthreads();
    for (int it = 0; it < iters; it++) {
        if (it > 0) {  // rows
            for (int t = threadIdx.x; t < nc; t += blockDim.x) {
                const double* row = c + (t / hc) * hc;
                double sum = 0;
                for (int j = 0; j < hc; j++) sum += row[j];
                nw[t] = c[t] / (sum + e);
            }
            __syncthreads();
            double* tmp = c;
            c = nw;
            nw = tmp;
        }
        for (int t = threadIdx.x; t < nc; t += blockDim.x) {  // columns
            double sum = 0;
            for (int i = 0; i < hc; i++) sum += c[i * hc + t % hc];
            nw[t] = c[t] / (sum + e);
        }
        __syncthreads();
        double* tmp = c;
        c = nw;
        nw = tmp;
    }
    for (int t = threadIdx.x; t < nc; t += blockDim.x) cr[hc + t] = float(c[t]);
    __syncthreads();
    const float* Xr = X + size_t(r) * hc * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
        double s = 0;
        for (int i = 0; i < hc; i++) s += pre[i] * double(Xr[size_t(i) * hidden + d]);
        x[size_t(r) * hidden + d] = float(s);
    }
}

// In place, X[j] = post_j·y + Σ_i comb[i][j]·X[i] per token and hidden
// index, float64 (kernels/ref.HyperPost): X (n, hc·hidden), y (n, hidden),
// coef (n, hc + hc·hc). Launch: any 1-D grid of 256 threads; hc ≤ 16.
extern "C" __global__ void ferrite_hyper_post(float* X, const float* y, const float* coef, int n, int hidden, int hc) {
    const uint64_t total = uint64_t(n) * hidden;
    const int cw = hc + hc * hc;
    for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total; t += uint64_t(gridDim.x) * blockDim.x) {
        const size_t r = t / hidden, d = t % hidden;
        float* Xr = X + r * hc * hidden;
        const float* post = coef + r * cw;
        const float* comb = post + hc;
        double old[kHyperMaxStreams];
        for (int i = 0; i < hc; i++) old[i] = double(Xr[size_t(i) * hidden + d]);
        const double o = double(y[r * hidden + d]);
        for (int j = 0; j < hc; j++) {
            double acc = double(post[j]) * o;
            for (int i = 0; i < hc; i++) acc += double(comb[i * hc + j]) * old[i];
            Xr[size_t(j) * hidden + d] = float(acc);
        }
    }
}

// x (n, hidden) = the mean of each token's hc streams, summed in float64
// (kernels/ref.HyperMerge). Launch: any 1-D grid of 256 threads.
extern "C" __global__ void ferrite_hyper_merge(float* x, const float* X, int n, int hidden, int hc) {
    const uint64_t total = uint64_t(n) * hidden;
    const double inv = 1.0 / double(hc);
    for (uint64_t t = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; t < total; t += uint64_t(gridDim.x) * blockDim.x) {
        const size_t r = t / hidden, d = t % hidden;
        double s = 0;
        for (int j = 0; j < hc; j++) s += double(X[(r * hc + j) * hidden + d]);
        x[t] = float(s * inv);
    }
}

// ---------------------------------------------------------------------------
// The k-pool indexer. A cache row is [k | γ] (2·dim), F32 or BF16; the
// slot of position q of sequence s is blocks[s][q / bs]·bs + q % bs.

// Stores every row's [LayerNorm(k)·nw + nb | γ] at its slot (kernels/ref
// .LayerNorm: float64 sums, the mean and variance rounded to float32, the
// affine in float32); a slot outside [0, slots) is skipped. Launch: grid
// n, 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_kpool_store(void* cache, const float* k, const float* g, const int* slot, int slots, int dim,
                        const float* nw, const float* nb, float eps, int bf16) {
    __shared__ double part[32];
    const int i = blockIdx.x;
    const int sl = slot[i];
    const float* kr = k + size_t(i) * dim;
    float mean, inv;
    layer_norm_stats(kr, dim, eps, part, &mean, &inv);
    if (sl < 0 || sl >= slots) return;
    const size_t row = size_t(sl) * 2 * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float kn = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(kr[c], mean), inv), nw[c]), nb[c]);
        put(cache, bf16, row + c, kn);
        put(cache, bf16, row + dim + c, g[size_t(i) * dim + c]);
    }
}

// For every row whose position closes a pool (pos % size = size − 1), the
// pool's key (kernels/ref.KPoolKey) from its members' cached rows, per
// channel Σ_j softmax_j(γ_j + ape_j)·k_j in float64 (γ + ape in float32),
// replaces the first dim values of the row's slot. A thread owns channels,
// so the row's own k is read before it is overwritten. Launch: grid n, 128
// threads; after ferrite_kpool_store.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_kpool_pool(void* cache, const int* pos, const int* seq, const int* slot, const int* blocks, int max_blocks,
                       int bs, int slots, int dim, int size, const float* ape, int bf16) {
    const int i = blockIdx.x;
    const int p = pos[i], sl = slot[i];
    if (p % size != size - 1 || sl < 0 || sl >= slots) return;
    const int* bt = blocks + size_t(seq[i]) * max_blocks;
    const int first = p + 1 - size;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        double mx = -INFINITY;
        for (int j = 0; j < size; j++) {
            const int q = first + j;
            const size_t row = (size_t(bt[q / bs]) * bs + q % bs) * 2 * dim;
            mx = fmax(mx, double(__fadd_rn(cache_at(cache, row + dim + c, bf16), ape[size_t(j) * dim + c])));
        }
        double sum = 0;
        for (int j = 0; j < size; j++) {
            const int q = first + j;
            const size_t row = (size_t(bt[q / bs]) * bs + q % bs) * 2 * dim;
            sum += exp(double(__fadd_rn(cache_at(cache, row + dim + c, bf16), ape[size_t(j) * dim + c])) - mx);
        }
        double acc = 0;
        for (int j = 0; j < size; j++) {
            const int q = first + j;
            const size_t row = (size_t(bt[q / bs]) * bs + q % bs) * 2 * dim;
            const double pr = exp(double(__fadd_rn(cache_at(cache, row + dim + c, bf16), ape[size_t(j) * dim + c])) - mx);
            acc += pr / sum * double(cache_at(cache, row + c, bf16));
        }
        put(cache, bf16, size_t(sl) * 2 * dim + c, float(acc));
    }
}

// Pool scores (kernels/ref.KPoolScores): scores[i][P] (row stride L) =
// Σ_h w_h·ReLU(scale·q_h·K̄_P) for the complete pools P < (pos+1)/size of
// row i, float64 sums; K̄_P is the first dim values of the slot of pool
// P's last token. Block (i, tile) takes pools [64·tile, 64·tile + 64), a
// warp one pool at a time with its lanes over the heads. Launch: grid (n,
// ceil(L/64)), 128 threads, dynamic shared memory (heads·(dim+1) + 4·dim)·4
// bytes.
extern "C" __global__ void __launch_bounds__(128)
    ferrite_kpool_scores(float* scores, int L, const float* q, const float* w, const void* cache, const int* pos,
                         const int* seq, const int* blocks, int max_blocks, int bs, int heads, int dim, int size,
                         float scale, int bf16) {
    extern __shared__ float ks_sm[];
    float* qs = ks_sm;                                // (heads, dim+1): padded against bank conflicts
    float* kw = ks_sm + size_t(heads) * (dim + 1);   // (4, dim) each warp's pool key
    const int i = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cand = (pos[i] + 1) / size;
    const int P0 = blockIdx.y * 64;
    if (P0 >= cand) return;  // the whole block
    for (int t = threadIdx.x; t < heads * dim; t += blockDim.x)
        qs[(t / dim) * (dim + 1) + t % dim] = q[size_t(i) * heads * dim + t];
    __syncthreads();
    const int* bt = blocks + size_t(seq[i]) * max_blocks;
    float* kr = kw + warp * dim;
    for (int P = P0 + warp; P < min(cand, P0 + 64); P += 4) {
        const int e = P * size + size - 1;
        const size_t row = (size_t(bt[e / bs]) * bs + e % bs) * 2 * dim;
        __syncwarp();
        for (int c = lane; c < dim; c += 32) kr[c] = cache_at(cache, row + c, bf16);
        __syncwarp();
        double acc = 0;
        for (int h = lane; h < heads; h += 32) {
            const float* qh = qs + size_t(h) * (dim + 1);
            double d = 0;
            for (int c = 0; c < dim; c++) d += double(qh[c]) * double(kr[c]);
            acc += double(w[size_t(i) * heads + h]) * fmax(d * double(scale), 0.0);
        }
        acc = warp_sum_f64(acc);
        if (lane == 0) scores[size_t(i) * L + P] = float(acc);
    }
}

// The k-pool selection of row i (kernels/ref.KPoolSelect) from its pool
// scores (row stride L): the best min(keep, cand) of its cand = (pos+1)/size
// complete pools, ties to the lower pool, found by a radix select on the
// scores' order keys (one 8-bit digit per pass); the kept pools' tokens in
// increasing order, then with tail the tokens of the incomplete pool
// [pos+1 − (pos+1) mod size, pos], then −1 to sw. Launch: grid n, 256
// threads.
extern "C" __global__ void __launch_bounds__(256)
    ferrite_kpool_select(int* sel, int sw, const float* scores, int L, const int* pos, int size, int keep, int tail) {
    __shared__ unsigned hist[256];
    __shared__ int cnt[32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    const int i = blockIdx.x;
    const int p = pos[i];
    const int cand = (p + 1) / size;
    const float* sc = scores + size_t(i) * L;
    int* out = sel + size_t(i) * sw;
    const int K = min(keep, cand);
    // The K-th largest key T, and need: how many of the keys equal to T
    // are kept (the lowest pools).
    uint32_t prefix = 0, mask = 0;
    int need = K;
    if (cand > keep) {
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int P = threadIdx.x; P < cand; P += blockDim.x) {
                const uint32_t u = rank_key(sc[P]);
                if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int cum = 0, b = 255;
                for (; b > 0; b--) {
                    if (cum + int(hist[b]) >= need) break;
                    cum += int(hist[b]);
                }
                s_need = need - cum;
                s_prefix = prefix | (uint32_t(b) << shift);
            }
            __syncthreads();
            need = s_need;
            prefix = s_prefix;
            mask |= 255u << shift;
        }
    }
    // Ascending compaction: pool P is kept when all are, or its key is
    // above T, or it is one of the first need pools whose key equals T.
    int kept = 0, eqs = 0;
    for (int base = 0; base < cand; base += blockDim.x) {
        const int P = base + threadIdx.x;
        const uint32_t u = P < cand ? rank_key(sc[P]) : 0u;
        const bool eq = P < cand && cand > keep && u == prefix;
        int eqBefore, at;
        const int eqTotal = flag_scan(eq, &eqBefore, cnt);
        const bool keepP = P < cand && (cand <= keep || u > prefix || (eq && eqs + eqBefore < need));
        const int keptTotal = flag_scan(keepP, &at, cnt);
        if (keepP)
            for (int j = 0; j < size; j++) out[(kept + at) * size + j] = P * size + j;
        kept += keptTotal;
        eqs += eqTotal;
    }
    int n = K * size;
    if (tail) {
        const int t0 = p + 1 - (p + 1) % size;
        for (int s = t0 + threadIdx.x; s <= p; s += blockDim.x) out[n + s - t0] = s;
        n += p + 1 - t0;
    }
    for (int j = n + threadIdx.x; j < sw; j += blockDim.x) out[j] = -1;
}
