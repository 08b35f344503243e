#!/usr/bin/env bash
# The three experiments of docs/sim.md at tiny scale. Usage: scripts/sim-experiments.sh [OUT_DIR] [DELOCO]
# Writes one run folder per run under OUT_DIR (default runs/sim-exp) and prints the tables of docs/sim.md.
set -euo pipefail
out=${1:-runs/sim-exp}
deloco=${2:-./build/deloco}
mkdir -p "$out"
run() {  # run NAME CONFIG --set ...
  local name=$1 cfg=$2; shift 2
  if [ ! -f "$out/$name/summary.json" ]; then
    rm -rf "$out/$name"
    "$deloco" sim --config "$cfg" --set sim.out_dir="$out/$name" "$@" > "$out/$name.log" 2>&1
  fi
}
row() { jq -r --arg n "$1" '"| \($n) | \(.final_val_loss|.*10000|round/10000) | \(.uptime|.*1000|round/1000) | \(.goodput|.*1000|round/1000) | \(.outer_steps) | \(.contributions_merged) | \(.failures) | \(.tokens) |"' "$out/$1/summary.json"; }
header() { echo "| run | final val loss | uptime | goodput | fragment merges | contributions merged | failures | tokens |"; echo "|---|---|---|---|---|---|---|---|"; }

# 1. IsoLoCo vs DiLoCo at equal total tokens (1600 inner steps of batch 8 in all), M = 1..16.
total=1600
for M in 1 2 4 8 16; do
  steps=$((total / M))
  for algo in diloco isoloco; do
    run "e1-$algo-M$M" "configs/sim-$algo.toml" --set sync.learners=$M --set sync.quorum=$M \
      --set train.steps=$steps --set sync.sync_every=20 --set train.warmup_steps=$((steps / 10)) --set sim.eval_interval=0
  done
done
echo "### 1. IsoLoCo vs DiLoCo, equal total tokens"
echo "| M | DiLoCo | IsoLoCo | gap (DiLoCo − IsoLoCo) |"; echo "|---|---|---|---|"
for M in 1 2 4 8 16; do
  d=$(jq .final_val_loss "$out/e1-diloco-M$M/summary.json"); i=$(jq .final_val_loss "$out/e1-isoloco-M$M/summary.json")
  python3 -c "print(f'| $M | {$d:.4f} | {$i:.4f} | {$d-$i:+.4f} |')"
done

# 2. Heterogeneous learners: half 20% slower, 10% jitter. K = M vs K = 1 vs K = 1 + grace window.
het=(--set sim.slow_fraction=0.5 --set sim.slow_factor=1.2 --set sim.jitter=0.1 --set sim.mtbf=0 --set sync.fragments=1 --set sync.overlap=5)
run e2-KM configs/sim-decoupled.toml "${het[@]}" --set sync.quorum=4 --set sync.wait_for_answer=true --set sync.overlap=0 --set sync.grace=false
run e2-K1 configs/sim-decoupled.toml "${het[@]}" --set sync.quorum=1 --set sync.grace=false
run e2-K1-grace configs/sim-decoupled.toml "${het[@]}" --set sync.quorum=1 --set sync.grace=true
echo; echo "### 2. Heterogeneous learners"; header
for n in e2-KM e2-K1 e2-K1-grace; do row $n; done

# 3. Failures: every learner fails every ~4 outer rounds on average and is down 20 s.
run e3-diloco configs/sim-diloco.toml --set sim.mtbf=100 --set sim.downtime=20
run e3-decoupled configs/sim-decoupled.toml
echo; echo "### 3. Failures"; header
for n in e3-diloco e3-decoupled; do row $n; done
