#!/usr/bin/python3
"""Inner-step throughput: `deloco train` against the same model, batch and threads in Python PyTorch.

Runs them in turn, round after round, in one invocation, so all see the same machine state, and reports the median
tokens/s of each, their ratios, model FLOPs utilisation against the measured matrix-multiply peak of each precision,
and the peak resident memory of each process (from wait4). When deloco corrected OpenBLAS's kernel choice
(src/util/blas.h), a third row runs PyTorch with the same OPENBLAS_CORETYPE set by hand: PyTorch as users
run it, and PyTorch on the same kernels. Usage, from the repository root after scripts/setup.sh:

    /usr/bin/python3 bench/train_vs_pytorch.py [--config configs/small.toml] [--steps 60] [--rounds 3] [--threads 2]
        [--precisions fp32,bf16]

Each precision runs deloco (train.precision) with its fused kernels, deloco with train.fused = false (the ATen
operations they replace: the code before them, the "unfused" row; --no-unfused leaves it out), deloco with
train.optimizer = muon (the "deloco-muon" row, docs/muon.md: Muon against deloco's own AdamW in the same run;
--no-muon leaves it out) and PyTorch (fp32, or the forward under torch.autocast("cpu", torch.bfloat16) with the loss
in float32) on the same batches' shapes.

Must run under Debian's /usr/bin/python3 (python3-torch). Prints a Markdown table and writes JSON with --json.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_measured(cmd, env):
    """Runs cmd, returns (stdout, peak RSS in MiB) of that child alone."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"command failed ({status}): {' '.join(cmd)}\n{err.decode()[-2000:]}")
    return out.decode(), usage.ru_maxrss / 1024.0


def python_worker(args):
    """The PyTorch side: same architecture (tests/python/deloco_ref.py), AdamW, clipping, schedule."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from deloco_ref import GPT
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = tomllib.load(open(args.config, "rb"))
    m, t = cfg["model"], cfg["train"]
    model = GPT(**{k: m[k] for k in ("block_size", "n_layer", "n_head", "n_embd", "tie_embeddings")})
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=t.get("lr", 2e-3), betas=(0.9, 0.95), eps=1e-8)
    data = b"".join(open(os.path.join(args.data, f), "rb").read() for f in sorted(os.listdir(args.data))
                    if not f.startswith("."))
    stream = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    B, T = t.get("batch_size", 16), m["block_size"]
    g = torch.Generator().manual_seed(1)
    timed, elapsed = 0, 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        offs = torch.randint(0, len(stream) - T - 1, (B,), generator=g)
        batch = torch.stack([stream[o:o + T + 1] for o in offs.tolist()]).long()
        if args.precision == "bf16":  # PyTorch's recipe: forward under autocast, the loss in float32
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        else:
            loss = model.loss(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for grp in opt.param_groups:
            grp["lr"] = t.get("lr", 2e-3)
        opt.step()
        loss.item()
        if step >= 3:  # the same warm-up exclusion as deloco's tokens_per_s
            elapsed += time.perf_counter() - t0
            timed += 1
    print(json.dumps({"tokens_per_s": timed * B * T / elapsed}))


def matmul_peak(threads):
    """The best square-matmul rate of this process's libtorch, in FLOP/s, for float32 and bfloat16."""
    import torch
    torch.set_num_threads(threads)
    best = {"fp32": 0.0, "bf16": 0.0}
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for n in (512, 1024, 2048):
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            for _ in range(2):
                a @ b
            reps = max(3, int(2e10 / (2 * n ** 3)))
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            best[prec] = max(best[prec], 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def openblas_core_of(summary_blas):
    """The OPENBLAS_CORETYPE deloco set ('' if it set none), from its summary's "blas" field."""
    if "set by deloco" not in summary_blas:
        return ""
    return summary_blas.split()[1]


def flops_per_token(m):
    C, L, V, T = m["n_embd"], m["n_layer"], m.get("vocab_size", 256), m["block_size"]
    return 6.0 * (12 * L * C * C + V * C) + 12.0 * L * C * T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "small.toml"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "sotu"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "deloco"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (train.precision / autocast)")
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)  # the worker's
    ap.add_argument("--no-unfused", action="store_true", help="leave out the deloco train.fused=false rows")
    ap.add_argument("--no-muon", action="store_true", help="leave out the deloco train.optimizer=muon rows")
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peak-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return python_worker(args)
    if args.peak_worker:
        print(json.dumps(matmul_peak(args.threads)))
        return

    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(args.threads))
    cfg = tomllib.load(open(args.config, "rb"))
    precisions = [p for p in args.precisions.split(",") if p]
    # deloco corrects OpenBLAS's kernel choice on CPUs newer than the library (src/util/blas.h); PyTorch
    # does not. "pytorch+core" is PyTorch given the same OPENBLAS_CORETYPE by hand: the kernel-for-kernel peer.
    impls = ("deloco", "pytorch", "pytorch+core") if args.no_unfused else ("deloco", "deloco-unfused", "pytorch", "pytorch+core")
    if not args.no_muon:
        impls = impls[:1] + ("deloco-muon",) + impls[1:]
    variants = [(impl, prec) for prec in precisions for impl in impls]
    res = {f"{impl} {prec}": [] for impl, prec in variants}
    core = None  # learned from deloco's first summary
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # every variant once per round, in turn: all see the same machine state
            line = []
            for impl, prec in variants:
                key = f"{impl} {prec}"
                if impl.startswith("deloco"):
                    out_dir = os.path.join(tmp, f"run{r}-{prec}-{impl}")
                    summary = os.path.join(tmp, f"s{r}-{prec}-{impl}.json")
                    _, rss = run_measured([args.binary, "train", "--config", args.config, "--set", f"data.path={args.data}",
                                           "--set", f"train.steps={args.steps}", "--set", "train.eval_every=0",
                                           "--set", "train.eval_tokens=4096", "--set", f"train.threads={args.threads}",
                                           "--set", f"train.out_dir={out_dir}", "--set", "train.log_every=1000",
                                           "--set", f"train.precision={prec}",
                                           "--set", f"train.fused={'false' if impl == 'deloco-unfused' else 'true'}",
                                           "--set", f"train.optimizer={'muon' if impl == 'deloco-muon' else 'adamw'}",
                                           "--summary", summary], env)
                    s = json.load(open(summary))
                    if core is None:
                        core = openblas_core_of(s.get("blas", ""))
                    res[key].append((s["tokens_per_s"], rss))
                else:
                    if impl == "pytorch+core" and not core:
                        continue  # deloco changed nothing: the plain PyTorch row is the peer
                    penv = dict(env, OPENBLAS_CORETYPE=core) if impl == "pytorch+core" else env
                    out, rss = run_measured([sys.executable, __file__, "--worker", "--config", args.config, "--data",
                                             args.data, "--steps", str(args.steps), "--threads", str(args.threads),
                                             "--precision", prec], penv)
                    res[key].append((json.loads(out.strip().splitlines()[-1])["tokens_per_s"], rss))
                line.append(f"{key} {res[key][-1][0]:.0f}")
            print(f"round {r + 1}: " + ", ".join(line) + " tok/s", file=sys.stderr)
    res = {k: v for k, v in res.items() if v}
    # The peaks, in the kernels deloco trains with (its OPENBLAS_CORETYPE, if it set one).
    penv = dict(env, OPENBLAS_CORETYPE=core) if core else env
    out, _ = run_measured([sys.executable, __file__, "--peak-worker", "--threads", str(args.threads)], penv)
    peaks = json.loads(out.strip().splitlines()[-1])
    fpt = flops_per_token(cfg["model"])
    rows = {}
    for k, v in res.items():
        tps = statistics.median(x[0] for x in v)
        prec = k.split()[-1]
        rows[k] = {"tokens_per_s": tps, "peak_rss_mib": statistics.median(x[1] for x in v),
                   "mfu": fpt * tps / peaks[prec], "all_tokens_per_s": [x[0] for x in v]}
    print(f"\nconfig {os.path.relpath(args.config, ROOT)}, {args.steps} steps x {args.rounds} rounds, {args.threads} threads, "
          f"OpenBLAS core set by deloco: {core or 'none'}; matmul peaks {peaks['fp32'] / 1e9:.1f} GFLOP/s fp32, "
          f"{peaks['bf16'] / 1e9:.1f} bf16 (MFU is against the peak of the row's precision), {fpt / 1e6:.1f} MFLOP/token\n")
    print("| implementation | tokens/s (median) | MFU | peak RSS (MiB) |")
    print("|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {r['peak_rss_mib']:.0f} |")
    ratios = {}
    for a, b in (("deloco fp32", "deloco-unfused fp32"), ("deloco bf16", "deloco-unfused bf16"),
                 ("deloco-unfused bf16", "deloco-unfused fp32"), ("deloco fp32", "pytorch fp32"), ("deloco fp32", "pytorch+core fp32"), ("deloco bf16", "pytorch bf16"),
                 ("deloco bf16", "pytorch+core bf16"), ("deloco bf16", "pytorch fp32"), ("deloco bf16", "pytorch+core fp32"),
                 ("deloco bf16", "deloco fp32"), ("deloco-muon fp32", "deloco fp32"), ("deloco-muon bf16", "deloco bf16")):
        if a in rows and b in rows:
            ratios[f"{a} / {b}"] = rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratios": ratios, "matmul_peak_flops": peaks, "openblas_core_set_by_deloco": core,
                       "flops_per_token": fpt}, f, indent=2)

if __name__ == "__main__":
    main()
