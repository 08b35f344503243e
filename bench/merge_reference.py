#!/usr/bin/python3
"""Python/PyTorch reference for bench/merge_bench.cpp: whole-model Iso-C merge with torch.linalg.svd per tensor.

    /usr/bin/python3 bench/merge_reference.py DIR T
reads DIR/base.safetensors and DIR/input{0..T-1}.safetensors, merges the task vectors (iso_c for 2-D tensors,
mean for the rest, alpha = 1) in float32, writes DIR/python_merged.safetensors and prints one JSON line with the
compute time (file reading excluded, as in the C++ timing).
"""
import json
import struct
import sys
import time

import numpy as np
import torch

NP = {"F32": np.float32, "F64": np.float64}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=NP[e["dtype"]]).reshape(e["shape"]).copy())
    return out


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def iso_c(M):
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    return S.mean() * (U @ Vh)


def main():
    d, T = sys.argv[1], int(sys.argv[2])
    base = load(f"{d}/base.safetensors")
    inputs = [load(f"{d}/input{i}.safetensors") for i in range(T)]
    t0 = time.perf_counter()
    out = {}
    for name, b in base.items():
        M = sum(x[name] - b for x in inputs) / T
        out[name] = b + (iso_c(M) if M.dim() == 2 else M)
    seconds = time.perf_counter() - t0
    save(f"{d}/python_merged.safetensors", out)
    print(json.dumps({"seconds": seconds, "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
