#!/usr/bin/env bash
# Codecs fitted to the link (ctest testbed.codec_fit; docs/runtime.md, "Codecs fitted to the link"): `deloco run` on a
# testbed of 3 hosts whose links are shaped to 2 Mbit/s, with the codecs it defaults to there (net.encoding = auto,
# net.broadcast_encoding = auto). The demo model's fp32 pushes (2.5 MB every 40 steps: 10 s at 2 Mbit/s) fit such a
# link only if a step took over 0.3 s (the demo's take 0.03-0.1 s, on a machine loaded by a parallel ctest too; at
# 10 Mbit/s a loaded machine's slow steps made fp32 fit, rightly); checks: the run finishes every step; the syncer measured each learner's link near its shaped rate (within
# 4x: the rates are estimates on a shared 2-core machine) and fitted both learners to codecs coarser than fp32
# (codec_changed records, the summary's codecs); the learners' later pushes are smaller than an fp32 push of
# their fragment; the broadcasts went out as deltas in the fitted codec; no push was rejected; the model trained.
# Skips (77) where no testbed can be made (not root). Bounded: the run has a 150 s timeout; the testbed is removed
# on every exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/testbed.sh check || { echo "testbed codec fit test skipped"; exit 77; }
exec 9>/tmp/deloco-testbed.lock
flock -w 300 9 || { echo "FAIL: another testbed held /tmp/deloco-testbed.lock for 5 minutes" >&2; exit 1; }
DELOCO=${1:-build/deloco}
unset SUDO_UID SUDO_GID
export TESTBED_NAME=dlc$$
TB=scripts/testbed.sh
out=$(mktemp -d); echo "run folder: $out"
trap '$TB down >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; tail -30 "$out/run.log" >&2 || true; exit 1; }

$TB up --hosts 3 --rate 2mbit
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE timeout 150 "$DELOCO" run --config configs/demo.toml \
  --set syncer.out_dir="$out/run" --set testbed.name="$TESTBED_NAME" --set sync.learners=2 \
  --set chaos.enabled=false --set syncer.checkpoint_every=0 --set train.steps=240 --set train.threads=1 \
  --set syncer.eval_interval=0 > "$out/run.log" 2>&1 || fail "deloco run failed"

/usr/bin/python3 - "$out/run" <<'PY'
import json, sys
run = sys.argv[1]
def records(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]
syncer = json.load(open(f"{run}/syncer-summary.json"))
config = json.load(open(f"{run}/config.json"))
errors = []
if config["net"]["encoding"] != "auto" or config["net"]["broadcast_encoding"] != "auto":
    errors.append(f"deloco run on a testbed did not default to auto codecs: {config['net']}")
codecs = syncer.get("codecs")
if not codecs or len(codecs) != 2 or any(c is None for c in codecs):
    errors.append(f"the summary has no fit for every learner: {codecs}")
rate = 2e6 / 8
for m, c in enumerate(codecs or []):
    if not c:
        continue
    print(f"learner {m}: push {c['push']}, broadcast {c['broadcast']}, period {c['period']}, fits {c['fits']}, "
          f"up {c['up_rate'] / 1e6:.2f} MB/s, down {c['down_rate'] / 1e6:.2f} MB/s (link {rate / 1e6:.2f})")
    if c["push"] == "fp32":
        errors.append(f"learner {m} pushes fp32 across a 2 Mbit/s link")
    if not rate / 4 <= c["up_rate"] <= rate * 4:
        errors.append(f"learner {m}'s uplink measured at {c['up_rate']:.0f} B/s, the link carries {rate:.0f}")
    if c["down_rate"] > 0 and not rate / 4 <= c["down_rate"] <= rate * 4:
        errors.append(f"learner {m}'s downlink measured at {c['down_rate']:.0f} B/s, the link carries {rate:.0f}")
changes = [r for r in records(f"{run}/syncer.jsonl") if r["kind"] == "codec_changed"]
for m in range(2):
    if not any(r["scope"] == "learner" and r.get("learner") == m for r in changes):
        errors.append(f"no codec_changed record for learner {m}")
# The deltas start in int4 and change (a scope broadcast record) only if a fit allows finer: at 2 Mbit/s none need.
if syncer.get("delta_encoding") in (None, "", "fp32"):
    errors.append(f"the delta broadcast ended in {syncer.get('delta_encoding')!r}")
if syncer.get("deltas_sent", 0) == 0:
    errors.append("no broadcast went out as a delta")
if syncer.get("contributions_rejected", 0):
    errors.append(f"{syncer['contributions_rejected']} contributions rejected")
for m in range(2):
    recs = records(f"{run}/learner-{m}.jsonl")
    done = [r for r in recs if r["kind"] == "learner_done"]
    if not done or done[-1].get("step") != 240:
        errors.append(f"learner {m} did not finish its 240 steps: {done[-1] if done else None}")
    pushes = [r for r in recs if r["kind"] == "push"]
    late = pushes[len(pushes) // 2:]
    # The demo's fragments hold 0.16M parameters each: an fp32 push is about 640 kB.
    big = [p for p in late if p["bytes"] >= 0.6e6 or p.get("encoding") == "fp32"]
    print(f"learner {m}: {len(pushes)} pushes in " + ", ".join(sorted({p.get('encoding', '?') for p in pushes})) +
          f"; the later half {min(p['bytes'] for p in late) if late else 0}-{max(p['bytes'] for p in late) if late else 0} bytes")
    if not late or big:
        errors.append(f"learner {m}: {len(big)} of its later pushes are fp32")
s = json.load(open(f"{run}/summary.json"))
# The demo's text is bytes: a model that learned nothing is at ln 256 = 5.55 nats per byte.
print(f"final val loss {s['final_val_loss']:.3f}")
if not s["final_val_loss"] < 3.5:
    errors.append(f"the model did not train: final validation loss {s['final_val_loss']}")
if errors:
    print("FAIL: " + "\nFAIL: ".join(errors), file=sys.stderr)
    sys.exit(1)
print("codec fit test passed")
PY
