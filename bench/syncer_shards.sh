#!/usr/bin/env bash
# A sharded syncer (issue 13): memory and merges per shard against S, measured on running shards. One `deloco run`
# per (round, S), S values in turn each round: M learners, P fragments, one model sized by N_EMBD and N_LAYER
# (default 768 and 8: 57M parameters), a short run (STEPS inner steps, H = 10), chaos off.
# Reported per S, medians over rounds, from each shard's own summary (RUN/shard-s/syncer-summary.json; the
# unsharded syncer's RUN/syncer-summary.json):
#   peak RSS per shard  = the largest VmHWM of the S shard processes: Θ and the outer state of its fragments, the
#                         merge working set (≈ (2M + 8) × 4 B per parameter it serves, docs/runtime.md), its fp32
#                         state snapshot for joins, and what every shard holds whole: libtorch and one model replica
#                         (the evaluator; it fixes the fingerprint and, on shard 0, evaluates)
#   parameters per shard = the largest shard's share of the model
# Usage: bench/syncer_shards.sh [ROUNDS=3] [SHARDS="1 2 4"] [STEPS=40] [LEARNERS=2] [FRAGMENTS=8]
set -euo pipefail
ROUNDS=${1:-3}
SHARDS=${2:-"1 2 4"}
STEPS=${3:-40}
M=${4:-2}
P=${5:-8}
N_EMBD=${N_EMBD:-768}
N_LAYER=${N_LAYER:-8}
BIN=${DELOCO_BINARY:-./build/deloco}
OUT=$(mktemp -d /tmp/deloco-shards.XXXXXX)
echo "round shards peak_rss_max_bytes shard_params_max total_params merges wall" > "$OUT/results.txt"
for r in $(seq 1 "$ROUNDS"); do
  for S in $SHARDS; do
    run="$OUT/r$r-$S"
    "$BIN" run --config configs/tiny.toml --set model.n_embd="$N_EMBD" --set model.n_layer="$N_LAYER" \
      --set model.n_head=8 --set model.block_size=64 --set train.batch_size=1 --set train.steps="$STEPS" \
      --set train.eval_every=0 --set train.eval_tokens=2048 --set train.warmup_steps=2 --set sync.learners="$M" \
      --set sync.quorum=1 --set sync.fragments="$P" --set sync.sync_every=10 --set sync.wait_for_answer=false \
      --set syncer.shards="$S" --set syncer.eval_interval=0 --set syncer.metrics= --set chaos.enabled=false \
      --set net.plaintext=true --set syncer.out_dir="$run" --summary "$run.json" > "$run.log" 2>&1
    /usr/bin/python3 - "$run" "$S" "$r" >> "$OUT/results.txt" <<'PY'
import json, os, sys
run, S, r = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dirs = [run] if S == 1 else [os.path.join(run, f"shard-{k}") for k in range(S)]
sums = [json.load(open(os.path.join(d, "syncer-summary.json"))) for d in dirs]
total = sum(s["parameters"] for s in sums)
print(r, S, max(s["peak_rss_bytes"] for s in sums), max(s["parameters"] for s in sums), total,
      sum(s["outer_steps"] for s in sums), max(s["wall_seconds"] for s in sums))
PY
    tail -1 "$OUT/results.txt"
  done
done
/usr/bin/python3 - "$OUT/results.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
shards = sorted({int(r[1]) for r in rows})
print("| shards S | parameters per shard (largest) | peak RSS per shard (largest, median) | bytes per model parameter | merges |")
print("|---|---|---|---|---|")
for S in shards:
    mine = [r for r in rows if int(r[1]) == S]
    rss = statistics.median(float(r[2]) for r in mine)
    part, total = int(mine[0][3]), int(mine[0][4])
    print(f"| {S} | {part / 1e6:.1f}M of {total / 1e6:.1f}M | {rss / 2**20:,.0f} MiB | {rss / total:.1f} | "
          f"{statistics.median(int(r[5]) for r in mine):.0f} |")
PY
echo "raw results: $OUT/results.txt"
