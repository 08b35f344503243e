#!/usr/bin/env python3
"""SparseLoCo's decayed error feedback at the quick scale (docs/wire.md, "SparseLoCo's decayed error feedback").

Top-k 3% both ways under outer SGD with net.error_feedback_decay β = 1, 0.8, 0.5 and without error feedback, against
fp32 under outer SGD and under Nesterov: the tiny model in fp32, M = 4, H = 20, `rounds` outer rounds per learner.
Each row's η is tuned on the dev half with seed 0 (the science suite's protocol), then reported on the test half over
seeds 1-3 with the paired difference against fp32 SGD and its 95% interval (Student's t). Prints a Markdown table.
Runs are kept under --out and reused when present (delete it after changing the binary).

    /usr/bin/python3 bench/ef_decay.py 10 [--out runs/ef-decay] [--deloco build/deloco] [--jobs 2]
"""
import argparse, concurrent.futures as cf, json, math, os, shutil, statistics, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ("model.block_size=32 model.n_layer=2 model.n_head=2 model.n_embd=48 train.batch_size=8 train.lr=3e-3 "
        "train.eval_tokens=4096 train.threads=1 data.val_fraction=0.05 train.precision=fp32 merge.preset=diloco "
        "sync.learners=4 sync.quorum=4 sync.fragments=1 sync.sync_every=20 sync.overlap=0 sync.wait_for_answer=true "
        "sync.grace=false sim.eval_interval=0 sim.mtbf=0 sim.jitter=0.1").split()
TOPK = ("net.encoding=topk net.topk_bits=2 net.topk_density=0.03 net.broadcast_encoding=topk outer.kind=sgd "
        "outer.momentum=0.0").split()
ROWS = {  # name: (keys, η grid)
    "fp32, Nesterov": (["outer.kind=nesterov", "outer.momentum=0.9"], [0.15, 0.25, 0.42, 0.7, 1.05]),
    "fp32, outer SGD": (["outer.kind=sgd", "outer.momentum=0.0"], [0.36, 0.6, 1.0, 1.5]),
    "top-k 3%, β = 1": (TOPK + ["net.error_feedback=true"], [1.0, 1.5, 1.8, 2.25]),
    "top-k 3%, β = 0.8": (TOPK + ["net.error_feedback=true", "net.error_feedback_decay=0.8"], [1.0, 1.5, 1.8, 2.25]),
    "top-k 3%, β = 0.5": (TOPK + ["net.error_feedback=true", "net.error_feedback_decay=0.5"], [1.0, 1.5, 1.8, 2.25]),
    "top-k 3%, no error feedback": (TOPK + ["net.error_feedback=false"], [1.0, 1.5, 1.8, 2.25]),
}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def run(a, tag, sets):
    d = os.path.join(a.out, tag)
    summary = os.path.join(d, "summary.json")
    if not os.path.exists(summary):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        kv = dict(s.split("=", 1) for s in sets)
        kv["sim.out_dir"] = os.path.join(d, "run")
        cmd = [a.deloco, "sim", "--config", os.path.join(ROOT, "configs/sim-diloco.toml")]
        for k, v in kv.items():
            cmd += ["--set", f"{k}={v}"]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        r = subprocess.run(cmd + ["--summary", summary], capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(f"{tag}: deloco sim exited {r.returncode}:\n{r.stderr[-2000:]}")
    loss = json.load(open(summary))["final_val_loss"]
    return loss if math.isfinite(loss) else float("inf")


def interval(x):
    return T95[len(x) - 1] * statistics.stdev(x) / math.sqrt(len(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", type=int)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "ef-decay"))
    ap.add_argument("--deloco", default=os.path.join(ROOT, "build", "deloco"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    steps = a.rounds * 20
    common = BASE + [f"data.path={os.path.join(ROOT, 'data/sotu')}", f"train.steps={steps}",
                     f"train.warmup_steps={steps // 10}"]
    slug = lambda s: "".join(c if c.isalnum() else "_" for c in s)
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        dev = {(v, lr): ex.submit(run, a, f"r{a.rounds}-{slug(v)}-lr{lr}-dev",
                                  common + keys + [f"outer.lr={lr}", "data.holdout=dev", "train.seed=0", "sim.seed=0"])
               for v, (keys, lrs) in ROWS.items() for lr in lrs}
        best = {}
        for v, (keys, lrs) in ROWS.items():
            losses = {lr: dev[(v, lr)].result() for lr in lrs}
            best[v] = min(lrs, key=lambda lr: losses[lr])
            edge = " (grid edge)" if best[v] in (lrs[0], lrs[-1]) else ""
            print(f"tune {v}: " + ", ".join(f"η {lr}: {x:.4f}" for lr, x in losses.items()) + f" -> {best[v]}{edge}")
        test = {v: [ex.submit(run, a, f"r{a.rounds}-{slug(v)}-lr{best[v]}-test-{s}",
                              common + keys + [f"outer.lr={best[v]}", "data.holdout=test", f"train.seed={s}",
                                               f"sim.seed={s}"]) for s in (1, 2, 3)]
                for v, (keys, _) in ROWS.items()}
        test = {v: [f.result() for f in fs] for v, fs in test.items()}
    ref = test["fp32, outer SGD"]
    print(f"\n| {a.rounds} outer rounds | η | test loss | − fp32 SGD (paired) |\n|---|---:|---:|---:|")
    for v, losses in test.items():
        d = [x - y for x, y in zip(losses, ref)]
        print(f"| {v} | {best[v]} | {statistics.fmean(losses):.3f} ± {interval(losses):.3f} | "
              f"{statistics.fmean(d):+.3f} ± {interval(d):.3f} |")


if __name__ == "__main__":
    main()
