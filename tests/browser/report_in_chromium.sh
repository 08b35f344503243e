#!/usr/bin/env bash
# A generated `deloco report` page, loaded in headless Chromium: every chart has drawn data points, the summary
# table names the run, chaos events are listed, and the page logged nothing to the console (no errors).
# Usage: report_in_chromium.sh DELOCO_BINARY SOURCE_DIR. Exits 77 (skipped) when no chromium is installed.
set -euo pipefail
deloco=$1 src=$2
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "skipped: no chromium (scripts/setup.sh installs it)"; exit 77; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=PASSIVE
# A short real run: two learners over CURVE, the syncer killed once by chaos and resumed.
"$deloco" run --config "$src/configs/tiny.toml" --set data.path="$src/data/sotu" --set train.steps=800 \
  --set sync.learners=2 --set sync.quorum=1 --set sync.fragments=4 --set sync.sync_every=40 \
  --set syncer.eval_interval=1 --set train.eval_tokens=2048 --set syncer.metrics= \
  --set chaos.enabled=true --set chaos.syncer_kill_at=3 --set chaos.restart_delay=1 \
  --set syncer.out_dir="$tmp/run" > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
"$deloco" report "$tmp/run" --out "$tmp/report.html" > "$tmp/report.log" 2>&1 || { cat "$tmp/report.log"; exit 1; }
timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
  --virtual-time-budget=5000 --dump-dom "file://$tmp/report.html" > "$tmp/dom.html" 2> "$tmp/browser.log"
fail=0
for chart in loss-time loss-tokens bpb-time merge-rate quorum grace learner-loss learner-step; do
  points=$(grep -o "id=\"$chart\" data-points=\"[0-9]*\" data-rendered=\"1\"" "$tmp/dom.html" | grep -o 'points="[0-9]*' | tr -dc 0-9 || true)
  if [ -z "$points" ] || [ "$points" -eq 0 ]; then echo "FAIL: chart $chart was not drawn with data"; fail=1;
  else echo "chart $chart: $points points"; fi
done
grep -q '<td><span class="sw"[^>]*></span>run</td>' "$tmp/dom.html" || { echo "FAIL: the summary table does not name the run"; fail=1; }
grep -q 'chaos: SIGKILL' "$tmp/dom.html" || { echo "FAIL: the chaos kill is not among the events"; fail=1; }
if grep -q 'CONSOLE' "$tmp/browser.log"; then echo "FAIL: the page wrote to the console:"; grep CONSOLE "$tmp/browser.log"; fail=1; fi
[ "$fail" = 0 ] && echo "report page OK in $("$browser" --version 2>/dev/null | head -1)"
exit "$fail"
