#!/usr/bin/env python3
"""Writes engine/gguf/testdata/gguf-py.gguf with llama.cpp's own GGUF writer
(gguf-py), and gguf-py.json with the values the Go reader must find in it.

It checks ferrite's reader against the reference implementation of the
format: metadata of every value type, arrays, a non-default alignment, and
F32 / F16 / Q8_0 tensors (Q8_0 blocks quantized by gguf-py's numpy code).

Usage (Debian: apt-get install python3-numpy; gguf-py from a llama.cpp
checkout, e.g. the unslothai/llama.cpp mirror):

    PYTHONPATH=/path/to/llama.cpp/gguf-py /usr/bin/python3 tools/ggufref/make_reference.py
"""
import json
import os
import sys

import numpy as np
import gguf

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "..", "engine", "gguf", "testdata")
path = os.path.join(out, "gguf-py.gguf")

w = gguf.GGUFWriter(path, "llama")  # writes general.architecture
w.data_alignment = 64
w.add_custom_alignment(64)
w.add_uint8("t.u8", 200)
w.add_int8("t.i8", -5)
w.add_uint16("t.u16", 60000)
w.add_int16("t.i16", -300)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -70000)
w.add_float32("t.f32", 1.5)
w.add_uint64("t.u64", 1 << 63)
w.add_int64("t.i64", -(1 << 40))
w.add_float64("t.f64", 2.25)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo ✓")
w.add_array("t.strs", ["a", "", "ccc"])
w.add_array("t.ints", [1, -2, 3])
w.add_array("t.floats", [0.5, -1.0])
w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

rng = np.random.default_rng(7)
f32 = rng.standard_normal((3, 5)).astype(np.float32)           # (rows, cols): ne = [5, 3]
f16 = rng.standard_normal((2, 4)).astype(np.float16)
q_src = rng.standard_normal((2, 64)).astype(np.float32)
q8 = gguf.quants.quantize(q_src, gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("a.f32", f32)
w.add_tensor("b.f16", f16)
w.add_tensor("c.q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

deq = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
ref = {
    "generator": "gguf-py " + getattr(gguf, "__version__", "(llama.cpp checkout)") + ", numpy " + np.__version__,
    "tensors": {
        "a.f32": {"shape": list(f32.shape), "values": [float(x) for x in f32.ravel()]},
        "b.f16": {"shape": list(f16.shape), "values": [float(x) for x in f16.astype(np.float32).ravel()]},
        "c.q8_0": {"shape": list(q_src.shape), "values": [float(x) for x in deq.ravel()]},
    },
}
with open(os.path.join(out, "gguf-py.json"), "w") as f:
    json.dump(ref, f, indent=1)
print("wrote", path, os.path.getsize(path), "bytes")
