#!/usr/bin/env bash
# The live dashboard of a running `deloco run`, loaded twice in headless Chromium from the URL the run prints:
# the charts have data points, the learner table shows every learner, values grow between the two reads, the
# page wrote nothing to the console, and its data (api/data) names no absolute path. Then, through a proxy that
# adds a check script to the page, a chart zoomed in (setScale) keeps its zoom across a poll that brought more data:
# the charts are updated in place (setData), not drawn anew.
# Usage: dashboard_in_chromium.sh DELOCO_BINARY SOURCE_DIR. Exits 77 (skipped) when no chromium is installed.
set -euo pipefail
deloco=$1 src=$2
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "skipped: no chromium (scripts/setup.sh installs it)"; exit 77; fi
tmp=$(mktemp -d)
pid="" proxy=""
cleanup() { [ -n "$proxy" ] && kill "$proxy" 2>/dev/null; [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
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
read_page() {  # $1: output name; $2: the URL (default: the dashboard); $3: virtual ms (5000: two refreshes).
  timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
    --virtual-time-budget="${3:-5000}" --dump-dom "${2:-$url}" > "$tmp/$1.html" 2> "$tmp/$1.log"
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
# Zoom survives a poll. The proxy serves the dashboard's page with zoom_check.js added and its api/data, holding each
# answer after the first until the run's data changed (at most 30 s), so the poll after the zoom brings more data.
cat > "$tmp/zoom_check.js" <<'JS'
(() => {
  const say = v => { document.body.dataset.zoomCheck = v; };
  let u0, zoom, n0, last0, reads0, seen;
  const tick = () => {
    const p = plots['learner-step'], reads = +(document.body.dataset.reads || 0);
    if (!u0) {
      if (!p || reads < 1) return setTimeout(tick, 50);
      u0 = p.u; reads0 = seen = reads; n0 = u0.data[0].length; last0 = u0.data[0][n0 - 1];
      const x = u0.data[0], lo = x[0], hi = x[x.length - 1];
      zoom = [lo + (hi - lo) / 4, lo + (hi - lo) / 2];
      u0.setScale('x', {min: zoom[0], max: zoom[1]});
      return setTimeout(tick, 50);
    }
    if (reads <= seen) return setTimeout(tick, 50);
    seen = reads;
    const u = plots['learner-step'].u, sx = u.scales.x, n = u.data[0].length, last = u.data[0][n - 1];
    if (u !== u0) return say('fail: the chart was drawn anew');
    if (sx.min !== zoom[0] || sx.max !== zoom[1]) return say('fail: the zoom ' + zoom + ' became ' + [sx.min, sx.max]);
    // A poll can bring other news (status, an eval) and no new learner point: the zoom must hold there too; the
    // check ends at the first poll that brought newer points to this chart (newer, not more: a long run's series
    // are thinned to a fixed number of points, report.cpp).
    if (!(last > last0)) {
      if (reads - reads0 >= 20) return say('fail: no newer data in 20 polls (the newest x stayed ' + last0 + ')');
      return setTimeout(tick, 50);
    }
    const v = plots['learner-loss'].u, vx = v.data[0];  // not zoomed: its x scale follows the data
    if (v.scales.x.max < vx[vx.length - 1]) return say('fail: an unzoomed chart does not show its newest data');
    say('ok: zoom kept, ' + n0 + ' then ' + n + ' x values, the newest from ' + last0 + ' to ' + last);
  };
  tick();
})();
JS
python3 - "$url" "$tmp/zoom_check.js" "$tmp/proxy.port" > "$tmp/proxy.log" 2>&1 <<'PY' &
import http.server, sys, time, urllib.request
base, check, portfile = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3]
last = [None]
def get(path): return urllib.request.urlopen(base + path, timeout=10).read()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == '/api/data':
            body = get('api/data')
            end = time.time() + 30
            while last[0] is not None and body == last[0] and time.time() < end:
                time.sleep(0.3); body = get('api/data')
            last[0] = body
        elif self.path == '/':
            body = get('').replace(b'</body>', b'<script>' + check.encode() + b'</script></body>')
        else:
            self.send_error(404); return
        self.send_response(200); self.send_header('Content-Type', 'text/html' if self.path == '/' else 'application/json')
        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
s = http.server.HTTPServer(('127.0.0.1', 0), H)
open(portfile, 'w').write(str(s.server_port))
s.serve_forever()
PY
proxy=$!
for _ in $(seq 1 50); do [ -s "$tmp/proxy.port" ] && break; sleep 0.1; done
read_page zoom "http://127.0.0.1:$(cat "$tmp/proxy.port")/" 45000  # up to 20 polls 2 s apart
zoom=$(grep -o 'data-zoom-check="[^"]*"' "$tmp/zoom.html" || true)
case "$zoom" in
  *'"ok:'*) echo "zoom across a poll: ${zoom#*=}";;
  *) echo "FAIL: a zoomed chart across a poll: ${zoom:-no result (the check did not finish)}"; cat "$tmp/proxy.log"; fail=1;;
esac
if grep -q CONSOLE "$tmp/first.log" "$tmp/second.log" "$tmp/zoom.log"; then echo "FAIL: the page wrote to the console:"; grep -h CONSOLE "$tmp"/*.log; fail=1; fi
[ "$fail" = 0 ] && echo "dashboard OK"
exit "$fail"
