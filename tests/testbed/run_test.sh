#!/usr/bin/env bash
# `deloco run` across the testbed (ctest testbed.run): the syncer on host 0, two learners on hosts 1 and 2, every
# link 20 Mbit/s, CURVE over TCP between the hosts' addresses. Learner 1's host is partitioned (its link down) for
# 10 s mid-run, then healed. Checks: the run finishes, both learners finish every step, learner 0 kept merging while
# learner 1 was cut off, learner 1 noticed the partition and joined again after the heal (the times from heal to its
# join and to its next merged push are printed), no push is rejected, merge counts never go back, and each host's
# link (its interface's counters) carried at least the bytes its learner counted as sent (learner 0, never cut:
# at most 1.25x, the framing; learner 1: the bytes of the pushes it sent while its link was up).
# The run goes as if started by `sudo` from uid 65534 (SUDO_UID/SUDO_GID): every process on the hosts runs as
# 65534 (the summary's testbed.uid, the owner of the records they wrote), none as root.
# Then one learner of 2 ranks on the same testbed: its ranks on hosts 1 and 2, the all-reduce on both links; no
# sudo user this time, so its processes keep root and deloco run says so.
# Skips (77) where no testbed can be made (not root). Bounded: the run has a 240 s timeout; the testbed is removed
# on every exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/testbed.sh check || { echo "testbed run test skipped"; exit 77; }
# One testbed at a time on this machine (all share 198.18.255.254): wait for the others' (ctest's RESOURCE_LOCK
# orders only ctest's own tests).
exec 9>/tmp/deloco-testbed.lock
flock -w 300 9 || { echo "FAIL: another testbed held /tmp/deloco-testbed.lock for 5 minutes" >&2; exit 1; }
DELOCO=${1:-build/deloco}
unset SUDO_UID SUDO_GID   # whom the runs' processes run as is this test's choice, whoever started it
export TESTBED_NAME=dlr$$
TB=scripts/testbed.sh
PY=/usr/bin/python3
out=$(mktemp -d); echo "run folder: $out"
chmod 755 "$out"   # the run's processes run as uid 65534: they must reach their run folder
trap '$TB down >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; tail -30 "$out/run.log" >&2 || true; exit 1; }

$TB up --hosts 3 --rate 20mbit
SUDO_UID=65534 SUDO_GID=65534 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE timeout 240 "$DELOCO" run --config configs/tiny.toml \
  --set syncer.out_dir="$out/run" --set testbed.name="$TESTBED_NAME" --set sync.learners=2 --set sync.quorum=1 \
  --set sync.fragments=2 --set sync.sync_every=10 --set train.steps=1500 --set train.threads=1 \
  --set net.dead_after=5 > "$out/run.log" 2>&1 &
run=$!
# The partition starts once learner 1 has merged something (its records say it trains over the testbed).
for _ in $(seq 1 600); do
  grep -q '"kind":"push"' "$out/run/learner-1.jsonl" 2>/dev/null && break
  kill -0 $run 2>/dev/null || fail "deloco run ended before learner 1 pushed"
  sleep 0.1
done
sleep 2
cut_t=$(date +%s.%N); $TB link 2 down
sleep 10
heal_t=$(date +%s.%N); $TB link 2 up
wait $run || fail "deloco run exited $?"

grep -q "run as .*(uid 65534, gid 65534, from sudo)" "$out/run.log" ||
  fail "deloco run did not say that the hosts' processes run as the sudo user"
for f in syncer.jsonl learner-0.jsonl learner-1.jsonl; do
  [ "$(stat -c %u:%g "$out/run/$f")" = 65534:65534 ] || fail "$f was written as $(stat -c %u:%g "$out/run/$f"), not 65534"
done
tx1=$($TB counters 1 | sed 's/.*tx_bytes=\([0-9]*\).*/\1/')
tx2=$($TB counters 2 | sed 's/.*tx_bytes=\([0-9]*\).*/\1/')
$PY - "$out/run" "$cut_t" "$heal_t" "$tx1" "$tx2" <<'PY'
import json, sys
run, cut, heal = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
link_tx = {0: int(sys.argv[4]), 1: int(sys.argv[5])}  # learner n runs on host n + 1
def records(name):
    with open(f"{run}/{name}") as f:
        return [json.loads(l) for l in f if l.strip()]
syncer = records("syncer.jsonl")
merges = [r for r in syncer if r["kind"] == "merge"]
during = [m for m in merges if cut + 6 < m["t"] < heal]
assert during and all(m["learners"] == [0] for m in during), "learner 0 did not merge alone while learner 1 was cut off"
learner1 = records("learner-1.jsonl")
joined = [r for r in learner1 if r["kind"] == "joined" and r["t"] > heal]
assert joined, "learner 1 never joined again after the heal"
lost = [r for r in learner1 if r["kind"] == "syncer_lost" and cut < r["t"] < heal]
assert lost, "learner 1 did not notice the partition (no syncer_lost record)"
late = [m for m in merges if heal < m["t"] < joined[0]["t"] and 1 in m["learners"]]
after = [m for m in merges if m["t"] > joined[0]["t"] and 1 in m["learners"]]
counts = [m["merges"] for m in merges]
assert counts == sorted(counts), "merge counts went back"
rejects = [r for r in syncer if r["kind"] == "reject"]
assert not rejects, f"pushes rejected: {rejects[:3]}"
s = json.load(open(f"{run}/summary.json"))
assert s["testbed"]["hosts"][0] == "198.18.0.1", s.get("testbed")
assert s["testbed"]["uid"] == 65534, f"the hosts' processes ran as uid {s['testbed']['uid']}, not the sudo user's"
sent = {}
for n in (0, 1):
    done = [r for r in records(f"learner-{n}.jsonl") if r["kind"] == "learner_done"]
    assert done and done[-1]["step"] == 1500, f"learner {n} did not finish: {done[-1:]}"
    sent[n] = done[-1]["bytes_sent"]
# Learner 0 was never cut off: its link carried at least every byte it counted. Learner 1's count includes what it
# queued while its link was down and before it noticed (ZeroMQ takes a message while the connection still looks up;
# the message dies with the connection), so its bound is the pushes it sent while the link was surely up: before
# the cut (1 s of margin) and after it joined again.
assert link_tx[0] >= sent[0], f"learner 0's link carried {link_tx[0]} bytes, fewer than the {sent[0]} it counted"
up = sum(r["bytes"] for r in learner1 if r["kind"] == "push" and (r["t"] < cut - 1 or r["t"] > joined[0]["t"]))
assert up > 0 and link_tx[1] >= up, f"learner 1's link carried {link_tx[1]} bytes, fewer than the {up} bytes of " \
    "pushes it sent while the link was up"
# Learner 0's link, never cut: its own accounting plus TCP/IP, ZMTP and CURVE framing.
assert link_tx[0] <= 1.25 * sent[0], f"learner 0's link carried {link_tx[0]} bytes for {sent[0]} counted"
again = f"{after[0]['t'] - heal:.1f} s after the heal" if after else "never (it had trained to its last step alone)"
print(f"learner 0 merged {len(during)} times alone while learner 1 was cut off; learner 1 noticed after "
      f"{lost[0]['silent_seconds']:.1f} s of silence, joined again {joined[0]['t'] - heal:.1f} s after the heal "
      f"(meanwhile {len(late)} merges took pushes it had queued before the cut) and contributed to a merge after "
      f"joining {again}; {len(merges)} merges, 0 rejected")
for n in (0, 1):
    print(f"learner {n}: {sent[n]} bytes sent by its own count, {link_tx[n]} on its host's link "
          f"({link_tx[n] / max(sent[n], 1):.3f}x)")
PY

# A learner group across hosts: one learner of 2 ranks on the same testbed (about 12 s). deloco run puts rank 0 on
# host 1 and rank 1 on host 2 (docs/testbed.md, Placement), the group's store at host 1's address, Gloo on eth0: both
# hosts' links carry the per-step all-reduce (the tiny model: about 0.28 MB per step each way).
link_counters() { for h in 1 2; do $TB counters $h | sed 's/.*tx_bytes=\([0-9]*\) rx_bytes=\([0-9]*\)/\1 \2/'; done; }
before=$(link_counters)
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE timeout 120 "$DELOCO" run --config configs/tiny.toml \
  --set syncer.out_dir="$out/group" --set testbed.name="$TESTBED_NAME" --set sync.learners=1 --set sync.quorum=1 \
  --set learner.ranks=2 --set sync.sync_every=20 --set train.steps=40 --set train.threads=1 --set chaos.enabled=false \
  > "$out/group.log" 2>&1 || { rc=$?; tail -30 "$out/group.log" >&2; fail "deloco run of a 2-rank learner exited $rc"; }
[ "$(grep -c "run as root: no other user" "$out/group.log")" = 1 ] ||
  fail "deloco run did not say once that the hosts' processes keep root (no sudo user)"
after=$(link_counters)
$PY - "$out/group" "$before" "$after" <<'PY'
import json, sys
run = sys.argv[1]
before = [[int(x) for x in l.split()] for l in sys.argv[2].splitlines()]
after = [[int(x) for x in l.split()] for l in sys.argv[3].splitlines()]
moved = {h: [a - b for a, b in zip(after[h - 1], before[h - 1])] for h in (1, 2)}  # [tx, rx]
s = json.load(open(f"{run}/summary.json"))
assert s["testbed"]["learner_hosts"] == [[1, 2]], s["testbed"]
assert s["testbed"]["uid"] == 0, f"no sudo user, yet the hosts' processes ran as uid {s['testbed']['uid']}"
logs = {r: open(f"{run}/logs/learner-0{'' if r == 0 else '.rank-1'}.log").read() for r in (0, 1)}
for r, text in logs.items():
    assert "--master-addr 198.18.0.2" in text, f"rank {r} was not told the group's store at host 1's address"
done = [json.loads(l) for l in open(f"{run}/learner-0.jsonl") if '"learner_done"' in l]
assert done and done[-1]["step"] == 40, f"the 2-rank learner did not finish: {done[-1:]}"
assert s.get("contributions_merged", 0) >= 1, "no merge"
# 40 steps of about 0.28 MB each way: at least 5 MB each way on both learner hosts' links (rank 1's is all-reduce).
for h in (1, 2):
    assert min(moved[h]) >= 5e6, f"host {h}'s link carried only {moved[h]} bytes (tx, rx): the all-reduce is not on it"
print(f"2-rank learner: rank 0 on host 1, rank 1 on host 2; links moved (tx, rx) host 1 {moved[1][0] / 1e6:.1f}, "
      f"{moved[1][1] / 1e6:.1f} MB, host 2 {moved[2][0] / 1e6:.1f}, {moved[2][1] / 1e6:.1f} MB; "
      f"{s['contributions_merged']} contributions merged")
PY
echo "testbed run test passed"
