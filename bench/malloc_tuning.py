#!/usr/bin/python3
"""What keeping freed memory in the process buys (util/malloc_tuning.h), measured side by side in one run.

The same short `deloco sim` (the science suite's full-scale model by default: bf16 GPT 4 x 256, T = 128, batch 8,
SentencePiece 4096 tokens from runs/science/tokens; byte-level data/sotu when those are missing) runs in alternating
pairs: "defaults" with DELOCO_KEEP_MALLOC=1 (glibc's malloc as it comes) and "tuned" as deloco starts by default.
Reports the median wall, user and system seconds of each side and their ratio, and checks that both sides end at
the same validation loss to the last bit (the setting changes where memory comes from, never a number).

    /usr/bin/python3 bench/malloc_tuning.py [--rounds 3] [--steps 50] [--learners 2] [--bytes]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, keep, tmp):
    out = os.path.join(tmp, "run")
    shutil.rmtree(out, ignore_errors=True)
    summary = os.path.join(tmp, "summary.json")
    tokens = os.path.join(SRC, "runs", "science", "tokens")
    data = (["data.path=" + os.path.join(SRC, "data", "sotu"), "model.vocab_size=256"] if args.bytes else
            ["data.format=tokens", "data.path=" + tokens, "model.vocab_size=4096"])
    sets = ["model.block_size=128", "model.n_layer=4", "model.n_head=4", "model.n_embd=256", "train.batch_size=8",
            "train.lr=2e-3", "train.precision=bf16", "train.eval_tokens=16384", "train.threads=1",
            f"sync.learners={args.learners}", f"sync.quorum={args.learners}", f"sync.sync_every={min(25, args.steps)}",
            f"train.steps={args.steps}", "sim.eval_interval=0", "sim.mtbf=0", "sim.out_dir=" + out] + data
    cmd = [args.binary, "sim", "--config", os.path.join(SRC, "configs", "sim-diloco.toml"), "--summary", summary]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    if keep:
        env["DELOCO_KEEP_MALLOC"] = "1"
    else:
        env.pop("DELOCO_KEEP_MALLOC", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    loss = json.load(open(summary))["final_val_loss"]
    return dict(wall=wall, user=after.ru_utime - before.ru_utime, sys=after.ru_stime - before.ru_stime, loss=loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.environ.get("DELOCO_BINARY", os.path.join(SRC, "build", "deloco")))
    ap.add_argument("--rounds", type=int, default=3, help="pairs of runs")
    ap.add_argument("--steps", type=int, default=50, help="inner steps per learner")
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--bytes", action="store_true", help="byte-level data/sotu instead of the science tokens")
    args = ap.parse_args()
    if not args.bytes and not os.path.exists(os.path.join(SRC, "runs", "science", "tokens", "tokens.json")):
        print("malloc_tuning: runs/science/tokens is missing (scripts/science.sh makes it); using bytes")
        args.bytes = True
    sides = {"defaults": [], "tuned": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in (("defaults", "tuned") if r % 2 == 0 else ("tuned", "defaults")):
                sides[name].append(run(args, name == "defaults", tmp))
                x = sides[name][-1]
                print(f"  round {r + 1} {name:8s}: {x['wall']:.2f} s wall, {x['user']:.2f} user, {x['sys']:.2f} sys, "
                      f"loss {x['loss']:.6f}", flush=True)
    med = {n: {k: statistics.median(x[k] for x in v) for k in ("wall", "user", "sys")} for n, v in sides.items()}
    for n in sides:
        print(f"{n:8s} median: {med[n]['wall']:.2f} s wall, {med[n]['user']:.2f} user, {med[n]['sys']:.2f} sys")
    print(f"speed-up (defaults / tuned wall, medians): {med['defaults']['wall'] / med['tuned']['wall']:.2f}x")
    losses = {x["loss"] for v in sides.values() for x in v}
    if len(losses) != 1:
        print(f"malloc_tuning: the final losses differ: {sorted(losses)}", file=sys.stderr)
        return 1
    print(f"same final validation loss on every run: {losses.pop()!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
