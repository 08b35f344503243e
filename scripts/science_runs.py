"""Running the science suite (scripts/science.py is the driver): the binary's snapshot and the tokens it needs, one
`deloco sim` run and what its records say (merge_stats, eval_curve), where it ran (machine, build_of; the report's
provenance line), and the queue that runs every missing point of the plan (science_protocol.py), `jobs` at a time,
into the results file."""
import concurrent.futures as futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import jsonl_records  # scripts/science.py puts this folder on sys.path first
from science_protocol import ROOT, Results, inner_lr, key_of, probe_jobs, reported_jobs, tuning_jobs, tuning_points


# ---- running -----------------------------------------------------------------------------------------------------
def ensure_tokens(args, out):
    tokens = os.path.join(out, "tokens")
    if os.path.exists(os.path.join(tokens, "tokens.json")):
        return
    subprocess.run([args.deloco, "tokenize", "--input", os.path.join(ROOT, "data/sotu"), "--out", tokens, "--vocab", "4096"],
                   check=True)


def machine():
    """The machine a run ran on, as its rows record it (_machine): the CPU's model name, the instruction sets that
    decide which bf16 and fp32 kernels run (rows rerun on another CPU differ in the last digits, and a run that is
    chaotic in its seed by more), and the core count."""
    name, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            if k.strip() == "model name":
                name = v.strip()
            elif k.strip() == "flags":
                flags = set(v.split())
            if name != "unknown CPU" and flags:
                break
    except OSError:
        pass
    isa = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{name}; {' '.join(isa) or 'no AVX2'}; {os.cpu_count()} cores"


def build_of(root=ROOT):
    """The source the binary was built from, as its rows record it (_build): the checkout's commit, "+changes" when
    its tracked files differ from it (the binary is taken to be built from the checkout)."""
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "diff", "--quiet", "HEAD", "--", "src", "include", "CMakeLists.txt"]).returncode
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(res):
    """The header's bullet on where the rows in use ran: a run reproduces exactly on one CPU only (docs/sim.md,
    "Reruns on another machine"), so the report says which machines and builds its rows came from (_machine, _build;
    rows older than the record, begun 7 December, have neither)."""
    runs = {r["key"]: r for r in res.rows.values()}.values()
    machines, builds = {}, set()
    for r in runs:
        m = r.get("_machine") or "not recorded (rows older than the record, begun 7 December)"
        machines[m] = machines.get(m, 0) + 1
        if r.get("_build"):
            builds.add(r["_build"])
    parts = ", ".join(f"{n} on {m}" if not m.startswith("not recorded") else f"{n} whose machine was {m}"
                      for m, n in sorted(machines.items(), key=lambda x: -x[1]))
    return ("* Machines: a run reproduces bit for bit on one CPU only; on another the bf16 and fp32 kernels round "
            "differently and the rerun differs like a perturbation of the run (up to 0.05 nats where it sits on a loss "
            "plateau; docs/sim.md, \"Reruns on another machine\"), which the seeds' spread takes in. Runs in use: " +
            parts + (f"; builds {', '.join(sorted(builds))}" if builds else "") + ".")


def snapshot_binary(args, out):
    """Points args.deloco at a copy of it taken now, in OUT/bin: a suite runs for hours, and a rebuild of build/deloco
    meanwhile would make a run that starts while the linker writes it fail (a half-written file) and stop the suite.
    Each start (or resume) takes the build there is then."""
    d = os.path.join(out, "bin")
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".deloco.{os.getpid()}")
    try:
        shutil.copy2(args.deloco, tmp)
    except OSError as e:
        sys.exit(f"science: cannot copy {args.deloco} ({e}); build it (cmake --build build) or pass --deloco PATH")
    os.replace(tmp, os.path.join(d, "deloco"))  # a run still using an earlier copy keeps its file
    args.deloco = os.path.join(d, "deloco")
    args.build, args.machine = build_of(), machine()


def run_point(args, out, sets):
    """Runs one `deloco sim`; returns its summary (dict)."""
    k = key_of(sets)
    d = os.path.join(out, "runs", k)
    os.makedirs(d, exist_ok=True)
    shutil.rmtree(os.path.join(d, "run"), ignore_errors=True)  # what an interrupted attempt left
    summary = os.path.join(d, "summary.json")
    cmd = [args.deloco, "sim", "--config", os.path.join(ROOT, "configs/sim-diloco.toml")] + sum((["--set", s] for s in sets + [f"sim.out_dir={d}/run"]), []) + ["--summary", summary]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    t0 = time.time()
    with open(os.path.join(d, "log.txt"), "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"deloco sim failed ({r.returncode}); see {d}/log.txt; command: {' '.join(cmd)}")
    s = json.load(open(summary))
    s["_wall"] = time.time() - t0
    s["_machine"], s["_build"] = getattr(args, "machine", None) or machine(), getattr(args, "build", None) or build_of()
    s["curve"] = eval_curve(os.path.join(d, "run", "metrics.jsonl"))
    s.update(merge_stats(os.path.join(d, "run", "metrics.jsonl")))
    return s


def records(metrics, kinds):
    """The records of the given kinds in a run's metrics.jsonl (none when it is missing; unreadable lines skipped)."""
    return jsonl_records.read(metrics, kinds=kinds)


def merge_stats(metrics):
    """What the run's merge records say (issue 33 asks for them with every run): the grace window of each merge
    (mean, and the share of merges where it was open), contributions per merge, and their staleness (merges since
    their base version)."""
    merges = records(metrics, ("merge",))
    if not merges:
        return {}
    grace = [float(r.get("grace", 0.0)) for r in merges]
    per = [len(r.get("learners", [])) for r in merges]
    stale = [int(k) for r in merges for k in r.get("staleness", [])]
    return dict(grace_mean=statistics.fmean(grace), grace_open=sum(g > 0 for g in grace) / len(grace),
                per_merge=statistics.fmean(per), staleness_mean=statistics.fmean(stale) if stale else None)


def eval_curve(metrics):
    """[[virtual seconds, loss], ...] of a run's evaluations of the global model (sim.eval_interval > 0 writes them
    during the run; the final one closes it), or None when the run evaluated only at its end."""
    pts = [[round(float(r["t"]), 2), round(float(r["val_loss"]), 5)] for r in records(metrics, ("eval", "final_eval"))
           if r.get("t") is not None and r.get("val_loss") is not None]
    return sorted(pts) if len(pts) > 2 else None


FIELDS = ("final_val_loss", "val_bpb", "initial_val_loss", "uptime", "goodput", "virtual_seconds", "tokens",
          "outer_steps", "bytes_sent", "failures", "contributions_rejected", "_wall", "curve", "grace_mean",
          "grace_open", "per_merge", "staleness_mean", "bytes_up", "bytes_down", "parameters", "stale_bases",
          "_machine", "_build")


def run_cost(sets):
    """A run's cost in arbitrary units, from its sets (later sets win, as on deloco's command line): layers × width²
    × sequences in all (0 when a shape or length is not set). The queue runs the cheapest first, so that a partial
    report has whole experiments at the small sizes rather than a little of everything."""
    d = dict(x.split("=", 1) for x in sets)
    if "model.n_embd" not in d or "train.steps" not in d:
        return 0
    learners = int(d.get("sync.learners", 1))
    return (int(d["model.n_layer"]) * int(d["model.n_embd"]) ** 2 * int(d["train.steps"]) * learners *
            int(d.get("train.batch_size", 8)))


def run_suite(args, out, S, pts, meths, results_file):
    """Runs every missing point, `args.jobs` at a time, into the results file `results_file` (Results), and returns
    the results.

    One queue for the whole suite, so no core waits while another finishes a round: a method's tuning runs (its
    grid, then the extensions its results ask for) come first, and the reported runs of a point start as soon as
    its method's choice is final, as does its probe below μ's edge (probe_jobs). Each distinct setting runs once;
    rows of other experiments with the same setting are filled from it."""
    res = Results(results_file)
    running = {}  # future -> the rows waiting for it
    done = 0
    with futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        while True:
            final = {m: b for m, b in ((m, tuning_points(res, S, m)) for m in meths) if not b[1] and b[2] is not None}
            best = {m: (b[2][1], b[2][2], inner_lr(res, S, m)) for m, b in final.items()}
            jobs = tuning_jobs(res, S, [m for m in meths if m not in final])
            jobs += reported_jobs(S, [p for p in pts if p[2] is None or p[2] in best], best)
            jobs += probe_jobs(res, S, sorted(final))
            jobs.sort(key=lambda j: run_cost(j[1]))  # the cheapest first (stable): small sizes finish early
            waiting = {}
            for m, sets in jobs:
                k = key_of(sets)
                row = dict(m, key=k, sets=sets)
                if Results.row_id(row) in res.rows:
                    continue
                if k in res.by_key:  # the same setting ran for another experiment
                    res.add(dict(row, **{f: res.by_key[k].get(f) for f in FIELDS}))
                    continue
                waiting.setdefault(k, []).append(row)
            in_flight = {rows[0]["key"] for rows in running.values()}
            for k, rows in waiting.items():
                if len(running) >= args.jobs:
                    break
                if k not in in_flight:
                    running[ex.submit(run_point, args, out, rows[0]["sets"])] = rows
            if not running:
                return res
            finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            left = len(waiting) - len(finished)  # known so far; extensions and reported runs add more
            for f in finished:
                rows = running.pop(f)
                summ = f.result()
                keep = {k: summ.get(k) for k in FIELDS}
                for row in rows:
                    res.add(dict(row, **keep))
                done += 1
                m = rows[0]
                print(f"  [{done} done, {left} more known] {m['exp']} {m['variant']} "
                      f"seed {m['seed']} ({m['holdout']}"
                      + (f", η {m['lr']}, μ {m['mu']}" if m["exp"] in ("tune", "probe") else "") +
                      f"): loss {keep['final_val_loss']:.4f}, {keep['_wall']:.0f} s", flush=True)
