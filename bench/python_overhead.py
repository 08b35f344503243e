#!/usr/bin/python3
"""The Python learner's overhead per step (issue 17; goal ≤ 2%), measured side by side in one process.

One ordinary PyTorch loop (the Llama of examples/llama at the example's size, AdamW, bf16 autocast unless --fp32)
trains in alternating blocks of --block steps: "plain" blocks are the loop alone, "deloco" blocks add
learner.step() after each optimizer step, joined to a real `deloco syncer` process (plaintext ipc, one learner, the
algorithm of examples/llama/llama.toml: 4 fragments, H = 40, τ = 5, no waiting; a push every 10 steps, merges coming
back and applied in place). The syncer is pinned to the last core, as if it were on its own host.
Alternating blocks share the machine's state, so noise hits both sides alike. Reports the median and mean step time
of each side, their ratio, and the time spent inside learner.step() itself.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--blocks 12] [--block 20]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import torch.nn.functional as F

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "examples", "llama"))
from make_model import Llama  # noqa: E402

import deloco  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.environ.get("DELOCO_BINARY", os.path.join(SRC, "build", "deloco")))
    ap.add_argument("--blocks", type=int, default=12, help="blocks of each kind")
    ap.add_argument("--block", type=int, default=20, help="steps per block")
    ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--aa", action="store_true",
                    help="A/A control: the 'deloco' blocks skip learner.step() too, so the difference is noise")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory(prefix="deloco_pybench_")
    d = tmp.name
    torch.manual_seed(1337)
    model = Llama(256, 64, 4, 128, 4)  # examples/llama/make_model.py's defaults: 857,216 parameters
    path = os.path.join(d, "model.pt")
    torch.jit.script(model).save(path)
    # examples/llama/llama.toml's algorithm (quorum 1 with grace, 4 fragments, H = 40, τ = 5, no waiting, Nesterov),
    # one learner, plaintext ipc, no evaluations or checkpoints on the syncer.
    config = os.path.join(SRC, "examples", "llama", "llama.toml")
    sets = ["model.path=" + path, "data.path=" + os.path.join(SRC, "data", "sotu"), "train.steps=100000",
            "sync.learners=1", "net.plaintext=true", "net.address=ipc://" + os.path.join(d, "syncer.sock"),
            "syncer.eval_interval=0", "syncer.checkpoint_every=0", "syncer.metrics="]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    log = open(os.path.join(d, "syncer.log"), "w")
    # The syncer stands in for a remote host: pinned to the last core, the learner (this process, its main and comms
    # threads) to the others, so the syncer's merges do not take the learner's CPU as they would not in a cluster.
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        os.sched_setaffinity(0, cores[:-1])
    pin = ["taskset", "-c", str(cores[-1])] if len(cores) >= 2 and shutil.which("taskset") else []
    syncer = subprocess.Popen(pin + [a.binary, "syncer", "--config", config, "--out", os.path.join(d, "run")] +
                              [x for kv in sets for x in ("--set", kv)], stdout=log,
                              stderr=subprocess.STDOUT, env=env)
    try:
        learner = deloco.Learner(model, config=config, set=sets, learner_id=0, out=os.path.join(d, "run"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 256, (200000,))
        gen = torch.Generator().manual_seed(1)
        times = {"plain": [], "deloco": []}
        inside = []

        def one_step(with_deloco):
            t0 = time.perf_counter()
            s = torch.randint(0, data.numel() - 65, (16,), generator=gen).tolist()
            x = torch.stack([data[i:i + 64] for i in s])
            y = torch.stack([data[i + 1:i + 65] for i in s])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not a.fp32):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if with_deloco:
                t1 = time.perf_counter()
                learner.step(tokens=16 * 64, loss=loss.item())
                inside.append(time.perf_counter() - t1)
            return time.perf_counter() - t0

        for _ in range(5):  # warm-up, not counted
            one_step(False)
        for b in range(2 * a.blocks):
            kind = "deloco" if b % 2 else "plain"
            for _ in range(a.block):
                times[kind].append(one_step(kind == "deloco" and not a.aa))
        summary = learner.close()
    finally:
        syncer.terminate()
        syncer.wait(timeout=60)
        log.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    out = {
        "steps_per_side": len(times["plain"]),
        "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "mean_step_ms": {k: round(v * 1e3, 3) for k, v in mean.items()},
        "median_overhead": med["deloco"] / med["plain"] - 1,
        "mean_overhead": mean["deloco"] / mean["plain"] - 1,
        "aa_control": a.aa,
        "inside_step_median_ms": statistics.median(inside or [0]) * 1e3,
        "inside_step_p90_ms": sorted(inside or [0])[int(0.9 * len(inside or [0]))] * 1e3,
        "deloco_step_without_call_median_ms": statistics.median(
            [t - c for t, c in zip(times["deloco"], inside or [0] * len(times["deloco"]))]) * 1e3,
        "inside_step_mean_ms": statistics.fmean(inside or [0]) * 1e3,
        "inside_step_max_ms": max(inside or [0]) * 1e3,
        "inside_share_of_mean_step": statistics.fmean(inside or [0]) / mean["plain"],
        "pushes": summary["pushes"],
        "merged_fragments_received": summary["broadcasts"],
        "precision": "fp32" if a.fp32 else "bf16 autocast",
    }
    print(f"python learner overhead{' (A/A CONTROL: no learner.step() on either side)' if a.aa else ''}, "
          f"{out['steps_per_side']} steps per side, {out['precision']}, 857,216 parameters:")
    print(f"  step time, median: plain {out['median_step_ms']['plain']:.2f} ms, with deloco "
          f"{out['median_step_ms']['deloco']:.2f} ms: {100 * out['median_overhead']:+.2f}%")
    print(f"  step time, mean:   plain {out['mean_step_ms']['plain']:.2f} ms, with deloco "
          f"{out['mean_step_ms']['deloco']:.2f} ms: {100 * out['mean_overhead']:+.2f}%")
    print(f"  inside learner.step(): mean {out['inside_step_mean_ms']:.3f} ms, max {out['inside_step_max_ms']:.2f} ms "
          f"({100 * out['inside_share_of_mean_step']:.2f}% of a plain step); {out['pushes']} pushes, "
          f"{out['merged_fragments_received']} merged fragments received")
    print(f"  inside learner.step(): median {out['inside_step_median_ms']:.3f} ms, p90 {out['inside_step_p90_ms']:.3f} ms; "
          f"a deloco step without its learner.step() call: median {out['deloco_step_without_call_median_ms']:.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
