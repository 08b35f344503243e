#!/usr/bin/env bash
# A learner as a data-parallel group (issue 13): throughput and the all-reduce's share of the step for R ranks
# per learner, side by side, R values in turn each round, one `deloco run` per (round, R): one learner
# (sync.learners=1), the syncer, chaos off, each rank one thread.
# Reported per R, medians over rounds, from rank 0's learner_done record:
#   tokens/s       = steps_trained / wall time of its training loop × tokens per step of the group (b × T × R)
#   comm share     = group_comm_seconds / wall: gradient all-reduce time not hidden behind backward, plus the
#                    boundary broadcasts (control message, changed fragments)
# Usage: bench/learner_group.sh [ROUNDS=3] [STEPS=120] [RANKS="1 2"] [CONFIG=configs/demo.toml]
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-120}
RANKS=${3:-"1 2"}
CFG=${4:-configs/demo.toml}
BIN=${DELOCO_BINARY:-./build/deloco}
OUT=$(mktemp -d /tmp/deloco-group.XXXXXX)
tps_step=$(( $(grep -E '^batch_size' "$CFG" | grep -oE '[0-9]+' | head -1) * $(grep -E '^block_size' "$CFG" | grep -oE '[0-9]+' | head -1) ))
echo "round ranks tokens_per_s comm_share" > "$OUT/results.txt"
for r in $(seq 1 "$ROUNDS"); do
  for R in $RANKS; do
    "$BIN" run --config "$CFG" --set train.steps="$STEPS" --set train.eval_every=0 --set train.eval_tokens=4096 \
      --set sync.learners=1 --set sync.quorum=1 --set learner.ranks="$R" --set chaos.enabled=false --set syncer.eval_interval=0 \
      --set syncer.out_dir="$OUT/r$r-$R" --summary "$OUT/r$r-$R.json" > "$OUT/r$r-$R.log" 2>&1
    jq -r --arg r "$r" --arg R "$R" --argjson t "$tps_step" 'select(.kind == "learner_done") |
      "\($r) \($R) \(.steps_per_second * $t * ($R | tonumber)) \(.group_comm_seconds / .wall_seconds)"' \
      "$OUT/r$r-$R/learner-0.jsonl" >> "$OUT/results.txt"
    tail -1 "$OUT/results.txt"
  done
done
/usr/bin/python3 - "$OUT/results.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
ranks = sorted({int(r[1]) for r in rows})
base = None
print("| ranks per learner | tokens/s (median) | speed-up | all-reduce + broadcast share of the loop |")
print("|---|---|---|---|")
for R in ranks:
    tps = statistics.median(float(r[2]) for r in rows if int(r[1]) == R)
    share = statistics.median(float(r[3]) for r in rows if int(r[1]) == R)
    base = base or tps
    print(f"| {R} | {tps:.0f} | {tps / base:.2f}x | {100 * share:.1f}% |")
PY
echo "raw results and logs: $OUT"
