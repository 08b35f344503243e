#!/usr/bin/env bash
# A hostile run folder through `deloco report`, loaded in headless Chromium: records and a summary written by hand
# (no training) whose texts are markup and scripts (<img onerror>, <!--<script>, </script>, U+2028, strings where
# numbers are expected) in a folder whose name is markup and a gnuplot command. The page must render (charts
# drawn, tables filled), show those texts escaped, and run none of them: every payload would set the title to
# PWNED, mark <body data-pwned> or log PWNED to the console. A second page holds the same report with its data
# block replaced by data of the wrong types everywhere (what an old or foreign syncer's api/data could serve): the
# page's script must escape what it shows by itself. `--png` over the same folder must run no command.
# Usage: hostile_in_chromium.sh DELOCO_BINARY SOURCE_DIR. Exits 77 (skipped) when no chromium is installed.
set -euo pipefail
deloco=$(realpath "$1")
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "skipped: no chromium (scripts/setup.sh installs it)"; exit 77; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# The payloads: each would leave a trace if it ran.
img="<img src=x onerror=\"document.title='PWNED';document.body.setAttribute('data-pwned','1');console.log('PWNED')\">"
run=$'hostile <img src=x onerror=document.title=1>\n!touch pwned-by-name #'
mkdir "$run"
python3 - "$run" "$img" <<'PY'
import json, sys
run, img = sys.argv[1], sys.argv[2]
def lines(path, recs):
    with open(f"{run}/{path}", "w") as f:
        for r in recs: f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
syncer = [{"kind": "started", "t": 1000.0, "resumed": False},
          {"kind": "status", "t": 1000.5, "connected": [0, 1], "uptime": img, "merges": 3}]
for i in range(8):
    syncer.append({"kind": "merge", "t": 1001.0 + i, "learners": [0, 1], "grace_wait": 0.1 * i})
    syncer.append({"kind": "eval", "t": 1001.5 + i, "val_loss": 5.0 - 0.2 * i, "val_bpb": 2.0 - 0.05 * i,
                   "tokens": 1000 * (i + 1)})
syncer += [{"kind": "chaos", "t": 1002.2, "what": "<!--<script>"},
           {"kind": "chaos", "t": 1002.4, "what": "</script><script>document.title='PWNED'</script>"},
           {"kind": "chaos", "t": 1002.6, "what": img},
           {"kind": "chaos", "t": 1002.8, "what": "line\u2028separator\u2029paragraph & ampersand"},
           {"kind": "reject", "t": 1003.0, "reason": "<svg onload=\"document.title='PWNED'\">"},
           {"kind": "merge", "t": 1e300, "learners": [0]},           # an impossible time: skipped, noted
           {"kind": "eval", "t": "<b>soon</b>", "val_loss": 1.0},    # a time of the wrong type: no time
           "<script>document.title='PWNED'</script>"]               # not a record
lines("syncer.jsonl", syncer)
for n in (0, 1):
    lines(f"learner-{n}.jsonl", [{"kind": "learner", "t": 1000.2 + k, "step": 10 * k, "loss": 6.0 - 0.1 * k - n,
                                  "tokens": 640 * k} for k in range(10)])
json.dump({"command": "run", "final_val_loss": img, "uptime": "<b>bold</b>", "wall_seconds": 12.5,
           "goodput": {"x": img}, "loss_unit": "</script>", "rejects": {img: 2}}, open(f"{run}/summary.json", "w"))
PY
"$deloco" report "$run" --out report.html --png png > report.log 2>&1 || { cat report.log; exit 1; }
# The same page with a data block whose every shown value is a string of markup (escaped as JSON must be).
python3 - "$img" <<'PY'
import json, re, sys
img = sys.argv[1]
page = open("report.html").read()
m = re.search(r'(<script id="deloco-data" type="application/json">)(.*?)(</script>)', page, re.S)
data = json.loads(m.group(2))
for r in data:
    r["name"] = img
    r["thinned_to"] = img
    r["notes"] = [img]
    r["summary"] = {k: img for k in ["wall_seconds", "final_val_loss", "val_bpb", "tokens", "outer_steps",
                                     "contributions_merged", "contributions_rejected", "uptime", "goodput",
                                     "bytes_sent", "learner_kills", "syncer_kills"]}
    r["rejects"] = {img: img}
    r["events"] = [[img, img]] + r["events"]
    for n in r["learner_now"].values():
        n.update({"state": img, "step": img, "loss": img, "t": img, "tokens_per_s": img})
block = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
open("typed.html", "w").write(page[:m.start(2)] + block + page[m.end(2):])
PY
fail=0
check_page() {  # $1: page name. Loads it and checks it rendered, escaped, and ran nothing.
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
    --virtual-time-budget=5000 --dump-dom "file://$tmp/$1.html" > "$1.dom" 2> "$1.log"
  for chart in loss-time loss-tokens bpb-time merge-rate quorum grace learner-loss learner-step; do
    points=$(grep -o "id=\"$chart\" data-points=\"[0-9]*\" data-rendered=\"1\"" "$1.dom" | grep -o 'points="[0-9]*' | tr -dc 0-9 || true)
    if [ -z "$points" ] || [ "$points" -eq 0 ]; then echo "FAIL ($1): chart $chart was not drawn with data"; fail=1; fi
  done
  grep -q '<tr class="learner">' "$1.dom" || { echo "FAIL ($1): the learner table is empty"; fail=1; }
  grep -q '<td>&lt;img src=x onerror="document.title=' "$1.dom" || { echo "FAIL ($1): the payload is not shown escaped"; fail=1; }
  if grep -o '<title>[^<]*</title>' "$1.dom" | grep -q PWNED; then echo "FAIL ($1): a payload set the title"; fail=1; fi
  if grep -q '<body[^>]*data-pwned' "$1.dom"; then echo "FAIL ($1): a payload marked the body"; fail=1; fi
  if grep -q 'CONSOLE' "$1.log"; then echo "FAIL ($1): the page wrote to the console:"; grep CONSOLE "$1.log"; fail=1; fi
}
check_page report
grep -q '&lt;!--&lt;script&gt;' report.dom || { echo "FAIL: the <!--<script> event is not listed escaped"; fail=1; }
grep -q '&lt;/script&gt;&lt;script&gt;document.title' report.dom || { echo "FAIL: the </script> event is not listed escaped"; fail=1; }
grep -q 'hostile &lt;img src=x onerror=document.title=1&gt;?!touch pwned-by-name #' report.dom ||
  { echo "FAIL: the run's name is not shown escaped, its newline as '?'"; fail=1; }
grep -q 'time 1e+300 is not a finite time' report.dom || { echo "FAIL: the skipped time is not noted on the page"; fail=1; }
grep -q '"final_val_loss" is a string, not a number' report.dom || { echo "FAIL: the mistyped summary field is not noted"; fail=1; }
check_page typed
if [ -e pwned-by-name ] || [ -e png/pwned-by-name ]; then echo "FAIL: --png ran a command from the folder's name"; fail=1; fi
if command -v gnuplot >/dev/null && [ ! -s png/val_loss_time.png ]; then echo "FAIL: --png drew no chart"; cat report.log; fail=1; fi
[ "$fail" = 0 ] && echo "hostile run folder OK: rendered, escaped, nothing ran ($("$browser" --version 2>/dev/null | head -1))"
exit "$fail"
