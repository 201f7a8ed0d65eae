#!/usr/bin/python3
"""Writes kernels/testdata/quant: GGML quantized blocks and the float32
values llama.cpp's gguf-py dequantizes them to, computed independently of
ferrite, so kernels' dequantizers can be checked bit for bit.

Run with Debian's python3-numpy and gguf-py from a llama.cpp checkout (the
unslothai/llama.cpp mirror, commit 34af94cd or later), e.g.

    /usr/bin/python3 tools/quantfixtures/make.py /path/to/llama.cpp/gguf-py

For each type T it writes
    T.blocks     random-valid blocks (finite float16 scales, random quants)
    T.f32        gguf-py's dequantization of T.blocks, little-endian float32
and for Q8_0 and Q4_0, whose gguf-py quantizers are bit-exact with ggml's
reference quantizers,
    T.in.f32     random input values
    T.quant      gguf-py's quantization of T.in.f32
"""

import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "testdata", "quant")
rng = np.random.default_rng(14)


def f16_bytes(n):
    """n random finite float16 scales as bytes: mostly normal values of
    magnitude 2^-14..2^1, some subnormal, either sign."""
    exp = rng.integers(1, 17, n, dtype=np.uint16)
    exp[rng.random(n) < 0.1] = 0
    bits = rng.integers(0, 2, n, dtype=np.uint16) << 15 | exp << 10 | rng.integers(0, 1024, n, dtype=np.uint16)
    return bits.astype("<u2").view(np.uint8).reshape(n, 2)


def random_blocks(qtype, n):
    """n random blocks of qtype whose float16 fields are finite."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if qtype in (T.Q8_0, T.Q4_0):
        b[:, 0:2] = f16_bytes(n)
    elif qtype in (T.Q4_K, T.Q5_K):
        b[:, 0:2] = f16_bytes(n)
        b[:, 2:4] = f16_bytes(n)
    elif qtype == T.Q6_K:
        b[:, 208:210] = f16_bytes(n)
    return b


def write(name, arr):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(arr.tobytes())


def main():
    os.makedirs(OUT, exist_ok=True)
    for qtype, n in ((T.Q8_0, 64), (T.Q4_0, 64), (T.Q4_K, 16), (T.Q5_K, 16), (T.Q6_K, 16)):
        blocks = random_blocks(qtype, n)
        vals = quants.dequantize(blocks, qtype).astype("<f4")
        assert np.all(np.isfinite(vals))
        write(qtype.name + ".blocks", blocks)
        write(qtype.name + ".f32", vals)
    for qtype in (T.Q8_0, T.Q4_0):
        x = (rng.standard_normal(64 * 32) * np.exp(rng.uniform(-6, 2, 64 * 32))).astype(np.float32)
        x[:32] = 0  # an all-zero block
        x[32:64] = 0.25  # a constant block
        write(qtype.name + ".in.f32", x.astype("<f4"))
        write(qtype.name + ".quant", quants.quantize(x.reshape(1, -1), qtype))


if __name__ == "__main__":
    main()
