#!/usr/bin/env bash
# bench/apply_sim.sh — how a learner applies late answers, in the simulator (issue 56): the demo's testbed rows
# (configs/sim-wan.toml) with answers on time and ~27 steps late, for each apply rule and outer momentum, two seeds;
# one JSON line per run into the results, then docs/apply-rule.md (bench/apply_report.py). Deterministic: the
# simulator's virtual clock does not depend on the machine's load. ~1 minute per run, two at a time.
#
#   bench/apply_sim.sh [--out FILE] [--doc FILE] [--jobs N] [--seeds "1 2"] [--latencies "0 13"]
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/apply/sim.jsonl
doc=docs/apply-rule.md
jobs=2
seeds="1 2"
latencies="0 13"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --doc) doc=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --latencies) latencies=$2; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) echo "apply_sim.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x build/deloco ] || { echo "apply_sim.sh: build/deloco is missing (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d /tmp/apply-sim.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# rule name | its --set arguments
variants=(
  "overwrite|sync.apply=overwrite outer.momentum=0.9"
  "mix|sync.apply=overwrite sync.alpha=0.5 outer.momentum=0.9"
  "overwrite-mu0.6|sync.apply=overwrite outer.momentum=0.6"
  "rebase-mu0.9|sync.apply=rebase outer.momentum=0.9"
  "rebase|sync.apply=rebase outer.momentum=0.6"
)
run_one() {  # rule latency seed sets...
  local rule=$1 lat=$2 seed=$3; shift 3
  local name="$rule-l$lat-s$seed" args=()
  for kv in "$@"; do args+=(--set "$kv"); done
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 build/deloco sim --config configs/sim-wan.toml "${args[@]}" \
    --set sim.latency="$lat" --set sim.seed="$seed" --set sim.out_dir="$tmp/$name" \
    --summary "$tmp/$name.json" > "$tmp/$name.log" 2>&1 || { echo "apply_sim.sh: $name failed: $tmp/$name.log" >&2; return 1; }
  /usr/bin/python3 bench/apply_report.py row --summary "$tmp/$name.json" --metrics "$tmp/$name/metrics.jsonl" \
    --rule "$rule" --latency "$lat" --seed "$seed" --sets "$*" > "$tmp/$name.row"
  echo "  $name: $(cut -c1-160 "$tmp/$name.row")"
}
pids=()
for v in "${variants[@]}"; do
  rule=${v%%|*}; sets=${v#*|}
  for lat in $latencies; do
    for seed in $seeds; do
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
      # shellcheck disable=SC2086
      run_one "$rule" "$lat" "$seed" $sets &
      pids+=($!)
    done
  done
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$tmp"/*.row > "$out"
/usr/bin/python3 bench/apply_report.py report --results "$out" --doc "$doc"
echo "apply_sim.sh: $(wc -l < "$out") runs in $out, $doc written"
exit $rc
