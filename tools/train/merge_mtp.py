#!/usr/bin/env python3
"""Put the tensors of one safetensors file (train_mtp.py's mtp.safetensors) into another (the bf16
checkpoint), byte for byte, keeping every other tensor, the order and the metadata; standard library
only. Usage: merge_mtp.py CHECKPOINT MTP OUT"""
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    meta = head.pop("__metadata__", None)
    return head, meta, data


def main():
    ck, mtp, out = sys.argv[1:4]
    h0, meta, d0 = read(ck)
    h1, _, d1 = read(mtp)
    missing = [k for k in h1 if k not in h0]
    if missing:
        raise SystemExit(f"{mtp}: tensors not in {ck}: {missing[:5]}")
    names = sorted(h0, key=lambda k: h0[k]["data_offsets"][0])
    head, blobs, off, changed = {}, [], 0, 0
    for k in names:
        src, d = (h1[k], d1) if k in h1 else (h0[k], d0)
        if src["dtype"] != h0[k]["dtype"] or src["shape"] != h0[k]["shape"]:
            raise SystemExit(f"{k}: {src['dtype']} {src['shape']} against {h0[k]['dtype']} {h0[k]['shape']}")
        a, b = src["data_offsets"]
        blob = d[a:b]
        if k in h1 and blob != d0[h0[k]["data_offsets"][0]:h0[k]["data_offsets"][1]]:
            changed += 1
        head[k] = {"dtype": src["dtype"], "shape": src["shape"], "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if meta is not None:
        head = {"__metadata__": meta, **head}
    hb = json.dumps(head, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    print(f"{out}: {len(names)} tensors, {changed} replaced by {mtp}'s")


if __name__ == "__main__":
    main()
