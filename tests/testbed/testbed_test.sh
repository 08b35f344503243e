#!/usr/bin/env bash
# The testbed of scripts/testbed.sh end to end (ctest testbed.script): hosts reach each other and nothing else, a
# shaped link carries about its rate in both directions, `shape` changes it while up, a partition (`link down`)
# cuts a host off and healing restores it, `down` leaves no namespace behind, and `--delay` (the delay line) adds
# its round trip. Skips (77) when not root or
# without ip/tc. Bounded: every transfer is a few MB with a 60 s socket timeout; the whole test takes ~15 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/testbed.sh check || { echo "testbed test skipped"; exit 77; }
# One testbed at a time on this machine (all share 198.18.255.254): wait for the others' (ctest's RESOURCE_LOCK
# orders only ctest's own tests).
exec 9>/tmp/deloco-testbed.lock
flock -w 300 9 || { echo "FAIL: another testbed held /tmp/deloco-testbed.lock for 5 minutes" >&2; exit 1; }
export TESTBED_NAME=dlt$$
TB=scripts/testbed.sh
PY=/usr/bin/python3
trap '$TB down >/dev/null 2>&1 || true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Mbit/s of a transfer of $3 bytes from host $1 to host $2.
rate() {
  local port=$((7000 + RANDOM % 2000))
  $TB exec "$2" $PY tests/testbed/tcp_rate.py serve $port >/dev/null &
  local srv=$!
  local r; r=$($TB exec "$1" $PY tests/testbed/tcp_rate.py send "$($TB addr "$2")" $port "$3")
  wait $srv
  echo "$r"
}
within() { $PY -c "import sys; r,lo,hi=map(float,sys.argv[1:]); sys.exit(0 if lo<=r<=hi else 1)" "$@"; }

# Refused without arguments that make sense, with nothing made.
! $TB up --hosts 0 2>/dev/null || fail "--hosts 0 accepted"
! $TB up --rate fast 2>/dev/null || fail "--rate fast accepted"
! ip netns list | grep -q "^$TESTBED_NAME" || fail "a refused up left namespaces"

$TB up --hosts 3 --rate 20mbit
status=$($TB status); grep -q "host 2 .*198.18.0.3 .*link 20mbit" <<<"$status" || fail "status does not list host 2: $status"
! $TB up 2>/dev/null || fail "a second up accepted"

# This machine reaches a host through its own port on the bridge.
out=$($TB exec 0 $PY -c "
import socket
s = socket.create_server(('0.0.0.0', 7999)); s.settimeout(10)
c, a = s.accept(); print(a[0])" & sleep 0.5; $PY -c "
import socket; socket.create_connection(('$($TB addr 0)', 7999), timeout=5).close()"; wait)
[ "$out" = 198.18.255.254 ] || fail "this machine does not reach host 0 through the testbed: $out"

# No route out of a host: only the testbed's own subnet.
out=$($TB exec 1 $PY -c "
import socket
s = socket.socket(); s.settimeout(2)
try:
    s.connect(('10.0.0.1', 80)); print('reached')
except OSError as e:
    print('unreachable' if e.errno == 101 else 'other: %s' % e)")
[ "$out" = unreachable ] || fail "a host reaches outside the testbed: $out"

r=$(rate 1 0 4000000); echo "20mbit host 1 -> 0: $r Mbit/s"; within "$r" 14 21 || fail "20mbit link carried $r Mbit/s"
r=$(rate 0 2 4000000); echo "20mbit host 0 -> 2: $r Mbit/s"; within "$r" 14 21 || fail "20mbit link carried $r Mbit/s"
$TB shape 1 5mbit
r=$(rate 1 0 1500000); echo "5mbit host 1 -> 0: $r Mbit/s"; within "$r" 3.5 5.3 || fail "5mbit link carried $r Mbit/s"
$TB shape 1 none; $TB shape 0 none
r=$(rate 1 0 20000000); echo "unshaped host 1 -> 0: $r Mbit/s"; within "$r" 100 1e9 || fail "unshaped link carried $r Mbit/s"
before=$($TB counters 1 | sed 's/.*tx_bytes=\([0-9]*\).*/\1/')
[ "$before" -gt 20000000 ] || fail "host 1's interface counted $before bytes sent, below the 20 MB it sent"

# A partition: host 1 cut off, then healed.
$TB link 1 down
out=$($TB exec 1 $PY -c "
import socket
s = socket.socket(); s.settimeout(2)
try:
    s.connect(('$($TB addr 0)', 9)); print('reached')
except OSError as e:
    print('cut')")
[ "$out" = cut ] || fail "a partitioned host still reaches host 0"
$TB link 1 up
r=$(rate 1 0 2000000); echo "healed host 1 -> 0: $r Mbit/s"; within "$r" 1 1e9 || fail "no traffic after healing"

$TB down
! ip netns list | grep -q "^$TESTBED_NAME" || fail "down left namespaces"
[ ! -f /run/$TESTBED_NAME.testbed ] || fail "down left its state file"

# Propagation delay without netem (issue 56): the delay line holds each frame 10 ms each way on each host's link,
# so a round trip between two hosts takes 40 ms more; the links still carry their rate; down stops the delay line.
! $TB up --hosts 2 --delay ten 2>/dev/null || fail "--delay ten accepted"
! ip netns list | grep -q "^$TESTBED_NAME" || fail "a refused up left namespaces"
rtt() {
  local port=$((9000 + RANDOM % 900))
  $TB exec "$2" $PY tests/testbed/tcp_rtt.py serve $port &
  local srv=$!
  sleep 0.3
  local r; r=$($TB exec "$1" $PY tests/testbed/tcp_rtt.py ping "$($TB addr "$2")" $port 9)
  wait $srv
  echo "$r"
}
$TB up --hosts 2
r=$(rtt 1 0); echo "round trip, no delay: $r ms"; within "$r" 0 5 || fail "round trip without delay took $r ms"
$TB down >/dev/null
$TB up --hosts 2 --rate 20mbit --delay 10
grep -q "^delay: 10 ms each way" <<<"$($TB status)" || fail "status does not show the delay: $($TB status)"
pid=$(sed -n 's/^delayline_pid=//p' /run/$TESTBED_NAME.testbed)
kill -0 "$pid" || fail "the delay line (pid $pid) is not running"
r=$(rtt 1 0); echo "round trip, 10 ms each way on each link: $r ms"; within "$r" 39 80 || fail "round trip with delay took $r ms"
r=$(rate 1 0 3000000); echo "20mbit host 1 -> 0 with delay: $r Mbit/s"; within "$r" 10 21 || fail "20mbit link with delay carried $r Mbit/s"
out=$($TB down); grep -q 'delay line: {"delay_ms":10' <<<"$out" || fail "down did not report the delay line's counters: $out"
! kill -0 "$pid" 2>/dev/null || fail "down left the delay line running"
! ip netns list | grep -q "^$TESTBED_NAME" || fail "down left namespaces"
echo "testbed test passed"
