#!/usr/bin/env python3
"""Read a tenplan checkpoint without tenplan, as PyTorch DCP's Hugging Face
storage reader does: every `*.safetensors` file of the directory, each entry
placed at its `DCP_SHARDING_INFO` offsets. Rebuilds every global tensor,
checks that the entries tile it exactly once, and compares the XXH3-128 of
its row-major bytes with the manifest's digest.

Usage: read_checkpoint.py DIR   (exit 0: every tensor matches)
"""
import glob
import json
import os
import struct
import sys

import numpy as np
import xxhash
from safetensors import safe_open

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
          "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def assemble(d):
    """Every global tensor of checkpoint `d` as a numpy array (bf16 as
    uint16), with a count of how often each element was stored, and the
    manifest."""
    manifest = json.load(open(os.path.join(d, "tenplan.json")))
    shapes = {t["name"]: t["shape"] for t in manifest["tensors"]}
    arrays, covered = {}, {}
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    for path in files:
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        meta = header.pop("__metadata__", {})
        info = json.loads(meta.get("DCP_SHARDING_INFO", "{}"))
        # The reference library must accept the file and see the same keys.
        with safe_open(path, framework="numpy") as f:
            assert sorted(f.keys()) == sorted(header), path
            assert f.metadata().get("DCP_SHARDING_INFO") is not None or not header, path
        for key, e in header.items():
            name = key if key in shapes else key.rsplit("#", 1)[0]
            dt = DTYPES[e["dtype"]]
            lo, hi = e["data_offsets"]
            block = np.frombuffer(raw, dtype=dt, count=(hi - lo) // np.dtype(dt).itemsize,
                                  offset=8 + n + lo).reshape(e["shape"])
            off = info[key]["saved_offsets"]
            if name not in arrays:
                arrays[name] = np.zeros(shapes[name], dtype=dt)
                covered[name] = np.zeros(shapes[name], dtype=np.uint8)
            idx = tuple(slice(o, o + s) for o, s in zip(off, e["shape"]))
            arrays[name][idx] = block
            covered[name][idx] += 1
    return arrays, covered, manifest, files


def main(d):
    arrays, covered, manifest, files = assemble(d)
    digests = {t["name"]: t["digest"] for t in manifest["tensors"]}
    bad = 0
    for name, want in digests.items():
        if name not in arrays or not (covered[name] == 1).all():
            print(f"{name}: not covered exactly once")
            bad += 1
            continue
        got = "xxh3-128:" + xxhash.xxh3_128_hexdigest(np.ascontiguousarray(arrays[name]).tobytes())
        if got != want:
            print(f"{name}: digest {got} != manifest {want}")
            bad += 1
    print(f"{d}: {len(files)} files, {len(digests)} tensors, {len(digests) - bad} match")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
