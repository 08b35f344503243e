#!/usr/bin/env bash
# bench/peer_rejoin.sh — rejoin from peers (issue 34, docs/reliability.md): how long a restarted learner takes to get
# the global state from the syncer alone, and from the syncer plus 4 donor learners, on a testbed whose every host
# sends at RATE (scripts/testbed.sh; egress shaped, as an uplink-bound host). Side by side in one run: phase 1 a
# cluster whose syncer names no donors (net.donors=0: the classic download), phase 2 the same cluster with
# net.donors=4 and net.serve=auto. In each phase the joining learner is SIGKILLed N times (deloco run restarts it)
# and each download's time is read from its `joined` record (hello to verified state). Prints the medians, their
# ratio and what the donors served, and appends one JSON line to --out.
#
#   bench/peer_rejoin.sh [--rate 100mbit] [--rejoins 4] [--embd 512] [--layers 2] [--out FILE]
#
# The cluster: configs/tiny.toml widened to n_embd x n_layer (512 x 2: 6.4M parameters, a 25 MB state), 5 learners,
# K = 4, P = 4, H = 50, learners never wait, int4 pushes, fp32 broadcasts, learner.slowdown = 3, CURVE.
#
# Needs root (namespaces) and build/deloco. Holds /tmp/deloco-testbed.lock; removes the testbed on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=100mbit rejoins=4 embd=512 layers=2 out=docs/reliability/peer_rejoin.jsonl
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --rejoins) rejoins=$2; shift 2 ;;
    --embd) embd=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n 2,13p "$0" >&2; exit 2 ;;
  esac
done
export TESTBED_NAME=peerb
TB=scripts/testbed.sh
runs=$(mktemp -d /tmp/deloco-peer-rejoin.XXXXXX)
exec 9>/tmp/deloco-testbed.lock
flock 9
run_pid=""
cleanup() {
  [ -n "$run_pid" ] && kill -INT "$run_pid" 2>/dev/null && sleep 3 && kill -KILL "$run_pid" 2>/dev/null
  pkill -KILL -f "$runs/" 2>/dev/null || true
  $TB down >/dev/null 2>&1 || true
  rm -rf "$runs"
}
trap cleanup EXIT
$TB up --hosts 6 --rate none >/dev/null
for h in 0 1 2 3 4 5; do $TB shape "$h" "$rate" egress >/dev/null; done

# The learner that rejoins: learner 4 (host 5); learners 0-3 are the donors (hosts 1-4), the syncer on host 0.
phase() { # donors -> prints the download seconds, one per line, and leaves $runs/d$1
  local donors=$1 dir=$runs/d$1 serve=""
  [ "$donors" -gt 0 ] && serve="--set net.serve=auto"
  ./build/deloco run --config configs/tiny.toml --set testbed.name=$TESTBED_NAME --set syncer.out_dir="$dir" \
    --set sync.learners=5 --set sync.quorum=4 --set sync.sync_every=50 --set sync.fragments=4 --set sync.wait_for_answer=false \
    --set model.n_embd="$embd" --set model.n_layer="$layers" --set model.n_head=8 --set train.steps=100000 \
    --set learner.slowdown=3 --set net.encoding=int4 --set syncer.eval_interval=0 --set net.donors="$donors" $serve \
    --set net.join_timeout=120 >"$dir.console.log" 2>&1 &
  run_pid=$!
  local f=$dir/learner-4.jsonl n=0 tries=0
  # The first merge (so a restarted learner's own seeded state is not the syncer's), and learner 4 joined.
  until [ -f "$dir/syncer.jsonl" ] && grep -q '"kind":"merge"' "$dir/syncer.jsonl" && [ -f "$f" ] && grep -q '"kind":"joined"' "$f"; do
    sleep 1; tries=$((tries + 1)); [ $tries -lt 600 ] || { echo "peer_rejoin: no merge after 600 s" >&2; exit 1; }
  done
  while [ $n -lt "$rejoins" ]; do
    local before pid
    before=$(grep -c '"kind":"joined"' "$f" || true)
    pid=$(pgrep -f "^/[^ ]*/deloco learner .* --id 4 " | head -1 || true)  # the learner itself, not its ip-netns wrapper
    [ -n "$pid" ] || { sleep 1; continue; }
    kill -KILL "$pid" 2>/dev/null || { sleep 1; continue; }
    tries=0
    until [ "$(grep -c '"kind":"joined"' "$f" || true)" -gt "$before" ]; do
      sleep 1; tries=$((tries + 1)); [ $tries -lt 300 ] || { echo "peer_rejoin: learner 4 did not rejoin" >&2; exit 1; }
    done
    n=$((n + 1))
    # The donors settle (they apply the merges made meanwhile), and deloco run's crash-loop policy (5 exits in 120 s
    # end a process) is kept clear of: at most 4 kills in any 120 s.
    sleep 32
  done
  kill -INT "$run_pid"; wait "$run_pid" || true; run_pid=""
}
phase 0
phase 4
/usr/bin/python3 - "$runs" "$rate" "$embd" "$layers" "$out" "$rejoins" <<'PY'
import json, os, statistics, sys, time
runs, rate, embd, layers, out, rejoins = sys.argv[1:]
def joins(d):  # the downloads of the restarted processes: the last `rejoins` (the first join may have downloaded too)
    rs = [json.loads(l) for l in open(os.path.join(runs, d, "learner-4.jsonl")) if l.strip()]
    return [r for r in rs if r.get("kind") == "joined" and r.get("download_bytes", 0) > 0][-int(rejoins):]
alone, peers = joins("d0"), joins("d4")
served = 0
for n in range(4):
    for l in open(os.path.join(runs, "d4", f"learner-{n}.jsonl")):
        r = json.loads(l)
        if r.get("kind") == "learner_done": served += r.get("served_bytes", 0)
# What serving costs the donors' training: each donor's step rate across a download (from its last progress record
# before the download began to its first after it ended) over its rate in the 12 s before; the same ratio in the
# syncer-only phase is the control (a restarting process loads the machine either way).
def rate_ratios(d, downloads):
    out = []
    for n in range(4):
        prog = [json.loads(l) for l in open(os.path.join(runs, d, f"learner-{n}.jsonl")) if '"kind":"learner"' in l]
        prog = [(r["t"], r["step"]) for r in prog]
        def rate(a, b):  # steps per second between the last record at or before a and the first at or after b
            lo = [p for p in prog if p[0] <= a]
            hi = [p for p in prog if p[0] >= b]
            if not lo or not hi or hi[0][0] <= lo[-1][0] or hi[0][1] < lo[-1][1]: return None
            return (hi[0][1] - lo[-1][1]) / (hi[0][0] - lo[-1][0])
        for r in downloads:
            t1 = r["t"]; t0 = t1 - r["download_seconds"]
            during, before = rate(t0, t1), rate(t0 - 12, t0 - 2)
            if during and before: out.append(during / before)
    return out
ctrl, serving = rate_ratios("d0", alone), rate_ratios("d4", peers)
ma = statistics.median(r["download_seconds"] for r in alone)
mp = statistics.median(r["download_seconds"] for r in peers)
row = {"t": time.time(), "rate": rate, "model_bytes": alone[0]["download_bytes"], "rejoins": len(alone),
       "syncer_only_s": [round(r["download_seconds"], 3) for r in alone],
       "four_donors_s": [round(r["download_seconds"], 3) for r in peers],
       "median_syncer_only_s": round(ma, 3), "median_four_donors_s": round(mp, 3), "ratio": round(mp / ma, 3),
       "peer_share": round(statistics.median(r.get("peer_bytes", 0) / r["download_bytes"] for r in peers), 3),
       "donors_served_bytes": served,
       "welcome_s": [round(r.get("welcome_seconds", 0), 3) for r in peers],
       "source_chunks": [r.get("source_chunks") for r in peers],
       "source_first_s": [[round(x, 3) for x in r.get("source_first_seconds", [])] for r in peers],
       "donor_refused": [r.get("donor_refused") for r in peers], "endgame_asks": [r.get("endgame_asks") for r in peers],
       "donor_step_rate_ratio_control": round(statistics.median(ctrl), 3) if ctrl else None,
       "donor_step_rate_ratio_serving": round(statistics.median(serving), 3) if serving else None}
print(f"peer_rejoin: {row['model_bytes'] / 1e6:.1f} MB state at {rate} per host: syncer alone median {ma:.2f} s "
      f"{row['syncer_only_s']}, with 4 donors median {mp:.2f} s {row['four_donors_s']}: {100 * mp / ma:.0f}% of the "
      f"time; donors served {100 * row['peer_share']:.0f}% of each download")
print(f"peer_rejoin: donors' step rate during a download over before it: {row['donor_step_rate_ratio_serving']} serving "
      f"(median of {len(serving)}), {row['donor_step_rate_ratio_control']} in the syncer-only phase (control, {len(ctrl)})")
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "a") as f: f.write(json.dumps(row) + "\n")
PY
