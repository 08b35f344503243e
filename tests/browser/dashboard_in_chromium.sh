#!/usr/bin/env bash
# The live dashboard of a running `deloco run`, loaded twice in headless Chromium from the URL the run prints:
# the charts have data points, the learner table shows every learner, values grow between the two reads, the
# page wrote nothing to the console, and its data (api/data) names no absolute path.
# Usage: dashboard_in_chromium.sh DELOCO_BINARY SOURCE_DIR. Exits 77 (skipped) when no chromium is installed.
set -euo pipefail
deloco=$1 src=$2
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "skipped: no chromium (scripts/setup.sh installs it)"; exit 77; fi
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE
"$deloco" run --config "$src/configs/tiny.toml" --set data.path="$src/data/sotu" --set train.steps=100000 \
  --set sync.learners=2 --set sync.quorum=1 --set sync.fragments=4 --set sync.sync_every=40 \
  --set syncer.eval_interval=1 --set train.eval_tokens=2048 --set syncer.metrics=127.0.0.1:0 \
  --set syncer.out_dir="$tmp/run" > "$tmp/run.log" 2>&1 &
pid=$!
url=""
for _ in $(seq 1 240); do
  url=$(grep -o 'dashboard: http://127.0.0.1:[0-9]*/' "$tmp/run.log" | tail -1 | cut -d' ' -f2 || true)
  [ -n "$url" ] && grep -q '"kind":"eval"' "$tmp/run/syncer.jsonl" 2>/dev/null && break
  sleep 0.5
done
[ -n "$url" ] || { echo "FAIL: deloco run printed no dashboard URL"; cat "$tmp/run.log"; exit 1; }
echo "dashboard at $url"
read_page() {  # $1: output name. Waits (in virtual time) for two refreshes of the page's data.
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
    --virtual-time-budget=5000 --dump-dom "$url" > "$tmp/$1.html" 2> "$tmp/$1.log"
}
points() { grep -o "id=\"$2\" data-points=\"[0-9]*\" data-rendered=\"1\"" "$tmp/$1.html" | grep -o 'points="[0-9]*' | tr -dc 0-9 || true; }
read_page first
sleep 4
read_page second
fail=0
for chart in loss-time loss-tokens bpb-time merge-rate quorum grace learner-loss learner-step; do
  a=$(points first $chart) b=$(points second $chart)
  if [ -z "$b" ] || [ "$b" -eq 0 ]; then echo "FAIL: chart $chart has no data points"; fail=1;
  else echo "chart $chart: $a then $b points"; fi
done
a=$(points first learner-step) b=$(points second learner-step)
if [ -z "$a" ] || [ -z "$b" ] || [ "$b" -le "$a" ]; then echo "FAIL: the learners' steps did not grow between two reads ($a, $b)"; fail=1; fi
for id in 0 1; do
  grep -q "<tr class=\"learner\"><td>run</td><td>$id</td><td class=\"state-training\">training</td>" "$tmp/second.html" ||
    { echo "FAIL: the learner table does not show learner $id training"; fail=1; }
done
grep -q 'data-reads="[1-9]' "$tmp/second.html" || { echo "FAIL: the page never read api/data"; fail=1; }
# The data names no absolute path: the run folder is "." (issue 29: it showed the syncer's out_dir).
python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "${url}api/data" > "$tmp/api.json" || { echo "FAIL: api/data did not answer"; fail=1; }
if grep -qF "$tmp" "$tmp/api.json"; then echo "FAIL: api/data names the absolute run folder $tmp/run"; fail=1; fi
grep -q '"dir":"\."' "$tmp/api.json" || { echo "FAIL: api/data does not name the run folder '.'"; fail=1; }
if grep -q CONSOLE "$tmp/first.log" "$tmp/second.log"; then echo "FAIL: the page wrote to the console:"; grep -h CONSOLE "$tmp"/*.log; fail=1; fi
[ "$fail" = 0 ] && echo "dashboard OK"
exit "$fail"
