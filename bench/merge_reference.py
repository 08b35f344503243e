#!/usr/bin/python3
"""Python/PyTorch reference for bench/merge_bench.cpp: whole-model Iso-C merge with torch.linalg.svd per tensor.

    /usr/bin/python3 bench/merge_reference.py DIR T
    /usr/bin/python3 bench/merge_reference.py ns-coefficients      (needs scipy)
The first form reads DIR/base.safetensors and DIR/input{0..T-1}.safetensors, merges the task vectors (iso_c for 2-D tensors,
mean for the rest, alpha = 1) in float32, writes DIR/python_merged.safetensors and prints one JSON line with the
compute time (file reading excluded, as in the C++ timing).

The second prints the quintic tables of src/merge/iso_c_ns.cpp (kFirst, kRest, kBf16). Each minimax step is the odd
p(x) = a x + b x^3 + c x^5 minimising max |1 - p(x)| over the current band [lo, hi] (a linear programme on a dense
grid); the next band is p's range with its top widened by 2 %. Starting from [l0, 1.02] the steps run until the
band is within 0.1 of 1; for k = 1..9 steps, l0 is the smallest value (bisection in log10) that needs only k.
bf16's table is cushioned: each step is fitted on [max(lo, hi / 10), hi] only (greedy(cushion=10)).
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


def minimax_quintic(lo, hi, points=2000):
    from scipy.optimize import linprog
    xs = np.unique(np.concatenate([np.geomspace(lo, hi, points), np.linspace(lo, hi, points)]))
    V = np.stack([xs, xs ** 3, xs ** 5], 1)
    ones = np.ones((len(xs), 1))
    # variables (a, b, c, t): minimise t subject to -t <= 1 - V.(a, b, c) <= t at every grid point
    A = np.vstack([np.hstack([-V, -ones]), np.hstack([V, -ones])])
    rhs = np.concatenate([-np.ones(len(xs)), np.ones(len(xs))])
    r = linprog([0, 0, 0, 1], A_ub=A, b_ub=rhs, bounds=[(None, None)] * 4, method="highs")
    coef = r.x[:3]
    dense = np.geomspace(lo, hi, 20000)
    p = coef[0] * dense + coef[1] * dense ** 3 + coef[2] * dense ** 5
    return coef, p.min(), p.max()


def greedy(l0, band=0.1, margin=1.02, cap=40, cushion=None):
    """The greedy schedule from the band [l0, margin]. With a cushion C each step is designed on [max(lo, hi / C),
    hi] only (the values below hi / C are lifted by its slope, not fitted), so that no step maps a value of the band
    far below the top: the next band is p's range over the whole band."""
    lo, hi, steps = l0, margin, []
    while len(steps) < cap:
        coef, pmin, pmax = minimax_quintic(max(lo, hi / cushion) if cushion else lo, hi)
        if cushion:
            dense = np.geomspace(lo, hi, 20000)
            p = coef[0] * dense + coef[1] * dense ** 3 + coef[2] * dense ** 5
            pmin, pmax = p.min(), p.max()
        steps.append(coef)
        lo, hi = pmin, pmax * margin
        if (pmax - pmin) / 2 < band:
            break
    return steps


def smallest_l0(k, cushion=None):
    """The smallest l0 (bisection in log10) whose greedy schedule needs at most k steps, and that schedule."""
    a, b = -8.0, -0.01
    for _ in range(30):
        mid = (a + b) / 2
        if len(greedy(10 ** mid, cushion=cushion)) <= k:
            b = mid
        else:
            a = mid
    return 10 ** b, greedy(10 ** b, cushion=cushion)


def ns_coefficients():
    tables = {k: smallest_l0(k) for k in range(1, 10)}
    print("kFirst (first step for k = 1..9 minimax steps):")
    for k in range(1, 10):
        l0, s = tables[k]
        print("    {%.9g, %.9g, %.9g},   // l0 = %.2g" % (*s[0], l0))
    print("kRest (shared continuation; k steps use the last k - 1):")
    for c in tables[9][1][1:]:
        print("    {%.9g, %.9g, %.9g}," % tuple(c))
    # bf16's schedule, cushioned at 10 (the first step designed on [0.102, 1.02], then the steady growth step on
    # [hi / 10, hi], repeated, then the last minimax step): its k minimax steps are lead, k - 2 grow, last.
    print("kBf16 (cushion 10: lead, grow, last; l0 for k = 2..8 minimax steps:",
          ", ".join("%.2g" % smallest_l0(k, 10)[0] for k in range(2, 9)) + ")")
    s = smallest_l0(6, 10)[1]
    for c in (s[0], s[-2], s[-1]):
        print("    {%.9g, %.9g, %.9g}," % tuple(c))


def main():
    if sys.argv[1] == "ns-coefficients":
        ns_coefficients()
        return
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
