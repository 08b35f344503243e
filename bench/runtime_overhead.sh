#!/usr/bin/env bash
# Inner-step throughput of a learner inside the distributed runtime against `deloco train` alone (issue 5 goal:
# overhead under 3%). Side by side, alternating A/B rounds in one run, on the demo model:
#   A  M `deloco train` processes at once, one thread each (the same CPU load as M learners, no runtime)
#   B  `deloco run` with M learners (one thread each) + the syncer, chaos off, CURVE on
# Throughput: A = the train summary's tokens_per_s (time inside train_step only, which favours A);
#             B = each learner's steps_trained / wall time of its training loop × tokens per step (includes
#             applying merged fragments, copying pushes and every other cost the runtime adds to the loop).
# Usage: bench/runtime_overhead.sh [ROUNDS=3] [STEPS=300] [M=2]   (from the repository root, after the build)
set -euo pipefail
ROUNDS=${1:-3}
STEPS=${2:-300}
M=${3:-2}
BIN=${DELOCO_BINARY:-./build/deloco}
CFG=configs/demo.toml
OUT=$(mktemp -d /tmp/deloco-overhead.XXXXXX)
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# `deloco train` knows only the model, data and train sections: the same model from a stripped copy.
awk '/^\[/ { keep = ($0 == "[model]" || $0 == "[data]" || $0 == "[train]") } keep' "$CFG" > "$OUT/train.toml"
flags=(--set train.steps="$STEPS" --set train.threads=1 --set train.eval_every=0 --set train.eval_tokens=4096)
tps_step=$(( $(grep -E '^batch_size' "$CFG" | grep -oE '[0-9]+' | head -1) * $(grep -E '^block_size' "$CFG" | grep -oE '[0-9]+' | head -1) ))
echo "round variant tokens_per_s_per_learner" > "$OUT/results.txt"
for r in $(seq 1 "$ROUNDS"); do
  # A: M trainers at once.
  pids=()
  for m in $(seq 0 $((M - 1))); do
    "$BIN" train --config "$OUT/train.toml" "${flags[@]}" --set train.learner_id="$m" --set train.num_learners="$M" \
      --set train.checkpoint_every=0 --set train.out_dir="$OUT/a$r-$m" --summary "$OUT/a$r-$m.json" \
      > "$OUT/a$r-$m.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  a=$(jq -s 'map(.tokens_per_s) | add / length' "$OUT"/a$r-*.json)
  echo "$r train $a" >> "$OUT/results.txt"
  # B: the runtime.
  "$BIN" run --config "$CFG" "${flags[@]}" --set sync.learners="$M" --set chaos.enabled=false --set syncer.eval_interval=0 \
    --set syncer.out_dir="$OUT/b$r" --summary "$OUT/b$r.json" > "$OUT/b$r.log" 2>&1
  b=$(cat "$OUT"/b$r/learner-*.jsonl | jq -s --argjson t "$tps_step" \
      'map(select(.kind == "learner_done")) | map(.steps_per_second * $t) | add / length')
  cf=$(cat "$OUT"/b$r/learner-*.jsonl | jq -s 'map(select(.kind == "learner_done")) | map(.comm_fraction) | add / length')
  echo "$r runtime $b comm_fraction=$cf" >> "$OUT/results.txt"
done
cat "$OUT/results.txt"
/usr/bin/python3 - "$OUT/results.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
a = statistics.median(float(r[2]) for r in rows if r[1] == "train")
b = statistics.median(float(r[2]) for r in rows if r[1] == "runtime")
print(f"median tokens/s per learner: train alone {a:.0f}, runtime {b:.0f}, ratio {b/a:.3f} (overhead {100*(1-b/a):.1f}%)")
PY
echo "raw results and logs: $OUT"
