#!/usr/bin/env bash
# `scripts/testbed.sh up` refuses a machine that already uses 198.18.0.0/15 (ctest testbed.route_conflict): the
# testbed puts 198.18.255.254/16 on the machine, which would shadow (or be shadowed by) any other route there.
# Nothing real is touched: the "machine" is a private network namespace of this test, and the script runs inside it
# (nsenter --net), so its own namespace is that one. Each case puts one thing in 198.18.0.0/15 there and checks that
# `up` fails naming it, with nothing made (no namespace, no state file); then, with the range free (a route to
# 10.0.0.0/8 stays: outside the range), `up` works, and a second testbed beside it works too (the first's port is
# its own kind, not a conflict). Skips (77) when not root or without namespaces and tbf. About 2 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
TB=$PWD/scripts/testbed.sh
$TB check >/dev/null || { echo "testbed route conflict test skipped: $($TB check || true)"; exit 77; }
ns=dltc$$
a=rca$(($$ % 100000)) b=rcb$(($$ % 100000))
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }
cleanup() {
  local rc=$?
  for n in "$a" "$b"; do TESTBED_NAME=$n in_ns "$TB" down >/dev/null 2>&1 || true; done
  ip netns del "$ns" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ip netns add "$ns"
in_ns ip link set lo up
in_ns ip link add tc0 type veth peer name tc1
in_ns ip link set tc0 up
in_ns ip link set tc1 up
in_ns ip route add 10.0.0.0/8 dev tc1   # outside 198.18.0.0/15: never a conflict

# refused WHAT: `up` must fail, say WHAT on stderr, and leave nothing behind.
refused() {
  local err
  if err=$(TESTBED_NAME=$a in_ns "$TB" up --hosts 2 2>&1 >/dev/null); then fail "up accepted with $1 in place"; fi
  grep -qF -- "$1" <<<"$err" || fail "up refused without naming $1: $err"
  grep -q "nothing was made" <<<"$err" || fail "the refusal does not say that nothing was made: $err"
  ! ip netns list | grep -q "^$a-" || fail "a refused up (over $1) left namespaces: $(ip netns list)"
  [ ! -e "/run/$a.testbed" ] || fail "a refused up (over $1) left /run/$a.testbed"
  echo "refused, naming $1"
}

in_ns ip addr add 198.19.200.1/24 dev tc0            # an address (and its subnet's route) in the range
refused "198.19.200.0/24 dev tc0"
in_ns ip addr del 198.19.200.1/24 dev tc0
in_ns ip route add blackhole 198.18.5.0/24           # a route with no device
refused "blackhole 198.18.5.0/24"
in_ns ip route del blackhole 198.18.5.0/24
in_ns ip route add 198.0.0.0/8 dev tc1               # a route covering the whole range
refused "198.0.0.0/8 dev tc1"
in_ns ip route del 198.0.0.0/8 dev tc1
in_ns ip route add 198.19.9.9 dev tc1 table 100      # a host route in another table
refused "198.19.9.9 dev tc1 table 100"
in_ns ip route del 198.19.9.9 dev tc1 table 100

# The range free: up works; a second testbed beside the first is no conflict (the first one's port is a testbed's).
TESTBED_NAME=$a in_ns "$TB" up --hosts 2 >/dev/null || fail "up failed with 198.18.0.0/15 free"
TESTBED_NAME=$b in_ns "$TB" up --hosts 2 >/dev/null || fail "a second testbed was refused beside the first"
in_ns ip -4 route | grep -q "198.18.0.0/16 dev $b-root" || fail "the second testbed has no route: $(in_ns ip -4 route)"
TESTBED_NAME=$b in_ns "$TB" down >/dev/null
TESTBED_NAME=$a in_ns "$TB" down >/dev/null
! ip netns list | grep -qE "^($a|$b)-" || fail "down left namespaces"
echo "testbed route conflict test passed"
