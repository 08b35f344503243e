#!/usr/bin/env python3
"""Checks the invariants of a chaos-soaked `deloco run` folder (see bench/chaos_soak.sh). Standard library only.

Reads the records the run wrote: syncer.jsonl (started, merge, checkpoint, eval, retired) and learner-N.jsonl
(apply, syncer_behind). Prints one line per invariant and exits 1 when any fails."""
import argparse, glob, json, os, re, sys


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a SIGKILL mid-write: only ever the last line of an incarnation
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--syncer-kills", type=int, default=0)
    ap.add_argument("--stops", type=int, default=0)
    ap.add_argument("--pairs", action="store_true", help="a sharded syncer of standby pairs (chaos_soak.sh --pairs)")
    a = ap.parse_args()
    d = a.run_dir
    if a.pairs:
        sys.exit(check_pairs(a))
    syncer = records(os.path.join(d, "syncer.jsonl"))
    learners = {os.path.basename(p): records(p) for p in sorted(glob.glob(os.path.join(d, "learner-*.jsonl")))}
    results = []

    def check(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

    # 1. The run finished: deloco run exited 0 and the syncer retired every learner as done.
    retired = {r.get("learner") for r in syncer if r.get("kind") == "retired"}
    check("run finishes", a.exit_code == 0 and len(retired) == len(learners) and len(learners) > 0,
          f"exit {a.exit_code}, {len(retired)}/{len(learners)} learners retired")

    # 2. No merge a learner has seen is missing after a resume.
    applies = sorted((r["t"], r["fragment"], r["version"]) for recs in learners.values() for r in recs
                     if r.get("kind") == "apply")
    behind = [r for recs in learners.values() for r in recs if r.get("kind") == "syncer_behind"]
    starts = [r for r in syncer if r.get("kind") == "started"]
    resumes = [r for r in starts if r.get("resumed")]
    lost = []
    for s in resumes:
        versions = s.get("versions")
        if versions is None:
            lost.append(("no versions in the started record", s.get("t")))
            continue
        seen = {}
        for t, p, v in applies:
            if t < s["t"]:
                seen[p] = max(seen.get(p, -1), v)
        for p, v in seen.items():
            if p >= len(versions) or versions[p] < v:
                lost.append((f"fragment {p}: learners had version {v}, resumed syncer {versions[p] if p < len(versions) else '?'}", s["t"]))
    check("no merge a learner saw is lost", not lost and not behind,
          f"{len(resumes)} resumes checked against {len(applies)} applied fragments; "
          f"{len(lost)} lost, {len(behind)} 'syncer behind' reports" + (f"; first: {lost[0][0]}" if lost else ""))

    # 3. The merge count and the checkpointed model never go back.
    back = []
    last_ckpt = -1
    for r in syncer:
        if r.get("kind") == "checkpoint":
            if r["merges"] < last_ckpt:
                back.append(f"checkpoint at {r['merges']} merges after one at {last_ckpt}")
            last_ckpt = max(last_ckpt, r["merges"])
        elif r.get("kind") == "started" and r.get("resumed"):
            if r["merges"] < last_ckpt:
                back.append(f"resumed at {r['merges']} merges after a checkpoint at {last_ckpt}")
    latest_ok = True
    latest = os.path.join(d, "latest")
    if os.path.exists(latest):
        name = open(latest).read().strip()
        m = re.match(r"merges_(\d+)", name)
        latest_ok = bool(m) and int(m.group(1)) == last_ckpt and os.path.isdir(os.path.join(d, "checkpoints", name))
        if not latest_ok:
            back.append(f"'latest' names {name}, newest checkpoint record is at {last_ckpt} merges")
    check("merge count and checkpoints never go back", not back,
          f"{sum(1 for r in syncer if r.get('kind') == 'checkpoint')} checkpoints, newest at {last_ckpt} merges"
          + (f"; {back[0]}" if back else ""))

    # 4. No temporary files are left.
    tmp = [os.path.join(root, n) for root, dirs, files in os.walk(d) for n in dirs + files if ".tmp" in n]
    check("no temporary files left", not tmp, f"{len(tmp)} found" + (f": {tmp[:3]}" if tmp else ""))

    # 5. Validation loss still falls.
    evals = [r for r in syncer if r.get("kind") in ("eval", "final_eval") and r.get("val_loss") is not None]
    ok = len(evals) >= 2 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    check("validation loss falls", ok,
          f"{evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f} over {len(evals)} evaluations" if evals else "no evaluations")

    merges = sum(1 for r in syncer if r.get("kind") == "merge")
    print(f"soak: {a.kills} SIGKILLs ({a.syncer_kills} of the syncer), {a.stops} SIGSTOPs, {len(starts)} syncer starts, "
          f"{merges} merges, {len(applies)} fragments applied by learners")
    sys.exit(0 if all(results) else 1)


def check_pairs(a):
    """The invariants of a run whose syncer is S shards, each a standby pair (issue 34)."""
    d = a.run_dir
    shards = {}
    for path in sorted(glob.glob(os.path.join(d, "shard-*", "syncer.jsonl")) +
                       glob.glob(os.path.join(d, "shard-*", "standby", "syncer.jsonl"))):
        k = int(os.path.relpath(path, d).split(os.sep)[0][6:])
        shards.setdefault(k, []).extend(records(path))
    learners = {os.path.basename(p): records(p) for p in sorted(glob.glob(os.path.join(d, "learner-*.jsonl")))}
    results = []

    def check(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

    retired = {k: {r.get("learner") for r in rs if r.get("kind") == "retired"} for k, rs in shards.items()}
    done = all(len(v) == len(learners) for v in retired.values()) and len(shards) > 0 and len(learners) > 0
    check("run finishes", a.exit_code == 0 and done,
          f"exit {a.exit_code}, learners retired per shard: {[len(v) for k, v in sorted(retired.items())]}")

    # Every fragment's merges in sequence over every term of its shard; a killed leader's merge that was checkpointed
    # but never replicated (never sent: broadcasts wait for the standby) is void, by the takeover's merge count.
    bad, total, void, takeovers, mismatches = [], 0, 0, 0, 0
    for k, rs in sorted(shards.items()):
        kept, version = [], {}
        for r in sorted((r for r in rs if r.get("kind") in ("merge", "takeover")), key=lambda r: r["t"]):
            if r["kind"] == "takeover":
                takeovers += 1
                mismatches += r.get("mismatches", 0)
                void += sum(1 for m in kept if m.get("merges", 0) > r["merges"])
                kept = [m for m in kept if m.get("merges", 0) <= r["merges"]]
            else:
                kept.append(r)
        for m in kept:
            f, v = m["fragment"], m["version"]
            if v != version.get(f, 0) + 1:
                bad.append(f"shard {k} fragment {f}: version {v} after {version.get(f, 0)}")
            version[f] = v
        total += len(kept)
        mismatches += sum(1 for r in rs if r.get("kind") == "standby" and r.get("event") == "mismatch")
    check("merges in sequence over every term", not bad,
          f"{total} merges, {takeovers} takeovers, {void} void merges of killed leaders" + (f"; first: {bad[0]}" if bad else ""))
    check("standbys replayed every merge exactly", mismatches == 0, f"{mismatches} mismatches")

    twice, behind, applies = [], 0, 0
    for name, rs in learners.items():
        seen = set()
        for r in rs:
            if r.get("kind") == "apply":
                applies += 1
                key = (r["fragment"], r["version"])
                if key in seen:
                    twice.append(f"{name}: fragment {key[0]} version {key[1]}")
                seen.add(key)
            behind += r.get("kind") == "syncer_behind"
    check("no version applied twice, no syncer behind", not twice and behind == 0,
          f"{applies} applies, {len(twice)} twice, {behind} 'syncer behind'" + (f"; first: {twice[0]}" if twice else ""))

    tmp = [os.path.join(root, n) for root, dirs, files in os.walk(d) for n in dirs + files if ".tmp" in n]
    check("no temporary files left", not tmp, f"{len(tmp)} found" + (f": {tmp[:3]}" if tmp else ""))

    evals = sorted((r for r in shards.get(0, []) if r.get("kind") in ("eval", "final_eval") and r.get("val_loss") is not None),
                   key=lambda r: r["t"])
    ok = len(evals) >= 2 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    check("validation loss falls", ok,
          f"{evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f} over {len(evals)} evaluations" if evals else "no evaluations")
    moves = sum(1 for rs in learners.values() for r in rs if r.get("kind") == "syncer_failover")
    print(f"soak: {a.kills} SIGKILLs ({a.syncer_kills} of syncers), {a.stops} SIGSTOPs, {takeovers} takeovers, "
          f"{moves} learner link moves, {total} merges, {applies} fragments applied by learners")
    return 0 if all(results) else 1


if __name__ == "__main__":
    main()
