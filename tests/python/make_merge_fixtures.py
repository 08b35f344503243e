#!/usr/bin/python3
"""Reference fixtures for the merge library and the outer optimizers (src/merge/*_test.cpp, src/outer/*_test.cpp).

Run with Debian's PyTorch (the python3 first on PATH may have no torch):
    /usr/bin/python3 tests/python/make_merge_fixtures.py tests/fixtures/merge
Every reference is computed here in float64 directly from the definitions in DESIGN.md §2.5-2.6 and the papers
(Iso-C / Iso-CTS: Marczak et al. 2025, "No Task Left Behind"), independently
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


def ref_iso_c(ds, w, threshold=0.0):
    """Iso-C (Marczak et al. 2025; IsoLoCo): sigma_bar = (1/r) sum_{i<=r} sigma_i, result sigma_bar * U V^T over
    the full thin SVD. threshold > 0: drop sigma_i <= threshold * sigma_max and average over the rest."""
    M = wmean(ds, w)
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    if threshold == 0:
        return S.mean() * U @ Vh
    keep = S > threshold * S.max()
    if not keep.any():
        return torch.zeros_like(M)
    return S[keep].mean() * U[:, keep] @ Vh[keep]


def ref_iso_c_range(ds, w, rank):
    """The part of Iso-C that is unique for a rank-deficient M of known rank: P_U R P_V = sigma_bar U_k V_k^T,
    with sigma_bar still the mean over all r = min(m, n) singular values. Also returns P_U and P_V."""
    M = wmean(ds, w)
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    Uk, Vk = U[:, :rank], Vh[:rank].T
    return S.mean() * Uk @ Vk.T, S.mean(), Uk @ Uk.T, Vk @ Vk.T


def polar_cols(A):
    P, D, Qh = torch.linalg.svd(A, full_matrices=False)
    k = rank_of(D, A.shape)
    return P[:, :k] @ Qh[:k]


def ref_tsv(ds, w):
    pairs = [(wi, d) for wi, d in zip(w, ds) if wi > 0]  # zero-weight inputs take no share of the rank
    r = min(ds[0].shape)
    s = max(1, r // len(pairs))
    us, ss, vs = [], [], []
    for wi, d in pairs:
        U, S, Vh = torch.linalg.svd(d, full_matrices=False)
        us.append(U[:, :s]); ss.append(wi * S[:s]); vs.append(Vh[:s].T)
    return (polar_cols(torch.cat(us, 1)) * torch.cat(ss)) @ polar_cols(torch.cat(vs, 1)).T


def cts_common_rank(r, T, common):
    """Iso-CTS common rank: among 1 <= k <= r with (r - k) divisible by T, the one nearest floor(common * r);
    on a tie the larger k (a bigger common subspace)."""
    target = math.floor(common * r)
    admissible = [k for k in range(1, r + 1) if (r - k) % T == 0]
    return min(admissible, key=lambda k: (abs(k - target), -k))


def ref_iso_cts(ds, w, common=0.8):
    """Iso-CTS (Marczak et al. 2025, Algorithm 'Iso-CTS'), written from the paper: common subspace = top-k of the
    merged task matrix; each task's matrix is projected off the common left subspace and contributes its top
    s = (r - k)/T singular triplets; U and V concatenations are orthogonalised (polar factor via SVD); every
    direction gets the mean of the concatenated singular values. Task matrices are w_i * Delta_i (zero-weight
    tasks dropped), so that with uniform weights everything is the paper's sum-based version divided by T."""
    tasks = [wi * d for wi, d in zip(w, ds) if wi > 0]
    T = len(tasks)
    M = sum(tasks)
    r = min(M.shape)
    k = cts_common_rank(r, T, common)
    s = (r - k) // T
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    Uc, Sc, Vc = U[:, :k], S[:k], Vh[:k].T
    task_u, task_s, task_v = [], [], []
    for t in tasks:
        resid = t - Uc @ (Uc.T @ t)
        Ut, St, Vht = torch.linalg.svd(resid, full_matrices=False)
        task_u.append(Ut[:, :s]); task_s.append(St[:s]); task_v.append(Vht[:s].T)
    # The paper's layout: task-specific blocks first, the common block last (the order does not change the result).
    Ucat = torch.cat(task_u + [Uc], dim=1)
    Vcat = torch.cat(task_v + [Vc], dim=1)
    Scat = torch.cat(task_s + [Sc])
    assert Ucat.shape[1] == r and Scat.numel() == r

    def polar(A):
        P, _, Qh = torch.linalg.svd(A, full_matrices=False)
        return P @ Qh

    return Scat.mean() * polar(Ucat) @ polar(Vcat).T


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


ISO_RANK_THRESHOLD = 1e-3


def merge_fixture(out):
    """Cases: random full-rank inputs (every method has a unique reference), 'spread' (one contribution with
    singular values over 5 decades: the iso_rank_threshold option drops some), 'lowrank' (rank-4 mean of 30x20
    matrices: iso_c is unique only on M's range, tsv and iso_cts not at all, so only the unique parts are stored).
    Metadata: cases, <case>.T, <case>.weights, <case>.methods (full references <case>.<method>),
    iso_rank_threshold (references <case>.iso_c@threshold), and for 'lowrank' <case>.rank with
    <case>.iso_c.range / .iso_c.sigma_bar / .Pu / .Pv."""
    g = torch.Generator().manual_seed(2)
    tensors, meta = {}, {}
    full = {"mean": wmean, "rda": ref_rda, "iso_c": ref_iso_c, "tsv": ref_tsv, "iso_cts": ref_iso_cts,
            "ties": ref_ties}
    cases = [("tall", (12, 7), 3, [0.5, 0.3, 0.2]), ("wide", (6, 10), 4, [1.0, 2.0, 3.0, 4.0]),
             ("square", (9, 9), 2, [1.0, 1.0]), ("big", (40, 24), 3, [1.0, 2.0, 1.0]),
             ("zero_weight", (16, 12), 3, [1.0, 0.0, 2.0]), ("spread", (20, 16), 1, [1.0]),
             ("lowrank", (30, 20), 3, [1.0, 1.0, 2.0])]
    for case, shape, T, w in cases:
        if case == "spread":
            Q1, _ = torch.linalg.qr(torch.randn(shape[0], shape[1], generator=g, dtype=torch.float64))
            Q2, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], generator=g, dtype=torch.float64))
            ds = [Q1 * torch.logspace(0, -5, shape[1], dtype=torch.float64) @ Q2.T]
        elif case == "lowrank":
            L = torch.randn(shape[0], 4, generator=g, dtype=torch.float64)
            ds = [L @ torch.randn(4, shape[1], generator=g, dtype=torch.float64) for _ in range(T)]
        else:
            ds = [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(T)]
        wn = [x / sum(w) for x in w]
        for i, d in enumerate(ds):
            tensors[f"{case}.delta{i}"] = d
        meta[f"{case}.weights"] = ",".join(repr(x) for x in w)
        meta[f"{case}.T"] = T
        methods = ["mean", "rda", "ties"] if case == "lowrank" else list(full)
        for method in methods:
            tensors[f"{case}.{method}"] = full[method](ds, wn)
        meta[f"{case}.methods"] = ",".join(methods)
        tensors[f"{case}.iso_c@threshold"] = ref_iso_c(ds, wn, ISO_RANK_THRESHOLD)
        if case == "lowrank":
            rng, sbar, Pu, Pv = ref_iso_c_range(ds, wn, 4)
            meta[f"{case}.rank"] = 4
            tensors[f"{case}.iso_c.range"] = rng
            tensors[f"{case}.iso_c.sigma_bar"] = sbar.reshape(1)
            tensors[f"{case}.Pu"], tensors[f"{case}.Pv"] = Pu, Pv
    meta["cases"] = ",".join(c[0] for c in cases)
    meta["iso_rank_threshold"] = repr(ISO_RANK_THRESHOLD)
    save(f"{out}/merge_methods.safetensors", tensors, meta)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/merge"
    outer_fixture(out)
    merge_fixture(out)
    print("wrote", out)
