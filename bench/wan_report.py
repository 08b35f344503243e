#!/usr/bin/python3
"""bench/wan.sh's results: one JSON line per (model, method, rate), and docs/wan.md with its plots made from them.

    /usr/bin/python3 bench/wan_report.py has --results F --model M --method X --rate R [--steps N --max-seconds S
        --learners M]                                                     # exit 0 when the row exists at that scale
    /usr/bin/python3 bench/wan_report.py collect --results F --dir RUN_DIR ...          # bench/wan.sh calls this
    /usr/bin/python3 bench/wan_report.py report [--results docs/wan/results.jsonl] [--doc docs/wan.md]
        [--plots docs/wan] [--target demo=1.9,large=1.8] [--equal-wall demo=60] [--notes FILE.md] [--status TEXT]

`collect` reads one run folder of bench/wan.sh (the records of deloco's processes, or bench/ddp_peer.py's JSON
lines, the hosts' interface counters before and after) and appends (or replaces) its row. Definitions:

  tokens_per_s   per learner host (one deloco learner, one DDP rank, one rank of deloco's group): the tokens it
                 trained over its training span: deloco, from its first join (the global model downloaded) to its
                 last step, or to its stop when the bench's bound stopped it first (waiting for answers counts);
                 DDP, its training time after the rendezvous (evaluation pauses taken out) up to its last step, its
                 stop or its break. Start-up and the end of the run (the drain, goodbyes) are outside: this is the
                 learners' training rate.
  e2e_tokens_per_s  tokens per learner host over the time from the command's start until the final model exists
                 (deloco: the syncer's 'done' record, after its last merge and final evaluation; DDP: every rank's
                 'done' record): process start, joins and state downloads, waiting, the last merges. What comes after
                 (goodbyes behind queued broadcasts, stopping) is in the row's "wall", the command's whole time.
  degraded       a learner trained on without the syncer's answers before its last step (syncer_lost,
                 wait_abandoned, alone): its tokens/s is no longer the method's.
  utilisation    (report) tokens_per_s / the same method's, same model, unshaped.
  link bytes     each host's eth0 counters (tx, rx) after minus before: every byte on the wire (TCP/IP, ZMTP,
                 CURVE, Gloo headers).
  deloco bytes   deloco's own accounting: each learner's learner_done bytes_sent / bytes_received (its transport's
                 payload counters: bytes handed to the transport, queued or sent), the syncer's bytes_sent /
                 bytes_received (its summary; else its last status record). DDP has no accounting of
                 its own: the row carries the all-reduce's payload computed from the steps (2 (W-1)/W x 4 bytes per
                 parameter per step and rank, ring all-reduce, plus the initial broadcast of rank 0's parameters).
  evals          (seconds since the command started, validation loss in nats per byte, tokens per learner): the
                 syncer's eval records (the global model), DDP rank 0's (its evaluation pauses taken out of the time).
  merge_times    (deloco) the syncer's merge records summarised over the later half of the run (the earlier half
                 holds start-up, before a transfer was measured): {"merges": records summarised, and for each of
                 upload_seconds, broadcast_seconds (ξ_sync's transfer terms as the syncer measured them on the
                 links: moving averages), grace (the grace window when the round merged) and grace_wait (the wait
                 from the round's quorum to its merge): {"median", "p90"}}; a key is absent when the records lack
                 the field (older builds), the whole entry absent on rows collected before it existed.
  broke          what went wrong, in words: heartbeats lost (syncer_lost, lost), timeouts (Gloo, the bench's
                 bound), no progress (no merge, steps not reached), refusals. "bounded" says the bench's wall-time
                 bound ended the run before the last step (a slow run, not a failure by itself).
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# decoupled_fixed: Decoupled DiLoCo rows measured before codec fitting (int4 pushes, bf16 broadcasts), renamed so a
# page can set them beside rows of the fitted codecs (bench/wan.sh never runs it: its rows come from older results).
# decoupled_rebase: Decoupled DiLoCo run with --set sync.apply=rebase (renamed likewise, from its own results file).
# decoupled_paper: Decoupled DiLoCo with the papers' apply rule (sync.apply=overwrite, outer.momentum=0.9, as the
# method ran before issue 56's apply rule), renamed likewise.
METHOD_ORDER = ["ddp", "dp", "sync", "streaming", "decoupled_fixed", "decoupled_paper", "decoupled", "decoupled_rebase"]
GRACE_METHODS = {"decoupled", "decoupled_fixed", "decoupled_rebase", "decoupled_paper", "dp"}  # the adaptive grace window (sync.grace)
METHOD_NAMES = {"ddp": "PyTorch DDP", "dp": "deloco DP group", "sync": "sync DiLoCo",
                "streaming": "Streaming DiLoCo", "decoupled": "Decoupled DiLoCo",
                "decoupled_fixed": "Decoupled DiLoCo, int4/bf16", "decoupled_rebase": "Decoupled DiLoCo, rebase",
                "decoupled_paper": "Decoupled DiLoCo, overwrite (μ 0.9)"}


def split_rate(rate):
    """'10mbit@50ms' -> ('10mbit', 50.0): the link rate and the added round trip (bench/wan.sh --rates); 0 without."""
    if "@" not in rate:
        return rate, 0.0
    r, rtt = rate.split("@", 1)
    if not rtt.endswith("ms"):
        raise ValueError(f"rate '{rate}': the round trip is written like @50ms")
    return r, float(rtt[:-2])


def rate_mbit(rate):
    """'10mbit' -> 10.0, 'none' -> inf (unshaped); a round trip (@50ms) does not change it."""
    rate = split_rate(rate)[0]
    if rate == "none":
        return math.inf
    units = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "tbit": 1e6, "bit": 1e-6,
             "kbps": 8e-3, "mbps": 8.0, "gbps": 8e3, "bps": 8e-6}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f
    raise ValueError(f"rate '{rate}'")


def rate_label(rate):
    r, rtt = split_rate(rate)
    label = "unshaped" if r == "none" else f"{rate_mbit(r):g} Mbit/s"
    return label + (f", {rtt:g} ms RTT" if rtt else "")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from jsonl_records import read as read_jsonl  # noqa: E402  (a line cut by a kill is skipped)


def row_key(r):
    """(model, method, rate, repeat) of a results line (repeat 0 when it does not say: rows before repeats)."""
    return r["model"], r["method"], r["rate"], r.get("repeat", 0)


def read_all(path):
    """Every results line by row_key (a later line replaces an earlier one)."""
    rows = {}
    for r in read_jsonl(path):
        rows[row_key(r)] = r
    return rows


def final_loss(row):
    return row["evals"][-1][1] if row.get("evals") else math.inf


def read_results(path):
    """One row per (model, method, rate): with repeats, the one whose final loss is the median (the lower middle)."""
    groups = {}
    for k, r in read_all(path).items():
        groups.setdefault(k[:3], []).append(r)
    return {k: sorted(v, key=final_loss)[(len(v) - 1) // 2] for k, v in groups.items()}


def read_repeats(path):
    """Every repeat per (model, method, rate), in repeat order."""
    groups = {}
    for k, r in sorted(read_all(path).items(), key=lambda kv: kv[0][3]):
        groups.setdefault(k[:3], []).append(r)
    return groups


def params_of(model):
    C, L, V, T = model["n_embd"], model["n_layer"], model.get("vocab_size", 256), model["block_size"]
    n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return n if model.get("tie_embeddings", True) else n + V * C


def counters(path):
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def tcp_counters(path):
    """bench/wan.sh's tcp.after: per host ("host N" then nstat's "Name value rate" lines), a dict of the counts."""
    hosts = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "host":
                hosts.append({})
            elif len(parts) >= 2 and hosts and parts[1].isdigit():
                hosts[-1][parts[0]] = int(parts[1])
    return hosts


# ---------------------------------------------------------------------------------------------------- collect
MERGE_TIME_FIELDS = ("upload_seconds", "broadcast_seconds", "grace", "grace_wait")


def quantile(values, q):
    """The q-quantile of values by linear interpolation between order statistics (the median at q = 0.5)."""
    v = sorted(values)
    x = q * (len(v) - 1)
    i = int(math.floor(x))
    return v[i] if i + 1 >= len(v) else v[i] + (x - i) * (v[i + 1] - v[i])


def merge_times(merges):
    """The merge records' times over the later half of the run (see merge_times in the module's docstring)."""
    later = merges[len(merges) // 2:]
    if not later:
        return None
    out = {"merges": len(later)}
    for k in MERGE_TIME_FIELDS:
        v = [m[k] for m in later if isinstance(m.get(k), (int, float))]
        if v:
            out[k] = {"median": quantile(v, 0.5), "p90": quantile(v, 0.9)}
    return out


def collect_deloco(a, row, cfg, steps):
    run = os.path.join(a.dir, "run")
    B, T = cfg["train"].get("batch_size", 16), cfg["model"]["block_size"]
    hosts_tokens_per_step = B * T
    syncer = read_jsonl(os.path.join(run, "syncer.jsonl"))
    learners = sorted(int(f[len("learner-"):-len(".jsonl")]) for f in os.listdir(run)
                      if f.startswith("learner-") and f.endswith(".jsonl")) if os.path.isdir(run) else []
    broke, per = [], []
    for n in learners:
        recs = read_jsonl(os.path.join(run, f"learner-{n}.jsonl"))
        prog = [r for r in recs if r["kind"] == "learner"]
        done = [r for r in recs if r["kind"] == "learner_done"]
        d = done[-1] if done else {}
        # The training span: from its first join (it holds the global model and trains from there) to its last
        # step when it trained every step, else to when it was stopped (its learner_done record, or the command's
        # end). Steps, not the records' token counts (a restarted process counts tokens from 0 again).
        joined = [r for r in recs if r["kind"] == "joined"]
        last_step = max([r["step"] for r in prog] + [d.get("step", 0)])
        if joined:
            t_start, s_start = joined[0]["t"], joined[0]["step"]
        elif prog:
            t_start, s_start = prog[0]["t"], prog[0]["step"]
        else:
            t_start, s_start = None, 0
        finished = [r for r in prog if r["step"] >= steps]
        t_end = finished[0]["t"] if finished else (d["t"] if d else a.t1)
        tps = ((last_step - s_start) * hosts_tokens_per_step / (t_end - t_start)
               if t_start is not None and t_end > t_start else 0.0)
        busy = (d["busy_seconds"] / d["wall_seconds"]) if d.get("wall_seconds") else None
        L = {"learner": n, "steps": last_step, "tokens_per_s": tps, "busy_fraction": busy,
             "joined_t": round(t_start - a.t0, 2) if t_start is not None else None,
             "last_step_t": round(prog[-1]["t"] - a.t0, 2) if prog else None,
             "bytes_sent": d.get("bytes_sent"), "bytes_received": d.get("bytes_received"),
             "wall_seconds": d.get("wall_seconds"), "busy_seconds": d.get("busy_seconds"),
             "wait_seconds": d.get("wait_seconds"), "pushes": d.get("pushes"), "broadcasts": d.get("broadcasts"),
             "pushes_dropped": d.get("pushes_dropped"), "pushes_superseded": d.get("pushes_superseded"),
             "finished": d.get("finished"), "ranks": d.get("ranks", 1)}
        per.append(L)
        if not done:
            broke.append(f"learner {n}: no learner_done record (killed)")
        last_t = prog[-1]["t"] if prog else a.t1
        for r in recs:
            k = r["kind"]
            # Training on without the syncer's answers (the method is not what it says any more) between its join
            # and its last step (what happens while it downloads the state is start-up, in the row's times).
            if k in ("syncer_lost", "wait_abandoned", "alone") and (t_start or 0) < r["t"] <= last_t:
                row.setdefault("degraded", []).append(f"learner {n}: {k}")
            if k == "syncer_lost":
                broke.append(f"learner {n}: heartbeats lost, no frame from the syncer for {r.get('silent_seconds', 0):.1f} s "
                             f"(at +{r['t'] - a.t0:.0f} s, step {r.get('step')})")
            elif k in ("alone", "wait_abandoned", "leave_undelivered", "rejected", "bad_frame", "auth_refused",
                       "group_stop_undelivered", "shard_missing"):
                why = r.get("detail") or r.get("reason") or ""
                broke.append(f"learner {n}: {k} at +{r['t'] - a.t0:.0f} s" + (f" ({why})" if why else ""))
    for r in syncer:
        k = r["kind"]
        if k == "lost":
            why = (f"no frame for {r['silent_seconds']:.1f} s" if r.get("silent_seconds") else r.get("reason", ""))
            broke.append(f"syncer: lost learner {r.get('learner')} at +{r['t'] - a.t0:.0f} s ({why})")
        elif k in ("learners_blocked", "reject", "broadcast_failed", "merge_rolled_back", "state_request_dropped") \
                or k.endswith("_suppressed"):
            why = r.get("detail") or r.get("reason") or ""
            broke.append(f"syncer: {k} at +{r['t'] - a.t0:.0f} s" + (f" ({why})" if why else ""))
    merges = [r for r in syncer if r["kind"] == "merge"]
    status = [r for r in syncer if r["kind"] == "status"]
    # The global model is final when the syncer finished (its 'done' record; else its final evaluation).
    final = [r for r in syncer if r["kind"] == "done"] or [r for r in syncer if r["kind"] == "final_eval"]
    row["final_model_t"] = round(final[0]["t"] - a.t0, 2) if final else None
    evals = [(round(r["t"] - a.t0, 2), r["val_loss"], r.get("tokens")) for r in syncer
             if r["kind"] in ("eval", "final_eval") and r.get("val_loss") is not None]
    summary = {}
    for path in (os.path.join(a.dir, "summary.json"), os.path.join(run, "syncer-summary.json")):
        if not summary and os.path.exists(path):
            with open(path) as f:
                summary = json.load(f)
    for k in ("broadcasts_sent", "broadcasts_superseded", "broadcasts_acked", "contributions_merged", "uptime",
              "goodput", "final_val_loss", "grace_waits", "upload_seconds", "broadcast_seconds"):
        if k in summary:
            row.setdefault("syncer", {})[k] = summary[k]
    if isinstance(summary.get("push_accounting"), dict):
        row["push_accounting"] = summary["push_accounting"]
    row["learner_hosts"] = per
    row["merges"] = len(merges)
    row["last_merge_t"] = round(merges[-1]["t"] - a.t0, 2) if merges else None
    row["merge_quorum_mean"] = statistics.mean(m["quorum"] for m in merges) if merges else None
    row["merge_times"] = merge_times(merges)
    row["evals"] = evals
    last = status[-1] if status else {}
    # The syncer's own summary when it wrote one (its whole run), else its last status record.
    row["deloco_bytes"] = {"syncer_in": summary.get("bytes_received", last.get("bytes_in")),
                           "syncer_out": summary.get("bytes_sent", last.get("bytes_out")),
                           "learners": {str(L["learner"]): [L["bytes_sent"], L["bytes_received"]] for L in per}}
    if summary.get("syncer_forced_stop"):
        broke.append("the syncer did not exit after the learners finished: deloco run stopped it")
    if summary.get("interrupted"):
        row["interrupted"] = summary["interrupted"]
    if not merges:
        broke.append("no progress: no merge at all")
    return broke


def collect_ddp(a, row, cfg, world):
    broke, per, evals = [], [], []
    params = None
    for r in range(world):
        recs = read_jsonl(os.path.join(a.dir, f"ddp-{r}.jsonl"))
        start = [x for x in recs if x["kind"] == "start"]
        params = start[0]["params"] if start else params
        prog = [x for x in recs if x["kind"] == "train"]
        done = [x for x in recs if x["kind"] == "done"]
        bad = [x for x in recs if x["kind"] == "broke"]
        # Its training time: the done record's (evaluation pauses out), else up to its break or its last record.
        d = done[-1] if done else {}
        if d:
            tps = d["tokens_per_s"]
        elif bad:
            tps = bad[-1]["tokens"] / max(bad[-1]["wall"] - (prog[-1].get("eval_s", 0.0) if prog else 0.0), 1e-9)
        elif prog:
            tps = prog[-1]["tokens"] / max(prog[-1]["wall"] - prog[-1].get("eval_s", 0.0), 1e-9)
        else:
            tps = 0.0
        timed = [x for x in recs if x["kind"] in ("eval", "train", "done", "broke")]
        start_t = round(timed[0]["t"] - timed[0]["wall"] - a.t0, 2) if timed else None  # after the rendezvous
        per.append({"rank": r, "steps": d.get("steps", prog[-1]["step"] if prog else 0), "joined_t": start_t,
                    "tokens_per_s": tps, "last_step_t": round(prog[-1]["t"] - a.t0, 2) if prog else None,
                    "stopped_by": d.get("stopped_by"), "train_seconds": d.get("train_seconds")})
        for x in bad:
            broke.append(f"rank {r}: broke at {x['where']} after {x['wall']:.0f} s of training: {x['detail']} "
                         f"(Gloo timeout {x.get('timeout')} s)")
        if not done and not bad:
            log = os.path.join(a.dir, f"ddp-{r}.log")
            tail = open(log, errors="replace").read().strip().splitlines()[-1:] if os.path.exists(log) else []
            broke.append(f"rank {r}: no done record (killed by the bench's bound?) {tail[0][:200] if tail else ''}".rstrip())
        if r == 0:
            # The evaluation pauses taken out: the time is since the command's start minus the pauses before it.
            evals = [(round(x["t"] - a.t0 - (x.get("eval_s", 0.0)), 2), x["val_loss"], x["tokens"])
                     for x in recs if x["kind"] == "eval"]
    row["learner_hosts"] = per
    row["evals"] = evals
    ends = [x["t"] for r in range(world) for x in read_jsonl(os.path.join(a.dir, f"ddp-{r}.jsonl")) if x["kind"] == "done"]
    row["final_model_t"] = round(max(ends) - a.t0, 2) if len(ends) == world else None
    steps = max((p["steps"] for p in per), default=0)
    p = params or row["params"]
    row["estimated_bytes_per_rank"] = int(steps * 2 * (world - 1) / world * 4 * p + 4 * p)
    return broke


def cmd_collect(a):
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    steps = a.steps or cfg.get("train", {}).get("steps", 1500)
    before, after = counters(os.path.join(a.dir, "counters.before")), counters(os.path.join(a.dir, "counters.after"))
    row = {"model": a.model, "method": a.method, "rate": a.rate, "repeat": a.repeat, "config": a.config,
           "params": params_of(cfg["model"]),
           "learners": a.learners, "steps": steps, "max_seconds": a.max_seconds, "wall": round(a.t1 - a.t0, 2),
           "rc": a.rc, "commit": a.commit, "started": round(a.t0, 1),
           "batch_tokens": cfg["train"].get("batch_size", 16) * cfg["model"]["block_size"],
           "link_bytes": [[x[0] - y[0], x[1] - y[1]] for x, y in zip(after, before)]}  # [tx, rx] per host
    if a.tcp_cc:
        row["tcp_cc"] = a.tcp_cc
    if os.path.exists(os.path.join(a.dir, "tcp.after")):  # each host's TCP counters (its namespace is the row's)
        row["tcp"] = tcp_counters(os.path.join(a.dir, "tcp.after"))
    for when in ("before", "after"):  # the machine's load averages (1, 5, 15 min): other work on the same cores
        path = os.path.join(a.dir, f"load.{when}")
        if os.path.exists(path):
            row[f"load_{when}"] = [float(x) for x in open(path).read().split()]
    if a.method == "ddp":
        broke = collect_ddp(a, row, cfg, a.learners)
        row["ddp_timeout"] = a.ddp_timeout
    else:
        broke = collect_deloco(a, row, cfg, steps)
    hosts = row["learner_hosts"]
    rates = [h["tokens_per_s"] for h in hosts if h.get("tokens_per_s")]
    row["tokens_per_s"] = statistics.mean(rates) if rates else 0.0
    reached = [h["steps"] for h in hosts]
    row["steps_reached"] = min(reached) if reached else 0
    # End to end: until the final model exists (deloco: the syncer is done; DDP: every rank is done), else until
    # the command ended.
    t_model = row.get("final_model_t") or (a.t1 - a.t0)
    row["e2e_tokens_per_s"] = (statistics.mean(reached) * row["batch_tokens"] / t_model) if reached else 0.0
    row["degraded"] = sorted(set(row.get("degraded", [])))
    row["bounded"] = row["steps_reached"] < steps
    if not row["bounded"] and a.rc == 124:
        last = max((h["last_step_t"] for h in hosts if h.get("last_step_t") is not None), default=None)
        broke.append(f"did not end within its bound: interrupted at {a.t1 - a.t0:.0f} s"
                     + (f", {a.t1 - a.t0 - last:.0f} s after the last step (the drain)" if last is not None else ""))
    if row["bounded"]:
        broke.append(f"bounded: step {row['steps_reached']} of {steps} when the run ended at {a.t1 - a.t0:.0f} s "
                     f"(bound {a.max_seconds} s of training)")
    if a.rc not in (0,) and not row.get("interrupted") and not (row["bounded"] and a.rc == 124):
        broke.append(f"exit status {a.rc}" + (" (the bench's timeout)" if a.rc in (124, 137) else ""))
    # The same line repeated by several records (a learner losing the syncer many times) counts once, with a count.
    seen = {}
    for b in broke:
        key = b.split(" at +")[0].split(" (at +")[0].split(", no frame")[0]
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [b, 1]
    row["broke"] = [b if n == 1 else f"{b} [x{n}]" for b, n in seen.values()]
    rows = read_all(a.results)
    rows[row_key(row)] = row
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    tmp = a.results + ".tmp"
    with open(tmp, "w") as f:
        for r in rows.values():
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, a.results)
    print(f"  {a.model} {a.method} {a.rate}{f' repeat {a.repeat}' if a.repeat else ''}: {row['tokens_per_s']:.0f} tokens/s per learner host "
          f"(end to end {row['e2e_tokens_per_s']:.0f}), step {row['steps_reached']}/{steps}, wall {row['wall']:.0f} s, "
          f"final val {row['evals'][-1][1] if row['evals'] else float('nan'):.3f}, link tx "
          f"{'/'.join(f'{x[0] / 1e6:.1f}' for x in row['link_bytes'])} MB"
          + (f"; {'; '.join(row['broke'])}" if row["broke"] else ""))


# ----------------------------------------------------------------------------------------------------- report
def fmt(x, spec=".0f", none="–"):
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def seconds(x):
    """A time for a table cell: two or three significant digits below 10 s."""
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 0.1 or x == 0 else f"{x:.3f}"


def shorten(text, n=110):
    """A break's text for a table cell: a long detail in brackets cut to n characters."""
    if len(text) <= n:
        return text
    count = text[text.rfind(" [x"):] if text.endswith("]") and " [x" in text else ""
    return text[:n - 1 - len(count)].rstrip() + "…" + (")" if "(" in text[:n] and ")" not in text[text.index("("):n] else "") + count


def loss_at(evals, t):
    """The last evaluation at or before t seconds: (time, loss), or None."""
    best = None
    for e in evals:
        if e[0] <= t + 1e-9:
            best = e
    return best


def parse_map(s):
    out = {}
    for part in filter(None, (s or "").split(",")):
        k, v = part.split("=")
        out[k.strip()] = float(v)
    return out


def cmd_report(a):
    rows = read_results(a.results)
    if not rows:
        sys.exit(f"wan_report: no results in {a.results} (run bench/wan.sh)")
    models = sorted({k[0] for k in rows}, key=lambda m: (m != "demo", m))
    rates = sorted({k[2] for k in rows}, key=lambda r: (-rate_mbit(r), split_rate(r)[1]))
    methods = [m for m in METHOD_ORDER if any(k[1] == m for k in rows)]
    targets, equal_wall = parse_map(a.target), parse_map(a.equal_wall)
    repeats = read_repeats(a.results)
    most = max(len(v) for v in repeats.values())
    delayed = any(split_rate(r)[1] for r in rates)

    def marks(m):
        """(equal wall time, target loss) of model m: given, else from its unshaped rows."""
        base_rows = [x for k, x in rows.items() if k[0] == m and k[2] == "none" and x["evals"]]
        t_eq = equal_wall.get(m) or (min(x["evals"][-1][0] for x in base_rows) if base_rows else None)
        target = targets.get(m) or (max(x["evals"][-1][1] for x in base_rows) if base_rows else None)
        return t_eq, target
    os.makedirs(a.plots, exist_ok=True)
    doc_dir = os.path.dirname(os.path.abspath(a.doc))
    rel_plots = os.path.relpath(os.path.abspath(a.plots), doc_dir)
    L = []
    w = L.append
    commits = sorted({r.get("commit", "?") for r in rows.values()})
    any_row = next(iter(rows.values()))
    w("# Data parallel across a WAN: DDP and the DiLoCo family on shaped links")
    w("")
    if a.status:
        w(f"**{a.status}**")
        w("")
    w("Generated by `bench/wan_report.py` from `" + os.path.relpath(a.results, ROOT) + "` (bench/wan.sh); do not edit by "
      "hand. **The figures are from this machine: 2 CPU cores shared by every process of a run (and by whatever "
      "else ran at the time: the load averages are in the time table), each learner or rank on one thread; links are `tc tbf` rate limits "
      "with 256 KiB queues on network-namespace hosts (scripts/testbed.sh, docs/testbed.md); netem is absent in this "
      "kernel" + (", so a row marked *ms RTT* adds its round trip through the testbed's own delay line (`up --delay`); "
                  "elsewhere the round-trip time between hosts is the kernel's (well under a millisecond) plus whatever "
                  "a full queue adds.**" if delayed else
                  ", so there is no added propagation delay: rates and queues only.** The round-trip time between hosts "
                  "is the kernel's (well under a millisecond) plus whatever a full queue adds.")
      + f" Measured with deloco at {', '.join(commits)}. "
      + ("Runs are single (no repeats)" if most == 1 else
         f"Rows have up to {most} repeats (the section *Repeats* gives each one's spread; the other tables show the "
         "repeat with the median final loss)")
      + ": the noise of this shared machine is easily ±20 % on a throughput figure, more under load (the load "
      "averages are in the time table); a utilisation a few percent above 100 % is that noise.")
    w("")
    w("Regenerate (as root, after `scripts/setup.sh`; each row holds `/tmp/deloco-testbed.lock` while its testbed is "
      "up):")
    w("")
    w("```sh")
    w("bench/wan.sh                                   # the whole matrix: rows already in the results are skipped")
    w("bench/wan.sh --redo                            # everything again (e.g. after a runtime fix)")
    w("bench/wan.sh --models demo --rates \"none 10mbit\" --steps 400 --max-seconds 90 --out /tmp/quick.jsonl  # a quick subset")
    w("/usr/bin/python3 bench/wan_report.py report    # this page and its plots from the results alone")
    w("```")
    w("")
    w("This page was written by `/usr/bin/python3 bench/wan_report.py " + shlex.join(
        os.path.relpath(x, ROOT) if os.path.isabs(x) and x.startswith(ROOT) else x for x in sys.argv[1:]) + "`.")
    w("")
    w("## Set-up")
    w("")
    w(f"* **Hosts**: {any_row['learners'] + 1} namespaces; host 0 runs deloco's syncer, hosts 1..{any_row['learners']} "
      "one learner each (one DDP rank each; host 0 idle for DDP). Every host's link is shaped in both directions to "
      "the rate of the row.")
    ccs = sorted({x.get("tcp_cc", "") for x in rows.values()})
    if ccs != [""]:
        w("* **TCP**: the hosts' congestion control (`bench/wan.sh --tcp`): "
          + "; ".join(f"{c or 'the kernel default (cubic)'} in {sum(x.get('tcp_cc', '') == c for x in rows.values())} rows"
                      for c in ccs) + ".")
    for m in models:
        r = next(x for x in rows.values() if x["model"] == m)
        w(f"* **Model `{m}`** (`{r['config']}`): {r['params'] / 1e6:.2f}M parameters, {r['batch_tokens']} tokens per "
          f"step per learner host, {r['steps']} steps per learner host, at most {r['max_seconds']} s of training per run; "
          f"one full fp32 copy of the model is {4 * r['params'] / 1e6:.2f} MB.")
    w("* **Methods** (deloco: `deloco run --set testbed.name=...`, H = 40 inner steps, chaos off, CURVE over TCP, "
      "syncer checkpoints only at the end, the global model evaluated by the syncer every `--eval-seconds`, 10 s "
      "unless bench/wan.sh was told otherwise; DDP's rank 0 evaluates as often):")
    w("  * *PyTorch DDP* (`bench/ddp_peer.py`): DistributedDataParallel over Gloo, one rank per learner host; the "
      "same GPT, data shards, batch, AdamW, clipping and schedule as deloco's learners; its gradients all-reduced every "
      "step (fp32).")
    if "dp" in methods:
        w("  * *deloco DP group*: one deloco learner of M ranks (`learner.ranks`), rank r on host r + 1, per-step "
          "gradient all-reduce over c10d Gloo across the links; its syncer on host 0 (Decoupled settings, M = 1). "
          "`deloco run` places the ranks (docs/testbed.md); rows of builds before d330a70 started them by hand, "
          "placed the same way.")
    w("  * *sync DiLoCo*: K = M, P = 1, τ = 0, learners wait for the merged model, mean merge, Nesterov (0.7, 0.9), "
      "fp32 both ways.")
    w("  * *Streaming DiLoCo*: K = M, P = 4 fragments staggered over H, τ = 5 (a learner trains 5 steps on while a "
      "fragment is in flight, then waits for its answer), mean merge, Nesterov, fp32 both ways.")
    w("  * *Decoupled DiLoCo*: K = 1 plus the adaptive grace window, P = 4, τ = 5, learners never wait, token weights, "
      "the `decoupled` merge preset, codecs fitted to each link (`net.encoding = auto`, `net.broadcast_encoding = auto`, "
      "docs/runtime.md; before 82716e2: int4 pushes with error feedback, bf16 broadcasts), learners that rebase on "
      "the answers (`sync.apply = rebase`) with the outer Nesterov at (0.7, 0.6) (docs/apply-rule.md; before issue "
      "56's apply rule they overwrote, with (0.7, 0.9): *Decoupled DiLoCo, overwrite (μ 0.9)* where a page shows both).")
    w("* **tokens/s** per learner host is its training rate: the steps it trained × tokens per step, over the time "
      "from its start of training (deloco: its join, the global model downloaded; DDP: after the rendezvous) to "
      "its last step, or to its stop when the bench's bound stopped it first. Waiting for the syncer's answers "
      "counts; start-up and the end of the run do not; DDP's evaluation pauses are taken out. **End-to-end** divides "
      "the tokens each host trained by the time from the command's start until the final model exists (deloco: the "
      "syncer's `done` record, after its last merge and final evaluation; DDP: every rank done): process start, "
      "state downloads, waiting and the last merges count. **Utilisation** = tokens/s ÷ the same method's unshaped "
      "tokens/s, on each of the two rates.")
    w("")

    def util(m, me, r, key="tokens_per_s"):
        row, base = rows.get((m, me, r)), rows.get((m, me, "none"))
        if not row or not base or not base.get(key):
            return None
        return row[key] / base[key]

    def table(*columns):
        w("| " + " | ".join(columns) + " |")
        w("|" + "---|" * len(columns))

    def each_row(keep=lambda row: True):
        """(model, method, rate, row) of every row kept, by model, then method, then rate."""
        for m in models:
            for me in methods:
                for r in rates:
                    row = rows.get((m, me, r))
                    if row and keep(row):
                        yield m, me, r, row

    # ---- utilisation
    w("## Utilisation: tokens/s per learner host against the same method unshaped")
    w("")
    for m in models:
        w(f"**{m}** — training rate (end-to-end in brackets); unshaped rows give the absolute tokens/s.")
        w("")
        table("method", *(rate_label(r) for r in rates))
        for me in [x for x in methods if any(k[0] == m and k[1] == x for k in rows)]:
            cells = []
            for r in rates:
                row = rows.get((m, me, r))
                if not row:
                    cells.append("–")
                elif r == "none":
                    cells.append(f"{row['tokens_per_s']:.0f} tok/s ({row['e2e_tokens_per_s']:.0f})")
                else:
                    u, ue = util(m, me, r), util(m, me, r, "e2e_tokens_per_s")
                    cells.append(f"{fmt(u and 100 * u, '.0f')}% ({fmt(ue and 100 * ue, '.0f')}%)"
                                 + (" †" if row.get("bounded") else "") + (" ‡" if row.get("degraded") else ""))
            w(f"| {METHOD_NAMES[me]} | " + " | ".join(cells) + " |")
        w("")
    w("† the bench's wall-time bound ended the run before its last step (the rate is over what it trained). "
      "‡ degraded: a learner trained on without the syncer's answers before its last step (it lost the syncer's "
      "heartbeats or gave up waiting for an answer): the rate is no longer the method's, see *Where each method "
      "breaks*.")
    w("")
    plot_utilisation(rows, models, methods, rates, a.plots)
    w(f"![utilisation against link rate]({rel_plots}/utilisation.png)")
    w("")

    # ---- where the time went
    w("### Where the time went")
    w("")
    w("Per row: when the learner hosts began training (deloco: joined, the global model downloaded; DDP: after the "
      "rendezvous), when they trained their last step, when the final model existed (deloco: the syncer done, after "
      "its last merges and final evaluation), when the command ended (after that: learners' goodbyes queued behind "
      "broadcasts, stopping), and for deloco the share of each learner's time spent "
      "waiting for the syncer's answers (learner_done wait_seconds ÷ wall_seconds). Seconds since the command "
      "started; medians over the learner hosts. The load average of the machine at the row's start and end says "
      "how much else ran on its 2 cores.")
    w("")
    table("model", "method", "rate", "training from (s)", "last step (s)", "final model (s)", "command end (s)",
          "waiting", "load avg (start → end)")
    for m, me, r, row in each_row():
        hs = row["learner_hosts"]

        def med(key):
            v = [h[key] for h in hs if h.get(key) is not None]
            return statistics.median(v) if v else None
        start = med("joined_t")
        waits = [h["wait_seconds"] / h["wall_seconds"] for h in hs
                 if h.get("wait_seconds") is not None and h.get("wall_seconds")]
        load = (f"{row['load_before'][0]:.1f} → {row['load_after'][0]:.1f}"
                if row.get("load_before") and row.get("load_after") else "–")
        wait = f"{100 * statistics.median(waits):.0f}%" if waits else "–"
        w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | {fmt(start, '.1f')} | {fmt(med('last_step_t'), '.1f')} "
          f"| {fmt(row.get('final_model_t'), '.1f')} | {row['wall']:.1f} | {wait} | {load} |")
    w("")

    # ---- bytes
    w("## Bytes on each host's link: the interfaces' counters against deloco's accounting")
    w("")
    w("Per row: MB sent (tx) and received (rx) on each host's `eth0` during the run, from `ip -s link`'s counters "
      "in the namespace (`scripts/testbed.sh counters`); deloco's own payload accounting beside it (the syncer's "
      "bytes sent / received from its summary, each learner's bytes_sent / bytes_received from its learner_done "
      "record: bytes handed to the transport, so a run stopped with data still queued counts more than the wire "
      "carried); the ratio is "
      "wire ÷ deloco for the learner hosts' tx (framing: TCP/IP, ZMTP, CURVE). DDP has no accounting: its column "
      "is the ring all-reduce's payload computed from the steps it trained.")
    w("")
    table("model", "method", "rate", "host 0 tx / rx (MB)", "learner hosts tx / rx (MB)",
          "deloco: syncer out / in, learners sent / received (MB)", "wire ÷ counted (learners' tx)",
          "MB sent per 1k tokens per learner host")
    for m, me, r, row in each_row():
        lb = row["link_bytes"]
        h0 = f"{lb[0][0] / 1e6:.1f} / {lb[0][1] / 1e6:.1f}"
        hl = ", ".join(f"{x[0] / 1e6:.1f} / {x[1] / 1e6:.1f}" for x in lb[1:])
        ratio = "–"
        if me == "ddp":
            est = row.get("estimated_bytes_per_rank", 0)
            counted = f"all-reduce payload ≈ {est / 1e6:.1f} per rank each way"
            if est:
                ratio = ", ".join(f"{x[0] / est:.2f}" for x in lb[1:])
        else:
            db = row.get("deloco_bytes", {})
            ls = db.get("learners", {})
            counted = (f"{fmt(db.get('syncer_out') and db['syncer_out'] / 1e6, '.1f')} / "
                       f"{fmt(db.get('syncer_in') and db['syncer_in'] / 1e6, '.1f')}; "
                       + ", ".join(f"{fmt(v[0] and v[0] / 1e6, '.1f')} / {fmt(v[1] and v[1] / 1e6, '.1f')}"
                                   for v in ls.values()))
            rs = []
            for i, v in enumerate(ls.values()):
                if v[0] and i + 1 < len(lb) and me != "dp":
                    rs.append(f"{lb[i + 1][0] / v[0]:.2f}")
            ratio = ", ".join(rs) or "–"
        # Every learner host trains about the same steps (a deloco DP group's ranks: exactly; its records are rank 0's).
        per_host = max(statistics.mean(h["steps"] for h in row["learner_hosts"]), 1) * row["batch_tokens"]
        per_k = statistics.mean(x[0] for x in lb[1:]) / per_host * 1000 / 1e6
        w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | {h0} | {hl} | {counted} | {ratio} | {per_k:.3f} |")
    w("")
    tcp_rows = [(m, me, r, row) for m, me, r, row in each_row() if row.get("tcp")]
    if tcp_rows:
        w("Each host's TCP counters over the row (its namespace is made for the row; host 0 first): segments "
          "retransmitted, retransmission timeouts, and connections the kernel aborted because data stayed "
          "unacknowledged past the connection's TCP user timeout (`net.tcp_timeout`, fitted to each link since "
          "9f5734a, docs/transport.md): a connection dialled afresh, the learner joins again.")
        w("")
        table("model", "method", "rate", "retransmitted segments", "retransmission timeouts", "aborted on timeout")
        for m, me, r, row in tcp_rows:
            def per(k):
                return ", ".join(str(h.get(k, 0)) for h in row["tcp"])
            w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | {per('TcpRetransSegs')} | {per('TcpExtTCPTimeouts')} | "
              f"{per('TcpExtTCPAbortOnTimeout')} |")
        w("")
    if "dp" in methods:
        w("deloco DP group: the learner hosts' links carry the Gloo all-reduce, which deloco does not count; the "
          "learner's counters are its link to the syncer only (rank 0).")
        w("")

    # ---- the grace window
    w("## The grace window on real links")
    w("")
    timed = list(each_row(lambda row: bool(row.get("merge_times"))))
    if not timed:
        w("No row here carries the merge records' times (rows collected before `bench/wan_report.py collect` "
          "summarised them; `bench/wan.sh --recollect` adds them while the run folders are there).")
        w("")
    else:
        w("Per deloco row: the syncer's merge records over the later half of the run (the earlier half holds "
          "start-up, before a transfer was measured), median (p90 in brackets) of ξ_sync's transfer terms as the "
          "syncer measured them on the links (moving averages when the round merged): a push's upload (the heartbeat "
          "sent right before it to its arrival) and a broadcast (hand-off to acknowledgement); the grace window "
          "ξ_grace = min(cap, max(0, γ(τ·ξ_step − (ξ_quorum + ξ_sync)))) when the round merged, and the wait from "
          "the round's quorum to its merge. *merges*: the run's (the medians are over the later half). sync and "
          "Streaming DiLoCo merge when every learner is in, without a window: only their transfer times.")
        w("")
        table("model", "method", "link", "merges", "upload (s)", "broadcast (s)", "grace window (s)",
              "wait after quorum (s)")
        for m, me, r, row in timed:
            mt = row["merge_times"]

            def cell(k):
                if k in ("grace", "grace_wait") and me not in GRACE_METHODS:
                    return "off"
                q = mt.get(k)
                return f"{seconds(q['median'])} ({seconds(q['p90'])})" if q else "–"
            w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | {row.get('merges', '–')} | "
              + " | ".join(cell(k) for k in MERGE_TIME_FIELDS) + " |")
        w("")

    # ---- every push accounted for (issue 56)
    w("## Every push accounted for")
    w("")
    counted = list(each_row(lambda row: isinstance(row.get("push_accounting"), dict)))
    if not counted:
        w("No row here carries `push_accounting` (rows measured before issue 56; `deloco run`'s summary has it "
          "since: docs/runtime.md, \"Every push accounted for\").")
        w("")
    else:
        w("Per deloco row, from `deloco run`'s summary: the pushes the learners' schedules made due; of those not "
          "sent, the ones superseded in the outbox while the link's window was full, dropped while not joined, or "
          "left at the end; of those sent, the ones merged, refused, replaced at the syncer by the same learner's "
          "newer push, waiting at the end, and not counted by the final syncer process.")
        w("")
        table("model", "method", "link", "due", "sent", "superseded", "dropped", "unsent at end", "merged",
              "refused", "replaced", "waiting at end", "unaccounted")
        for m, me, r, row in counted:
            pa = row["push_accounting"]
            un, um = pa.get("unsent", {}), pa.get("unmerged", {})
            cells = [pa.get("due"), pa.get("sent"), un.get("superseded"), un.get("dropped"), un.get("at_end"),
                     pa.get("merged"), um.get("refused"), um.get("replaced"), um.get("pending_at_end"),
                     pa.get("unaccounted")]
            w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | " + " | ".join(fmt(c) for c in cells) + " |")
        w("")

    # ---- loss at equal wall time and time to target
    w("## Validation loss at equal wall time, and wall time to a target loss")
    w("")
    w("Validation loss in nats per byte of the global model (deloco: the syncer's evaluations; DDP: rank 0's, its "
      "evaluation pauses taken out of the time), on the held-out split, at the same seconds after each run's "
      "command started (start-up included for every method). The equal wall time per model is the last "
      "evaluation of the fastest unshaped run unless given (`--equal-wall`); the target loss is the worst final "
      "loss among the unshaped runs unless given (`--target`), so every method reaches it unshaped.")
    w("")
    for m in models:
        t_eq, target = marks(m)
        if t_eq is None or target is None:
            continue
        w(f"**{m}**: loss at {t_eq:.0f} s (cell: loss, or the run's last loss and when, if it ended earlier) / "
          f"seconds to reach {target:.3f} nats/byte ({target / math.log(2):.3f} bits/byte)")
        w("")
        table("method", *(rate_label(r) for r in rates))
        for me in [x for x in methods if any(k[0] == m and k[1] == x for k in rows)]:
            cells = []
            for r in rates:
                row = rows.get((m, me, r))
                if not row or not row["evals"]:
                    cells.append("–")
                    continue
                ev = row["evals"]
                at = loss_at(ev, t_eq)
                if ev[-1][0] < t_eq - 1e-9:
                    loss_cell = f"{ev[-1][1]:.3f} (ended {ev[-1][0]:.0f} s)"
                else:
                    loss_cell = f"{at[1]:.3f}" if at else "no evaluation yet"
                hit = next((e for e in ev if e[1] <= target), None)
                cells.append(f"{loss_cell} / {f'{hit[0]:.0f} s' if hit else f'not reached (best {min(e[1] for e in ev):.3f})'}")
            w(f"| {METHOD_NAMES[me]} | " + " | ".join(cells) + " |")
        w("")
        plot_losses(rows, m, methods, rates, t_eq, target, a.plots)
        w(f"![validation loss against wall time, {m}]({rel_plots}/loss-{m}.png)")
        w("")

    # ---- repeats
    if most > 1:
        w("## Repeats")
        w("")
        w("Each row measured several times (bench/wan.sh --repeats N), on the same targets as above: the median and, "
          "in brackets, the lowest and highest over the repeats of the final loss (equal tokens: every run trains "
          "the same steps unless bounded), the loss at the equal wall time, the wall time from the command's start "
          "to the target loss and to DDP's unshaped final loss (the median of its repeats; how many of the repeats "
          "reached each), and the end-to-end tokens/s per learner host.")
        w("")

        def spread(xs, spec):
            xs = sorted(x for x in xs if x is not None)
            if not xs:
                return "–"
            med = statistics.median(xs)
            return f"{med:{spec}} [{xs[0]:{spec}}–{xs[-1]:{spec}}]" if len(xs) > 1 else f"{med:{spec}}"
        for m in models:
            t_eq, target = marks(m)
            if t_eq is None or target is None:
                continue
            ddp_base = [final_loss(x) for x in repeats.get((m, "ddp", "none"), []) if x.get("evals")]
            ddp_final = statistics.median(ddp_base) if ddp_base else None
            w(f"**{m}**: equal wall time {t_eq:.0f} s, target {target:.3f} nats/byte"
              + (f", DDP's unshaped final loss {ddp_final:.3f}" if ddp_final is not None else ""))
            w("")
            table("method", "link", "runs", "final loss", f"loss at {t_eq:.0f} s", "time to target (s)",
                  "time to DDP's final (s)", "end-to-end tokens/s")

            def time_to(runs, goal):
                if goal is None:
                    return "–"
                hits = [next((e[0] for e in x["evals"] if e[1] <= goal), None) for x in runs if x.get("evals")]
                reached = [h for h in hits if h is not None]
                return f"{spread(reached, '.0f')} ({len(reached)} of {len(runs)})"
            for me in methods:
                for r in rates:
                    runs = repeats.get((m, me, r), [])
                    if not runs:
                        continue
                    finals = [final_loss(x) for x in runs if x.get("evals")]
                    at = [loss_at(x["evals"], t_eq) for x in runs if x.get("evals")]
                    w(f"| {METHOD_NAMES[me]} | {rate_label(r)} | {len(runs)} | {spread(finals, '.3f')} | "
                      f"{spread([e[1] if e else None for e in at], '.3f')} | {time_to(runs, target)} | "
                      f"{time_to(runs, ddp_final)} | {spread([x.get('e2e_tokens_per_s') for x in runs], '.0f')} |")
            w("")

    # ---- where it breaks
    w("## Where each method breaks")
    w("")
    w("Per row, what the records say went wrong: heartbeats lost (a learner's `syncer_lost`, the syncer's `lost`), "
      "timeouts (Gloo's, the bench's bound), no progress (steps not reached, no merge), refusals. *ok*: every "
      "host trained every step and nothing of the kind was recorded.")
    w("")
    table("model", "method", "rate", "steps reached", "merges", "what happened")
    for m, me, r, row in each_row():
        what = "; ".join(shorten(b) for b in row["broke"]) if row["broke"] else "ok"
        w(f"| {m} | {METHOD_NAMES[me]} | {rate_label(r)} | {row['steps_reached']}/{row['steps']} | "
          f"{row.get('merges', '–')} | {what} |")
    w("")

    # ---- goal
    w("## The goal (issue 31): Decoupled DiLoCo (int4) ≥ 90 % of its unshaped tokens/s at 10 Mbit/s and ≥ 50 % at "
      "1 Mbit/s per host; DDP below 10 % at 100 Mbit/s")
    w("")
    w("Checked on the training rate (the learners' tokens/s) and on the end-to-end rate (until the final model "
      "exists); both against the same method unshaped. The DDP goal is checked for deloco's DP group too. ‡: "
      "learners trained on without the syncer's answers (see *Where each method breaks*).")
    w("")
    table("model", "check", "goal", "training rate", "verdict", "end-to-end", "verdict")
    checks = [("decoupled", "10mbit", ">=", 0.9), ("decoupled", "1mbit", ">=", 0.5), ("ddp", "100mbit", "<", 0.1),
              ("dp", "100mbit", "<", 0.1)]
    for m in models:
        for me, r, op, goal in checks:
            if me not in methods:
                continue
            u, ue = util(m, me, r), util(m, me, r, "e2e_tokens_per_s")
            if u is None:
                w(f"| {m} | {METHOD_NAMES[me]} at {rate_label(r)} | {op} {100 * goal:.0f} % | not measured | – | – | – |")
                continue

            def verdict(x, degraded=False):
                ok = x >= goal if op == ">=" else x < goal
                miss = round(100 * abs(x - goal))
                if not ok:
                    return f"miss by {miss} point{'s' if miss != 1 else ''}"
                return "pass, but degraded ‡" if degraded else "pass"
            mark = " ‡" if rows[(m, me, r)].get("degraded") else ""
            w(f"| {m} | {METHOD_NAMES[me]} at {rate_label(r)} | {op} {100 * goal:.0f} % | {100 * u:.0f} %{mark} | "
              f"{verdict(u, bool(mark))} | {100 * ue:.0f} % | {verdict(ue, bool(mark))} |")
    w("")
    if a.notes:
        with open(a.notes) as f:
            w(f.read().rstrip())
        w("")
    with open(a.doc, "w") as f:
        f.write("\n".join(L) + "\n")
    print(f"wrote {a.doc} and plots in {a.plots}/")


def plot_utilisation(rows, models, methods, rates, plots):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shaped = [r for r in rates if r != "none" and not split_rate(r)[1]]  # the rate sweep (rows with a delay: tables)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        for me in methods:
            base = rows.get((m, me, "none"))
            xs, ys = [], []
            for r in shaped:
                row = rows.get((m, me, r))
                if row and base and base["tokens_per_s"]:
                    xs.append(rate_mbit(r))
                    ys.append(100 * row["tokens_per_s"] / base["tokens_per_s"])
            if xs:
                ax.plot(xs, ys, marker="o", label=METHOD_NAMES[me])
        ax.set_xscale("log")
        ax.set_xlabel("link rate per host (Mbit/s)")
        ax.set_ylabel("tokens/s, % of unshaped")
        ax.set_title(f"{m}: training rate per learner host")
        ax.axhline(90, color="grey", lw=0.6, ls="--")
        ax.axhline(50, color="grey", lw=0.6, ls=":")
        ax.axhline(10, color="grey", lw=0.6, ls="-.")
        ax.set_ylim(0, 115)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "utilisation.png"), dpi=110)
    plt.close(fig)


def plot_losses(rows, m, methods, rates, t_eq, target, plots):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rates), figsize=(3.6 * len(rates), 3.4), squeeze=False, sharey=True)
    # One colour per method on every panel (a panel without some method's row must not shift the others' colours).
    colour = {me: f"C{i}" for i, me in enumerate(methods)}
    for ax, r in zip(axes[0], rates):
        for me in methods:
            row = rows.get((m, me, r))
            if row and row["evals"]:
                ax.plot([e[0] for e in row["evals"]], [e[1] for e in row["evals"]], marker=".", label=METHOD_NAMES[me],
                        color=colour[me])
        ax.axvline(t_eq, color="grey", lw=0.6, ls="--")
        ax.axhline(target, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{m}, {rate_label(r)}")
        ax.set_xlabel("seconds since start")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation loss (nats/byte)")
    axes[0][0].set_ylim(top=min(5.7, axes[0][0].get_ylim()[1]))  # 5.55 nats: the untrained model
    handles, labels = [], []
    for ax in axes[0]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    if handles:
        axes[0][0].legend(handles, labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, f"loss-{m}.png"), dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("has")
    for k in ("results", "model", "method", "rate"):
        h.add_argument(f"--{k}", required=True)
    h.add_argument("--config", default="", help="with --steps 0: the config whose train.steps the row must have")
    h.add_argument("--steps", type=int, default=0)
    h.add_argument("--max-seconds", type=float, default=0)
    h.add_argument("--learners", type=int, default=0)
    h.add_argument("--repeat", type=int, default=0)
    c = sub.add_parser("collect")
    c.add_argument("--results", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--config", required=True)
    c.add_argument("--method", required=True)
    c.add_argument("--rate", required=True)
    c.add_argument("--learners", type=int, required=True)
    c.add_argument("--t0", type=float, required=True)
    c.add_argument("--t1", type=float, required=True)
    c.add_argument("--rc", type=int, default=0)
    c.add_argument("--max-seconds", type=float, default=0)
    c.add_argument("--steps", type=int, default=0)
    c.add_argument("--commit", default="")
    c.add_argument("--ddp-timeout", type=float, default=0)
    c.add_argument("--tcp-cc", default="", help="the hosts' TCP congestion control (bench/wan.sh --tcp; '': the kernel's)")
    c.add_argument("--repeat", type=int, default=0, help="which repeat of the row this run is (bench/wan.sh --repeats)")
    r = sub.add_parser("report")
    r.add_argument("--results", default=os.path.join(ROOT, "docs", "wan", "results.jsonl"))
    r.add_argument("--doc", default=os.path.join(ROOT, "docs", "wan.md"))
    r.add_argument("--plots", default=os.path.join(ROOT, "docs", "wan"))
    r.add_argument("--target", default="", help="target loss per model: demo=1.9,large=1.8")
    r.add_argument("--equal-wall", default="", help="equal wall time per model in seconds: demo=60")
    r.add_argument("--notes", default="", help="a Markdown file appended to the page (an analysis written by hand)")
    r.add_argument("--status", default="", help="a paragraph under the title (e.g. what run this is)")
    a = ap.parse_args()
    if a.cmd == "has":  # the row exists, measured at the same scale (steps, bound, learners)
        row = read_all(a.results).get((a.model, a.method, a.rate, a.repeat))
        steps = a.steps
        if not steps and a.config:
            with open(a.config, "rb") as f:
                steps = tomllib.load(f).get("train", {}).get("steps", 1500)
        same = row is not None and (not steps or row["steps"] == steps) and \
            (not a.max_seconds or row["max_seconds"] == a.max_seconds) and (not a.learners or row["learners"] == a.learners)
        sys.exit(0 if same else 1)
    if a.cmd == "collect":
        return cmd_collect(a)
    return cmd_report(a)


if __name__ == "__main__":
    main()
