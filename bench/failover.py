#!/usr/bin/python3
"""Failover of a standby syncer pair under repeated SIGKILLs of the leader (issue 34, docs/reliability.md).

    /usr/bin/python3 bench/failover.py [--kills 22] [--interval 6] [--shards 1] [--out DIR] [--binary build/deloco]
                                       [--check RUN]

Runs `deloco run` (configs/tiny.toml, 2 learners, Decoupled DiLoCo: K = 2, P = 2, no waiting) with
syncer.standby = true and chaos.syncer_kill_at every --interval seconds from 8 s on: each kill hits the syncer that
leads (deloco run keeps track), its standby takes over after syncer.lease (1 s), and the killed one restarts as the
new standby (`--follow` / `--standby`). After the last kill plus 15 s the run is stopped (SIGINT). Then, from the
records of the run folder:
  * per kill: the takeover (its silence before it), the first merge of the new leader, the learners' moves;
    median and max of kill → takeover and kill → first merge;
  * the checks of every takeover: rounds replayed and compared with the leader's, mismatches (must be 0);
  * merge versions over every term: each merge of a fragment has the next version (none lost or applied twice).
--check RUN only analyses an existing run folder. Exits non-zero when a check fails or a kill had no takeover.
"""
import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(ROOT, "scripts"))
from jsonl_records import read as records  # noqa: E402


def syncer_files(run):
    files = glob.glob(os.path.join(run, "syncer.jsonl")) + glob.glob(os.path.join(run, "standby", "syncer.jsonl"))
    files += glob.glob(os.path.join(run, "shard-*", "syncer.jsonl")) + glob.glob(os.path.join(run, "shard-*", "standby", "syncer.jsonl"))
    return sorted(files)


def shard_of(path, run):
    rel = os.path.relpath(path, run)
    return int(rel.split(os.sep)[0][6:]) if rel.startswith("shard-") else 0


def analyse(run):
    kills = [r for r in records(os.path.join(run, "events.jsonl"))
             if r.get("kind") == "chaos" and "SIGKILL" in r.get("what", "") and "syncer" in r.get("what", "")]
    by_shard = {}
    for path in syncer_files(run):
        s = shard_of(path, run)
        for r in records(path):
            r["_file"] = os.path.relpath(path, run)
            by_shard.setdefault(s, []).append(r)
    ok = True
    takeover_s, first_merge_s = [], []
    print(f"{'kill':>4} {'at (s)':>8} {'shard':>5} {'takeover after':>15} {'first merge after':>18} {'checked':>8} {'mismatch':>8}")
    t0 = min((r["t"] for rs in by_shard.values() for r in rs if "t" in r), default=0)
    for i, k in enumerate(kills):
        what = k["what"]
        shard = int(what.split("syncer shard ")[1].split()[0]) if "syncer shard " in what else 0
        nxt = kills[i + 1]["t"] if i + 1 < len(kills) else float("inf")
        rs = by_shard.get(shard, [])
        take = next((r for r in sorted(rs, key=lambda r: r["t"]) if r.get("kind") == "takeover" and k["t"] < r["t"] < nxt), None)
        fm = next((r for r in sorted(rs, key=lambda r: r["t"]) if r.get("kind") == "failover_merge" and k["t"] < r["t"] < nxt), None)
        if take is None:
            ok = False
            print(f"{i + 1:>4} {k['t'] - t0:8.1f} {shard:>5} {'NONE':>15}")
            continue
        takeover_s.append(take["t"] - k["t"])
        if fm is not None:
            first_merge_s.append(fm["t"] - k["t"])
        if take.get("mismatches", 0) != 0:
            ok = False
        print(f"{i + 1:>4} {k['t'] - t0:8.1f} {shard:>5} {take['t'] - k['t']:14.3f}s "
              f"{(fm['t'] - k['t']) if fm else float('nan'):17.3f}s {take.get('rounds_checked', 0):>8} {take.get('mismatches', 0):>8}")
    # Merge versions across terms: only the leader writes merge records.
    for s, rs in sorted(by_shard.items()):
        version = {}
        bad = 0
        n = 0
        # A leader killed between a merge's checkpoint and its replication leaves a merge record that no learner
        # saw (broadcasts wait for the standby's acknowledgement): the takeover's merge count says which are void.
        kept = []
        for r in sorted((r for r in rs if r.get("kind") in ("merge", "takeover")), key=lambda r: r["t"]):
            if r["kind"] == "takeover":
                void = [m for m in kept if m.get("merges", 0) > r["merges"]]
                if void:
                    print(f"shard {s}: {len(void)} merge(s) of the killed leader never replicated nor sent (void), "
                          f"before the takeover at {r['merges']} merges")
                kept = [m for m in kept if m.get("merges", 0) <= r["merges"]]
            else:
                kept.append(r)
        for r in kept:
            f, v = r["fragment"], r["version"]
            if v != version.get(f, 0) + 1:
                bad += 1
                if bad <= 5:
                    print(f"shard {s}: fragment {f} version {v} after {version.get(f, 0)} ({r['_file']})")
            version[f] = v
            n += 1
        print(f"shard {s}: {n} merges over every term, {bad} out of sequence")
        ok = ok and bad == 0
    steps = {}
    for path in glob.glob(os.path.join(run, "learner-*.jsonl")):
        rs = records(path)
        steps[os.path.basename(path)] = sum(1 for r in rs if r.get("kind") == "syncer_failover")
    print("learner moves:", steps)
    if takeover_s:
        print(f"kills {len(kills)}, takeovers {len(takeover_s)}; kill → takeover: median {statistics.median(takeover_s):.3f} s, "
              f"max {max(takeover_s):.3f} s")
    if first_merge_s:
        print(f"kill → first merge of the new leader ({len(first_merge_s)}): median {statistics.median(first_merge_s):.3f} s, "
              f"max {max(first_merge_s):.3f} s, under 2 s: {sum(1 for x in first_merge_s if x < 2)}/{len(first_merge_s)}")
    if not kills:
        print("no syncer kill in events.jsonl")
        ok = False
    if len(first_merge_s) < len(kills):
        ok = False
    print("RESULT:", "PASS" if ok else "FAIL")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=22)
    ap.add_argument("--interval", type=float, default=6.0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "deloco"))
    ap.add_argument("--check", default="")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if analyse(a.check) else 1)
    out = a.out or os.path.join(ROOT, "runs", "failover-" + time.strftime("%Y%m%d-%H%M%S"))
    kill_at = [8 + a.interval * i for i in range(a.kills)]
    end = kill_at[-1] + 15
    sets = ["sync.learners=2", "sync.quorum=2", f"sync.fragments={max(2, a.shards)}", "sync.sync_every=10",
            "sync.wait_for_answer=false", "train.steps=1000000", "train.log_every=200", "syncer.eval_interval=0",
            "syncer.standby=true", "syncer.lease=1", f"syncer.shards={a.shards}", "chaos.enabled=true",
            "chaos.restart_delay=1", "chaos.syncer_kill_at=" + ",".join(f"{x:g}" for x in kill_at),
            "data.path=" + os.path.join(ROOT, "data", "sotu")]
    sets.append("syncer.out_dir=" + out)
    cmd = [a.binary, "run", "--config", os.path.join(ROOT, "configs", "tiny.toml")]
    for s in sets:
        cmd += ["--set", s]
    print("failover:", " ".join(cmd), flush=True)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    with open(out + ".log", "w") if os.path.isdir(os.path.dirname(out) or ".") else open(os.devnull, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        start = time.time()
        while p.poll() is None and time.time() - start < end:
            time.sleep(0.5)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
    sys.exit(0 if analyse(out) else 1)


if __name__ == "__main__":
    main()
