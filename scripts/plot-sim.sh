#!/usr/bin/env bash
# Plots validation loss of the global model against tokens and against virtual time for one or more
# `deloco sim` run folders:   scripts/plot-sim.sh OUT.png RUN_DIR [RUN_DIR ...]
# Needs jq and gnuplot (Debian: apt-get install jq gnuplot-nox).
set -euo pipefail
if [ $# -lt 2 ]; then echo "usage: $0 OUT.png RUN_DIR [RUN_DIR ...]" >&2; exit 2; fi
out=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
by_tokens="" by_time=""
i=0
for run in "$@"; do
  [ -f "$run/metrics.jsonl" ] || { echo "$0: no $run/metrics.jsonl" >&2; exit 1; }
  jq -r 'select(.kind=="eval" or .kind=="final_eval") | "\(.tokens) \(.t) \(.val_loss)"' "$run/metrics.jsonl" > "$tmp/$i.dat"
  title=$(basename "$run")
  by_tokens+="${by_tokens:+, }'$tmp/$i.dat' using 1:3 with linespoints title '$title'"
  by_time+="${by_time:+, }'$tmp/$i.dat' using 2:3 with linespoints title '$title'"
  i=$((i + 1))
done
gnuplot <<GP
set terminal pngcairo size 1400,550 noenhanced
set output '$out'
set multiplot layout 1,2
set grid
set ylabel 'validation loss (nats/byte)'
set xlabel 'tokens (all learners)'
plot $by_tokens
set xlabel 'virtual time (s)'
plot $by_time
unset multiplot
GP
echo "wrote $out"
