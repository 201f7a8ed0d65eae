// Seeded pseudo-random weights made in device memory: the bytes of a
// kernels.RandomFill (engine/randweights' matrices), bit for bit those
// kernels.RandomFill.Fill writes on the host, so a benchmark on random
// weights uploads nothing. Every 4 MiB chunk of the matrix has its own
// splitmix64 stream, and the n-th output of a stream is mix64(state +
// n·golden), so each thread computes its own output directly. It uses
// mix64 of convert.cu and the dtype codes of ops.cu (one translation unit).
#include <stdint.h>

namespace {

constexpr uint64_t kRandomChunk = 4ull << 20;  // kernels.RandomChunk
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// rand_half is the 16-bit pattern kernels.halfTable maps the random bits v
// to: sign bit 15, an exponent offset from bits 12–14 (1 with probability
// ½, 2 with ¼, 3 and 4 with ⅛), the low man_bits bits the mantissa.
__device__ inline uint32_t rand_half(uint32_t v, int top, int man_bits, int bias) {
    const int off = __ffs(int(((v >> 12) & 7u) | 8u));  // lowest set bit + 1
    const uint32_t e = uint32_t(uint16_t(max(top - off + bias, 1)));
    return ((v & 0x8000u) | (e << man_bits) | (v & ((1u << man_bits) - 1))) & 0xffffu;
}

}  // namespace

// Fills dst (bytes bytes, any alignment) with the kernels.RandomFill
// {seed, top} values of dtype (F32, BF16 or F16 codes): one stream output
// per 8 bytes of 16-bit values (four of them, little-endian) or per F32, a
// chunk's tail shorter than that zero. Launch: any 1-D grid; the threads
// stride over the outputs.
extern "C" __global__ void ferrite_random_fill(uint8_t* dst, uint64_t bytes, uint64_t seed, int dtype, int top) {
    const uint64_t word = dtype == kF32 ? 4 : 8;
    const uint64_t words = (bytes + word - 1) / word;
    const int man_bits = dtype == kF16 ? 10 : 7, bias = dtype == kF16 ? 15 : 127;
    for (uint64_t g = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; g < words; g += uint64_t(gridDim.x) * blockDim.x) {
        const uint64_t o = g * word;
        const uint64_t chunk = o / kRandomChunk * kRandomChunk;
        const uint64_t end = bytes < chunk + kRandomChunk ? bytes : chunk + kRandomChunk;
        if (o + word > end) {
            for (uint64_t b = o; b < end; b++) dst[b] = 0;
            continue;
        }
        const uint64_t n = (o - chunk) / word + 1;  // the output's number in its chunk's stream
        const uint64_t x = mix64((seed ^ (chunk * 0xbf58476d1ce4e5b9ull)) + n * kGolden);
        uint2 v = make_uint2(0, 0);  // the output's bytes, little-endian (v.y unused for F32)
        if (dtype == kF32) {
            const int off = __ffs(int(uint32_t(x >> 40) | 8u));
            const uint32_t e = uint32_t(max(top - off + 127, 1));
            v.x = (uint32_t(x) & 0x807fffffu) | (e << 23);
        } else {
            v.x = rand_half(uint32_t(x), top, man_bits, bias) | rand_half(uint32_t(x >> 16), top, man_bits, bias) << 16;
            v.y = rand_half(uint32_t(x >> 32), top, man_bits, bias) | rand_half(uint32_t(x >> 48), top, man_bits, bias) << 16;
        }
        uint8_t* p = dst + o;
        if ((uintptr_t(p) & (word - 1)) == 0) {
            if (dtype == kF32) *reinterpret_cast<uint32_t*>(p) = v.x;
            else *reinterpret_cast<uint2*>(p) = v;
        } else {  // a matrix stacked after one of an odd byte count
            for (int b = 0; b < int(word); b++) p[b] = uint8_t((b < 4 ? v.x >> (8 * b) : v.y >> (8 * (b - 4))) & 0xffu);
        }
    }
}
