#!/usr/bin/python3
"""Reference fixtures for the merge library and the outer optimizers (src/merge/*_test.cpp, src/outer/*_test.cpp).

Run with Debian's PyTorch (the python3 first on PATH may have no torch):
    /usr/bin/python3 tests/python/make_merge_fixtures.py tests/fixtures/merge
Every reference is computed here in float64 directly from the definitions in DESIGN.md §2.5-2.6, independently
of the C++ code. The files are safetensors written by the small writer below (no safetensors package needed).
"""
import json
import math
import struct
import sys

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32"}


def save(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---------------------------------------------------------------- outer optimizers (torch.optim.SGD itself)
def outer_fixture(out):
    g = torch.Generator().manual_seed(1)
    tensors, meta = {}, {}
    cases = {"diloco": (0.7, 0.9, True), "isoloco": (1.8, 0.8, True), "heavyball": (0.5, 0.7, False)}
    steps = 6
    for case, (lr, mu, nesterov) in cases.items():
        p0 = torch.randn(5, 4, generator=g, dtype=torch.float64)
        p = torch.nn.Parameter(p0.clone())
        opt = torch.optim.SGD([p], lr=lr, momentum=mu, dampening=0, nesterov=nesterov)
        tensors[f"{case}.param0"] = p0
        for s in range(steps):
            grad = torch.randn(5, 4, generator=g, dtype=torch.float64)
            p.grad = grad.clone()
            opt.step()
            tensors[f"{case}.grad{s}"] = grad
            tensors[f"{case}.param{s + 1}"] = p.detach().clone()
        tensors[f"{case}.buffer"] = opt.state[p]["momentum_buffer"].clone()
        meta[f"{case}.lr"], meta[f"{case}.momentum"], meta[f"{case}.nesterov"] = lr, mu, int(nesterov)
    meta["steps"] = steps
    save(f"{out}/outer_sgd.safetensors", tensors, meta)


# ---------------------------------------------------------------- merge methods (from their definitions)
def rank_of(S, shape):
    tol = max(shape) * torch.finfo(torch.float64).eps
    return int((S > S[0] * tol).sum()) if S.numel() and S[0] > 0 else 0


def wmean(ds, w):
    return sum(wi * d for wi, d in zip(w, ds))


def ref_rda(ds, w):
    radius = sum(wi * d.norm() for wi, d in zip(w, ds))
    direction = sum(wi * d / d.norm() for wi, d in zip(w, ds))
    return radius * direction / direction.norm()


def ref_iso_c(ds, w):
    M = wmean(ds, w)
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    k = rank_of(S, M.shape)
    return S[:k].mean() * U[:, :k] @ Vh[:k]


def polar_cols(A):
    P, D, Qh = torch.linalg.svd(A, full_matrices=False)
    k = rank_of(D, A.shape)
    return P[:, :k] @ Qh[:k]


def ref_tsv(ds, w):
    r = min(ds[0].shape)
    s = max(1, r // len(ds))
    us, ss, vs = [], [], []
    for wi, d in zip(w, ds):
        U, S, Vh = torch.linalg.svd(d, full_matrices=False)
        us.append(U[:, :s]); ss.append(wi * S[:s]); vs.append(Vh[:s].T)
    return (polar_cols(torch.cat(us, 1)) * torch.cat(ss)) @ polar_cols(torch.cat(vs, 1)).T


def ref_iso_cts(ds, w, common=0.8):
    M = wmean(ds, w)
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    r = min(M.shape)
    kc = max(1, int(common * r))
    s = (r - kc) // len(ds)
    Uc = U[:, :kc]
    us, vs = [Uc], [Vh[:kc].T]
    for d in ds:
        if s == 0:
            break
        Ui, Si, Vhi = torch.linalg.svd(d - Uc @ (Uc.T @ d), full_matrices=False)
        us.append(Ui[:, :s]); vs.append(Vhi[:s].T)
    return S.mean() * polar_cols(torch.cat(us, 1)) @ polar_cols(torch.cat(vs, 1)).T


def ref_ties(ds, w, keep=0.9):
    trimmed = []
    for d in ds:
        n = d.numel()
        k = max(1, math.ceil(keep * n))
        thr = d.abs().flatten().sort().values[n - k]
        trimmed.append(d * (d.abs() >= thr))
    sign = wmean(trimmed, w).sign()
    num = torch.zeros_like(ds[0]); den = torch.zeros_like(ds[0])
    for wi, t in zip(w, trimmed):
        agree = ((t.sign() == sign) & (t != 0)).double()
        num += wi * t * agree
        den += wi * agree
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def merge_fixture(out):
    g = torch.Generator().manual_seed(2)
    tensors, meta = {}, {}
    cases = [("tall", (12, 7), 3, [0.5, 0.3, 0.2]), ("wide", (6, 10), 4, [1.0, 2.0, 3.0, 4.0]),
             ("square", (9, 9), 2, [1.0, 1.0])]
    refs = {"mean": wmean, "rda": ref_rda, "iso_c": ref_iso_c, "tsv": ref_tsv, "iso_cts": ref_iso_cts,
            "ties": ref_ties}
    for case, shape, T, w in cases:
        ds = [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(T)]
        wn = [x / sum(w) for x in w]
        for i, d in enumerate(ds):
            tensors[f"{case}.delta{i}"] = d
        meta[f"{case}.weights"] = ",".join(repr(x) for x in w)
        meta[f"{case}.T"] = T
        for method, f in refs.items():
            tensors[f"{case}.{method}"] = f(ds, wn)
    meta["cases"] = ",".join(c[0] for c in cases)
    meta["methods"] = ",".join(refs)
    save(f"{out}/merge_methods.safetensors", tensors, meta)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/merge"
    outer_fixture(out)
    merge_fixture(out)
    print("wrote", out)
