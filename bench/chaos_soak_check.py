#!/usr/bin/env python3
"""Checks the invariants of a chaos-soaked `deloco run` folder (see bench/chaos_soak.sh). Standard library only.

Reads the records the run wrote: syncer.jsonl (started, merge, checkpoint, eval, retired) and learner-N.jsonl
(apply, syncer_behind). Prints one line per invariant and exits 1 when any fails."""
import argparse, glob, math, os, re, subprocess, sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from jsonl_records import read as records  # noqa: E402  (a line cut by a SIGKILL mid-write is skipped)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--syncer-kills", type=int, default=0)
    ap.add_argument("--stops", type=int, default=0)
    ap.add_argument("--pairs", action="store_true", help="a sharded syncer of standby pairs (chaos_soak.sh --pairs)")
    ap.add_argument("--binary", help="deloco binary: also check that the newest checkpoint loads and evaluates")
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
    if a.binary:
        ok, _, _, detail = final_eval(a.binary, d)
        check("the newest checkpoint loads and evaluates", ok, detail)

    # 5. Validation loss still falls.
    evals = [r for r in syncer if r.get("kind") in ("eval", "final_eval") and r.get("val_loss") is not None]
    ok = len(evals) >= 2 and evals[-1]["val_loss"] < evals[0]["val_loss"]
    check("validation loss falls", ok,
          f"{evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f} over {len(evals)} evaluations" if evals else "no evaluations")

    merges = sum(1 for r in syncer if r.get("kind") == "merge")
    print(f"soak: {a.kills} SIGKILLs ({a.syncer_kills} of the syncer), {a.stops} SIGSTOPs, {len(starts)} syncer starts, "
          f"{merges} merges, {len(applies)} fragments applied by learners")
    sys.exit(0 if all(results) else 1)


def account_pushes(merges_by_shard, learners):
    """Every contribution's fate. A push (learner, shard, fragment, base version) is merged when a merge of that fragment
    names the learner with that base (version - 1 - staleness); each merge counts once per contribution. A push not
    merged must have a reason its learner recorded before its next push of that fragment: refused (`rejected`,
    `pushes_settled`), its syncer failed over or was lost (`syncer_failover`, `syncer_lost`), or the learner itself
    restarted (`state_restored`); failing those, that next push has the same base (`superseded`: no answer came in
    between, so the next push is the progress since that base again, this push's included, and the accounting moves
    to it). Returns (pushes, merged, reasons Counter, unexplained list, merged-without-push)."""
    import collections
    merged = collections.Counter()
    for k, ms in merges_by_shard.items():
        for m in ms:
            for l, st in zip(m.get("learners", []), m.get("staleness", [])):
                merged[(l, k, m["fragment"], m["version"] - 1 - st)] += 1
    n_push, reasons, unexplained, pushed = 0, collections.Counter(), [], collections.Counter()
    for name, rs in learners.items():
        lid = int(re.sub(r"\D", "", name) or -1)
        rs = sorted(rs, key=lambda r: r.get("t", 0))
        pushes = [r for r in rs if r.get("kind") == "push"]
        n_push += len(pushes)
        by_key = collections.defaultdict(list)
        for r in pushes:
            by_key[(lid, r.get("shard", 0), r["fragment"], r["base_version"])].append(r)
        for key, ps in by_key.items():
            pushed[key] = len(ps)
            for r in ps[:max(0, len(ps) - merged[key])]:  # a refused push's progress goes in the next one: the earlier
                t, sh, f = r["t"], key[1], key[2]
                nxt = next((q for q in pushes if q["t"] > t and q.get("shard", 0) == sh and q["fragment"] == f), None)
                t1 = nxt["t"] if nxt is not None else 1e300
                why = next((q["kind"] for q in rs if t < q.get("t", 0) <= t1 and (
                    (q.get("kind") == "pushes_settled" and q.get("shard", 0) == sh and f in q.get("fragments", [])) or
                    (q.get("kind") in ("rejected", "syncer_failover", "syncer_lost") and q.get("shard", 0) == sh) or
                    q.get("kind") == "state_restored")), None)
                if why is None and nxt is not None and nxt["base_version"] == key[3]:
                    why = "superseded"
                if why: reasons[why] += 1
                else: unexplained.append(f"{name} shard {sh} fragment {f} base {key[3]} at t={t:.3f}")
    extra = sum(max(0, n - pushed[k]) for k, n in merged.items())
    return n_push, sum(min(n, merged[k]) for k, n in pushed.items()), reasons, unexplained, extra


def final_eval(binary, run_dir):
    """`deloco eval` of the run folder's newest checkpoint (every shard's, assembled): (ok, merges, loss, detail)."""
    try:
        p = subprocess.run([binary, "eval", "--checkpoint", run_dir, "--set", "train.eval_tokens=4096"],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, None, None, str(e)
    m = re.search(r"after (\d+) merges\): val loss ([-+0-9.eEnaif]+) nats", p.stdout)
    if p.returncode != 0 or not m:
        return False, None, None, f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"
    loss = float(m.group(2))
    return math.isfinite(loss), int(m.group(1)), loss, f"{int(m.group(1))} merges, val loss {loss:.4f}"


def check_pairs(a):
    """The invariants of a run whose syncer is S shards, each a standby pair (issue 34)."""
    d = a.run_dir
    shards = {}
    for path in sorted(glob.glob(os.path.join(d, "shard-*", "syncer.jsonl")) +
                       glob.glob(os.path.join(d, "shard-*", "standby", "syncer.jsonl"))):
        k = int(os.path.relpath(path, d).split(os.sep)[0][6:])
        rs = records(path)
        # Each merge with the term its syncer led in: the first leader's is 1, a takeover's its epoch (a restarted
        # syncer comes back as a standby and merges only after a takeover).
        term = 0 if os.sep + "standby" + os.sep in path else 1
        for r in sorted(rs, key=lambda r: r.get("t", 0)):
            if r.get("kind") == "takeover":
                term = r.get("epoch", term)
            elif r.get("kind") == "merge":
                r["_term"] = term
        shards.setdefault(k, []).extend(rs)
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
    # but never replicated (never sent: broadcasts wait for the standby) is void, by the takeover's merge count, and
    # so is a merge a replaced leader finished after its successor's takeover (it was paused in the middle of it; its
    # broadcast waits for the standby that now leads: were it delivered, a learner would apply that version twice).
    bad, total, void, takeovers, mismatches = [], 0, 0, 0, 0
    kept_by_shard, replaced = {}, []
    for k, rs in sorted(shards.items()):
        kept, version, newest = [], {}, 1
        for r in sorted((r for r in rs if r.get("kind") in ("merge", "takeover")), key=lambda r: r["t"]):
            if r["kind"] == "takeover":
                takeovers += 1
                newest = max(newest, r.get("epoch", newest))
                mismatches += r.get("mismatches", 0)
                void += sum(1 for m in kept if m.get("merges", 0) > r["merges"])
                kept = [m for m in kept if m.get("merges", 0) <= r["merges"]]
            elif r.get("_term", newest) < newest:
                void += 1
                replaced.append(r)
            else:
                kept.append(r)
        for m in kept:
            f, v = m["fragment"], m["version"]
            if v != version.get(f, 0) + 1:
                bad.append(f"shard {k} fragment {f}: version {v} after {version.get(f, 0)}")
            version[f] = v
        total += len(kept)
        kept_by_shard[k] = kept
        mismatches += sum(1 for r in rs if r.get("kind") == "standby" and r.get("event") == "mismatch")
    check("merges in sequence over every term", not bad,
          f"{total} merges, {takeovers} takeovers, {void} void merges of killed or replaced leaders" +
          (f"; first: {bad[0]}" if bad else ""))
    # A replaced leader's void merge never reached a learner: no apply of its (fragment, version) before the merge
    # of that version the successor made (which every learner then applies).
    reached = []
    for r in replaced:
        f, v = r["fragment"], r["version"]
        after = min((m["t"] for ks in kept_by_shard.values() for m in ks
                     if m["fragment"] == f and m["version"] == v and m["t"] > r["t"]), default=1e300)
        for name, rs in learners.items():
            reached += [f"{name}: fragment {f} version {v} at t={q['t']:.3f}" for q in rs if q.get("kind") == "apply"
                        and q.get("fragment") == f and q.get("version") == v and r["t"] <= q.get("t", 0) < after]
    check("no replaced leader's merge reached a learner", not reached,
          f"{len(replaced)} merges finished by a leader after its successor took over, {len(reached)} applied" +
          (f"; first: {reached[0]}" if reached else ""))
    check("standbys replayed every merge exactly", mismatches == 0, f"{mismatches} mismatches")

    n, ok_n, reasons, unexplained, extra = account_pushes(kept_by_shard, learners)
    check("every push merged once, or not merged for a recorded reason", not unexplained and extra == 0 and n > 0,
          f"{n} pushes: {ok_n} merged, {sum(reasons.values())} not ({dict(reasons)}), {len(unexplained)} unexplained, "
          f"{extra} merged without a push" + (f"; first: {unexplained[0]}" if unexplained else ""))

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

    # Rejoin from peers (net.serve): every donor is honest here, so a chunk that failed its hash would be a serving bug.
    fetched = [r for rs in learners.values() for r in rs if r.get("kind") == "joined" and r.get("peer_bytes") is not None]
    lied = [r for rs in learners.values() for r in rs if r.get("kind") == "peer_lied"]
    if fetched:
        check("no honest donor served a wrong chunk", not lied,
              f"{len(fetched)} downloads fetched with donors, {sum(1 for r in fetched if r['peer_bytes'] > 0)} got chunks "
              f"from them ({sum(r['peer_bytes'] for r in fetched)} bytes), {len(lied)} 'peer_lied'"
              + (f"; first: {lied[0].get('detail', '')[:200]}" if lied else ""))

    tmp = [os.path.join(root, n) for root, dirs, files in os.walk(d) for n in dirs + files if ".tmp" in n]
    check("no temporary files left", not tmp, f"{len(tmp)} found" + (f": {tmp[:3]}" if tmp else ""))
    if a.binary:  # every shard's newest checkpoint (of either syncer of its pair), assembled: every merge in it
        ok, merges, loss, detail = final_eval(a.binary, d)
        check("the newest checkpoints load and evaluate, holding every merge", ok and merges == total,
              detail + f" (the records hold {total})")

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
