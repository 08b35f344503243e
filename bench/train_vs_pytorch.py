#!/usr/bin/python3
"""Inner-step throughput: `deloco train` against the same model, batch and threads in Python PyTorch.

Runs the two alternately (ABAB...) in one invocation, so both see the same machine state, and reports the median
tokens/s of each, their ratio, model FLOPs utilisation against a measured matrix-multiply peak, and the peak
resident memory of each process (from wait4). Usage, from the repository root after scripts/setup.sh:

    /usr/bin/python3 bench/train_vs_pytorch.py [--config configs/small.toml] [--steps 60] [--rounds 3] [--threads 2]

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
    import torch
    torch.set_num_threads(threads)
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(2):
            a @ b
        reps = max(3, int(2e10 / (2 * n ** 3)))
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


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
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return python_worker(args)

    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(args.threads))
    cfg = tomllib.load(open(args.config, "rb"))
    res = {"deloco": [], "pytorch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            out_dir = os.path.join(tmp, f"run{r}")
            summary = os.path.join(tmp, f"s{r}.json")
            _, rss = run_measured([args.binary, "train", "--config", args.config, "--set", f"data.path={args.data}",
                                   "--set", f"train.steps={args.steps}", "--set", "train.eval_every=0",
                                   "--set", "train.eval_tokens=4096", "--set", f"train.threads={args.threads}",
                                   "--set", f"train.out_dir={out_dir}", "--set", "train.log_every=1000",
                                   "--summary", summary], env)
            res["deloco"].append((json.load(open(summary))["tokens_per_s"], rss))
            out, rss = run_measured([sys.executable, __file__, "--worker", "--config", args.config, "--data", args.data,
                                     "--steps", str(args.steps), "--threads", str(args.threads)], env)
            res["pytorch"].append((json.loads(out.strip().splitlines()[-1])["tokens_per_s"], rss))
            print(f"round {r + 1}: deloco {res['deloco'][-1][0]:.0f} tok/s, pytorch {res['pytorch'][-1][0]:.0f} tok/s",
                  file=sys.stderr)
    peak = matmul_peak(args.threads)
    fpt = flops_per_token(cfg["model"])
    rows = {}
    for k, v in res.items():
        tps = statistics.median(x[0] for x in v)
        rows[k] = {"tokens_per_s": tps, "peak_rss_mib": statistics.median(x[1] for x in v),
                   "mfu": fpt * tps / peak, "all_tokens_per_s": [x[0] for x in v]}
    ratio = rows["deloco"]["tokens_per_s"] / rows["pytorch"]["tokens_per_s"]
    print(f"\nconfig {os.path.relpath(args.config, ROOT)}, {args.steps} steps x {args.rounds} rounds, {args.threads} threads, "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s, {fpt / 1e6:.1f} MFLOP/token\n")
    print("| implementation | tokens/s (median) | MFU | peak RSS (MiB) |")
    print("|---|---|---|---|")
    for k in ("deloco", "pytorch"):
        r = rows[k]
        print(f"| {k} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {r['peak_rss_mib']:.0f} |")
    print(f"\ndeloco / pytorch throughput ratio: {ratio:.3f}; memory ratio: "
          f"{rows['deloco']['peak_rss_mib'] / rows['pytorch']['peak_rss_mib']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratio": ratio, "matmul_peak_flops": peak, "flops_per_token": fpt}, f, indent=2)


if __name__ == "__main__":
    main()
